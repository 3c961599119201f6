#!/usr/bin/env python3
"""Server CPU a message against the null server (issue 40): tarq's `--null` server (reads,
parses and answers: the I/O floor), tarq with its WAL in `write` mode (the default), and tarq
with `--wal-mode none` (no WAL: what the queue alone adds to the floor).

  run.py BIN_DIR OUT_DIR [ROUNDS] [DEPTHS]

BIN_DIR holds release builds of `tarq` and `tarq-loadgen`. Every run starts its server fresh on
an empty temporary data directory, pinned to core 0 (`taskset -c 0` and `--cpu 0`); the
loadgen is pinned to core 1: 4 producers + 4 consumers, 32-byte payloads, put -> take -> ack,
5 s after 1 s of warm-up. Over 3 s in the middle of each run, /proc gives the server's user
and system time; per message = divided by the loadgen's rate x 3 s. The configurations
alternate within each round. Writes each run's loadgen JSON and summary.json (medians).
"""
import json, os, shutil, socket, statistics, subprocess, sys, tempfile, threading, time

BIN, OUT = sys.argv[1], sys.argv[2]
ROUNDS = int(sys.argv[3]) if len(sys.argv) > 3 else 3
DEPTHS = [int(d) for d in (sys.argv[4] if len(sys.argv) > 4 else "1,16,64").split(",")]
CONFIGS = {"null": ["--null"], "tarq": [], "tarq-nowal": ["--wal-mode", "none"]}
WINDOW = 3.0
TICK = os.sysconf("SC_CLK_TCK")
os.makedirs(OUT, exist_ok=True)


def cpu_ticks(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(f[11]), int(f[12])  # utime, stime


def start(extra):
    d = tempfile.mkdtemp()
    # The server binds port 0 and logs the port it got: no port is picked and handed on.
    p = subprocess.Popen(["taskset", "-c", "0", f"{BIN}/tarq", "--listen", "127.0.0.1:0",
                          "--data-dir", f"{d}/data", "--cpu", "0", "--log-level", "info"] + extra,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in p.stdout:
        if "tarq serving" in line and "listen=127.0.0.1:" in line:
            port = int(line.split("listen=127.0.0.1:")[1].split()[0])
            threading.Thread(target=lambda: [None for _ in p.stdout], daemon=True).start()
            return p, d, port
    raise SystemExit(f"tarq {extra} did not start")


def run(tag, conf, depth):
    p, d, port = start(CONFIGS[conf])
    out = {}

    def window():
        time.sleep(1.5)
        u0, s0 = cpu_ticks(p.pid)
        time.sleep(WINDOW)
        u1, s1 = cpu_ticks(p.pid)
        out["user_s"], out["sys_s"] = (u1 - u0) / TICK, (s1 - s0) / TICK

    t = threading.Thread(target=window)
    path = f"{OUT}/{tag}.json"
    t.start()
    subprocess.run([f"{BIN}/tarq-loadgen", "--target", "null" if conf == "null" else "tarq",
                    "--addr", f"127.0.0.1:{port}", "--producers", "4", "--consumers", "4",
                    "--depth", str(depth), "--payload", "32", "--duration", "5s",
                    "--warmup", "1s", "--cpu", "1", "--quiet", "--json", path],
                   check=True, stdout=subprocess.DEVNULL)
    t.join()
    p.terminate()
    p.wait(10)
    shutil.rmtree(d, ignore_errors=True)
    lg = json.load(open(path))
    msgs = lg["msgs_per_s"] * WINDOW
    rec = {"tag": tag, "conf": conf, "depth": depth, "msgs_per_s": lg["msgs_per_s"],
           "user_us": out["user_s"] * 1e6 / msgs, "sys_us": out["sys_s"] * 1e6 / msgs,
           "loadavg_before": lg["machine"]["loadavg_before"], "commit": lg["commit"]}
    rec["cpu_us"] = rec["user_us"] + rec["sys_us"]
    print(f"{tag}: {rec['msgs_per_s']:.0f}/s, cpu {rec['cpu_us']:.3f} us/msg "
          f"(user {rec['user_us']:.3f}, sys {rec['sys_us']:.3f})", flush=True)
    return rec


runs = [run(f"{c}-d{dep}-r{r}", c, dep) for r in range(ROUNDS) for dep in DEPTHS for c in CONFIGS]
summary = {"commit": runs[0]["commit"], "machine": os.uname().nodename, "rounds": ROUNDS,
           "depths": {}}
for dep in DEPTHS:
    row = {}
    for c in CONFIGS:
        rs = [x for x in runs if x["conf"] == c and x["depth"] == dep]
        row[c] = {k: round(statistics.median(x[k] for x in rs), 3)
                  for k in ("msgs_per_s", "cpu_us", "user_us", "sys_us")}
    for c in ("tarq", "tarq-nowal"):
        row[c]["cpu_vs_null"] = round(row[c]["cpu_us"] / row["null"]["cpu_us"], 3)
    summary["depths"][f"d{dep}"] = row
json.dump({"summary": summary, "runs": runs}, open(f"{OUT}/summary.json", "w"), indent=1)
print(json.dumps(summary, indent=1))
