#!/usr/bin/env python3
"""Does io_uring pay for tarq's depth-1 shape on this machine (issue 40, item 4)? The null
servers, alternating within each round:

  tarq-null     tarq --null: the real server's mio (epoll) loop, answering every call at once
  epoll         null_io --io epoll: the same I/O pattern, with the prototype's code above it
  uring         null_io --io uring: one recv a connection re-armed after each completion
  uring-ms      null_io --io uring --multishot: multishot recv into provided buffers
  uring-sqpoll  uring-ms with SQPOLL (its thread idle 10 ms before it sleeps, pinned to core 0)

  tarq-null-bp  tarq --null --busy-poll 100 (only when named): the epoll loop spinning 100 us
                before it sleeps, against which SQPOLL's spinning thread is measured

  run.py BIN_DIR OUT_DIR [ROUNDS] [SHAPES] [SERVERS]

SHAPES and SERVERS are comma-separated names (d1,d1-spin,d16,d1-1x1; the servers above) to
run only those; by default every shape and every server but tarq-null-bp.

BIN_DIR holds release builds of `tarq`, `tarq-loadgen` and `null_io`. As in
results/busy-poll-2026-11-28/run.py: every run starts its server fresh, pinned to core 0
(`taskset -c 0`, and the loop `--cpu 0`), and drives it with the loadgen pinned to core 1
(`--target null`: 4 producers + 4 consumers, 32-byte payloads, put -> take -> ack, 5 s after
1 s of warm-up), at depth 1 with the loadgen sleeping, depth 1 with it spinning (`--spin`),
depth 16, and depth 1 with 1 producer + 1 consumer (`d1-1x1`: the loop sleeps between most
requests, so each one costs a wake-up). Over 3 s in the middle of each run: perf stat's task-clock and context switches
of the server, /proc's utime and stime of all its threads (an SQPOLL thread is one of them) and
their voluntary switches (each a sleep, so a wake-up), and the machine's busy time, less
the server's and the loadgen's: what else ran (`others_cores`; near 0 is a quiet run). Per message = the count / (the
loadgen's rate x 3 s). Then one run a shape and server with the system-call tracepoints on
(they slow each call: counts, not rates). Writes runs/ (each run's loadgen JSON and
.perf.json) and, through summarize.py, summary.json (medians over the rounds, ratios to
tarq-null and to epoll).
"""
import atexit, glob, json, os, socket, subprocess, sys, tempfile, threading, time

BIN, OUT = sys.argv[1], sys.argv[2]
ROUNDS = int(sys.argv[3]) if len(sys.argv) > 3 else 3
ONLY_SHAPES = sys.argv[4].split(",") if len(sys.argv) > 4 else None
RUNS = f"{OUT}/runs"
os.makedirs(RUNS, exist_ok=True)
WINDOW = 3.0
TICK = os.sysconf("SC_CLK_TCK")
SYSCALLS = ["epoll_wait", "epoll_pwait", "recvfrom", "sendto", "read", "write", "io_uring_enter",
            "epoll_ctl", "futex"]
ALL_CONFIGS = {
    "tarq-null": None,
    "tarq-null-bp": ["--busy-poll", "100"],
    "epoll": ["--io", "epoll"],
    "uring": ["--io", "uring"],
    "uring-ms": ["--io", "uring", "--multishot"],
    "uring-sqpoll": ["--io", "uring", "--multishot", "--sqpoll", "10", "--sqpoll-cpu", "0"],
}
CONFIGS = {k: v for k, v in ALL_CONFIGS.items()
           if (k in sys.argv[5].split(",") if len(sys.argv) > 5 else k != "tarq-null-bp")}
# (depth, loadgen spinning, connections of each side)
SHAPES = [(1, False, 4), (1, True, 4), (16, False, 4), (1, False, 1)]
SPAWNED = []


@atexit.register
def stop_all():
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


def threads_stat(pid):
    """((utime, stime) in s, voluntary switches) summed over the process's threads."""
    user, system, vol = 0, 0, 0
    for task in glob.glob(f"/proc/{pid}/task/*"):
        try:
            f = open(f"{task}/stat").read().rsplit(")", 1)[1].split()
            user += int(f[11])
            system += int(f[12])
            for line in open(f"{task}/status"):
                if line.startswith("voluntary_ctxt_switches"):
                    vol += int(line.split()[1])
        except (FileNotFoundError, ProcessLookupError):
            pass
    return (user / TICK, system / TICK), vol


