#!/usr/bin/env python3
"""Medians and ratios of one session's runs in results/tubes/<date>/ (loadgen and batch JSON),
written to results/tubes/<date>-summary.json. Reads the run files only; nothing is typed in.

    python3 results/tubes/summarize.py 2026-11-25
"""
import glob
import json
import os
import re
import statistics
import sys

here = os.path.dirname(os.path.abspath(__file__))
date = sys.argv[1]
runs = sorted(p for p in glob.glob(os.path.join(here, date, "*.json")) if not p.endswith("-summary.json"))


def load(path):
    with open(path) as f:
        return json.load(f)


def med(xs):
    return statistics.median(xs) if xs else None


# Loadgen runs: <kind>-d16-<round>.json; batch runs: put-many-100-<variant>-<round>.json.
loadgen = {}
batch = {}
for path in runs:
    name = os.path.basename(path)[: -len(".json")]
    d = load(path)
    m = re.fullmatch(r"(.+)-(\d+)", name)
    kind, rnd = m.group(1), int(m.group(2))
    if name.startswith("put-many"):
        batch.setdefault(kind, []).append((rnd, d))
    else:
        loadgen.setdefault(kind, []).append((rnd, d))

out = {
    "what": "Medians of the runs in results/tubes/%s/ (see README.md for the commands); "
    "per-run CPU shares and the load of the rest of the machine come from each file." % date,
    "loadgen": {},
    "batch": {},
}
for kind, rs in sorted(loadgen.items()):
    rs.sort(key=lambda r: r[0])
    out["loadgen"][kind] = {
        "commits": sorted({d["commit"] for _, d in rs}),
        "msgs_per_s": [d["msgs_per_s"] for _, d in rs],
        "target_cpu": [d["target_cpu"] for _, d in rs],
        "loadgen_cpu": [d["loadgen_cpu"] for _, d in rs],
        "other_cpu": [d["other_cpu"] for _, d in rs],
        "median_msgs_per_s": med([d["msgs_per_s"] for _, d in rs]),
    }
lg = out["loadgen"]


def ratio(a, b):
    if a in lg and b in lg:
        return round(lg[a]["median_msgs_per_s"] / lg[b]["median_msgs_per_s"], 3)
    return None


def round_ratios(a, b):
    """The ratio within each round (runs of a round follow each other)."""
    if a not in loadgen or b not in loadgen:
        return None
    bs = {r: d["msgs_per_s"] for r, d in loadgen[b]}
    rs = [d["msgs_per_s"] / bs[r] for r, d in loadgen[a] if r in bs]
    return {"per_round": [round(x, 3) for x in rs], "median": round(med(rs), 3)}


out["ratios"] = {
    "tubes_over_original": ratio("tubes-d16", "orig-d16"),
    "tubes_over_original_by_round": round_ratios("tubes-d16", "orig-d16"),
    "before_over_original": ratio("base-tubes-d16", "orig-d16"),
    "tubes_over_before": ratio("tubes-d16", "base-tubes-d16"),
    "tubes_over_seed": ratio("tubes-d16", "seed-d16"),
    "tubes_over_seed_by_round": round_ratios("tubes-d16", "seed-d16"),
    "before_tubes_over_before_seed": ratio("base-tubes-d16", "base-seed-d16"),
    "before_tubes_over_before_seed_by_round": round_ratios("base-tubes-d16", "base-seed-d16"),
    "seed_over_before_seed": ratio("seed-d16", "base-seed-d16"),
    "wal_write_over_none": ratio("walmode-write-d16", "walmode-none-d16"),
    "wal_write_over_null": ratio("walmode-write-d16", "walmode-null-d16"),
}
for kind, rs in sorted(batch.items()):
    rs.sort(key=lambda r: r[0])
    out["batch"][kind] = {
        "commits": sorted({d["commit"] for _, d in rs}),
        "connections": sorted({d["connections"] for _, d in rs}),
        "prefill": sorted({d.get("prefill", 0) for _, d in rs}),
        "tasks_per_s": [d["tasks_per_s"] for _, d in rs],
        "loop_cpu": [d.get("loop_cpu") for _, d in rs],
        "other_threads_cpu": [d.get("other_threads_cpu") for _, d in rs],
        "tool_cpu": [d.get("tool_cpu") for _, d in rs],
        "machine_busy_cpu": [d.get("machine_busy_cpu") for _, d in rs],
        "median_tasks_per_s": med([d["tasks_per_s"] for _, d in rs]),
    }
with open(os.path.join(here, date + "-summary.json"), "w") as f:
    json.dump(out, f, indent=1)
    f.write("\n")
print(json.dumps(out["ratios"], indent=1))
for k, v in out["batch"].items():
    print(k, round(v["median_tasks_per_s"]))
for k, v in out["loadgen"].items():
    print(k, round(v["median_msgs_per_s"]))
