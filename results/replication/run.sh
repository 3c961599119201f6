#!/bin/bash
# One configuration: a primary with R replicas (--replica-of), sync S, measured by the loadgen.
# Usage: run.sh NAME R S [extra loadgen args]
set -e
OUT=${OUT:-results/replication}
B=${B:-target/release}
NAME=$1; R=$2; S=$3; shift 3
D=$(mktemp -d)
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
PP=$(port)
SYNC=()
[ "$S" -gt 0 ] && SYNC=(--sync-replicas $S)
$B/tarq --listen 127.0.0.1:$PP --data-dir $D/p --wal-mode write "${SYNC[@]}" 2> $D/p.log & PIDS=$!
sleep 0.5
for i in $(seq 1 $R); do
  RP=$(port)
  $B/tarq --listen 127.0.0.1:$RP --data-dir $D/r$i --wal-mode write --replica-of 127.0.0.1:$PP 2> $D/r$i.log & PIDS="$PIDS $!"
done
for i in $(seq 1 50); do
  n=$($B/tarq ctl --addr 127.0.0.1:$PP stats 2>/dev/null | python3 -c 'import json,sys;print(json.load(sys.stdin)["replicas"])' 2>/dev/null || echo -1)
  [ "$n" = "$R" ] && break; sleep 0.1
done
$B/tarq-loadgen --target tarq --addr 127.0.0.1:$PP --producers 4 --consumers 4 --depth 16 --duration 5s --json $OUT/$NAME.json "$@" > $OUT/$NAME.txt 2>&1 || true
kill $PIDS; wait 2>/dev/null || true
rm -rf $D
grep -E "msgs/s|msgs_per_s" $OUT/$NAME.txt | head -3