def start(kind, port, tmp):
    if kind.startswith("tarq-null"):
        cmd = [f"{BIN}/tarq", "--listen", f"127.0.0.1:{port}", "--data-dir", f"{tmp}/data",
               "--cpu", "0", "--log-level", "warn", "--null"] + (CONFIGS[kind] or [])
    else:
        cmd = [f"{BIN}/null_io", "--listen", f"127.0.0.1:{port}", "--cpu", "0"] + CONFIGS[kind]
    p = subprocess.Popen(["taskset", "-c", "0"] + cmd, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    SPAWNED.append(p)
    end = time.time() + 20
    while time.time() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return p
        except OSError:
            time.sleep(0.02)
    raise SystemExit(f"{cmd} did not start")


def machine_busy():
    """Seconds of CPU the whole machine spent busy (not idle, not iowait) since boot."""
    f = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return (sum(f) - f[3] - f[4]) / TICK


def window(pid, events, out):
    time.sleep(1.5)
    m0 = machine_busy()
    c0, v0 = threads_stat(pid)
    r = subprocess.run(["perf", "stat", "-x", ";", "-e", ",".join(events), "-p", str(pid), "--",
                        "sleep", str(WINDOW)], capture_output=True, text=True)
    c1, v1 = threads_stat(pid)
    out["machine_busy_s"] = machine_busy() - m0
    out["proc_user_s"], out["proc_system_s"] = c1[0] - c0[0], c1[1] - c0[1]
    out["proc_cpu_s"], out["voluntary_switches"] = sum(c1) - sum(c0), v1 - v0
    for line in r.stderr.splitlines():
        f = line.split(";")
        if len(f) > 2 and f[0].replace(".", "").isdigit():
            out[f[2]] = float(f[0])


def run(tag, kind, depth, spin, conns, syscalls=False):
    path = f"{RUNS}/{tag}.json"
    tmp = tempfile.mkdtemp()
    port = free_port()
    load = open("/proc/loadavg").read().split()[:3]
    srv = start(kind, port, tmp)
    events = ["task-clock", "context-switches"]
    if syscalls:
        events += [f"syscalls:sys_enter_{s}" for s in SYSCALLS] + ["raw_syscalls:sys_enter"]
    counts = {}
    t = threading.Thread(target=window, args=(srv.pid, events, counts))
    cmd = [f"{BIN}/tarq-loadgen", "--target", "null", "--addr", f"127.0.0.1:{port}",
           "--producers", str(conns), "--consumers", str(conns), "--depth", str(depth), "--payload", "32",
           "--duration", "5s", "--warmup", "1s", "--cpu", "1", "--quiet", "--json", path]
    cmd += ["--spin"] if spin else []
    t.start()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, timeout=60)
    t.join()
    srv.kill()
    srv.wait()
    d = json.load(open(path))
    msgs = max(d["msgs_per_s"] * WINDOW, 1)
    per = {k: round(v / msgs, 4) for k, v in counts.items()
           if k not in ("task-clock", "proc_cpu_s", "proc_user_s", "proc_system_s",
                        "machine_busy_s")}
    per["cpu_us"] = round(counts.get("task-clock", 0) * 1e3 / msgs, 4)
    for k in ("cpu", "user", "system"):
        per[f"proc_{k}_us"] = round(counts[f"proc_{k}_s"] * 1e6 / msgs, 4)
    # What ran beside the server and the loadgen over the window, in cores (the loadgen's
    # share is its CPU over its whole measured time): near 0 is a quiet run.
    others = (counts["machine_busy_s"] - counts["proc_cpu_s"]) / WINDOW - d["loadgen_cpu"]
    rec = {"tag": tag, "kind": kind, "depth": depth, "spin": spin, "connections": conns,
           "msgs_per_s": d["msgs_per_s"], "cycle_us": d["cycle_us"],
           "loadgen_cpu": d["loadgen_cpu"], "others_cores": round(others, 3),
           "loadavg_before": load, "per_msg": per, "counts": counts, "commit": d["commit"]}
    json.dump(rec, open(f"{RUNS}/{tag}.perf.json", "w"), indent=1)
    print(f"{tag}: load {load[0]}, others {others:.2f} cores, {d['msgs_per_s']:.0f} msg/s, cycle p50 "
          f"{d['cycle_us']['p50']:.0f} p99 {d['cycle_us']['p99']:.0f} us, cpu "
          f"{per['cpu_us']} / {per['proc_cpu_us']} us/msg, sleeps "
          f"{per.get('voluntary_switches')}/msg", flush=True)
    return rec


def shape_name(depth, spin, conns):
    return f"d{depth}{'-spin' if spin else ''}{'' if conns == 4 else f'-{conns}x{conns}'}"


if ONLY_SHAPES:
    SHAPES = [s for s in SHAPES if shape_name(*s) in ONLY_SHAPES]
closed = []
for r in range(ROUNDS):
    for depth, spin, conns in SHAPES:
        for kind in CONFIGS:
            tag = f"closed-{kind}-{shape_name(depth, spin, conns)}-r{r}"
            closed.append(run(tag, kind, depth, spin, conns))
sys_runs = []
for depth, spin, conns in SHAPES:
    for kind in CONFIGS:
        tag = f"syscalls-{kind}-{shape_name(depth, spin, conns)}"
        sys_runs.append(run(tag, kind, depth, spin, conns, syscalls=True))

subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "summarize.py"), OUT],
               check=True)
