#!/bin/bash
# usage: callgrind-loadgen.sh LABEL seed|tubes SECONDS BIN_DIR: the loadgen under callgrind against a native tarq; instructions a message (OUT, default /tmp/cg)
set -e
label=$1; api=$2; secs=${3:-15}; bin=${4:-target/release}
port=35$((RANDOM%90+10))
d=$(mktemp -d ${OUT:-/tmp/cg}/data.XXXX)
$bin/tarq --listen 127.0.0.1:$port --data-dir $d > ${OUT:-/tmp/cg}/$label.srv.log 2>&1 &
spid=$!
for i in $(seq 100); do sleep 0.2; $bin/tarq ctl --addr 127.0.0.1:$port stats >/dev/null 2>&1 && break; done
extra=""; [ $api = tubes ] && extra="--api tubes --tube q --tube-type fifottl"
valgrind --tool=callgrind --callgrind-out-file=${OUT:-/tmp/cg}/$label.out $bin/tarq-loadgen --target tarq --addr 127.0.0.1:$port $extra --producers 4 --consumers 4 --depth 16 --duration ${secs}s --warmup 0s --quiet --json ${OUT:-/tmp/cg}/$label.lg.json > ${OUT:-/tmp/cg}/$label.lg.log 2>&1 || true
kill -TERM $spid; wait $spid || true
rm -rf $d
python3 - <<PY
import json
d=json.load(open("${OUT:-/tmp/cg}/$label.lg.json"))
tot=None
for l in open('${OUT:-/tmp/cg}/$label.out'):
    if l.startswith('totals:') or l.startswith('summary:'): tot=int(l.split()[1])
print('$label', 'acks', d['total_acks'], 'instr', tot, 'per msg', round(tot/d['total_acks']))
PY
