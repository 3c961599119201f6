#!/usr/bin/env python3
"""Summarises run.sh's runs: messages a second of each run, by condition (ten event streams
open, none), the medians and the ratio. Writes summary.json beside the runs."""
import glob
import json
import os
import statistics
import sys

out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
runs = {"none": [], "streams": []}
meta = None
for path in sorted(glob.glob(os.path.join(out, "run-*-*.json"))):
    if path.endswith("-server.json"):
        continue
    d = json.load(open(path))
    cond = path.rsplit("-", 1)[1].removesuffix(".json")
    server = json.load(open(path.removesuffix(".json") + "-server.json"))
    runs[cond].append({
        "live_tick_seconds": server["http"]["live_tick_seconds"],
        "live_ticks": server["http"]["live_ticks"],
        "uptime_s": server["uptime"],
        "loop_share_of_console": server["http"]["live_tick_seconds"] / server["uptime"],
        "file": os.path.basename(path),
        "msgs_per_s": d["msgs_per_s"],
        "e2e_p50_us": d["e2e_us"]["p50"],
        "e2e_p99_us": d["e2e_us"]["p99"],
        "target_cpu": d["target_cpu"],
        "errors": d["errors"],
        "loadavg_before": d["machine"]["loadavg_before"],
    })
    meta = meta or {"commit": d["commit"], "machine": d["machine"], "config": d["config"]}
med = {c: statistics.median(r["msgs_per_s"] for r in rs) for c, rs in runs.items() if rs}
pairs = sorted({r["file"].split("-")[1] for rs in runs.values() for r in rs})
by = {(r["file"].split("-")[1], c): r for c, rs in runs.items() for r in rs}
ratios = [by[(n, "streams")]["msgs_per_s"] / by[(n, "none")]["msgs_per_s"]
          for n in pairs if (n, "streams") in by and (n, "none") in by]
share = {c: statistics.median(r["loop_share_of_console"] for r in rs) for c, rs in runs.items() if rs}
summary = {
    "what": "4 producers + 4 consumers at depth 16 (closed loop, 64-byte payloads) against tarq "
            "with --http-listen, with ten /api/events streams open against none, alternating "
            "runs; tarq pinned to core 0, the loadgen and the stream readers (curl) to core 1",
    "commit": meta["commit"] if meta else None,
    "machine": meta["machine"] if meta else None,
    "runs": runs,
    "median_msgs_per_s": med,
    "streams_vs_none": (med["streams"] / med["none"]) if len(med) == 2 else None,
    "pair_ratios": ratios,
    "median_pair_ratio": statistics.median(ratios) if ratios else None,
    "median_loop_share_of_live_ticks": share,
    "target": "at most 2% lower with the streams open (ratio >= 0.98)",
}
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=2)
print(json.dumps({k: summary[k] for k in ("median_msgs_per_s", "streams_vs_none", "median_pair_ratio", "median_loop_share_of_live_ticks")}, indent=2))
