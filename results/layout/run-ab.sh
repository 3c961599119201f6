#!/usr/bin/env bash
# Before/after of the crate split: the same loadgen drives the tarq binary of the last commit
# before the split (a54f144) and the one after, alternating run by run so that both see the
# same machine, at each shape; every run's JSON lands in OUT. Usage:
#   run-ab.sh OLD_TARQ NEW_TARQ LOADGEN OUT [ROUNDS]
set -euo pipefail
old=$1 new=$2 loadgen=$3 out=$4 rounds=${5:-5}
mkdir -p "$out"
for shape in "4 4 16" "4 4 1" "32 32 16" "32 32 1"; do
  read -r p c d <<<"$shape"
  for r in $(seq 1 "$rounds"); do
    for which in old new; do
      bin=$old; [ "$which" = new ] && bin=$new
      "$loadgen" --target tarq --spawn --tarq-bin "$bin" --producers "$p" --consumers "$c" \
        --depth "$d" --duration 3s --warmup 1s --cpu 1 --target-cpu 0 --quiet \
        --json "$out/$which-p${p}c${c}-d${d}-r$r.json" >/dev/null
    done
  done
done
