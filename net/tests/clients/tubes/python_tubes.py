"""The tarantool/queue API driven through the PyPI `tarantool` connector, as its users call it.

    python3 python_tubes.py <port> [reference]

Needs a fresh server (no tubes) on 127.0.0.1:<port>. Prints one line per step and "OK" at the
end; on the first mismatch prints "FAIL: <what>" to stderr and exits 1.

`reference` runs against the original tarantool/queue 1.5.0 (serve.lua), which differs from tarq
by design only in task ids: both number each tube's tasks from 0, but the original takes
max(id) + 1 and so gives the id of a deleted newest task again; tarq never gives an id twice in
a tube. Without the flag the script checks that ids are never reused within a tube. Error texts are matched as substrings, as clients do (the
original adds a "file:line: " prefix).
"""

import sys
import threading
import time

import tarantool
from tarantool.error import DatabaseError

# Bound on every socket read, so that a server that never answers fails the script instead of
# hanging it; the longest wait asked of the server is WAKE_TIMEOUT.
CALL_TIMEOUT = 20.0
# How long a take waits for an event that must come (a put, a delay, a TTR, a disconnect):
# the events come within a second; this leaves room on a loaded machine.
WAKE_TIMEOUT = 5.0
# Short server-side times, in seconds: the original's timers are fibers woken on time.
DELAY = 0.2
TTR = 0.3
TTL = 0.2
# A take timeout that must run out: short, to keep the flow fast.
SHORT_TIMEOUT = 0.1
# How long to wait for the server to show a parked call (polling).
PARK_DEADLINE = 5.0
# Pause between polls of the server while waiting for a state (not a wait for an event).
POLL_INTERVAL = 0.02
# An id no fresh server holds.
MISSING_ID = 999999
# IPROTO error codes: ER_PROC_LUA (a Lua error()) and ER_NO_SUCH_PROC.
ER_PROC_LUA = 32
ER_NO_SUCH_PROC = 33

REFERENCE = False
STEP = "(start)"


class Failure(Exception):
    pass


def fail(msg):
    raise Failure(f"[{STEP}] {msg}")


def step(name):
    global STEP
    STEP = name
    print(f"== {name}", flush=True)


def expect(got, want, what):
    if got != want:
        fail(f"{what}: got {got!r}, want {want!r}")


def connect(port, **kwargs):
    try:
        return tarantool.Connection("127.0.0.1", port, socket_timeout=CALL_TIMEOUT, **kwargs)
    except tarantool.error.Error as e:
        fail(f"cannot connect to 127.0.0.1:{port}: {e!r}")


def call(conn, name, *args):
    """The IPROTO_DATA of a successful call (a list of the function's results)."""
    try:
        return conn.call(name, *args).data
    except DatabaseError as e:
        fail(f"{name}{args!r} failed: {e.args!r}")


def call_err(conn, name, *args, code, text):
    """Checks that the call fails with `code` and an error text containing `text`."""
    try:
        data = conn.call(name, *args).data
    except DatabaseError as e:
        got_code, message = e.args[0], e.args[1]
        if isinstance(message, bytes):
            message = message.decode(errors="replace")
        expect(got_code, code, f"error code of {name}{args!r} ({message!r})")
        if text not in message:
            fail(f"{name}{args!r}: error {message!r} does not contain {text!r}")
        return message
    fail(f"{name}{args!r} returned {data!r}, want the error {text!r}")


def task(data, what):
    """The one task in a CALL result: [[id, status, data]]."""
    if len(data) != 1 or not isinstance(data[0], list) or len(data[0]) != 3:
        fail(f"{what}: want one task [id, status, data], got {data!r}")
    return data[0]


class Ids:
    """Task ids seen so far, by tube: without `reference`, a new task never gets an id seen
    before in its tube."""

    def __init__(self):
        self.seen = set()

    def new(self, tube, t, what):
        if not isinstance(t[0], int) or t[0] < 0:
            fail(f"{what}: id {t[0]!r} is not a non-negative integer")
        if not REFERENCE and (tube, t[0]) in self.seen:
            fail(f"{what}: id {t[0]} was used before in {tube} (tarq never reuses an id)")
        self.seen.add((tube, t[0]))
        return t[0]


IDS = Ids()


def put(conn, tube, data, opts=None, status="r"):
    args = (data,) if opts is None else (data, opts)
    t = task(call(conn, f"queue.tube.{tube}:put", *args), f"put into {tube}")
    expect(t[1:], [status, data], f"put into {tube}: [status, data]")
    IDS.new(tube, t, f"put into {tube}")
    return t[0]


