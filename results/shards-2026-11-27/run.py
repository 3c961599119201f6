#!/usr/bin/env python3
"""Figures of a sharded tarq cluster (issue 28), on this machine's two cores.

  run.py BIN_DIR OUT_DIR [ROUNDS]

BIN_DIR holds release builds of `tarq` and `tarq-loadgen`. Starts a real etcd and real tarq
nodes (each its own replica set, one node a set: replicas add copies, not rate), drives them
with the loadgen (4 producers + 4 consumers, depth 16, the tube API, 5 s after 1 s of warm-up)
and writes one JSON per run plus summary.json:

- hop: the same tube (one partition) driven through the node that owns it and through a node
  of another set that forwards every call to it, alternating run by run; the CPU time each
  tarq process spent per message (from /proc) is kept beside the rates;
- scale: one set (one node, core 0, the loadgen on core 1) against two sets (a node on each
  core, a tube of two partitions, one loadgen per node with its clients on the owner);
- model: N sets' aggregate rate from the one-set rate and the measured CPU per message of an
  owner and of a forwarding node, for clients that reach the owners (f = 0) and for clients
  spread evenly (f = (N-1)/N of calls forwarded).
"""
import atexit, base64, json, os, shutil, socket, statistics, subprocess, sys, tempfile, threading, time
import urllib.request

BIN, OUT = sys.argv[1], sys.argv[2]
ROUNDS = int(sys.argv[3]) if len(sys.argv) > 3 else 5
os.makedirs(OUT, exist_ok=True)
TICK = os.sysconf("SC_CLK_TCK")
LEASE, SYNC = "10", "0"
SPAWNED = []


@atexit.register
def stop_all():
    # Whatever happens, no etcd or tarq of this script outlives it.
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


