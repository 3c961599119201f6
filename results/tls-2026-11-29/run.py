#!/usr/bin/env python3
"""What TLS costs tarq (issue 38): the same server, plain clients against TLS clients.

  run.py BIN_DIR OUT_DIR [ROUNDS]

BIN_DIR holds release builds of `tarq` and `tarq-loadgen`. A CA and a certificate for
127.0.0.1 are made with openssl in OUT_DIR. Every run spawns a fresh tarq (`--spawn`: the
server pinned to core 0, the loadgen to core 1) with `--listen-tls optional` and that
certificate, and drives it with 4 producers + 4 consumers, 32-byte payloads, put -> take -> ack,
5 s after 1 s of warm-up, at depths 1 and 16; plain and TLS (`--tls-ca`) alternate within each
round, so both meet the same machine. The server's CPU a message is its share of a core
(`target_cpu`, from /proc/<pid>/stat over the measured window) / messages a second. Writes
one loadgen JSON per run and summary.json: per depth and mode the medians over the rounds, and
TLS / plain.
"""
import json, os, statistics, subprocess, sys

BIN, OUT = sys.argv[1], sys.argv[2]
ROUNDS = int(sys.argv[3]) if len(sys.argv) > 3 else 3
os.makedirs(OUT, exist_ok=True)


def openssl(*args):
    subprocess.run(["openssl", *args], cwd=OUT, check=True, capture_output=True)


ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
        "-subj", "/CN=tarq bench CA")
openssl("req", *ec, "-keyout", "node.key", "-out", "node.csr", "-subj", "/CN=127.0.0.1")
open(f"{OUT}/node.ext", "w").write("subjectAltName=IP:127.0.0.1\n")
openssl("x509", "-req", "-in", "node.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "node.crt", "-days", "2", "-extfile", "node.ext")

runs = []
for r in range(ROUNDS):
    for depth in (1, 16):
        for mode in ("plain", "tls"):
            path = f"{OUT}/d{depth}-{mode}-r{r}.json"
            cmd = [f"{BIN}/tarq-loadgen", "--target", "tarq", "--spawn", "--tarq-bin",
                   f"{BIN}/tarq", "--target-args",
                   f"--listen-tls optional --tls-cert {OUT}/node.crt --tls-key {OUT}/node.key",
                   "--producers", "4", "--consumers", "4", "--depth", str(depth),
                   "--payload", "32", "--duration", "5s", "--warmup", "1s", "--quiet",
                   "--json", path]
            if mode == "tls":
                cmd += ["--tls-ca", f"{OUT}/ca.crt"]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            d = json.load(open(path))
            cpu_us = d["target_cpu"] * 1e6 / d["msgs_per_s"]
            runs.append({"round": r, "depth": depth, "mode": mode,
                         "msgs_per_s": d["msgs_per_s"], "target_cpu": d["target_cpu"],
                         "cpu_us_per_msg": cpu_us, "cycle_p50_us": d["cycle_us"]["p50"],
                         "cycle_p99_us": d["cycle_us"]["p99"], "other_cpu": d.get("other_cpu"),
                         "loadavg_before": d["machine"]["loadavg_before"],
                         "commit": d["commit"]})
            print(json.dumps(runs[-1]), flush=True)

summary = {"rounds": ROUNDS, "runs": runs, "medians": {}}
for depth in (1, 16):
    med = {}
    for mode in ("plain", "tls"):
        rs = [x for x in runs if x["depth"] == depth and x["mode"] == mode]
        med[mode] = {k: statistics.median(x[k] for x in rs)
                     for k in ("msgs_per_s", "cpu_us_per_msg", "cycle_p50_us", "cycle_p99_us")}
    med["tls_over_plain"] = {k: med["tls"][k] / med["plain"][k] for k in med["plain"]}
    # Within each round, TLS over plain: the pairs met the same machine.
    med["per_round_cpu_ratio"] = [
        next(x for x in runs if x["depth"] == depth and x["mode"] == "tls" and x["round"] == r)
        ["cpu_us_per_msg"] /
        next(x for x in runs if x["depth"] == depth and x["mode"] == "plain" and x["round"] == r)
        ["cpu_us_per_msg"] for r in range(ROUNDS)]
    summary["medians"][f"depth {depth}"] = med
json.dump(summary, open(f"{OUT}/summary.json", "w"), indent=1)
print(json.dumps(summary["medians"], indent=1))
