#!/bin/bash
# usage: callgrind.sh BASE_BIN_DIR BRANCH_BIN_DIR ROUNDS SECONDS > callgrind.json
# What reserving the WAL's room before every change costs the loop: tarq under callgrind
# (results/tubes/2026-11-26/callgrind-server.sh: write mode, the native loadgen at 4 producers
# + 4 consumers, depth 16), the binaries without and with it alternating, seed and tube API.
# Prints one JSON object: every run's instructions a message (put + take + ack), and medians.
set -e
here=$(cd "$(dirname "$0")" && pwd)
S=$here/../../tubes/2026-11-26/callgrind-server.sh
export OUT=${OUT:-/tmp/cg}
mkdir -p "$OUT"
for r in $(seq "$3"); do
  for api in seed tubes; do
    for b in base branch; do
      dir=$1; [ $b = branch ] && dir=$2
      bash "$S" "$b-$api-$r" "$api" "$4" "$dir" > /dev/null
    done
  done
done
python3 - "$3" "$4" <<'PY'
import json, os, statistics, sys
out = os.environ["OUT"]
rounds, secs = int(sys.argv[1]), sys.argv[2]
runs, per = [], {}
for r in range(1, rounds + 1):
    for api in ("seed", "tubes"):
        for b in ("base", "branch"):
            label = f"{b}-{api}-{r}"
            msgs = json.load(open(f"{out}/{label}.lg.json"))["total_acks"]
            tot = None
            for l in open(f"{out}/{label}.out"):
                if l.startswith(("totals:", "summary:")):
                    tot = int(l.split()[1])
            runs.append({"label": label, "messages": msgs, "instructions": tot,
                         "per_message": round(tot / msgs)})
            per.setdefault(f"{b}-{api}", []).append(tot / msgs)
med = {k: round(statistics.median(v)) for k, v in per.items()}
print(json.dumps({
    "what": f"callgrind instructions a message (put + take + ack), tarq's whole process "
            f"under valgrind, 4+4 connections depth 16, {secs} s a run, write mode; "
            f"base = before the WAL reserved room, branch = with it; rounds alternate",
    "runs": runs,
    "median_per_message": med,
    "branch_over_base": {api: round(med[f"branch-{api}"] / med[f"base-{api}"] - 1, 4)
                         for api in ("seed", "tubes")},
}, indent=1))
PY