def take(conn, tube, timeout, want_id, data=None):
    got = call(conn, f"queue.tube.{tube}:take", timeout)
    if want_id is None:
        expect(got, [], f"take({timeout}) from {tube} with nothing ready")
        return None
    t = task(got, f"take from {tube}")
    expect(t[0], want_id, f"take from {tube}: id")
    expect(t[1], "t", f"take from {tube}: status")
    if data is not None:
        expect(t[2], data, f"take from {tube}: data")
    return t


def method(conn, tube, name, *args, status, id_=None):
    """Calls a task method and checks the status letter (and the id) of the task it returns."""
    t = task(call(conn, f"queue.tube.{tube}:{name}", *args), f"{tube}:{name}")
    expect(t[1], status, f"{tube}:{name}{args!r}: status")
    if id_ is not None:
        expect(t[0], id_, f"{tube}:{name}{args!r}: id")
    return t


def stats(conn, tube):
    data = call(conn, "queue.statistics", tube)
    # The original's keys, and tarq's beside them (consumers, the head's age, the idle mark).
    extra = {"consumers", "oldest_ready_age", "idle"}
    if len(data) != 1 or not {"tasks", "calls"} <= set(data[0]) <= {"tasks", "calls"} | extra:
        fail(f"statistics({tube}): want [{{tasks, calls}}], got {data!r}")
    s = data[0]
    expect(
        set(s["tasks"]),
        {"ready", "taken", "done", "buried", "delayed", "total"},
        "statistics tasks keys",
    )
    expect(
        set(s["calls"]),
        {"put", "take", "ack", "release", "bury", "kick", "delete", "touch", "ttl", "ttr", "delay"},
        "statistics calls keys",
    )
    return s


def create(conn, name, kind, opts=None):
    args = (name, kind) if opts is None else (name, kind, opts)
    data = call(conn, "queue.create_tube", *args)
    if len(data) != 1 or not isinstance(data[0], dict):
        fail(f"create_tube{args!r}: want one map describing the tube, got {data!r}")


def wait_until(what, check):
    """Polls `check` until it is true, failing after PARK_DEADLINE."""
    deadline = time.monotonic() + PARK_DEADLINE
    while not check():
        if time.monotonic() > deadline:
            fail(f"{what} did not happen within {PARK_DEADLINE}s")
        time.sleep(POLL_INTERVAL)


# ---------------------------------------------------------------------------------------------


def create_tubes(c):
    step("create_tube: each type, if_not_exists, existing tube, unknown type")
    for name, kind in [("f", "fifo"), ("ft", "fifottl"), ("u", "utube"), ("ut", "utubettl")]:
        create(c, name, kind)
    create(c, "l", "limfifottl", {"capacity": 2})
    create(c, "f", "fifo", {"if_not_exists": True})
    call_err(c, "queue.create_tube", "f", "fifo", code=ER_PROC_LUA, text="Space 'f' already exists")
    call_err(c, "queue.create_tube", "x", "fifox", code=ER_PROC_LUA, text="Unknown tube type fifox")
    expect(set(call(c, "queue.statistics")[0]), {"f", "ft", "u", "ut", "l"}, "tubes in statistics()")
    expect(call(c, "queue.state"), ["RUNNING"], "queue.state()")


