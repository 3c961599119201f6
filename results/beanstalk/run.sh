#!/usr/bin/env bash
# The beanstalk figures of results/beanstalk/README.md: put → reserve → delete through tarq's
# beanstalk port (default WAL mode, write), beanstalkd in memory and beanstalkd with its binlog,
# each spawned fresh by the loadgen (target on core 0, loadgen on core 1), runs alternating so
# that the machine's noise falls on every target alike.
# Usage: bash results/beanstalk/run.sh OUT_DIR [RUNS] [DURATION]
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:?output directory}
runs=${2:-3}
duration=${3:-3s}
mkdir -p "$out"
cargo build --release -q -p tarq-net -p tarq-loadgen
for run in $(seq 1 "$runs"); do
  for shape in "4 16" "4 1" "32 16"; do
    set -- $shape
    conns=$1 depth=$2
    for target in tarq-beanstalk beanstalkd beanstalkd-binlog; do
      target/release/tarq-loadgen --target "$target" --spawn --producers "$conns" \
        --consumers "$conns" --depth "$depth" --duration "$duration" --cpu 1 --target-cpu 0 \
        --quiet --json "$out/$target-c$conns-d$depth-$run.json" >/dev/null
    done
  done
done
