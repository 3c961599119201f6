"""The seed's queue flow driven through the PyPI `tarantool` connector, unchanged.

    python3 python_flow.py <port> [reference]

Needs a fresh (empty) queue on 127.0.0.1:<port>; leaves it empty. Prints one line per step and
"OK" at the end; on the first mismatch prints "FAIL: <what>" to stderr and exits 1.

`reference` runs the same checks against the seed queue on a real Tarantool, which differs from
tarq only where API.md / IPROTO.md say it does: ids are wall-clock nanoseconds (printed with an
`ULL` suffix in messages), Lua errors carry a "file:line: " prefix, and binary payloads come
back as strings.
"""

import re
import sys
import threading
import time

import tarantool
from tarantool.error import DatabaseError

# Bound on every socket read, so that a server that never answers fails the script instead of
# hanging it (blocking takes wait at most WAKE_TIMEOUT + DELAY below this).
CALL_TIMEOUT = 20.0
# How long a take waits for a task that should become ready (a disconnect, a put, a delay):
# the seed polls delays once a second, so this leaves room on a loaded machine.
WAKE_TIMEOUT = 5.0
# The delay of the delayed put, in seconds: long enough for a few calls to see it waiting.
DELAY = 1.0
# A take timeout that must run out (nothing will be put): short, to keep the flow fast.
SHORT_TIMEOUT = 0.2
# Clock slack when comparing this client's clock with a runat the server computed.
CLOCK_SLACK = 0.05
# How long to wait for the server to show a parked take (polling queue.stats).
PARK_DEADLINE = 5.0
# An id no fresh queue holds: tarq counts from 1, the seed's ids are ~1.8e18.
MISSING_ID = 99999999999

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


class Conn(tarantool.Connection):
    """A plain connector connection that also tells when a request has left the socket."""

    def __init__(self, *args, **kwargs):
        self.sent = threading.Event()
        super().__init__(*args, **kwargs)

    def _sendall(self, data):  # the connector's one write path (1.x)
        super()._sendall(data)
        self.sent.set()


def connect(port, **kwargs):
    try:
        return Conn("127.0.0.1", port, socket_timeout=CALL_TIMEOUT, **kwargs)
    except tarantool.error.Error as e:
        fail(f"cannot connect to 127.0.0.1:{port}: {e!r}")


def call(conn, fn, *args):
    """The call's DATA (the list of returned values); a server error fails the step."""
    try:
        return list(conn.call(fn, *args).data)
    except DatabaseError as e:
        fail(f"{fn}{args!r} raised code {e.code}: {e.message!r}")


def check_task(t, what, id=None, status=None, data=None):
    if not isinstance(t, dict):
        fail(f"{what}: got {t!r}, want a task map")
    for key in ("id", "status", "runat", "data"):
        if key not in t:
            fail(f"{what}: task {t!r} has no {key!r}")
    tid = t["id"]
    if not isinstance(tid, int) or isinstance(tid, bool) or tid < 1:
        fail(f"{what}: id {tid!r} is not a positive integer")
    if id is not None:
        expect(tid, id, f"{what}: id")
    expect(t["status"], status, f"{what}: status")
    if status != "W":
        expect(t["runat"], 0, f"{what}: runat")
    if data is not None:
        expect(t["data"], data, f"{what}: data")
    return t


def call_task(conn, fn, *args, **want):
    """Calls `fn`, which must return exactly one task matching `want`."""
    res = call(conn, fn, *args)
    if len(res) != 1:
        fail(f"{fn}{args!r} returned {len(res)} values: {res!r}")
    return check_task(res[0], fn, **want)


def take_none(conn, timeout):
    res = call(conn, "queue.take", timeout)
    if res:
        fail(f"queue.take({timeout}) returned {res!r}, want no value")


def normalise(msg):
    if REFERENCE:
        msg = re.sub(r"^[^:]*:\d+: ", "", msg)
        msg = re.sub(r"(\d)U?LL", r"\1", msg)
    return msg


def call_error(conn, fn, *args, code, want):
    """Calls `fn`, which must fail with `code` and a message equal to `want` (a str) or fully
    matching `want` (a compiled regex, whose groups are returned)."""
    try:
        res = conn.call(fn, *args)
    except DatabaseError as e:
        msg = normalise(e.message)
        if e.code != code:
            fail(f"{fn}{args!r}: error code {e.code} ({e.message!r}), want {code}")
        if isinstance(want, str):
            if msg != want:
                fail(f"{fn}{args!r}: message {msg!r}, want {want!r}")
            return None
        m = want.fullmatch(msg)
        if not m:
            fail(f"{fn}{args!r}: message {msg!r} does not match {want.pattern!r}")
        return tuple(int(g) for g in m.groups())
    fail(f"{fn}{args!r} succeeded with {list(res.data)!r}, want error {want!r}")


def stats(conn):
    res = call(conn, "queue.stats")
    if len(res) != 1 or not isinstance(res[0], dict):
        fail(f"queue.stats returned {res!r}")
    return res[0]


