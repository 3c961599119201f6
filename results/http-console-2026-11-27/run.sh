#!/usr/bin/env bash
# The cost of open dashboards: 4 producers + 4 consumers at depth 16 (tarq-loadgen, closed loop)
# against tarq serving its HTTP port, alternately with ten event streams open (/api/events,
# what ten dashboards hold) and with none. Each run starts a fresh tarq pinned to core 0; the
# loadgen and the stream readers run on core 1. Writes run-<n>-<streams|none>.json beside this
# file, then summary.json (summarize.py). Usage: results/http-console-2026-11-27/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
out=results/http-console-2026-11-27
target=${CARGO_TARGET_DIR:-target}
TARQ=${TARQ:-$target/release/tarq}
LOADGEN=${LOADGEN:-$target/release/tarq-loadgen}
PAIRS=${PAIRS:-5}
DURATION=${DURATION:-10s}
STREAMS=10

run() { # $1: streams | none, $2: run number
  local dir pid http addr
  dir=$(mktemp -d)
  taskset -c 0 "$TARQ" --listen 127.0.0.1:0 --http-listen 127.0.0.1:0 --data-dir "$dir/data" 2>"$dir/log" &
  pid=$!
  for _ in $(seq 200); do grep -q "tarq serving" "$dir/log" && break; sleep 0.05; done
  addr=$(sed -n 's/.*tarq serving listen=\([0-9.:]*\).*/\1/p' "$dir/log")
  http=$(sed -n 's/.*serving Prometheus metrics at \/metrics listen=\([0-9.:]*\).*/\1/p' "$dir/log")
  local readers=()
  if [ "$1" = streams ]; then
    for i in $(seq $STREAMS); do
      taskset -c 1 curl -sN "http://$http/api/events" >"$dir/events-$i" &
      readers+=($!)
    done
  fi
  "$LOADGEN" --addr "$addr" --producers 4 --consumers 4 --depth 16 --duration "$DURATION" \
    --cpu 1 --quiet --json "$out/run-$2-$1.json" >/dev/null
  local got=0
  if [ "$1" = streams ]; then
    for i in $(seq $STREAMS); do got=$((got + $(grep -c '^data: ' "$dir/events-$i" || true))); done
    kill "${readers[@]}" 2>/dev/null || true
  fi
  # What the console cost the loop in this run, by its own count (live_tick_seconds).
  curl -s "http://$http/api/server" >"$out/run-$2-$1-server.json"
  echo "run $2 $1: events received $got" >&2
  kill "$pid"; wait "$pid" 2>/dev/null || true
  rm -rf "$dir"
}

for n in $(seq "$PAIRS"); do
  if [ $((n % 2)) = 1 ]; then run none "$n"; run streams "$n"; else run streams "$n"; run none "$n"; fi
done
python3 "$out/summarize.py" "$out"
