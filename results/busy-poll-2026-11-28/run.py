#!/usr/bin/env python3
"""Depth 1 and the loop's wake-ups (issue 40): tarq, tarq's null server and Redis, each with
and without tarq's `--busy-poll`, on this machine's two cores.

  run.py BIN_DIR OUT_DIR [ROUNDS] [BUSY_POLL_US]

BIN_DIR holds release builds of `tarq` and `tarq-loadgen`. Every run starts its server fresh
on a free port and an empty temporary data directory, pinned to core 0 (`taskset -c 0`, and
tarq's loop with `--cpu 0`), and drives it with the loadgen pinned to core 1: 4 producers + 4
consumers, 32-byte payloads, put → take → ack, 5 s after 1 s of warm-up. Writes one loadgen
JSON per run, each with `perf` beside it, and summary.json (medians over the rounds):

- closed loop at depths 1, 16 and 64 (depth 1 also with the loadgen spinning, `--spin`),
  the configurations interleaved round by round: redis, null, null with busy poll, tarq,
  tarq with busy poll. Over 3 s in the middle of each run `perf stat` counts the server's CPU
  time (task-clock) and context switches, and /proc its threads' voluntary switches (each one a
  sleep, so a wake-up); per message = divided by the loadgen's rate × 3 s;
- the same shapes once more with the system-call tracepoints on (they slow every call a
  little, so these runs give counts per message, not rates): epoll_wait, read, recvfrom,
  write, sendto, writev, epoll_ctl, futex, clock_gettime, and all calls together;
- open loop at half of tarq's median depth-16 closed-loop rate, depth 16, loadgen spinning
  (as the suite's open-loop runs), tarq with and without busy poll: the cycle's p99.9.
"""
import atexit, glob, json, os, shutil, socket, statistics, subprocess, sys, tempfile, threading, time

BIN, OUT = sys.argv[1], sys.argv[2]
ROUNDS = int(sys.argv[3]) if len(sys.argv) > 3 else 3
BUSY = sys.argv[4] if len(sys.argv) > 4 else "100"
os.makedirs(OUT, exist_ok=True)
SPAWNED = []
WINDOW = 3.0  # seconds of perf counting, from 1.5 s after the loadgen starts
SYSCALLS = ["epoll_wait", "epoll_pwait", "read", "recvfrom", "write", "sendto", "writev",
            "epoll_ctl", "futex", "clock_gettime"]
CONFIGS = [("redis", None), ("null", None), ("null", BUSY), ("tarq", None), ("tarq", BUSY)]


@atexit.register
def stop_all():
    # Whatever happens, no server of this script outlives it.
    for p in SPAWNED:
        if p.poll() is None:
            p.kill()
            p.wait()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def voluntary_switches(pid):
    n = 0
    for status in glob.glob(f"/proc/{pid}/task/*/status"):
        try:
            for line in open(status):
                if line.startswith("voluntary_ctxt_switches"):
                    n += int(line.split()[1])
        except FileNotFoundError:
            pass
    return n


class Server:
    def __init__(self, kind, busy):
        self.dir = tempfile.mkdtemp()
        self.port = free_port()
        if kind == "redis":
            cmd = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                   "--appendonly", "no", "--dir", self.dir]
        else:
            cmd = [f"{BIN}/tarq", "--listen", f"127.0.0.1:{self.port}", "--data-dir",
                   f"{self.dir}/data", "--cpu", "0", "--log-level", "warn"]
            cmd += ["--null"] if kind == "null" else []
            cmd += ["--busy-poll", busy] if busy else []
        self.proc = subprocess.Popen(["taskset", "-c", "0"] + cmd, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        SPAWNED.append(self.proc)
        end = time.time() + 20
        while time.time() < end:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.02)
        raise SystemExit(f"{cmd} did not start")

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def perf_window(pid, events, out):
    """perf stat on `pid` for WINDOW s, from 1.5 s after now; fills `out`."""
    time.sleep(1.5)
    v0 = voluntary_switches(pid)
    r = subprocess.run(["perf", "stat", "-x", ";", "-e", ",".join(events), "-p", str(pid), "--",
                        "sleep", str(WINDOW)], capture_output=True, text=True)
    out["voluntary_switches"] = voluntary_switches(pid) - v0
    for line in r.stderr.splitlines():
        f = line.split(";")
        if len(f) > 2 and f[0].replace(".", "").isdigit():
            out[f[2]] = float(f[0])


