#!/bin/bash
# Run from the repository root after `cargo build --release -p tarq-loadgen -p tarq-net`.
# The measured session: closed-loop maximum, then open loop at 25/50/75% of it, tarq and null
# alternating, with --spin (and the timer loop at 50% for comparison).
set -e
out=results/durability/tail-2026-11-26
run=$out/run.sh
steal() { awk '/^cpu[01] /{printf "%s steal %s ", $1, $9}' /proc/stat; echo; }
log=$out/session.log; : > $log
for i in 1 2; do
  for t in tarq null; do
    s1=$(steal); $run $out $t-closed-$i $t closed | tee -a $log; echo "  steal before: $s1 after: $(steal)" >> $log
  done
done
max=$(python3 -c "
import json,statistics
print(round(statistics.median(json.load(open('$out/tarq-closed-%d.json'%i))['msgs_per_s'] for i in (1,2))))")
echo "closed-loop max (tarq, median of 2): $max" | tee -a $log
for i in 1 2; do
  for pct in 25 50 75; do
    rate=$((max * pct / 100))
    for t in tarq null; do
      s1=$(steal); $run $out $t-spin-$pct-$i $t $rate --spin | tee -a $log; echo "  rate $rate steal before: $s1 after: $(steal)" >> $log
    done
  done
  rate=$((max / 2))
  for t in tarq null; do
    s1=$(steal); $run $out $t-timer-50-$i $t $rate | tee -a $log; echo "  rate $rate steal before: $s1 after: $(steal)" >> $log
  done
done
