#!/bin/bash
# Replication delay at a fixed open-loop rate: a primary and one replica (async), the
# loadgen at RATE puts/s, the probe measuring put-acknowledged → visible-on-replica.
set -e
OUT=${OUT:-results/replication}
B=${B:-target/release}
NAME=$1; RATE=$2; SYNC=$3
D=$(mktemp -d)
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
PP=$(port); RP=$(port)
$B/tarq --listen 127.0.0.1:$PP --data-dir $D/p --wal-mode write --sync-replicas $SYNC 2> $D/p.log & PIDS=$!
sleep 0.5
$B/tarq --listen 127.0.0.1:$RP --data-dir $D/r --wal-mode write --replica-of 127.0.0.1:$PP 2> $D/r.log & PIDS="$PIDS $!"
sleep 1
$B/tarq-loadgen --target tarq --addr 127.0.0.1:$PP --producers 4 --consumers 4 --depth 16 --duration 8s --rate $RATE --json $OUT/$NAME.json > $OUT/$NAME.txt 2>&1 &
LG=$!
sleep 2
python3 results/replication/lag.py $PP $RP 5 > $OUT/$NAME.lag.json
wait $LG || true
kill $PIDS; wait 2>/dev/null || true
rm -rf $D
grep -m1 "msgs/s" $OUT/$NAME.txt; cat $OUT/$NAME.lag.json
