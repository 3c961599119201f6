#!/usr/bin/env python3
"""Time a tarq restart on a kept data directory: from starting the process to its first
answer (the IPROTO greeting), and what its log says recovery did.

usage: restart.py TARQ_BIN DATA_DIR [ROUNDS]

Fill the directory first, e.g. (from the repository root):
  target/release/tarq --cpu 0 --data-dir DIR --listen 127.0.0.1:3391 &
  target/release/tarq-loadgen --target tarq --addr 127.0.0.1:3391 --fill 10000000 \
      --producers 4 --depth 16 --payload 64 --quiet --json fill.json
  kill -TERM %1
"""
import datetime, json, re, socket, subprocess, sys, time

ADDR = ("127.0.0.1", 3391)
# Flags before the data directory (TARQ_FLAGS, default "--cpu 0").
import os, shlex
EXTRA = shlex.split(os.environ.get("TARQ_FLAGS", "--cpu 0"))


def one(binary, data_dir):
    t0 = time.monotonic()
    p = subprocess.Popen([binary, *EXTRA, "--data-dir", data_dir, "--listen",
                          "%s:%d" % ADDR], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True)
    while True:
        try:
            s = socket.create_connection(ADDR, timeout=0.05)
            s.recv(128)
            s.close()
            break
        except OSError:
            if p.poll() is not None:
                sys.exit("tarq exited: " + p.stderr.read())
            time.sleep(0.005)
    first_answer = time.monotonic() - t0
    p.terminate()
    log = p.communicate(timeout=60)[1]
    rec = re.search(r"(\S+)Z +INFO \S+ recovered tasks=(\d+) .*records=(\d+) .*elapsed_ms=(\d+)", log)
    snap = re.search(r"(\S+)Z +INFO \S+ snapshot loaded file=(\S+) tasks=(\d+)", log)
    stamp = lambda m: datetime.datetime.fromisoformat(m.group(1))
    return {
        "first_answer_s": round(first_answer, 3),
        "tasks": int(rec.group(2)),
        "wal_records": int(rec.group(3)),
        "recovery_ms": int(rec.group(4)),
        "snapshot_tasks": int(snap.group(3)) if snap else 0,
        # From the snapshot loaded to recovery done: the WAL's replay.
        "wal_replay_ms": round((stamp(rec) - stamp(snap)).total_seconds() * 1000) if snap else None,
    }


if __name__ == "__main__":
    binary, data_dir = sys.argv[1], sys.argv[2]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    for _ in range(rounds):
        print(json.dumps({"bin": binary, **one(binary, data_dir)}), flush=True)