def fifo_flow(c, o):
    step("fifo: put/take order, release, ack, peek, colon form errors")
    a, b = put(c, "f", "a"), put(c, "f", {"b": [1, 2]})
    take(c, "f", 0, a, "a")
    take(c, "f", 0, b, {"b": [1, 2]})
    take(c, "f", 0, None)
    call_err(o, "queue.tube.f:ack", a, code=ER_PROC_LUA, text="Task was not taken")
    method(c, "f", "release", a, status="r", id_=a)
    take(c, "f", 0, a)
    method(c, "f", "ack", a, status="-", id_=a)
    call_err(c, "queue.tube.f:ack", a, code=ER_PROC_LUA, text="Task was not taken")
    call_err(c, "queue.tube.f:peek", a, code=ER_PROC_LUA, text=f"Task {a} not found")
    call_err(c, "queue.tube.f:touch", b, 1, code=ER_PROC_LUA, text="fifo queue does not support touch")
    call_err(c, "queue.tube.f:nosuch", code=ER_NO_SUCH_PROC,
             text="Procedure 'queue.tube.f:nosuch' is not defined")
    call_err(c, "queue.tube.nope:put", "x", code=ER_NO_SUCH_PROC,
             text="Procedure 'queue.tube.nope:put' is not defined")

    step("fifo: bury, kick, delete")
    method(c, "f", "bury", b, status="!", id_=b)
    d = put(c, "f", "d")
    method(c, "f", "bury", d, status="!", id_=d)
    expect(call(c, "queue.tube.f:kick", 1), [1], "kick(1) with two buried")
    method(c, "f", "peek", b, status="r", id_=b)
    method(c, "f", "peek", d, status="!", id_=d)
    expect(call(c, "queue.tube.f:kick", 10), [1], "kick(10) with one buried")
    expect(call(c, "queue.tube.f:kick", 10), [0], "kick(10) with none buried")
    method(c, "f", "delete", d, status="-", id_=d)
    call_err(c, "queue.tube.f:delete", d, code=ER_PROC_LUA, text=f"Task {d} not found")
    call_err(c, "queue.tube.f:bury", MISSING_ID, code=ER_PROC_LUA, text=f"Task {MISSING_ID} not found")

    step("fifo: a parked take is woken by a put on another connection")
    take(c, "f", 0, b)
    method(c, "f", "ack", b, status="-")
    result = {}
    waiter = threading.Thread(target=lambda: result.update(t=call(o, "queue.tube.f:take", WAKE_TIMEOUT)))
    started = time.monotonic()
    waiter.start()
    # The server shows no parked takes, so the put may land before the take parks; either way
    # the take must return this task well within its timeout.
    e = put(c, "f", "wake")
    waiter.join(CALL_TIMEOUT)
    t = task(result.get("t", []), "the woken take")
    expect(t[:2], [e, "t"], "the woken take")
    if time.monotonic() - started > WAKE_TIMEOUT:
        fail("the take was not woken by the put")
    method(o, "f", "ack", e, status="-")

    step("fifo: statistics counters")
    s = stats(c, "f")
    expect(s["tasks"], {"ready": 0, "taken": 0, "done": 4, "buried": 0, "delayed": 0, "total": 0},
           "statistics(f).tasks")
    expect(s["calls"]["put"], 4, "calls.put")
    expect(s["calls"]["take"], 5, "calls.take")
    expect(s["calls"]["ack"], 3, "calls.ack")
    expect(s["calls"]["delete"], 1, "calls.delete")
    expect(s["calls"]["bury"], 2, "calls.bury")
    expect(s["calls"]["kick"], 2, "calls.kick")
    expect(s["calls"]["release"], 1, "calls.release")
    # The original counts touch before the driver refuses it.
    expect(s["calls"]["touch"], 1, "calls.touch")


def fifottl_flow(c, o):
    step("fifottl: priorities, delay, TTR, touch, release with delay, TTL")
    p2 = put(c, "ft", "p2", {"pri": 2})
    p0 = put(c, "ft", "p0")
    p1 = put(c, "ft", "p1", {"pri": 1})
    for want in (p0, p1, p2):
        take(c, "ft", 0, want)
    for i in (p0, p1, p2):
        method(c, "ft", "ack", i, status="-")

    d = put(c, "ft", "later", {"delay": DELAY, "ttr": TTR}, status="~")
    take(c, "ft", 0, None)
    started = time.monotonic()
    take(c, "ft", WAKE_TIMEOUT, d)
    if time.monotonic() - started < DELAY / 2:
        fail("the delayed task was taken long before its delay")
    take(o, "ft", WAKE_TIMEOUT, d)  # back to ready after TTR, taken by o
    call_err(c, "queue.tube.ft:ack", d, code=ER_PROC_LUA, text="Task was not taken")
    method(o, "ft", "touch", d, 60, status="t", id_=d)
    take(c, "ft", SHORT_TIMEOUT, None)  # touched: no TTR return now
    method(o, "ft", "release", d, {"delay": DELAY}, status="~", id_=d)
    take(c, "ft", WAKE_TIMEOUT, d)
    method(c, "ft", "ack", d, status="-")

    dies = put(c, "ft", "short", {"ttl": TTL})
    method(c, "ft", "bury", dies, status="!")
    wait_until("the TTL expiry of a buried task", lambda: stats(c, "ft")["tasks"]["total"] == 0)
    s = stats(c, "ft")
    expect(s["calls"]["ttl"], 1, "calls.ttl")
    expect(s["calls"]["ttr"], 1, "calls.ttr")
    expect(s["calls"]["delay"], 2, "calls.delay")
    # A successful touch counts twice in the original (the method and the driver).
    expect(s["calls"]["touch"], 2, "calls.touch")


