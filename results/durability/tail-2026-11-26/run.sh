#!/bin/bash
# Run from the repository root after `cargo build --release -p tarq-loadgen -p tarq-net`.
# usage: run.sh OUTDIR NAME TARGET RATE|closed [extra loadgen args...]
# The loadgen runs SCHED_FIFO 50 on core 1; the spawned target inherits SCHED_FIFO 50 and is
# pinned to core 0 by the loadgen (--target-cpu 0).
set -e
out=$1; name=$2; target=$3; rate=$4; shift 4
LG=${LG:-target/release/tarq-loadgen}
rateargs=""
[ "$rate" != closed ] && rateargs="--rate $rate"
cat /proc/loadavg > $out/$name.loadavg
${NORT:-chrt -f 50} taskset -c 1 $LG --target $target --spawn --producers 4 --consumers 4 --depth 16 \
  --duration ${DUR:-5s} --cpu 1 --target-cpu 0 $rateargs --quiet \
  --tarq-bin target/release/tarq \
  --json $out/$name.json --hgrm $out/$name "$@" > $out/$name.txt 2>&1 || { cat $out/$name.txt; exit 1; }
cat /proc/loadavg >> $out/$name.loadavg
python3 - $out/$name.json <<'PY'
import json,sys
d=json.load(open(sys.argv[1]))
f=lambda k: d[k]
print("%-28s msgs/s %9.0f put p99 %8.1f p99.9 %8.1f | e2e p50 %7.1f p99 %8.1f p99.9 %8.1f max %8.1f | lag p99 %7.1f p99.9 %8.1f max %8.1f | cpu lg %.2f tg %s other %s" % (
 sys.argv[1].split('/')[-1][:-5], d['msgs_per_s'], d['put_us']['p99'], d['put_us']['p999'], d['e2e_us']['p50'], d['e2e_us']['p99'], d['e2e_us']['p999'], d['e2e_us']['max'],
 *( (d["send_lag_us"] or {}).get(k,0) for k in ("p99","p999","max")), d['loadgen_cpu'], d['target_cpu'], d['other_cpu']))
PY
true
