#!/bin/bash
# usage: callgrind.sh BASE_BIN_DIR NEW_BIN_DIR ROUNDS SECONDS DEPTH > callgrind-dDEPTH.json
# tarq's whole process under callgrind (write mode), the native loadgen at 4 producers + 4
# consumers and DEPTH calls in flight per connection, the base and the new binary
# alternating, seed and tube API. Prints one JSON object: every run's instructions a message
# (put + take + ack), and medians. Runs in OUT (default /tmp/cg-reshape).
set -e
base=$1 new=$2 rounds=$3 secs=$4 depth=$5
out=${OUT:-/tmp/cg-reshape}
mkdir -p "$out"
run() { # label api bin_dir
  local label=$1 api=$2 bin=$3 extra=""
  local port=34$((RANDOM % 90 + 10)) d
  d=$(mktemp -d "$out/data.XXXX")
  valgrind --tool=callgrind --callgrind-out-file="$out/$label.out" "$bin/tarq" \
    --listen 127.0.0.1:$port --data-dir "$d" > "$out/$label.srv.log" 2>&1 &
  local vpid=$!
  for _ in $(seq 100); do sleep 0.3; "$bin/tarq" ctl --addr 127.0.0.1:$port stats > /dev/null 2>&1 && break; done
  [ "$api" = tubes ] && extra="--api tubes --tube q --tube-type fifottl"
  # shellcheck disable=SC2086
  "$new/tarq-loadgen" --target tarq --addr 127.0.0.1:$port $extra --producers 4 --consumers 4 \
    --depth "$depth" --duration "${secs}s" --warmup 0s --quiet --json "$out/$label.lg.json" \
    > "$out/$label.lg.log" 2>&1 || true
  kill -TERM $vpid; wait $vpid || true
  rm -rf "$d"
}
for r in $(seq "$rounds"); do
  for api in seed tubes; do
    run "base-$api-$r" $api "$base"
    run "new-$api-$r" $api "$new"
  done
done
python3 - "$out" "$rounds" "$secs" "$depth" <<'PY'
import json, statistics, sys
out, rounds, secs, depth = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
runs, per = [], {}
for r in range(1, rounds + 1):
    for api in ("seed", "tubes"):
        for b in ("base", "new"):
            label = f"{b}-{api}-{r}"
            msgs = json.load(open(f"{out}/{label}.lg.json"))["total_acks"]
            tot = next(int(l.split()[1]) for l in open(f"{out}/{label}.out")
                       if l.startswith(("totals:", "summary:")))
            runs.append({"label": label, "messages": msgs, "instructions": tot,
                         "per_message": round(tot / msgs)})
            per.setdefault(f"{b}-{api}", []).append(tot / msgs)
med = {k: round(statistics.median(v)) for k, v in per.items()}
print(json.dumps({
    "what": f"callgrind instructions a message (put + take + ack), tarq's whole process under "
            f"valgrind, 4+4 connections, depth {depth}, {secs} s a run, write mode; rounds "
            f"alternate base and new",
    "runs": runs,
    "median_per_message": med,
    "new_over_base": {api: round(med[f"new-{api}"] / med[f"base-{api}"] - 1, 4)
                      for api in ("seed", "tubes")},
}, indent=1))
PY
