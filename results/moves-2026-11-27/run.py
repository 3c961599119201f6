#!/usr/bin/env python3
"""Figures of a partition move under load (issue: "a move of a partition holding 1M tasks under
load: duration, tasks/s moved, the worst and p99 client wait during it, the throughput dip").

  [MOVE_RATE=N] run.py BIN_DIR OUT_DIR [ROUNDS]

MOVE_RATE, when set, is passed to both nodes as `--move-rate N` (the tasks a second the copy
keeps to while the partition serves; 0: no limit); unset, the nodes keep the server's default
(200000, `move_rate` null in the JSON). MOVE_WINDOW_S, when set, overrides the move run's length.

BIN_DIR holds release builds of `tarq` and `tarq-loadgen`. Each round starts a real etcd and two
replica sets of one node each (a: loop on core 0, b: loop on core 1), creates a fifottl tube of
two partitions, and fills the partition set a owns with 1,000,000 tasks of 64 bytes (put
through a's node, pipelined, each delayed a day so the load's takes never reach them: they stay
in the partition as a backlog of not-yet-due work would). Then, one loadgen per node (4
producers + 4 consumers, depth 16, the tube API), each pinned to the other node's core:

- unloaded: both closed loop for UNLOADED_S: the rate each node's clients get;
- before / move / after: both open loop (`--rate`) at LOAD of that rate, three runs back to
  back; `tarq ctl move` of a's partition to b starts when the move run's measured window does
  (the first put the server counts, plus the warm-up), and that window lasts MOVE_WINDOW_S.

Client waits come from the loadgens: per run, put p99 (from each put's intended send time),
take→ack p99, and per second the worst put or reply wait. The loadgen has no percentiles per
interval, so "during the move" is the move run: a window that starts with the move and runs on
past its end. Throughput is read on the server (queue.statistics every POLL_S): each loadgen
counts only its own messages' acks, and a take tries every partition, so each also acks the
other's. The move's times come from ctl's report (`ms`: the move's start to its commit, the copy
while the partition serves included; `frozen_ms`: the freeze, for the last changes, to the
answer; `rounds` and `resent`: the catch-up rounds sent while serving and the tasks they sent
again), ctl's return, and the nodes' logs (`move started`: the copy begins and the partition
still serves; `move committed`; `a partition moved here`; on a, `letting go of a partition's
tasks` and `let go of a partition's tasks`: the old owner's letting go of its copy after the
commit, start and end). No log line marks the freeze: its instant is taken as a's
`move committed` less `frozen_ms`.

Failed calls (`errors`, `first_error`) are the loadgens' own: a count of every error and the
first one's text, not a count per kind.

Writes OUT_DIR/round-N.json (one a round), OUT_DIR/loadgen/*.json (the loadgens' own),
OUT_DIR/logs/round-N-{a,b}.log (the nodes' log lines on moves, partitions (the let-go's
among them), the placement and snapshots, and their warnings and errors) and OUT_DIR/summary.json (medians over rounds).
"""
import atexit, calendar, json, os, platform, shutil, socket, statistics, subprocess, sys, tempfile
import threading, time
import urllib.request

import msgpack
import tarantool

