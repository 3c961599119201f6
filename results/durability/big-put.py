#!/usr/bin/env python3
"""Peak memory of one big put: start a tarq (the binary given, a fresh data directory, the WAL
mode given), put one payload of SIZE bytes over IPROTO with the tarantool connector, and read the
server's peak and current RSS (VmHWM, VmRSS in /proc/<pid>/status) before and after. Prints one
JSON record (commit, machine, figures).

    python3 results/durability/big-put.py TARQ_BIN SIZE_MIB [WAL_MODE [TARQ_ARGS...]] > OUT.json

TARQ_ARGS go to the server as they are (e.g. `--snapshot-every-bytes 0`, to tell the put's own
cost from that of the snapshot a 256 MiB put triggers at the default threshold).
"""
import json, os, socket, subprocess, sys, tempfile, time

import tarantool


def status(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmHWM", "VmRSS"):
                out[k] = int(v.split()[0]) * 1024
    return out


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def main():
    binary, size_mib = sys.argv[1], int(sys.argv[2])
    mode = sys.argv[3] if len(sys.argv) > 3 else "write"
    extra = sys.argv[4:]
    size = size_mib << 20
    port = free_port()
    with tempfile.TemporaryDirectory() as data:
        proc = subprocess.Popen(
            [binary, "--listen", f"127.0.0.1:{port}", "--data-dir", data,
             "--max-frame-bytes", str(size + (1 << 20)), "--wal-mode", mode, *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(200):
                try:
                    c = tarantool.connect("127.0.0.1", port)
                    break
                except Exception:
                    time.sleep(0.05)
            before = status(proc.pid)
            try:
                # The reply carries the payload back; the connector may refuse to unpack one
                # this big, which changes nothing on the server's side.
                c.call("queue.put", [b"x" * size])
            except Exception:
                pass
            time.sleep(0.5)
            after = status(proc.pid)
        finally:
            proc.terminate()
            proc.wait()
    git = lambda *a: subprocess.run(["git", *a], capture_output=True, text=True).stdout.strip()
    print(json.dumps({
        "bench": "big-put",
        "commit": git("rev-parse", "--short", "HEAD"),
        "binary": binary,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cores": os.cpu_count(), "loadavg": open("/proc/loadavg").read().strip()},
        "wal_mode": mode,
        "tarq_args": extra,
        "payload_bytes": size,
        "rss_before": before["VmRSS"],
        "peak_rss": after["VmHWM"],
        "rss_after": after["VmRSS"],
        "peak_over_payload": round((after["VmHWM"] - before["VmRSS"]) / size, 2),
        "after_over_payload": round((after["VmRSS"] - before["VmRSS"]) / size, 2),
    }, indent=2))


if __name__ == "__main__":
    main()
