#!/bin/bash
# usage: rounds.sh OUTDIR ROUNDS: alternating rounds of the branch (NEW, default target/release) and the base (BASE):
# RT priority (SCHED_FIFO 50) for the loadgen and the tarq it spawns (inherited); loadgen on core 1, tarq on core 0.
out=$1; rounds=$2
mkdir -p $out
run() { # label bin api
  local label=$1 bin=$2 api=$3 i=$4 extra=""
  [ $api = tubes ] && extra="--api tubes --tube q --tube-type fifottl"
  local f=$out/$label-d16-$i
  cat /proc/loadavg > $f.load
  chrt -f 50 taskset -c 1 $bin/tarq-loadgen --target tarq --spawn $extra --tarq-bin $bin/tarq \
    --producers 4 --consumers 4 --depth 16 --duration 3s --cpu 1 --target-cpu 0 --quiet \
    --json $f.json > $f.log 2>&1
  python3 -c "
import json;d=json.load(open('$f.json'))
print('$label', $i, round(d['msgs_per_s']), 'lg %.2f tgt %.2f other %.2f' % (d['loadgen_cpu'], d['target_cpu'], d['other_cpu']), 'load', open('$f.load').read().split()[0])"
}
for i in $(seq $rounds); do
  run seed ${NEW:-target/release} seed $i
  run tubes ${NEW:-target/release} tubes $i
  run base-seed ${BASE:-/tmp/cg/base} seed $i
  run base-tubes ${BASE:-/tmp/cg/base} tubes $i
done