def limfifottl_flow(c, o):
    step("limfifottl: capacity; a put waits up to opts.timeout, else returns nil")
    a = put(c, "l", 1)
    put(c, "l", 2)
    expect(call(c, "queue.tube.l:put", 3), [None], "put into a full tube")
    started = time.monotonic()
    expect(call(c, "queue.tube.l:put", 3, {"timeout": SHORT_TIMEOUT}), [None], "put with timeout")
    if time.monotonic() - started < SHORT_TIMEOUT:
        fail("the put into a full tube returned before its timeout")
    take(c, "l", 0, a)
    result = {}
    waiter = threading.Thread(
        target=lambda: result.update(t=call(o, "queue.tube.l:put", 3, {"timeout": WAKE_TIMEOUT})))
    waiter.start()
    method(c, "l", "ack", a, status="-")
    waiter.join(CALL_TIMEOUT)
    t = task(result.get("t", []), "the waiting put")
    expect(t[1:], ["r", 3], "the waiting put got room")
    IDS.new("l", t, "the waiting put")


def utube_flow(c, o, tube):
    step(f"{tube}: one taken task per utube, FIFO inside a utube")
    a1 = put(c, tube, "a1", {"utube": "a"})
    a2 = put(c, tube, "a2", {"utube": "a"})
    b1 = put(c, tube, "b1", {"utube": "b"})
    take(c, tube, 0, a1)
    if tube == "u":
        call_err(c, "queue.tube.u:touch", a1, 1, code=ER_PROC_LUA,
                 text="utube queue does not support touch")
    take(o, tube, 0, b1)
    take(o, tube, 0, None)
    result = {}
    waiter = threading.Thread(target=lambda: result.update(t=call(o, f"queue.tube.{tube}:take", WAKE_TIMEOUT)))
    waiter.start()
    method(c, tube, "ack", a1, status="-")
    waiter.join(CALL_TIMEOUT)
    t = task(result.get("t", []), "the take woken by the ack")
    expect(t[:2], [a2, "t"], "the next task of utube a after the ack")
    method(o, tube, "bury", b1, status="!")
    expect(call(o, f"queue.tube.{tube}:kick", 1), [1], "kick")
    method(o, tube, "release", a2, status="r")
    take(c, tube, 0, a2)
    take(c, tube, 0, b1)
    method(c, tube, "ack", a2, status="-")
    method(c, tube, "ack", b1, status="-")


def call16_flow(port):
    step("CALL_16: each result wrapped as a tuple (a task stays an array)")
    c16 = connect(port, call_16=True)
    i = task(call(c16, "queue.tube.f:put", "x16"), "put over CALL_16")[0]
    IDS.new("f", [i], "put over CALL_16")
    expect(call(c16, "queue.tube.f:take", 0)[0][:2], [i, "t"], "take over CALL_16")
    expect(call(c16, "queue.tube.f:take", 0), [], "empty take over CALL_16")
    expect(call(c16, "queue.tube.f:kick", 1), [[0]], "kick over CALL_16")
    expect(call(c16, "queue.state"), [["RUNNING"]], "state over CALL_16")
    s = call(c16, "queue.statistics", "f")
    if len(s) != 1 or len(s[0]) != 1 or not {"tasks", "calls"} <= set(s[0][0]):
        fail(f"statistics over CALL_16: want [[{{tasks, calls}}]], got {s!r}")
    expect(call(c16, "queue.tube.f:ack", i)[0][:2], [i, "-"], "ack over CALL_16")
    expect(call(c16, "queue.tube.f:truncate"), [], "truncate over CALL_16")
    call_err(c16, "queue.tube.f:ack", i, code=ER_PROC_LUA, text="Task was not taken")
    c16.close()