def run(tag, kind, busy, depth, spin=False, rate=None, syscalls=False):
    path = f"{OUT}/{tag}.json"
    srv = Server(kind, busy)
    events = ["task-clock", "context-switches"]
    if syscalls:
        events += [f"syscalls:sys_enter_{s}" for s in SYSCALLS] + ["raw_syscalls:sys_enter"]
    counts = {}
    t = threading.Thread(target=perf_window, args=(srv.proc.pid, events, counts))
    target = {"tarq": "tarq", "null": "null", "redis": "redis"}[kind]
    cmd = [f"{BIN}/tarq-loadgen", "--target", target, "--addr", f"127.0.0.1:{srv.port}",
           "--producers", "4", "--consumers", "4", "--depth", str(depth), "--payload", "32",
           "--duration", "5s", "--warmup", "1s", "--cpu", "1", "--quiet", "--json", path]
    cmd += ["--spin"] if spin else []
    cmd += ["--rate", str(rate)] if rate else []
    t.start()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    t.join()
    srv.stop()
    d = json.load(open(path))
    msgs = max(d["msgs_per_s"] * WINDOW, 1)
    per = {k: round(v / msgs, 4) for k, v in counts.items() if k != "task-clock"}
    per["cpu_us"] = round(counts.get("task-clock", 0) * 1e3 / msgs, 4)  # task-clock is in ms
    rec = {"tag": tag, "kind": kind, "busy_poll_us": int(busy) if busy else 0, "depth": depth,
           "spin": spin, "rate": rate, "msgs_per_s": d["msgs_per_s"],
           "cycle_us": d["cycle_us"], "e2e_us": d["e2e_us"], "put_us": d["put_us"],
           "loadgen_cpu": d["loadgen_cpu"], "other_cpu": d.get("other_cpu"),
           "loadavg_before": d["machine"]["loadavg_before"], "per_msg": per,
           "counts": counts, "commit": d["commit"]}
    json.dump(rec, open(f"{OUT}/{tag}.perf.json", "w"), indent=1)
    print(f"{tag}: {d['msgs_per_s']:.0f} msg/s, cycle p50 {d['cycle_us']['p50']:.0f} us, "
          f"cpu {per['cpu_us']} us/msg, switches {per.get('voluntary_switches')}/msg",
          flush=True)
    return rec


def name(kind, busy):
    return kind + (f"-bp{busy}" if busy else "")


shapes = [(1, False), (1, True), (16, False), (64, False)]
closed = []
for r in range(ROUNDS):
    for depth, spin in shapes:
        for kind, busy in CONFIGS:
            tag = f"closed-{name(kind, busy)}-d{depth}{'-spin' if spin else ''}-r{r}"
            closed.append(run(tag, kind, busy, depth, spin))
sys_runs = []
for depth, spin in shapes:
    for kind, busy in CONFIGS:
        tag = f"syscalls-{name(kind, busy)}-d{depth}{'-spin' if spin else ''}"
        sys_runs.append(run(tag, kind, busy, depth, spin, syscalls=True))


def med(rs, f):
    return round(statistics.median(f(x) for x in rs), 3)


summary = {"machine": os.uname().nodename, "cores": os.cpu_count(), "rounds": ROUNDS,
           "busy_poll_us": int(BUSY), "commit": closed[0]["commit"], "closed": {}, "syscalls": {}}
for depth, spin in shapes:
    shape = f"d{depth}{'-spin' if spin else ''}"
    row = {}
    for kind, busy in CONFIGS:
        rs = [x for x in closed if x["kind"] == kind and x["busy_poll_us"] == (int(busy) if busy
              else 0) and x["depth"] == depth and x["spin"] == spin]
        row[name(kind, busy)] = {
            "msgs_per_s": med(rs, lambda x: x["msgs_per_s"]),
            "cycle_p50_us": med(rs, lambda x: x["cycle_us"]["p50"]),
            "cycle_p99_us": med(rs, lambda x: x["cycle_us"]["p99"]),
            "cpu_us_per_msg": med(rs, lambda x: x["per_msg"]["cpu_us"]),
            "wakeups_per_msg": med(rs, lambda x: x["per_msg"]["voluntary_switches"]),
            "rates": [round(x["msgs_per_s"]) for x in rs],
        }
    for k in list(row):
        if k != "redis":
            row[k]["vs_redis"] = round(row[k]["msgs_per_s"] / row["redis"]["msgs_per_s"], 3)
    for bp in ("", f"-bp{BUSY}"):
        row[f"tarq{bp}"]["cpu_vs_null"] = round(row[f"tarq{bp}"]["cpu_us_per_msg"] /
                                               row[f"null{bp}"]["cpu_us_per_msg"], 3)
    summary["closed"][shape] = row
    summary["syscalls"][shape] = {
        name(x["kind"], str(x["busy_poll_us"]) if x["busy_poll_us"] else None): x["per_msg"]
        for x in sys_runs if x["depth"] == depth and x["spin"] == spin}

peak = summary["closed"]["d16"]["tarq"]["msgs_per_s"]
rate = round(peak / 2)
opened = []
for r in range(ROUNDS):
    for busy in (None, BUSY):
        opened.append(run(f"open-{name('tarq', busy)}-d16-r{r}", "tarq", busy, 16, True, rate))
summary["open_loop"] = {"rate": rate, "depth": 16}
for busy in (None, BUSY):
    rs = [x for x in opened if x["busy_poll_us"] == (int(busy) if busy else 0)]
    summary["open_loop"][name("tarq", busy)] = {
        "msgs_per_s": med(rs, lambda x: x["msgs_per_s"]),
        "cycle_p50_us": med(rs, lambda x: x["cycle_us"]["p50"]),
        "cycle_p99_us": med(rs, lambda x: x["cycle_us"]["p99"]),
        "cycle_p999_us": med(rs, lambda x: x["cycle_us"]["p999"]),
        "e2e_p999_us": med(rs, lambda x: x["e2e_us"]["p999"]),
        "cpu_us_per_msg": med(rs, lambda x: x["per_msg"]["cpu_us"]),
    }
json.dump(summary, open(f"{OUT}/summary.json", "w"), indent=1)
print(json.dumps(summary, indent=1))
