#!/bin/bash
set -e
out=$1
R=results/durability/tail-2026-11-26/run.sh
steal() { awk '/^cpu[01] /{printf "%s steal %s ", $1, $9}' /proc/stat; }
one() { local name=$1; shift; local s0=$(steal)
  DUR=10s bash $R $out "$name" "$@" --warmup 2s --spin | tail -1
  echo "  steal before: $s0 after: $(steal)"; }
for i in 3 4; do
  one tarq-spin-25-$i tarq 62500
  one null-spin-25-$i null 62500
  one tarq-spin-50-$i tarq 125000
  one null-spin-50-$i null 125000
  one walnone-spin-50-$i tarq 125000 --target-args '--wal-mode none'
done