BIN, OUT = sys.argv[1], sys.argv[2]
ROUNDS = int(sys.argv[3]) if len(sys.argv) > 3 else 3
os.makedirs(f"{OUT}/loadgen", exist_ok=True)
os.makedirs(f"{OUT}/logs", exist_ok=True)
TUBE, CLUSTER = "mv", "moves"
TASKS, PAYLOAD = 1_000_000, 64
# Long enough that no filled task falls due during a round, short enough to be plainly a delay.
FILL_DELAY_S = 86_400
# Puts the filler keeps unanswered: enough to keep a node's loop busy, small enough that its
# replies never fill the socket buffers while it is still sending.
FILL_IN_FLIGHT = 4_000
LOAD = 0.5
# How often the server's ack count is sampled, and the bucket the dip is the lowest of.
POLL_S, DIP_BUCKET_S = 0.05, 0.5
UNLOADED_S, PHASE_S, WARMUP_S = 3, 5, 1
# The copy's rate while the partition serves (`--move-rate`); None: the server's default.
MOVE_RATE = int(os.environ["MOVE_RATE"]) if os.environ.get("MOVE_RATE") else None
SERVER_DEFAULT_MOVE_RATE = 200_000
# The move run's window. Unpaced, loaded moves of 1M tasks took 1.8-3.6 s here, so 8 s covered the
# move and the seconds right after it. Paced, the copy alone takes TASKS / rate, and the catch-up
# rounds send again what the load changed meanwhile (13-27% of the tasks unpaced, more the longer
# the copy runs), so the window is three times the copy alone, plus 2 s. A move that outlasts it
# is flagged (`move_inside_window`): waits that end after the window are not counted.
_rate = SERVER_DEFAULT_MOVE_RATE if MOVE_RATE is None else MOVE_RATE
MOVE_WINDOW_S = int(os.environ.get("MOVE_WINDOW_S") or (
    max(8, -(-3 * TASKS // _rate) + 2) if _rate else 8))
# The nodes' lease: long, so that a starved lease refresh on a shared machine is no failover.
LEASE_TTL = "30"
SPAWNED = []
# The node log lines kept with each round (OUT/logs/round-N-{a,b}.log): the moves, partitions,
# placement and snapshots (a snapshot walks the queue in the loop's turns), and every warning or
# error; not the rest, to stay small. The let-go's start and end hold "partition".
KEPT_LOG_LINE = lambda l: (any(w in l.lower() for w in ("move", "partition", "placement",
                                                        "snapshot"))
                           or " WARN " in l or " ERROR " in l)


@atexit.register
def stop_all():
    # Whatever happens, no etcd, tarq or loadgen of this script outlives it.
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


def wait(cond, what, secs=20):
    end = time.time() + secs
    while time.time() < end:
        if cond():
            return
        time.sleep(0.05)
    raise SystemExit(f"timed out waiting for {what}")


class Etcd:
    def __init__(self):
        # In memory (fsync costs nothing) and ahead of others for the CPU: on a busy two-core
        # machine, a lease refresh etcd answers late deposes a primary mid-run.
        self.dir = tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        c, p = free_port(), free_port()
        self.url = f"http://127.0.0.1:{c}"
        peer = f"http://127.0.0.1:{p}"
        self.proc = subprocess.Popen(
            ["nice", "-n", "-10", "etcd", "--name=f", f"--data-dir={self.dir}/data",
             f"--listen-client-urls={self.url}", f"--advertise-client-urls={self.url}",
             f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
             f"--initial-cluster=f={peer}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        SPAWNED.append(self.proc)

        def healthy():
            try:
                urllib.request.urlopen(self.url + "/health", timeout=1)
                return True
            except Exception:
                return False
        wait(healthy, "etcd")

    def stop(self):
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class Node:
    def __init__(self, etcd, name, cpu):
        self.name, self.cpu = name, cpu
        self.dir = tempfile.mkdtemp()
        self.port = free_port()
        self.addr = f"127.0.0.1:{self.port}"
        self.log = open(f"{self.dir}/log", "w")
        self.proc = subprocess.Popen(
            # The loop pinned (--cpu), the election thread free to run on the other core.
            [f"{BIN}/tarq", "--cpu", str(cpu), "--listen", self.addr, "--data-dir",
             f"{self.dir}/data", "--etcd", etcd.url, "--cluster", CLUSTER, "--node-name", name,
             "--replica-set", name, "--lease-ttl", LEASE_TTL, "--log-level", "info"]
            + ([] if MOVE_RATE is None else ["--move-rate", str(MOVE_RATE)]),
            env={k: v for k, v in os.environ.items() if k != "TARQ_MOVE_RATE"},
            stdout=self.log, stderr=subprocess.STDOUT)
        SPAWNED.append(self.proc)
        wait(lambda: self.reachable() and self.cluster()["sets"] and any(
            s["name"] == name and s["primary"] for s in self.cluster()["sets"]),
            f"node {name} to lead its set")

    def reachable(self):
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
            return True
        except OSError:
            return False

    def call(self, fn, args=()):
        c = tarantool.connect("127.0.0.1", self.port)
        try:
            return c.call(fn, list(args)).data
        finally:
            c.close()

    def cluster(self):
        return self.call("queue.cluster")[0]

    def logged_at(self, what):
        """When the node logged a line holding `what` (its own clock, UTC), as epoch seconds."""
        self.log.flush()
        for line in open(f"{self.dir}/log"):
            if what in line:
                stamp = line.split()[0].rstrip("Z")
                whole, frac = stamp.split(".")
                t = calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S"))
                return t + float("0." + frac)
        return None

    def stop(self, keep=None):
        """Stops the node; with `keep`, first copies the lines of its log that KEPT_LOG_LINE
        picks to that path."""
        self.proc.kill()
        self.proc.wait()
        self.log.close()
        if keep:
            with open(keep, "w") as out:
                out.writelines(l for l in open(f"{self.dir}/log") if KEPT_LOG_LINE(l))
        shutil.rmtree(self.dir, ignore_errors=True)


class Poller(threading.Thread):
    """Samples queue.statistics(TUBE) on one node every POLL_S: (time, puts, acks) of the whole
    tube, whichever client's. The loadgens count only their own messages' acks, and with two
    partitions each loadgen also takes the other's messages (a take tries every partition), so
    throughput is read here, on the server."""

    def __init__(self, node):
        super().__init__(daemon=True)
        self.conn = tarantool.connect("127.0.0.1", node.port)
        self.samples = []
        self.stop = False

    def run(self):
        while not self.stop:
            try:
                calls = self.conn.call("queue.statistics", [TUBE]).data[0]["calls"]
                self.samples.append((time.time(), calls["put"], calls["ack"]))
            except Exception as e:  # a lost sample is a gap in the series, not a failed round
                self.samples.append((time.time(), None, repr(e)))
            time.sleep(POLL_S)

    def puts_since(self, t):
        """The first time after t at which puts went up, or None."""
        ok = [x for x in self.samples if x[0] >= t and x[1] is not None]
        return next((b[0] for a, b in zip(ok, ok[1:]) if b[1] > a[1]), None)

    def rate(self, t0, t1):
        """Acks a second over the sampled intervals inside [t0, t1]. A partition's call counts
        stay on its old owner, so the whole tube's count drops when a move hands over: an
        interval whose count went down is left out (its time too), as is one not answered."""
        acks = secs = 0.0
        ok = [x for x in self.samples if x[1] is not None]
        for (ta, _, ka), (tb, _, kb) in zip(ok, ok[1:]):
            if ta >= t0 and tb <= t1 and kb >= ka:
                acks += kb - ka
                secs += tb - ta
        return round(acks / secs) if secs > 0.5 * (t1 - t0) else None

    def buckets(self, t0, t1, width):
        """Ack rates over consecutive buckets of `width` seconds from t0 to t1."""
        out, t = [], t0
        while t + width <= t1 + 1e-9:
            out.append(self.rate(t, t + width))
            t += width
        return out


def partitions(node):
    """TUBE's partitions as node's queue.cluster() shows them (set, and counts where owned)."""
    for t in node.cluster()["placement"]["tubes"]:
        if t["name"] == TUBE:
            return t["partitions"]
    return []


def owned_partition(node):
    """The partition of TUBE that node's set owns, and its task count."""
    for p in partitions(node):
        if p["set"] == node.name:
            return p["partition"], p.get("total")
    return None, None


def fill(node, n):
    """Puts n delayed tasks through node on one connection, FILL_IN_FLIGHT unanswered at most:
    IPROTO CALLs of queue.tube.TUBE:put(payload, {delay = FILL_DELAY_S})."""
    s = socket.create_connection(("127.0.0.1", node.port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    greeting = b""
    while len(greeting) < 128:
        greeting += s.recv(128 - len(greeting))
    body = msgpack.packb({0x22: f"queue.tube.{TUBE}:put",
                          0x21: [b"x" * PAYLOAD, {"delay": FILL_DELAY_S}]}, use_bin_type=True)
    head = msgpack.packb({0x00: 0x0a, 0x01: 1})  # CALL; replies are counted, not matched
    frame = b"\xce" + (len(head) + len(body)).to_bytes(4, "big") + head + body
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
    sent = answered = 0
    reply = []
    batch = FILL_IN_FLIGHT // 2
    while answered < n:
        if sent - answered <= batch and sent < n:
            k = min(batch, n - sent)
            s.sendall(frame * k)
            sent += k
            continue
        data = s.recv(1 << 20)
        if not data:
            raise SystemExit(f"node {node.name} closed the filler's connection")
        unpacker.feed(data)
        # The stream is size, header, body, size, ...: three objects a reply.
        for obj in unpacker:
            reply.append(obj)
            if len(reply) == 3:
                if reply[1][0] != 0:
                    raise SystemExit(f"put refused: {reply[1]} {reply[2]}")
                reply.clear()
                answered += 1
    s.close()


def loadgen(node, cpu, tag, secs, rate=None):
    """Starts a loadgen through node, pinned to cpu; returns the process and its JSON's path."""
    path = f"{OUT}/loadgen/{tag}.json"
    cmd = [f"{BIN}/tarq-loadgen", "--target", "tarq", "--addr", node.addr, "--api", "tubes",
           "--tube", TUBE, "--producers", "4", "--consumers", "4", "--depth", "16",
           "--payload", str(PAYLOAD), "--duration", f"{secs}s", "--warmup", f"{WARMUP_S}s",
           "--cpu", str(cpu), "--quiet", "--json", path]
    if rate:
        cmd += ["--rate", str(round(rate))]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    SPAWNED.append(p)
    return p, path


def finish(p, path):
    _, err = p.communicate()
    if p.returncode != 0:
        raise SystemExit(f"loadgen failed: {err}")
    return json.load(open(path))


def worst_ms(d):
    """A loadgen run's longest client wait: a put's (from its intended send time) or any reply's
    on a connection (`gap_max_us`), from its per-second series."""
    return round(max(max(s["put_max_us"], s["gap_max_us"]) for s in d["series"]) / 1e3, 3)


def phase(runs, poller, t0, t1):
    """One phase: the server's ack rate over [t0, t1] (the loadgens' measured window), and each
    node's clients' waits as its loadgen measured them."""
    return {
        "acks_per_s": poller.rate(t0, t1),
        "window": [round(t0, 3), round(t1, 3)],
        "by_node": {d["node"]: {
            "loadgen_own_acks_per_s": round(d["acks_per_s"]),
            "foreign_messages": d["foreign_messages"],
            "errors": d["errors"],
            "first_error": d["first_error"],
            "put_p99_ms": round(d["put_us"]["p99"] / 1e3, 3),
            "put_max_ms": round(d["put_us"]["max"] / 1e3, 3),
            "cycle_p99_ms": round(d["cycle_us"]["p99"] / 1e3, 3),
            "worst_wait_ms": worst_ms(d),
            "worst_wait_ms_per_second": [round(max(s["put_max_us"], s["gap_max_us"]) / 1e3, 3)
                                         for s in d["series"]],
        } for d in runs},
    }


def one_round(r):
    etcd = Etcd()
    a, b = Node(etcd, "a", 0), Node(etcd, "b", 1)
    a.call("queue.create_tube", [TUBE, "fifottl", {"partitions": 2}])
    wait(lambda: owned_partition(a)[0] is not None, "set a's partition in the placement")
    part, _ = owned_partition(a)
    t0 = time.time()
    fill(a, TASKS)
    fill_s = time.time() - t0
    _, total = owned_partition(a)
    if total != TASKS:
        raise SystemExit(f"set a's partition {part} holds {total} tasks, not {TASKS}")
    poller = Poller(b)
    poller.start()
    # Each node's loadgen on the other node's core, as in results/shards-2026-11-27.
    drivers = ((a, 1), (b, 0))

    def both(tag, secs, rates=None, during=None):
        """Runs a loadgen through each node at once; returns their JSONs, the measured window
        in wall-clock time (from the first put the server counts, plus the warm-up), and what
        `during(window_start)` returned."""
        launched = time.time()
        procs = [(n, loadgen(n, cpu, f"r{r}-{tag}-{n.name}", secs, rates and rates[n.name]))
                 for n, cpu in drivers]
        wait(lambda: poller.puts_since(launched) is not None, f"{tag} loadgens' first put")
        w0 = poller.puts_since(launched) + WARMUP_S
        out = during(w0) if during else None
        runs = []
        for n, (p, path) in procs:
            d = finish(p, path)
            d["node"] = n.name
            runs.append(d)
        return runs, (w0, w0 + secs), out

    unloaded, _, _ = both("unloaded", UNLOADED_S)
    rates = {d["node"]: LOAD * d["msgs_per_s"] for d in unloaded}
    before, wb, _ = both("before", PHASE_S, rates)

    def move(w0):
        time.sleep(max(0.0, w0 - time.time()))
        t = time.time()
        res = subprocess.run([f"{BIN}/tarq", "ctl", "move", TUBE, str(part), "--to", "b",
                              "--etcd", etcd.url, "--cluster", CLUSTER],
                             capture_output=True, text=True)
        t_end = time.time()
        if res.returncode != 0:
            for n in (a, b):
                n.log.flush()
                print(f"--- node {n.name} (exit {n.proc.poll()}):",
                      open(f"{n.dir}/log").read()[-3000:])
            raise SystemExit(f"move failed: {res.stderr.splitlines()[0]}")
        return {"report": json.loads(res.stdout.strip().splitlines()[-1]), "ctl_start": t,
                "ctl_end": t_end}

    during, wm, mv = both("move", MOVE_WINDOW_S, rates, move)
    after, wa, _ = both("after", PHASE_S, rates)
    poller.stop = True
    poller.join()
    moves = {n.name: n.cluster()["moves"] for n in (a, b)}
    logged = {"started": a.logged_at("move started"), "committed": a.logged_at("move committed"),
              "served_at_b": b.logged_at("a partition moved here"),
              "let_go_started": a.logged_at("letting go of a partition's tasks"),
              "let_go_done": a.logged_at("let go of a partition's tasks")}
    moved = next(p for p in partitions(b) if p["partition"] == part)
    a.stop(keep=f"{OUT}/logs/round-{r}-a.log")
    b.stop(keep=f"{OUT}/logs/round-{r}-b.log")
    etcd.stop()

    rep = mv["report"]
    # The owner's clock (`ms`) runs from the move's start (a's `move started`: the copy begins
    # while the partition serves) to the commit; `frozen_ms` from the freeze (the last changes)
    # to the answer, which a sends in the turn it logs `move committed`. So "the move" here is
    # from a's `move started` to ctl's return, and "the freeze" from a's `move committed` less
    # `frozen_ms` to ctl's return.
    m0 = logged["started"] or mv["ctl_end"] - rep["ms"] / 1e3
    m1 = mv["ctl_end"]
    f0 = (logged["committed"] or m1) - rep.get("frozen_ms", rep["ms"]) / 1e3
    mp = phase(during, poller, *wm)
    mp["move_in_window_s"] = {k: round(v - wm[0], 3) for k, v in dict(
        ctl_start=mv["ctl_start"], ctl_end=mv["ctl_end"], **logged).items() if v}
    # The old owner's let-go of its copy (a's log lines at its start and end), from the commit.
    mp["let_go_after_commit_s"] = {k: round(logged[f"let_go_{k}"] - logged["committed"], 3)
                                   for k in ("started", "done")
                                   if logged[f"let_go_{k}"] and logged["committed"]}
    mp["move_acks_per_s"] = poller.rate(m0, m1)
    # The worst wait in the seconds of the move run that overlap the move (a's `move started` to
    # ctl's return), from the loadgens' per-second series (second i: [w0 + i, w0 + i + 1)).
    mp["worst_wait_ms_in_move_seconds"] = {
        n: max((w for i, w in enumerate(x["worst_wait_ms_per_second"])
                if wm[0] + i < m1 and wm[0] + i + 1 > m0), default=None)
        for n, x in mp["by_node"].items()}
    dips = [x for x in poller.buckets(m0, max(m1, m0 + DIP_BUCKET_S), DIP_BUCKET_S)
            if x is not None]
    mp["move_min_acks_per_s"] = min(dips) if dips else None
    # The freeze is short: its rate is over whatever samples fall inside it (None if under two).
    mp["freeze_in_window_s"] = round(f0 - wm[0], 3)
    mp["freeze_acks_per_s"] = poller.rate(f0, m1) if m1 - f0 >= 2 * POLL_S else None
    mp["after_move_in_window_acks_per_s"] = poller.rate(m1, wm[1]) if m1 < wm[1] - 0.5 else None
    mp["acks_per_s_by_bucket"] = poller.buckets(wm[0], wm[1], DIP_BUCKET_S)
    return {
        "round": r,
        "move_rate": MOVE_RATE,
        "move_rate_in_effect": _rate,
        "tasks": rep["tasks"],
        "move_ms": rep["ms"],
        "tasks_per_s": round(rep["tasks"] / (rep["ms"] / 1e3)) if rep["ms"] else None,
        "frozen_ms": rep.get("frozen_ms"),
        "rounds": rep.get("rounds"),
        "resent": rep.get("resent"),
        "start_to_ctl_return_ms": round((m1 - m0) * 1e3),
        "ctl_wall_ms": round((mv["ctl_end"] - mv["ctl_start"]) * 1e3),
        "freeze_to_ctl_return_ms": round((m1 - f0) * 1e3),
        "commit_to_served_at_b_ms": round((logged["served_at_b"] - logged["committed"]) * 1e3)
        if logged["served_at_b"] and logged["committed"] else None,
        "move_report": rep,
        "move_inside_window": m1 < wm[1] - 1,
        "partition": part,
        "fill_s": round(fill_s, 2),
        "unloaded_acks_per_s": round(sum(d["msgs_per_s"] for d in unloaded)),
        "asked_rates": {k: round(v) for k, v in rates.items()},
        "before": phase(before, poller, *wb),
        "move_run": mp,
        "after": phase(after, poller, *wa),
        "moves_after": moves,
        "moved_partition_after": moved,
        "server_samples": [[round(t - wb[0], 3), p, k] for t, p, k in poller.samples],
    }


def git(*args):
    return subprocess.run(["git", *args], capture_output=True, text=True).stdout.strip()


def loadavg():
    return open("/proc/loadavg").read().strip()


cpu_model = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                  if l.startswith("model name")), None)
meta = {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain",
                                                               "--untracked-files=no")),
        "machine": os.uname().nodename, "cores": os.cpu_count(), "cpu_model": cpu_model,
        "kernel": platform.release(),
        "config": {"tasks": TASKS, "payload": PAYLOAD, "fill_delay_s": FILL_DELAY_S,
                   "load": LOAD, "unloaded_s": UNLOADED_S, "phase_s": PHASE_S,
                   "warmup_s": WARMUP_S, "move_window_s": MOVE_WINDOW_S,
                   "move_rate": MOVE_RATE, "move_rate_in_effect": _rate,
                   "loadgen": "4 producers + 4 consumers, depth 16, tube API, one per node, "
                              "pinned to the other node's core"}}
rounds = []
for r in range(ROUNDS):
    before = loadavg()
    d = one_round(r)
    d.update(meta, loadavg_before=before, loadavg_after=loadavg(),
             started_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    json.dump(d, open(f"{OUT}/round-{r}.json", "w"), indent=1)
    rounds.append(d)
    print(f"round {r} (move rate {_rate or 'unlimited'}): {d['tasks']} tasks in {d['move_ms']} ms "
          f"({d['frozen_ms']} ms frozen, "
          f"{d['rounds']} rounds), clients' worst wait "
          f"{ {n: x['worst_wait_ms'] for n, x in d['move_run']['by_node'].items()} } ms",
          flush=True)


def med(f):
    xs = [f(d) for d in rounds]
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


medians = {
    "tasks": med(lambda d: d["tasks"]),
    "move_ms": med(lambda d: d["move_ms"]),
    "frozen_ms": med(lambda d: d["frozen_ms"]),
    "rounds": med(lambda d: d["rounds"]),
    "resent": med(lambda d: d["resent"]),
    "start_to_ctl_return_ms": med(lambda d: d["start_to_ctl_return_ms"]),
    "tasks_per_s": med(lambda d: d["tasks_per_s"]),
    "ctl_wall_ms": med(lambda d: d["ctl_wall_ms"]),
    "freeze_to_ctl_return_ms": med(lambda d: d["freeze_to_ctl_return_ms"]),
    "commit_to_served_at_b_ms": med(lambda d: d["commit_to_served_at_b_ms"]),
    "unloaded_acks_per_s": med(lambda d: d["unloaded_acks_per_s"]),
    "asked_rate_total": med(lambda d: sum(d["asked_rates"].values())),
    "before_acks_per_s": med(lambda d: d["before"]["acks_per_s"]),
    "move_acks_per_s": med(lambda d: d["move_run"]["move_acks_per_s"]),
    "move_min_acks_per_s": med(lambda d: d["move_run"]["move_min_acks_per_s"]),
    "freeze_acks_per_s": med(lambda d: d["move_run"]["freeze_acks_per_s"]),
    "after_acks_per_s": med(lambda d: d["after"]["acks_per_s"]),
}
for n in ("a", "b"):
    for ph in ("before", "move_run", "after"):
        for k in ("worst_wait_ms", "put_p99_ms", "cycle_p99_ms", "errors", "foreign_messages"):
            medians[f"{n}_{ph}_{k}"] = med(lambda d: d[ph]["by_node"][n][k])
    medians[f"{n}_worst_wait_ms_in_move_seconds"] = med(
        lambda d: d["move_run"]["worst_wait_ms_in_move_seconds"][n])
# Failed calls over every round, per node and phase, and the first error's text of each run
# that had any (the loadgen counts errors, not errors per kind).
errors = {f"{n}_{ph}": {
    "errors": sum(d[ph]["by_node"][n]["errors"] for d in rounds),
    "first_errors": sorted({d[ph]["by_node"][n]["first_error"] for d in rounds
                            if d[ph]["by_node"][n]["errors"]}),
} for n in ("a", "b") for ph in ("before", "move_run", "after")}
summary = dict(meta, rounds=len(rounds), move_rate=MOVE_RATE, move_rate_in_effect=_rate,
               medians=medians, errors=errors, per_round=[
    {k: d[k] for k in ("move_rate", "move_rate_in_effect", "tasks", "move_ms", "frozen_ms", "rounds", "resent", "tasks_per_s",
                       "ctl_wall_ms", "start_to_ctl_return_ms", "freeze_to_ctl_return_ms",
                       "commit_to_served_at_b_ms", "move_inside_window", "loadavg_before",
                       "loadavg_after")} for d in rounds])
json.dump(summary, open(f"{OUT}/summary.json", "w"), indent=1)
print(json.dumps(summary, indent=1))