def session_flow(port, c):
    step("sessions: cfg{ttr}, identify after reconnect, ack the task taken before")
    expect(call(c, "queue.cfg", {"ttr": 60}), [], "queue.cfg{ttr = 60}")
    # The session uuid is 16 raw bytes in an MP_STR: read it without UTF-8 decoding.
    s1 = connect(port, encoding=None)
    uuid = call(s1, "queue.identify")[0]
    if not isinstance(uuid, bytes) or len(uuid) != 16:
        fail(f"identify(): want a 16-byte string, got {uuid!r}")
    expect(call(s1, "queue.identify")[0], uuid, "identify() again")
    i = put(c, "ft", "resume")
    got = call(s1, "queue.tube.ft:take", 0)
    expect(got[0][:2], [i, b"t"], "take before the disconnect")
    s1.close()
    s2 = connect(port, encoding=None)
    expect(call(s2, "queue.identify", uuid), [uuid], "identify(uuid) after reconnect")
    expect(call(s2, "queue.tube.ft:ack", i)[0][:2], [i, b"-"], "ack after reconnect")
    s2.close()
    call_err(c, "queue.cfg", {"ttr": -1}, code=ER_PROC_LUA, text="Invalid value of ttr: -1")
    call_err(c, "queue.cfg", {"nope": 1}, code=ER_PROC_LUA, text="Unknown option nope")
    call_err(c, "queue.identify", "short", code=ER_PROC_LUA, text="Invalid UUID format.")
    call_err(c, "queue.identify", "0123456789abcdef", code=ER_PROC_LUA,
             text="The UUID 33323130-3534-3736-3839-616263646566 is unknown.")

    step("sessions: without ttr a disconnect releases the task at once")
    expect(call(c, "queue.cfg", {"ttr": 0}), [], "queue.cfg{ttr = 0}")
    j = put(c, "ft", "released")
    s3 = connect(port)
    take(s3, "ft", 0, j)
    s3.close()
    take(c, "ft", WAKE_TIMEOUT, j)
    method(c, "ft", "ack", j, status="-")


def numbering_flow(c):
    step("numbering: a fresh tube counts from 0; the statistics tests' calls by number")
    create(c, "n", "fifottl")
    ids = [put(c, "n", f"n{i}") for i in range(5)]
    expect(ids, [0, 1, 2, 3, 4], "ids of five puts into a fresh tube")
    method(c, "n", "delete", 4, status="-", id_=4)
    take(c, "n", 0, 0, "n0")
    method(c, "n", "release", 0, status="r", id_=0)
    take(c, "n", 0, 0, "n0")
    method(c, "n", "ack", 0, status="-", id_=0)
    method(c, "n", "bury", 1, status="!", id_=1)
    method(c, "n", "bury", 2, status="!", id_=2)
    tasks = stats(c, "n")["tasks"]
    expect([tasks["total"], tasks["ready"], tasks["buried"]], [3, 1, 2], "tasks after the flow")
    # The original gives a deleted newest task's id again (max + 1): a late ack or delete of
    # the old task would hit the new one. tarq goes on counting.
    method(c, "n", "delete", 3, status="-", id_=3)
    again = put(c, "n", "again")
    expect(again, 3 if REFERENCE else 5, "the id after the newest task was deleted")
    expect(call(c, "queue.tube.n:drop"), [True], "drop()")


def drop_flow(c):
    step("drop: refused while a task is taken; then the tube is gone; release_all")
    i = put(c, "ut", "last", {"utube": "z"})
    take(c, "ut", 0, i)
    call_err(c, "queue.tube.ut:drop", code=ER_PROC_LUA, text="There are taken tasks in the tube")
    expect(call(c, "queue.tube.ut:release_all"), [], "release_all()")
    method(c, "ut", "peek", i, status="r")
    expect(call(c, "queue.tube.ut:truncate"), [], "truncate()")
    expect(stats(c, "ut")["tasks"]["total"], 0, "tasks after truncate")
    expect(call(c, "queue.tube.ut:drop"), [True], "drop()")
    call_err(c, "queue.tube.ut:put", "x", code=ER_NO_SUCH_PROC,
             text="Procedure 'queue.tube.ut:put' is not defined")
    if "ut" in call(c, "queue.statistics")[0]:
        fail("a dropped tube is still in statistics()")


def main():
    global REFERENCE
    if len(sys.argv) < 2:
        print("usage: python3 python_tubes.py <port> [reference]", file=sys.stderr)
        sys.exit(2)
    port = int(sys.argv[1])
    REFERENCE = sys.argv[2:] == ["reference"]
    try:
        c, o = connect(port), connect(port)
        # No tubes: the original sends its empty Lua table as an empty array.
        if call(c, "queue.statistics") not in ([{}], [[]]):
            fail("the server is not fresh: it has tubes")
        create_tubes(c)
        fifo_flow(c, o)
        fifottl_flow(c, o)
        limfifottl_flow(c, o)
        utube_flow(c, o, "u")
        utube_flow(c, o, "ut")
        call16_flow(port)
        session_flow(port, c)
        numbering_flow(c)
        drop_flow(c)
    except Failure as e:
        print(f"FAIL: {e}", file=sys.stderr)
        sys.exit(1)
    print("\nOK: python tubes flow passed", flush=True)


if __name__ == "__main__":
    main()