def cpu_seconds(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / TICK


class Etcd:
    def __init__(self):
        self.dir = tempfile.mkdtemp()
        c, p = free_port(), free_port()
        self.url = f"http://127.0.0.1:{c}"
        peer = f"http://127.0.0.1:{p}"
        self.proc = subprocess.Popen(
            ["etcd", "--name=f", f"--data-dir={self.dir}/data", f"--listen-client-urls={self.url}",
             f"--advertise-client-urls={self.url}", f"--listen-peer-urls={peer}",
             f"--initial-advertise-peer-urls={peer}", f"--initial-cluster=f={peer}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        SPAWNED.append(self.proc)
        for _ in range(200):
            try:
                urllib.request.urlopen(self.url + "/health", timeout=1)
                return
            except Exception:
                time.sleep(0.05)
        raise SystemExit("etcd did not start")

    def get(self, key):
        body = json.dumps({"key": base64.b64encode(key.encode()).decode()}).encode()
        try:
            r = urllib.request.urlopen(self.url + "/v3/kv/range", body, timeout=2)
        except Exception:
            return None
        kvs = json.load(r).get("kvs", [])
        return json.loads(base64.b64decode(kvs[0]["value"])) if kvs else None

    def stop(self):
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def wait(cond, what, secs=20):
    end = time.time() + secs
    while time.time() < end:
        if cond():
            return
        time.sleep(0.05)
    raise SystemExit(f"timed out waiting for {what}")


class Node:
    def __init__(self, etcd, cluster, name, cpu, set_name=None):
        set_name = set_name or name
        self.dir = tempfile.mkdtemp()
        self.port = free_port()
        self.addr = f"127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            # The loop pinned (--cpu), the election thread free to run on the other core; a
            # lease long enough that a loaded machine's scheduling delays are no failover.
            [f"{BIN}/tarq", "--cpu", str(cpu), "--listen", self.addr, "--data-dir",
             f"{self.dir}/data", "--etcd", etcd.url, "--cluster", cluster, "--node-name", name,
             "--replica-set", set_name, "--lease-ttl", LEASE, "--log-level", "warn",
             "--sync-replicas", SYNC],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        SPAWNED.append(self.proc)
        self.leader_key = f"/tarq/{cluster}/sets/{set_name}/leader"

    def stop(self):
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def create_tube(node, name, partitions):
    import tarantool
    c = tarantool.connect("127.0.0.1", node.port)
    c.call("queue.create_tube", [name, "fifottl", {"partitions": partitions}])
    c.close()


def loadgen(node, tube, cpu, out, tag, secs=5):
    path = f"{OUT}/{tag}.json"
    subprocess.run(
        [f"{BIN}/tarq-loadgen", "--target", "tarq", "--addr", node.addr, "--api", "tubes",
         "--tube", tube, "--producers", "4", "--consumers", "4", "--depth", "16",
         "--duration", f"{secs}s", "--warmup", "1s", "--cpu", str(cpu), "--quiet", "--json",
         path],
        check=True, stdout=subprocess.DEVNULL)
    return json.load(open(path))


def cluster(name, sets, cpus):
    etcd = Etcd()
    nodes = [Node(etcd, name, s, c) for s, c in zip(sets, cpus)]
    for n in nodes:
        wait(lambda: etcd.get(n.leader_key) is not None, f"{n.leader_key}")
    return etcd, nodes


summary = {"machine": os.uname().nodename, "cores": os.cpu_count(),
           "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                    text=True).stdout.strip()}

# --- the hop -------------------------------------------------------------------------------
etcd, (a, b) = cluster("hop", ["a", "b"], [0, 1])
create_tube(a, "hop", 1)
owner_set = etcd.get("/tarq/hop/placement/tubes/hop")["partitions"][0]["set"]
owner, forwarder = (a, b) if owner_set == "a" else (b, a)
runs = {"owner": [], "forwarded": []}
for r in range(ROUNDS):
    for how, via in (("owner", owner), ("forwarded", forwarder)):
        before = {n: cpu_seconds(n.proc.pid) for n in (owner, forwarder)}
        d = loadgen(via, "hop", 1, OUT, f"hop-{how}-r{r}")
        msgs = d["msgs_per_s"] * d.get("duration_s", 5)
        d["cpu_us_per_msg"] = {("owner" if n is owner else "forwarder"):
                               round((cpu_seconds(n.proc.pid) - before[n]) * 1e6 / max(msgs, 1), 3)
                               for n in (owner, forwarder)}
        runs[how].append(d)
for n in (a, b):
    n.stop()
etcd.stop()


def med(ds, f):
    return round(statistics.median(f(d) for d in ds), 3)


hop = {}
for how, ds in runs.items():
    hop[how] = {
        "runs": len(ds),
        "msgs_per_s_median": med(ds, lambda d: d["msgs_per_s"]),
        "cycle_p50_us_median": med(ds, lambda d: d["cycle_us"]["p50"]),
        "cycle_p99_us_median": med(ds, lambda d: d["cycle_us"]["p99"]),
        "owner_cpu_us_per_msg_median": med(ds, lambda d: d["cpu_us_per_msg"]["owner"]),
        "forwarder_cpu_us_per_msg_median": med(ds, lambda d: d["cpu_us_per_msg"]["forwarder"]),
    }
hop["forwarded_over_owner"] = round(
    hop["forwarded"]["msgs_per_s_median"] / hop["owner"]["msgs_per_s_median"] - 1, 4)
summary["hop"] = hop

# --- one set against two -----------------------------------------------------------------------
scale = {"one": [], "two": []}
for r in range(ROUNDS):
    etcd, (a,) = cluster("one", ["a"], [0])
    create_tube(a, "s", 1)
    scale["one"].append(loadgen(a, "s", 1, OUT, f"scale-one-r{r}")["msgs_per_s"])
    a.stop()
    etcd.stop()

    etcd, (a, b) = cluster("two", ["a", "b"], [0, 1])
    create_tube(a, "s", 2)
    rates = {}

    def drive(node, cpu, tag):
        rates[tag] = loadgen(node, "s", cpu, OUT, f"scale-two-{tag}-r{r}")["msgs_per_s"]

    ts = [threading.Thread(target=drive, args=(a, 1, "a")),
          threading.Thread(target=drive, args=(b, 0, "b"))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    scale["two"].append(rates["a"] + rates["b"])
    for n in (a, b):
        n.stop()
    etcd.stop()
summary["scale"] = {
    "one_set_msgs_per_s_median": round(statistics.median(scale["one"])),
    "two_sets_msgs_per_s_median": round(statistics.median(scale["two"])),
    "two_over_one": round(statistics.median(scale["two"]) / statistics.median(scale["one"]), 3),
    "note": "two tarq processes and two loadgens share this machine's two cores",
}

# --- one set's failover: the other set's rate meanwhile -------------------------------------
# Sets a and b of two nodes each (--sync-replicas 1, a 2 s lease); the loadgen drives set a's
# primary on a tube with a partition on each set (its puts and takes stay on a); 4 s in, set
# b's primary is killed (-9). The per-second series shows a's rate across b's failover.
LEASE, SYNC = "2", "1"
etcd = Etcd()
nodes = [Node(etcd, "fo", f"{s}{i}", i % 2, s) for s in ("a", "b") for i in (0, 1)]
leader = {}
for s in ("a", "b"):
    wait(lambda: etcd.get(f"/tarq/fo/sets/{s}/leader") is not None, f"set {s}'s leader")
    leader[s] = etcd.get(f"/tarq/fo/sets/{s}/leader")["name"]
by_name = {f"{s}{i}": nodes[k] for k, (s, i) in enumerate((s, i) for s in ("a", "b") for i in (0, 1))}
primary_a, primary_b = by_name[leader["a"]], by_name[leader["b"]]
create_tube(primary_a, "fo", 2)
result = {}
t = threading.Thread(target=lambda: result.update(
    d=loadgen(primary_a, "fo", 1, OUT, "failover-a", secs=12)))
t.start()
time.sleep(5)  # the warm-up second and four measured ones before the kill
primary_b.proc.kill()
killed = time.time()
wait(lambda: (etcd.get("/tarq/fo/sets/b/leader") or {}).get("name") not in (None, leader["b"]),
     "set b's new primary")
summary_failover_s = round(time.time() - killed, 2)
t.join()
for n in nodes:
    n.stop()
etcd.stop()
series = [s["acks"] for s in result["d"]["series"]]
summary["failover"] = {
    "set_b_new_primary_after_s": summary_failover_s,
    "set_a_acks_per_second": series,
    "kill_at_s": 4,
    "before_median": statistics.median(series[:4]),
    "during_and_after_median": statistics.median(series[4:]),
}

# --- the model ------------------------------------------------------------------------------
# A set's primary spends `own` µs of CPU per message it owns; a node that forwards spends
# `fwd` µs more per message it forwards. With one core per set, N sets' aggregate is N / (own +
# f * fwd) messages per µs when a fraction f of calls is forwarded.
own = hop["owner"]["owner_cpu_us_per_msg_median"]
fwd = hop["forwarded"]["forwarder_cpu_us_per_msg_median"]
one = summary["scale"]["one_set_msgs_per_s_median"]
model = {}
for n in (2, 4, 8, 16):
    f = (n - 1) / n
    model[n] = {
        "owners_reached_msgs_per_s": round(n * one),
        "spread_msgs_per_s": round(n * one * own / (own + f * fwd)),
        "spread_over_n_times_one": round(own / (own + f * fwd), 3),
    }
summary["model"] = {"owner_cpu_us_per_msg": own, "forwarder_cpu_us_per_msg": fwd, "sets": model}
json.dump(summary, open(f"{OUT}/summary.json", "w"), indent=1)
print(json.dumps(summary, indent=1))
