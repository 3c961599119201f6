"""Differential runner for the tarantool/queue API: one scripted sequence of calls, two servers.

    python3 diff_tubes.py PORT_A PORT_B [--script scenario.json] [--transcript OUT.jsonl]
    python3 diff_tubes.py PORT_A --against transcript.jsonl

Plays the steps of a scenario (default: `scenario.json` beside this file) against the server on
127.0.0.1:PORT_A, then against 127.0.0.1:PORT_B, normalises both transcripts and compares them
step by step. Exits 1 at the first step whose normalised outcome differs, printing both; exits 0
with an "OK" line when every step matches. `--transcript` writes A's normalised transcript (one
JSON object a line); `--against` compares one server with a transcript recorded earlier instead
of with a second server. Each server must be fresh (no tubes): tube names, statistics and task
ordinals are part of what is compared.

Scenario format: a JSON list; each step is one of
    [conn, "call", name, args]      IPROTO CALL (the 1.7+ call, results as a list of values)
    [conn, "call16", name, args]    IPROTO CALL_16 (each result wrapped as a tuple)
    [conn, "until", name, args, want, seconds]
                                    repeat a CALL until its normalised outcome equals `want`
                                    ({"result": ...} or {"error": [code, text]}), for at most
                                    `seconds`: waits for a server-side event (a TTL expiry)
    [conn, "close"]                 close that connection (its queue session disconnects)
    {"note": "..."}                 a comment, copied to the transcript
`conn` names a connection, opened on first use. In args, the string "#N" stands for the id of
the N-th task seen (see below) and "$uuidN" for the N-th session uuid `queue.identify` returned.

Normalisation (what may differ between two correct servers):
- task ids: a task is an array [id, status, data] with a status letter; each task returned by a
  `put` gets the next ordinal, shown as "#N"; any other result carrying (tube, id) shows the
  ordinal of the newest put of that id in that tube. This also absorbs the original's reuse of
  ids (it computes max(id)+1 per tube; tarq never reuses an id). "Task <id> not found" in an
  error text is mapped the same way.
- session uuids (16-byte strings from `queue.identify`): "$uuidN" in order of appearance.
- errors: the Lua "file:line: " prefix the original adds is stripped; the IPROTO code is kept.
- `statistics`: tarq's keys beside `tasks` and `calls` (`consumers`, `oldest_ready_age`,
  `idle`) are left out.
- `create_tube`'s result: the original returns its internal tube object (functions nil'ed out
  by serve.lua), tarq a map describing the tube; both show as "<tube>" (the wrapping is kept).
"""

import argparse
import json
import os
import re
import sys
import time

import tarantool
from tarantool.error import DatabaseError, NetworkError

# Bound on every socket read: a server that never answers fails the run instead of hanging it.
# The longest wait a scenario asks for is a take of a few seconds, well inside this.
CALL_TIMEOUT = 30.0
# The statuses a task array carries: ready, taken, done, buried, delayed.
STATUSES = {"r", "t", "-", "!", "~"}
# Bytes of a queue session uuid (`uuid.bin()` in the original).
UUID_LEN = 16
# The "file:line: " prefix Lua's error() puts before a message: the chunk name may be shortened
# to "...tail/of/path.lua" and its length varies with where the original is installed.
LUA_PREFIX = re.compile(r"^(?:\.\.\.)?[^\s:]*\.lua:\d+: ")
# Pause between two tries of an "until" step: a polling interval, not a wait for anything.
POLL_INTERVAL = 0.02
TASK_NOT_FOUND = re.compile(r"Task (\d+) not found")
TUBE_CALL = re.compile(r"^(?:[\w.]+)\.tube\.([\w]+):(\w+)$")


