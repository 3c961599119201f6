#!/usr/bin/env python3
"""Summarises a pass of run.py: OUT_DIR/runs/*.perf.json -> OUT_DIR/summary.json.

  summarize.py OUT_DIR
  summarize.py --combined OUT_JSON DIR1 DIR2 ...    # the passes' rounds together

With --combined every round of every pass is a round of its own (round r of the second
pass given is round rounds + r, and so on), and the summary goes to OUT_JSON.

Per shape and server, medians over the rounds of: msgs/s, the cycle's p50 and p99, the
server's CPU a message (perf's task-clock, every thread of the process), its user and system
time a message (/proc, tick-sampled: read the split, not the sum), its sleeps a message; the
ratios of those medians to tarq-null's and to epoll's; and each round's rate over tarq-null's
in the same round (a disturbance that hits a whole round cancels there). A round of a shape
is quiet when in each of its runs what else ran beside the server and the loadgen
(`others_cores`, passes that record it) stayed under QUIET cores; `quiet` lists those rounds'
rates. Then the system calls a message of the tracepoint runs.
"""
import glob, json, os, statistics, sys

if sys.argv[1] == "--combined":
    TARGET, DIRS = sys.argv[2], sys.argv[3:]
else:
    TARGET, DIRS = f"{sys.argv[1]}/summary.json", sys.argv[1:2]
QUIET = 0.3
KINDS = ["tarq-null", "tarq-null-bp", "epoll", "uring", "uring-ms", "uring-sqpoll"]
runs, offset = [], 0
for d in DIRS:
    mine = [json.load(open(p)) for p in sorted(glob.glob(f"{d}/runs/*.perf.json"))]
    for x in mine:
        if x["tag"].startswith("closed-"):
            head, r = x["tag"].rsplit("-r", 1)
            x["tag"] = f"{head}-r{int(r) + offset}"
    offset += 1 + max(int(x["tag"].rsplit("-r", 1)[1]) - offset for x in mine
                      if x["tag"].startswith("closed-"))
    runs += mine


def shape_of(x):
    conns = x.get("connections", 4)
    return (f"d{x['depth']}{'-spin' if x['spin'] else ''}"
            f"{'' if conns == 4 else f'-{conns}x{conns}'}")


def med(rs, f):
    vals = [f(x) for x in rs]
    vals = [v for v in vals if v is not None]
    return round(statistics.median(vals), 3) if vals else None


closed = [x for x in runs if x["tag"].startswith("closed-")]
sys_runs = [x for x in runs if x["tag"].startswith("syscalls-")]
loads = [float(x["loadavg_before"][0]) for x in closed]
summary = {"machine": os.uname().nodename, "kernel": os.uname().release,
           "cores": os.cpu_count(), "commit": closed[0]["commit"], "passes": DIRS,
           "rounds": 1 + max(int(x["tag"].rsplit("-r", 1)[1]) for x in closed),
           "loadavg_1min_before_runs": {"min": min(loads), "median": statistics.median(loads),
                                        "max": max(loads)},
           "closed": {}, "syscalls": {}}
shapes = list(dict.fromkeys(shape_of(x) for x in closed))
for shape in shapes:
    row = {}
    for kind in KINDS:
        rs = [x for x in closed if x["kind"] == kind and shape_of(x) == shape]
        if not rs:
            continue
        per = lambda k: (lambda x: x["per_msg"].get(k))
        row[kind] = {
            "msgs_per_s": med(rs, lambda x: x["msgs_per_s"]),
            "cycle_p50_us": med(rs, lambda x: x["cycle_us"]["p50"]),
            "cycle_p99_us": med(rs, lambda x: x["cycle_us"]["p99"]),
            "cpu_us_per_msg": med(rs, per("cpu_us")),
            "user_us_per_msg": med(rs, per("proc_user_us")),
            "system_us_per_msg": med(rs, per("proc_system_us")),
            "sleeps_per_msg": med(rs, per("voluntary_switches")),
            "rates": [round(x["msgs_per_s"]) for x in rs],
            "loadavg_before": [float(x["loadavg_before"][0]) for x in rs],
            "others_cores": [x.get("others_cores") for x in rs],
        }
    for kind in row:
        for base in ("tarq-null", "epoll"):
            if base in row:
                row[kind][f"rate_vs_{base}"] = round(
                    row[kind]["msgs_per_s"] / row[base]["msgs_per_s"], 3)
                row[kind][f"cpu_vs_{base}"] = round(
                    row[kind]["cpu_us_per_msg"] / row[base]["cpu_us_per_msg"], 3)
        ratios = []
        for r in range(summary["rounds"]):
            mine = [x for x in closed if x["tag"] == f"closed-{kind}-{shape}-r{r}"]
            base = [x for x in closed if x["tag"] == f"closed-tarq-null-{shape}-r{r}"]
            if mine and base:
                ratios.append(round(mine[0]["msgs_per_s"] / base[0]["msgs_per_s"], 3))
        row[kind]["round_rate_ratios_vs_tarq_null"] = ratios
        row[kind]["median_round_rate_ratio_vs_tarq_null"] = (
            round(statistics.median(ratios), 3) if ratios else None)
    quiet = {}
    for r in range(summary["rounds"]):
        rs = [x for x in closed if shape_of(x) == shape and x["tag"].endswith(f"-r{r}")]
        if rs and all((x.get("others_cores") if x.get("others_cores") is not None else 9) < QUIET
                      for x in rs):
            quiet[f"r{r}"] = {x["kind"]: round(x["msgs_per_s"]) for x in rs}
    row["quiet"] = quiet
    summary["closed"][shape] = row
    summary["syscalls"][shape] = {x["kind"]: x["per_msg"] for x in sys_runs
                                  if shape_of(x) == shape}
json.dump(summary, open(TARGET, "w"), indent=1)
for shape, row in summary["closed"].items():
    print(shape)
    for kind, v in row.items():
        if kind == "quiet":
            print(f"  quiet rounds: {v}")
            continue
        print(f"  {kind:13} {v['msgs_per_s']:>9.0f} msgs/s  x{v['median_round_rate_ratio_vs_tarq_null']}"
              f"  p50 {v['cycle_p50_us']:>6.1f}  p99 {v['cycle_p99_us']:>7.0f}"
              f"  cpu {v['cpu_us_per_msg']:>6.2f} us/msg (x{v.get('cpu_vs_epoll')} epoll)"
              f"  sleeps {v['sleeps_per_msg']}")
