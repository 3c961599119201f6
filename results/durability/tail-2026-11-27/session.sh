#!/bin/bash
# usage (from the repository root): session.sh OUTDIR
set -e
out=$1
R=results/durability/tail-2026-11-26/run.sh
steal() { awk '/^cpu[01] /{printf "%s steal %s ", $1, $9}' /proc/stat; }
one() { # name target rate args...
  local name=$1; shift
  local s0=$(steal)
  DUR=10s bash $R $out "$name" "$@" --warmup 2s | tail -1
  echo "  steal before: $s0 after: $(steal)"
}
for i in 1 2; do
  one tarq-closed-$i tarq closed
  one null-closed-$i null closed
done
