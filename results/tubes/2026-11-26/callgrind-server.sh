#!/bin/bash
# usage: callgrind-server.sh LABEL seed|tubes SECONDS BIN_DIR: tarq under callgrind, a native loadgen at 4+4 depth 16; instructions a message (OUT, default /tmp/cg)
set -e
label=$1; api=$2; secs=${3:-20}; bin=${4:-target/release}
port=34$((RANDOM%90+10))
d=$(mktemp -d ${OUT:-/tmp/cg}/data.XXXX)
valgrind --tool=callgrind --callgrind-out-file=${OUT:-/tmp/cg}/$label.out $bin/tarq --listen 127.0.0.1:$port --data-dir $d > ${OUT:-/tmp/cg}/$label.srv.log 2>&1 &
vpid=$!
for i in $(seq 100); do sleep 0.3; $bin/tarq ctl --addr 127.0.0.1:$port stats >/dev/null 2>&1 && break; done
extra=""; [ $api = tubes ] && extra="--api tubes --tube q --tube-type fifottl"
$bin/tarq-loadgen --target tarq --addr 127.0.0.1:$port $extra --producers 4 --consumers 4 --depth 16 --duration ${secs}s --warmup 0s --quiet --json ${OUT:-/tmp/cg}/$label.lg.json > ${OUT:-/tmp/cg}/$label.lg.log 2>&1 || true
$bin/tarq ctl --addr 127.0.0.1:$port stats > ${OUT:-/tmp/cg}/$label.stats.json
kill -TERM $vpid; wait $vpid || true
rm -rf $d
python3 - <<PY
import json
d=json.load(open("${OUT:-/tmp/cg}/$label.lg.json"))
import json,re
s=json.load(open('${OUT:-/tmp/cg}/$label.stats.json'))
tot=None
for l in open('${OUT:-/tmp/cg}/$label.out'):
    if l.startswith('totals:') or l.startswith('summary:'): tot=int(l.split()[1])
print('$label', 'acks', d['total_acks'], 'instr', tot, 'per msg', round(tot/d['total_acks']))
PY
