#!/usr/bin/env bash
# Before/after the server's reshape (issue 27), alternating run by run so both binaries see the
# same machine: tarq spawned by the loadgen on core 0, the loadgen on core 1, 4 producers + 4
# consumers, depth 1 and 16, the seed API and the tube API, 3 s a run after 1 s of warm-up.
#   rounds.sh BASE_BIN_DIR NEW_BIN_DIR OUT ROUNDS [FIRST]
# (FIRST, default 1: the first round's number, to add rounds to an OUT that has some; the
# summary covers every run in OUT.)
# Each BIN_DIR holds `tarq` and `tarq-loadgen` (the same loadgen drives both). One JSON per run
# in OUT, then a summary (medians, new / base) on stdout.
set -euo pipefail
base=$1 new=$2 out=$3 rounds=${4:-5} first=${5:-1}
mkdir -p "$out"
for r in $(seq "$first" $((first + rounds - 1))); do
  for depth in 1 16; do
    for api in seed tubes; do
      extra=""
      [ "$api" = tubes ] && extra="--api tubes --tube q --tube-type fifottl"
      for which in base new; do
        bin=$base; [ "$which" = new ] && bin=$new
        # shellcheck disable=SC2086
        "$new/tarq-loadgen" --target tarq --spawn --tarq-bin "$bin/tarq" $extra \
          --producers 4 --consumers 4 --depth "$depth" --duration 3s --warmup 1s \
          --cpu 1 --target-cpu 0 --quiet --json "$out/$which-$api-d$depth-r$r.json" >/dev/null
      done
    done
  done
done
python3 - "$out" <<'PY'
import glob, json, os, statistics, sys
out = sys.argv[1]
runs = {}
for f in glob.glob(f"{out}/*-r*.json"):
    which, api, depth, _ = os.path.basename(f).split("-")
    d = json.load(open(f))
    runs.setdefault((api, depth, which), []).append(d)
summary = {}
for (api, depth, which), ds in sorted(runs.items()):
    summary[f"{which}-{api}-{depth}"] = {
        "runs": len(ds),
        "msgs_per_s_median": round(statistics.median(d["msgs_per_s"] for d in ds)),
        "cycle_p50_us_median": round(statistics.median(d["cycle_us"]["p50"] for d in ds), 1),
        "cycle_p99_us_median": round(statistics.median(d["cycle_us"]["p99"] for d in ds), 1),
    }
for api in ("seed", "tubes"):
    for depth in ("d1", "d16"):
        b, n = summary.get(f"base-{api}-{depth}"), summary.get(f"new-{api}-{depth}")
        if b and n:
            n["new_over_base"] = round(n["msgs_per_s_median"] / b["msgs_per_s_median"] - 1, 4)
print(json.dumps(summary, indent=1))
PY
