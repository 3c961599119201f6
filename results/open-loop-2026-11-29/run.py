#!/usr/bin/env python3
"""Issue 40's open-loop figure: the put -> take -> ack cycle's tail at half of tarq's peak,
with and without `--busy-poll`, on this machine's two cores.

  run.py BIN_DIR OUT_DIR [ROUNDS] [BUSY_POLL_US]

BIN_DIR holds release builds of `tarq` and `tarq-loadgen`. Every run starts tarq fresh on
port 0 (it logs the port it got) with an empty temporary data directory, pinned to core 0
(`taskset -c 0` and `--cpu 0`), and drives it with the loadgen pinned to core 1 (`--cpu 1`,
spinning): 4 producers + 4 consumers, 32-byte payloads, 5 s after 1 s of warm-up.

1. Closed loop at depth 16, ROUNDS rounds alternating without and with busy polling: the
   peak is the median rate of the runs without.
2. Open loop at half that peak (`--rate`), depth 16, ROUNDS rounds alternating: the cycle's
   p50, p99 and p99.9, and whether the loadgen kept the schedule (its achieved rate).

Writes every run's loadgen JSON and summary.json (medians over the rounds, the load average
before each run).
"""
import json, os, re, statistics, subprocess, sys, tempfile, time

BIN, OUT = sys.argv[1], sys.argv[2]
ROUNDS = int(sys.argv[3]) if len(sys.argv) > 3 else 5
BUSY = sys.argv[4] if len(sys.argv) > 4 else "100"
os.makedirs(OUT, exist_ok=True)


def start(busy):
    """tarq on port 0, pinned; returns (process, port, data dir)."""
    data = tempfile.mkdtemp(prefix="tarq-open-")
    cmd = ["taskset", "-c", "0", f"{BIN}/tarq", "--listen", "127.0.0.1:0", "--data-dir", data,
           "--cpu", "0"] + (["--busy-poll", busy] if busy else [])
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 30
    while time.time() < deadline:
        line = p.stdout.readline()
        m = re.search(r"tarq serving listen=127\.0\.0\.1:(\d+)", line)
        if m:
            return p, int(m.group(1)), data
    p.kill()
    raise SystemExit("tarq did not say which port it serves")


def run(tag, busy, rate=None):
    p, port, data = start(busy)
    path = f"{OUT}/{tag}.json"
    cmd = [f"{BIN}/tarq-loadgen", "--target", "tarq", "--addr", f"127.0.0.1:{port}",
           "--producers", "4", "--consumers", "4", "--depth", "16", "--payload", "32",
           "--duration", "5s", "--warmup", "1s", "--cpu", "1", "--spin", "--quiet",
           "--json", path] + (["--rate", str(rate)] if rate else [])
    try:
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, timeout=120)
    finally:
        p.kill()
        p.wait()
        subprocess.run(["rm", "-rf", data])
    d = json.load(open(path))
    c = d["cycle_us"]
    print(f"{tag}: {d['msgs_per_s']:.0f} msg/s, cycle p50 {c['p50']:.0f} p99 {c['p99']:.0f} "
          f"p99.9 {c['p999']:.0f} us, load {d['machine']['loadavg_before'][:14]}", flush=True)
    return {"tag": tag, "busy_poll_us": int(busy) if busy else 0, "rate": rate,
            "msgs_per_s": d["msgs_per_s"], "cycle_us": c, "commit": d["commit"],
            "loadavg_before": d["machine"]["loadavg_before"]}


def name(busy):
    return "tarq" + (f"-bp{busy}" if busy else "")


closed = [run(f"closed-{name(b)}-d16-r{r}", b) for r in range(ROUNDS) for b in (None, BUSY)]
peak = statistics.median(x["msgs_per_s"] for x in closed if x["busy_poll_us"] == 0)
rate = round(peak / 2)
opened = [run(f"open-{name(b)}-d16-r{r}", b, rate) for r in range(ROUNDS) for b in (None, BUSY)]


def med(rs, f):
    return round(statistics.median(f(x) for x in rs), 1)


summary = {"machine": os.uname().nodename, "cores": os.cpu_count(), "rounds": ROUNDS,
           "commit": closed[0]["commit"], "peak_msgs_per_s": round(peak), "rate": rate,
           "closed": {}, "open": {}}
for b in (None, BUSY):
    busy = int(b) if b else 0
    cs = [x for x in closed if x["busy_poll_us"] == busy]
    os_ = [x for x in opened if x["busy_poll_us"] == busy]
    summary["closed"][name(b)] = {"msgs_per_s": med(cs, lambda x: x["msgs_per_s"]),
                                  "rates": [round(x["msgs_per_s"]) for x in cs]}
    summary["open"][name(b)] = {
        "msgs_per_s": med(os_, lambda x: x["msgs_per_s"]),
        "cycle_p50_us": med(os_, lambda x: x["cycle_us"]["p50"]),
        "cycle_p99_us": med(os_, lambda x: x["cycle_us"]["p99"]),
        "cycle_p999_us": med(os_, lambda x: x["cycle_us"]["p999"]),
        "p999s": [round(x["cycle_us"]["p999"]) for x in os_],
        "rates": [round(x["msgs_per_s"]) for x in os_],
        "loadavg_before": [x["loadavg_before"][:14] for x in os_],
    }
json.dump(summary, open(f"{OUT}/summary.json", "w"), indent=1)
print(json.dumps(summary, indent=1))