class Session:
    """One server: its connections and the maps that normalise what it answers."""

    def __init__(self, port):
        self.port = port
        self.conns = {}
        # (tube, raw id) -> ordinal of the newest put of that id; ordinal -> (tube, raw id).
        self.ordinal_of = {}
        self.id_of = []
        self.uuids = []

    def conn(self, name):
        if name not in self.conns:
            # encoding=None: the session uuid is a 16-byte MP_STR that is not UTF-8; strings
            # are decoded below, uuids mapped.
            self.conns[name] = tarantool.Connection(
                "127.0.0.1", self.port, encoding=None, socket_timeout=CALL_TIMEOUT
            )
        return self.conns[name]

    def close_all(self):
        for c in self.conns.values():
            c.close()

    # -- arguments ------------------------------------------------------------------------------

    def resolve(self, value):
        if isinstance(value, str) and re.fullmatch(r"#\d+", value):
            n = int(value[1:])
            if n >= len(self.id_of):
                raise SystemExit(f"scenario refers to {value} before that task exists")
            return self.id_of[n][1]
        if isinstance(value, str) and re.fullmatch(r"\$uuid\d+", value):
            return self.uuids[int(value[5:])]
        if isinstance(value, list):
            return [self.resolve(v) for v in value]
        if isinstance(value, dict):
            return {k: self.resolve(v) for k, v in value.items()}
        return value

    # -- results --------------------------------------------------------------------------------

    def task_ordinal(self, tube, raw_id, fresh):
        if fresh:
            self.ordinal_of[(tube, raw_id)] = len(self.id_of)
            self.id_of.append((tube, raw_id))
        n = self.ordinal_of.get((tube, raw_id))
        return f"#{n}" if n is not None else f"#?{raw_id}"

    def normalise(self, value, tube, method):
        if isinstance(value, bytes):
            if method == "identify" and len(value) == UUID_LEN:
                if value not in self.uuids:
                    self.uuids.append(value)
                return f"$uuid{self.uuids.index(value)}"
            try:
                return value.decode()
            except UnicodeDecodeError:
                return {"bytes": value.hex()}
        if (
            isinstance(value, (list, tuple))
            and len(value) == 3
            and isinstance(value[0], int)
            and not isinstance(value[0], bool)
            and isinstance(value[1], bytes)
            and value[1].decode(errors="replace") in STATUSES
            and tube is not None
        ):
            ordinal = self.task_ordinal(tube, value[0], fresh=method == "put")
            return [ordinal, value[1].decode(), self.normalise(value[2], tube, method)]
        if isinstance(value, (list, tuple)):
            return [self.normalise(v, tube, method) for v in value]
        if isinstance(value, dict):
            shown = {
                self.normalise(k, tube, method): self.normalise(v, tube, method)
                for k, v in value.items()
            }
            if {"tasks", "calls"} <= set(shown):
                # tarq's statistics carry keys beside the original's: compared without them.
                shown = {k: v for k, v in shown.items() if k in ("tasks", "calls")}
            return shown
        return value

    def normalise_error(self, message, tube):
        message = LUA_PREFIX.sub("", message)

        def task(m):
            n = self.ordinal_of.get((tube, int(m.group(1))))
            return f"Task #{n} not found" if n is not None else m.group(0)

        return TASK_NOT_FOUND.sub(task, message)

    # -- one step -------------------------------------------------------------------------------

    def play(self, step):
        if isinstance(step, dict):
            return {"note": step["note"]}
        conn_name, kind = step[0], step[1]
        if kind == "close":
            self.conns.pop(conn_name).close()
            return {"conn": conn_name, "close": True}
        if kind == "until":
            return self.play_until(step)
        name, args = step[2], step[3]
        m = TUBE_CALL.match(name)
        tube, method = (m.group(1), m.group(2)) if m else (None, name.rsplit(".", 1)[-1])
        conn = self.conn(conn_name)
        conn.call_16 = kind == "call16"
        out = {"conn": conn_name, "kind": kind, "call": name, "args": args}
        try:
            data = conn.call(name, *self.resolve(args)).data
        except DatabaseError as e:
            code, message = e.args[0], e.args[1]
            if isinstance(message, bytes):
                message = message.decode(errors="replace")
            out["error"] = [code, self.normalise_error(message, tube)]
            return out
        if method == "create_tube":
            data = [mask_tube(v) for v in data]
        out["result"] = self.normalise(data, tube, method)
        return out


    def play_until(self, step):
        conn_name, _, name, args, want, seconds = step
        deadline = time.monotonic() + seconds
        while True:
            out = self.play([conn_name, "call", name, args])
            got = {k: out[k] for k in ("result", "error") if k in out}
            if json.loads(json.dumps(got)) == want or time.monotonic() > deadline:
                out["kind"] = "until"
                return out
            time.sleep(POLL_INTERVAL)


def mask_tube(value):
    """The tube object (or map) create_tube returns, keeping CALL_16's tuple wrapping."""
    if isinstance(value, list):
        return [mask_tube(v) for v in value]
    if isinstance(value, dict):
        return "<tube>"
    return value


def run(port, steps):
    """The normalised transcript of `steps` against the server on `port`."""
    session = Session(port)
    transcript = []
    try:
        fresh = session.conn("_check").call("queue.statistics").data
        if fresh not in ([{}], [[]]):
            raise SystemExit(f"server on port {port} is not fresh: it has tubes {fresh!r}")
        session.conns.pop("_check").close()
        for i, step in enumerate(steps):
            entry = session.play(step)
            entry["step"] = i
            transcript.append(entry)
    except NetworkError as e:
        raise SystemExit(f"port {port}, step {len(transcript)}: network error {e!r}")
    finally:
        session.close_all()
    return transcript


def compare(a, b, label_a, label_b):
    for ea, eb in zip(a, b):
        if ea != eb:
            print(f"MISMATCH at step {ea.get('step')}:", file=sys.stderr)
            print(f"  {label_a}: {json.dumps(ea)}", file=sys.stderr)
            print(f"  {label_b}: {json.dumps(eb)}", file=sys.stderr)
            return False
    if len(a) != len(b):
        print(f"MISMATCH: {len(a)} steps vs {len(b)} steps", file=sys.stderr)
        return False
    return True


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("port_a", type=int)
    ap.add_argument("port_b", type=int, nargs="?")
    ap.add_argument("--script", default=os.path.join(here, "scenario.json"))
    ap.add_argument("--transcript", help="write A's normalised transcript here (JSON lines)")
    ap.add_argument("--against", help="compare A with this recorded transcript instead of B")
    opts = ap.parse_args()
    if (opts.port_b is None) == (opts.against is None):
        ap.error("give either PORT_B or --against TRANSCRIPT")
    with open(opts.script) as f:
        steps = json.load(f)

    a = run(opts.port_a, steps)
    if opts.transcript:
        with open(opts.transcript, "w") as f:
            for entry in a:
                f.write(json.dumps(entry, sort_keys=True) + "\n")
    if opts.against:
        with open(opts.against) as f:
            b = [json.loads(line) for line in f if line.strip()]
        label_b = opts.against
    else:
        b = run(opts.port_b, steps)
        label_b = f"port {opts.port_b}"
    # Round-trip A through JSON so that both sides compare as the same types.
    a = [json.loads(json.dumps(e)) for e in a]
    if not compare(a, b, f"port {opts.port_a}", label_b):
        sys.exit(1)
    print(f"OK: {len(steps)} steps, identical after normalisation")


if __name__ == "__main__":
    main()