def check_stats(conn, **want):
    s = stats(conn)
    for k, v in want.items():
        if s.get(k) != v:
            fail(f"queue.stats: {k} = {s.get(k)!r}, want {v} (all: {s!r})")


def ownership(id):
    return re.compile(rf"Task {id} taken by (\d+)\. Not you \((\d+)\)")


def main(port):
    step("connect, ping, an empty queue")
    if not hasattr(tarantool.Connection, "_sendall"):
        fail(f"connector {tarantool.__version__} has no Connection._sendall for Conn to hook")
    c1 = connect(port)
    c1.ping()
    check_stats(c1, total=0, ready=0, taken=0, waiting=0)

    step("put returns the task, data as sent")
    t1 = call_task(c1, "queue.put", "hello", status="R", data="hello")
    nested = {"k": [1, 2.5, "x", None, True], "n": {"deep": [[-7]]}}
    if not REFERENCE:
        # bytes go out as MP_BIN; tarq returns the payload's bytes as received, while the seed
        # passes it through a Lua string and answers MP_STR (not valid UTF-8 here).
        nested["b"] = b"\x00\xff"
    t2 = call_task(c1, "queue.put", nested, status="R", data=nested)
    if not t2["id"] > t1["id"]:
        fail(f"ids not increasing: {t1['id']} then {t2['id']}")
    check_stats(c1, total=2, ready=2, taken=0, waiting=0)
    id1, id2 = t1["id"], t2["id"]

    step("take, release, take again, ack")
    call_task(c1, "queue.take", id=id1, status="T", data="hello")
    check_stats(c1, total=2, ready=1, taken=1, waiting=0)
    call_task(c1, "queue.release", id1, id=id1, status="R", data="hello")
    check_stats(c1, total=2, ready=2, taken=0, waiting=0)
    # A released task goes back to its place by id: taken again before the newer t2.
    call_task(c1, "queue.take", 0, id=id1, status="T")
    call_task(c1, "queue.ack", id1, id=id1, status="T", data="hello")
    check_stats(c1, total=1, ready=1, taken=0, waiting=0)

    step("errors: not found, not taken, id required, unknown procedure")
    call_error(c1, "queue.ack", id1, code=32, want=f"Task {{{id1}}} was not found")
    call_error(c1, "queue.ack", MISSING_ID, code=32, want=f"Task {{{MISSING_ID}}} was not found")
    call_error(
        c1, "queue.release", str(MISSING_ID), code=32, want=f"Task {{{MISSING_ID}}} was not found"
    )
    call_error(c1, "queue.ack", id2, code=32, want=f"Task {id2} not taken by anybody")
    call_error(c1, "queue.release", id2, code=32, want=f"Task {id2} not taken by anybody")
    call_error(c1, "queue.ack", code=32, want="Task id required")
    call_error(c1, "queue.nope", code=33, want="Procedure 'queue.nope' is not defined")
    check_stats(c1, total=1, ready=1, taken=0, waiting=0)

    step("ownership: only the session that took a task may ack or release it")
    c2 = connect(port)
    call_task(c1, "queue.take", id=id2, status="T", data=nested)
    owner1, caller2 = call_error(c2, "queue.ack", id2, code=32, want=ownership(id2))
    again = call_error(c2, "queue.release", id2, code=32, want=ownership(id2))
    expect(again, (owner1, caller2), "session ids of the same two sessions")
    if owner1 == caller2:
        fail(f"two connections share session id {owner1}")
    id3 = call_task(c2, "queue.put", "three", status="R", data="three")["id"]
    call_task(c2, "queue.take", id=id3, status="T")
    seen = call_error(c1, "queue.ack", id3, code=32, want=ownership(id3))
    expect(seen, (caller2, owner1), "session ids seen the other way round")
    check_stats(c1, total=2, ready=0, taken=2, waiting=0)

    step("id as a decimal string")
    call_task(c1, "queue.release", str(id2), id=id2, status="R")
    call_task(c1, "queue.take", id=id2, status="T")
    call_task(c1, "queue.ack", str(id2), id=id2, status="T", data=nested)
    call_task(c2, "queue.ack", id3, id=id3, status="T", data="three")
    check_stats(c1, total=0, ready=0, taken=0, waiting=0)

    step("auto-release: a task taken by a connection that closes is ready again")
    id4 = call_task(c1, "queue.put", "orphan", status="R")["id"]
    c3 = connect(port)
    call_task(c3, "queue.take", id=id4, status="T")
    take_none(c1, 0)
    check_stats(c1, total=1, ready=0, taken=1, waiting=0)
    c3.close()
    call_task(c1, "queue.take", WAKE_TIMEOUT, id=id4, status="T", data="orphan")
    call_task(c1, "queue.ack", id4, id=id4, status="T")

    step("a blocking take is woken by a put from another connection")
    c4 = connect(port)
    result = {}

    def blocking_take():
        try:
            result["data"] = list(c4.call("queue.take", WAKE_TIMEOUT).data)
        except Exception as e:  # reported by the main thread
            result["error"] = e

    c4.sent.clear()
    taker = threading.Thread(target=blocking_take, daemon=True)
    taker.start()
    if not c4.sent.wait(PARK_DEADLINE):
        fail(f"the take was not sent within {PARK_DEADLINE}s")
    # tarq reports parked takes: wait until the server holds this one. The seed has no such
    # figure; there the take has at least left the socket before the put.
    deadline = time.monotonic() + PARK_DEADLINE
    while "parked_takes" in (s := stats(c1)) and s["parked_takes"] < 1:
        if time.monotonic() > deadline:
            fail(f"no parked take within {PARK_DEADLINE}s: {s!r}")
        time.sleep(0.005)  # polling interval of the wait above, not a synchronisation
    if result:
        fail(f"take({WAKE_TIMEOUT}) answered before any put: {result!r}")
    id5 = call_task(c2, "queue.put", "wake", status="R")["id"]
    taker.join(WAKE_TIMEOUT + CALL_TIMEOUT)
    if taker.is_alive():
        fail("the parked take did not return")
    if "error" in result:
        fail(f"parked take raised {result['error']!r}")
    if len(result["data"]) != 1:
        fail(f"parked take returned {result['data']!r}, want one task")
    check_task(result["data"][0], "parked take", id=id5, status="T", data="wake")
    call_task(c4, "queue.ack", id5, id=id5, status="T")
    c4.close()

    step("delayed put: waiting until runat, then takeable")
    before = time.time()
    t6 = call_task(c1, "queue.put", "later", {"delay": DELAY}, status="W")
    after = time.time()
    runat = t6["runat"]
    if not before + DELAY - CLOCK_SLACK <= runat <= after + DELAY + CLOCK_SLACK:
        fail(f"runat {runat}, want now + {DELAY} (now between {before} and {after})")
    s = stats(c1)
    if time.time() < runat - CLOCK_SLACK:
        got = (s["total"], s["ready"], s["waiting"], s["taken"])
        expect(got, (1, 0, 1, 0), "stats total/ready/waiting/taken")
    # Taking the task before runat is the failure; taking nothing is right until runat.
    early = call(c1, "queue.take", 0)
    if early and time.time() < runat - CLOCK_SLACK:
        fail(f"took {early!r} at {time.time()}, before its runat {runat}")
    if not early:
        call_task(c1, "queue.take", WAKE_TIMEOUT + DELAY, id=t6["id"], status="T", data="later")
        now = time.time()
        if now < runat - CLOCK_SLACK:
            fail(f"took the delayed task at {now}, before its runat {runat}")
    call_task(c1, "queue.ack", t6["id"], id=t6["id"], status="T", data="later")

    step("call_16: every result is an array of tuples")
    c16 = connect(port, call_16=True)

    def call16(fn, *args):
        return call(c16, fn, *args)

    res = call16("queue.take")
    expect(res, [], "call_16 queue.take on an empty queue")
    res = call16("queue.put", "c16")
    if len(res) != 1 or not isinstance(res[0], list) or len(res[0]) != 1:
        fail(f"call_16 queue.put returned {res!r}, want [[task]]")
    id7 = check_task(res[0][0], "call_16 queue.put", status="R", data="c16")["id"]
    res = call16("queue.take", 0)
    if len(res) != 1 or len(res[0]) != 1:
        fail(f"call_16 queue.take returned {res!r}, want [[task]]")
    check_task(res[0][0], "call_16 queue.take", id=id7, status="T", data="c16")
    res = call16("queue.ack", id7)
    if len(res) != 1 or len(res[0]) != 1:
        fail(f"call_16 queue.ack returned {res!r}, want [[task]]")
    check_task(res[0][0], "call_16 queue.ack", id=id7, status="T")
    res = call16("queue.stats")
    if len(res) != 1 or len(res[0]) != 1 or not isinstance(res[0][0], dict):
        fail(f"call_16 queue.stats returned {res!r}, want [[stats]]")
    expect(res[0][0]["total"], 0, "call_16 queue.stats total")
    c16.close()

    step("a take that times out answers no value, after its timeout")
    before = time.monotonic()
    take_none(c1, SHORT_TIMEOUT)
    waited = time.monotonic() - before
    if waited < SHORT_TIMEOUT - CLOCK_SLACK:
        fail(f"take({SHORT_TIMEOUT}) answered after {waited:.3f} s, before its timeout")

    step("the queue is empty again")
    check_stats(c1, total=0, ready=0, taken=0, waiting=0)
    c1.close()
    c2.close()


if __name__ == "__main__":
    if len(sys.argv) < 2 or not sys.argv[1].isdigit():
        sys.exit("usage: python3 python_flow.py <port> [reference]")
    REFERENCE = sys.argv[2:3] == ["reference"]
    port = int(sys.argv[1])
    try:
        main(port)
    except Failure as e:
        print(f"FAIL: {e}", file=sys.stderr)
        sys.exit(1)
    print(
        f"OK: python connector {tarantool.__version__} flow passed against 127.0.0.1:{port}"
        + (" (reference)" if REFERENCE else "")
    )
