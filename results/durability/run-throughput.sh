#!/usr/bin/env bash
# Throughput of put -> take -> ack through the wire per WAL mode, 64 producer connections and
# as many consumers, at pipelining depth 1 and 16 (in fsync mode an ack waits for a sync too, so
# the consumers need as many requests in flight as the producers). Starts a fresh tarq per run on a temporary data
# dir (on the same disk as the repository) and measures it with tarq-loadgen.
# Usage (from the repository root): bash results/durability/run-throughput.sh [DURATION]
set -euo pipefail
cd "$(dirname "$0")/../.."
duration="${1:-10s}"
cargo build --release -q -p tarq-net -p tarq-loadgen
out=results/durability
tmp="$(mktemp -d -p "${TMPDIR:-$PWD/target}")"
trap 'rm -rf "$tmp"' EXIT
port=33011
for mode in none write fsync; do
  for depth in 1 16; do
    port=$((port + 1))
    target/release/tarq --listen "127.0.0.1:$port" --data-dir "$tmp/$mode-$depth" \
      --wal-mode "$mode" --log-level warn &
    pid=$!
    for _ in $(seq 200); do (echo >"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.05; done
    target/release/tarq-loadgen --target tarq --addr "127.0.0.1:$port" --no-pin --quiet \
      --producers 64 --consumers 64 --depth "$depth" --window 100000 --duration "$duration" \
      --json "$out/throughput-$mode-depth$depth.json" || true
    kill "$pid"; wait "$pid" || true
  done
done
