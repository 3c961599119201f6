"""Every beanstalk command a client can send, driven through greenstalk (PyPI), unchanged.

    python3 greenstalk_flow.py <host> <port>

Needs a fresh server (no jobs, no tubes but `default`) on <host>:<port>. Prints a normalised
transcript, one line per step, and "end of flow" last. A protocol error greenstalk raises is
part of the transcript (its class name), and so is a reply it does not know; anything else (a
closed connection, a read that times out) fails the script with exit code 1. The transcript is what
`net/tests/beanstalk_clients.rs` compares between real beanstalkd and tarq, so it holds only what
must be equal on both; what legitimately differs is normalised here:

- job ids become #1, #2, ... in order of appearance (tarq's ids come from its task counter);
- times (`age`, `time-left`, `pause-time-left`) become a bound check, they move with the clock;
- `stats` keeps only what clients parse (`version` looking like a beanstalkd version, `pid`) and
  the job counters: the rest is per-process (uptime, rusage, hostname, binlog, id), counts
  connections or tubes, or counts commands
  (the `stats-tube` polls below make those vary from run to run); tarq also adds keys of its own;
- `stats-job`'s `delay` of a job that is no longer delayed is only checked to be there:
  beanstalkd keeps the delay it was last given, tarq keeps only what is left of a delay (0 once
  it is over, README "The beanstalkd protocol"). A delayed job's `delay` is compared: just after
  the put or release, what is left rounded up is the delay. The per-job counters (`reserves`,
  `timeouts`, `releases`, `buries`, `kicks`) are compared as they are;
- `list-tubes` is sorted, and compared whole: a tube is forgotten once empty and unused on
  both.

Waits are for events, never fixed sleeps: a reserve-with-timeout that must wait gets what a
delay, a pause, or another connection's put or disconnect makes ready; a TTR running out and a
reserve waiting are polled for (stats-job, stats-tube) with a deadline. The waits that need
protocol time use 1 s; the whole flow takes about 3 s.
"""

import re
import socket
import sys
import threading
import time

import greenstalk

# Bound on every socket read, so that a server that never answers fails the script instead of
# hanging it; the longest wait asked of the server is WAKE_TIMEOUT.
CALL_TIMEOUT = 20.0
# How long a reserve-with-timeout waits for a job that must come (a delay, a pause or a TTR of
# 1 s running out, a put or a disconnect on another connection): room for a loaded machine.
WAKE_TIMEOUT = 5
# How long to wait for the server to show a reserve waiting (polling stats-tube).
WAIT_DEADLINE = 5.0
# Pause between two polls of the server while waiting for a state (not a wait for an event).
POLL_INTERVAL = 0.005
# A delay no step lets run out: jobs that must stay delayed until kicked.
LONG_DELAY = 100
# An id no fresh server holds.
MISSING_ID = 999999
# Every tube the flow makes.
TUBES = ["flow", "short", "wait", "gone", "paused"]
# The keys of stats-job and stats-tube that protocol.txt lists, in its order.
STATS_JOB_KEYS = ["id", "tube", "state", "pri", "age", "delay", "ttr", "time-left", "file",
                  "reserves", "timeouts", "releases", "buries", "kicks"]
STATS_TUBE_KEYS = ["name", "current-jobs-urgent", "current-jobs-ready", "current-jobs-reserved",
                   "current-jobs-delayed", "current-jobs-buried", "total-jobs", "current-using",
                   "current-waiting", "current-watching", "pause", "cmd-delete", "cmd-pause-tube",
                   "pause-time-left"]
# The job counters of `stats` compared between servers.
STATS_COUNTERS = ["current-jobs-urgent", "current-jobs-ready", "current-jobs-reserved",
                  "current-jobs-delayed", "current-jobs-buried", "total-jobs", "job-timeouts",
                  "max-job-size"]
# What a beanstalkd version looks like to clients: "1.12", "1.13.1".
VERSION = re.compile(r"\d+\.\d+(\.\d+)*([-+][0-9A-Za-z.+-]*)?")


class Ids:
    """Job ids renamed #1, #2, ... in the order they first appear."""

    def __init__(self):
        self.names = {}

    def __call__(self, job_id):
        if job_id not in self.names:
            self.names[job_id] = f"#{len(self.names) + 1}"
        return self.names[job_id]


ids = Ids()


def say(step, result):
    print(f"{step}: {result}", flush=True)


def job(j):
    return f"job {ids(j.id)} {j.body!r}"


def step(name, call, show=str):
    """Runs `call`, prints its result through `show` or the protocol error greenstalk raised,
    and returns the result (None after an error)."""
    try:
        result = call()
    except greenstalk.BeanstalkdError as e:
        say(name, type(e).__name__)
        return None
    except greenstalk.UnknownResponseError as e:
        # Shown in the transcript, so the comparison points at the first reply that differs.
        say(name, f"UnknownResponseError {e.status!r} {e.values!r}")
        return None
    say(name, show(result))
    return result


def ok(_):
    return "ok"


def connect(host, port):
    sock = socket.create_connection((host, port), timeout=CALL_TIMEOUT)
    return greenstalk.Client(sock)


def bounded(value, bound):
    """A time reported by the server: between 0 and the time it was set to."""
    if isinstance(value, int) and isinstance(bound, int) and 0 <= value <= bound:
        return f"<={bound}"
    return f"{value!r}?"


def stats_job(s):
    if s is None:
        return "NotFoundError"
    out = []
    for key in STATS_JOB_KEYS:
        if key not in s:
            out.append(f"{key}=<missing>")
            continue
        v = s[key]
        if key == "id":
            v = ids(v)
        elif key == "age":
            v = bounded(v, 60)
        elif key == "time-left" and s.get("state") == "reserved":
            v = bounded(v, s.get("ttr"))
        elif key == "time-left" and s.get("state") == "delayed":
            v = bounded(v, s.get("delay"))
        elif key == "delay" and s.get("state") != "delayed":
            v = "n" if isinstance(v, int) and v >= 0 else f"{v!r}?"
        out.append(f"{key}={v}")
    return " ".join(out)


def stats_tube(s):
    out = []
    for key in STATS_TUBE_KEYS:
        v = s.get(key, "<missing>")
        if key == "pause-time-left":
            v = bounded(v, s.get("pause"))
        out.append(f"{key}={v}")
    return " ".join(out)


def stats(s):
    version = s.get("version")
    out = [
        "version=" + ("beanstalkd-like" if isinstance(version, str) and VERSION.fullmatch(version)
                      else f"{version!r}?"),
        "pid=" + ("present" if isinstance(s.get("pid"), int) and s["pid"] > 0
                  else f"{s.get('pid')!r}?"),
    ]
    out += [f"{key}={s.get(key, '<missing>')}" for key in STATS_COUNTERS]
    return " ".join(out)


def tubes(names):
    """list-tubes in name order."""
    return repr(sorted(names))


def wait_for(what, cond):
    deadline = time.monotonic() + WAIT_DEADLINE
    while not cond():
        if time.monotonic() > deadline:
            raise SystemExit(f"FAIL: {what} not seen within {WAIT_DEADLINE} s")
        time.sleep(POLL_INTERVAL)


def in_thread(call):
    """Starts `call` on a thread; the returned function joins it and returns (result, error)."""
    box = {}

    def run():
        try:
            box["result"] = call()
        except greenstalk.BeanstalkdError as e:
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()

    def join():
        t.join(CALL_TIMEOUT)
        if t.is_alive():
            raise SystemExit("FAIL: the waiting reserve never returned")
        return box.get("result"), box.get("error")

    return join


def main(host, port):
    a = connect(host, port)

    # --- a fresh connection, a fresh server
    step("list-tube-used", a.using)
    step("list-tubes-watched", a.watching)
    step("stats (fresh)", a.stats, stats)
    step("stats-tube nosuch", lambda: a.stats_tube("nosuch"), stats_tube)

    # --- put and peek: priorities, delays, bodies with CRLF and UTF-8, the empty body
    step("use flow", lambda: a.use("flow"), ok)
    step("list-tube-used", a.using)
    j1 = step("put hello pri=10 ttr=60", lambda: a.put("hello", priority=10, ttr=60), ids)
    step("put world pri=5", lambda: a.put("world", priority=5), ids)
    j3 = step("put later pri=0 delay=100",
              lambda: a.put("later", priority=0, delay=LONG_DELAY), ids)
    j4 = step("put crlf pri=max", lambda: a.put("line1\r\nline2 \u00fc", priority=2**32 - 1), ids)
    j5 = step("put empty pri=1024 delay=200",
              lambda: a.put("", priority=1024, delay=2 * LONG_DELAY), ids)
    step("peek-ready", a.peek_ready, job)
    step("peek-delayed", a.peek_delayed, job)
    step("peek-buried", a.peek_buried, job)
    for name, jid in [("j1", j1), ("j4", j4), ("j5", j5)]:
        step(f"peek {name}", lambda jid=jid: a.peek(jid), job)
    step("peek missing", lambda: a.peek(MISSING_ID), job)
    step("stats-job j3", lambda: a.stats_job(j3), stats_job)
    step("stats-job missing", lambda: a.stats_job(MISSING_ID), stats_job)
    step("stats-tube flow", lambda: a.stats_tube("flow"), stats_tube)
    step("stats (jobs put)", a.stats, stats)

    # --- watch and ignore
    step("watch flow", lambda: a.watch("flow"))
    step("ignore default", lambda: a.ignore("default"))
    step("ignore flow (the last)", lambda: a.ignore("flow"))
    step("list-tubes-watched", a.watching)

    # --- reserve, touch, release, bury, kick
    r = step("reserve-with-timeout 0", lambda: a.reserve(timeout=0), job)
    step("stats-job (reserved)", lambda: a.stats_job(r), stats_job)
    step("touch", lambda: a.touch(r), ok)
    step("release pri=20", lambda: a.release(r, priority=20), ok)
    step("release again", lambda: a.release(r, priority=20), ok)
    step("peek-ready", a.peek_ready, job)
    r = step("reserve", a.reserve, job)
    step("bury pri=7", lambda: a.bury(r, priority=7), ok)
    step("bury again", lambda: a.bury(r, priority=7), ok)
    step("peek-buried", a.peek_buried, job)
    step("stats-job (buried)", lambda: a.stats_job(r), stats_job)
    step("stats-tube flow", lambda: a.stats_tube("flow"), stats_tube)
    step("stats (buried)", a.stats, stats)
    step("kick 10 (the buried first)", lambda: a.kick(10))
    step("kick 10 (then the delayed)", lambda: a.kick(10))
    step("kick 10 (none left)", lambda: a.kick(10))
    step("peek-delayed", a.peek_delayed, job)
    step("kick-job j1 (ready)", lambda: a.kick_job(j1), ok)
    j6 = step("put kickme delay=100", lambda: a.put("kickme", delay=LONG_DELAY), ids)
    step("kick-job j6 (delayed)", lambda: a.kick_job(j6), ok)
    step("stats-job j6 (kicked)", lambda: a.stats_job(j6), stats_job)

    # --- reserve-job and delete; the errors of a job that is gone
    r3 = step("reserve-job j3", lambda: a.reserve_job(j3), job)
    step("reserve-job j3 (reserved)", lambda: a.reserve_job(j3), job)
    step("reserve-job missing", lambda: a.reserve_job(MISSING_ID), job)
    step("delete j3", lambda: a.delete(r3), ok)
    step("delete j3 again", lambda: a.delete(r3), ok)
    step("release j3 (gone)", lambda: a.release(r3), ok)
    step("bury j3 (gone)", lambda: a.bury(r3), ok)
    step("touch j3 (gone)", lambda: a.touch(r3), ok)
    step("kick-job j3 (gone)", lambda: a.kick_job(r3), ok)
    step("stats-job j3 (gone)", lambda: a.stats_job(r3), stats_job)
    step("peek j3 (gone)", lambda: a.peek(r3.id), job)

    # --- reserve order by priority, then by age; release with a delay comes back after it
    first = step("reserve (pri 7)", a.reserve, job)
    step("delete", lambda: a.delete(first), ok)
    held = step("reserve (pri 20)", a.reserve, job)
    for what in ["pri 1024", "pri 65536", "pri max"]:
        r = step(f"reserve-with-timeout 0 ({what})", lambda: a.reserve(timeout=0), job)
        step("delete", lambda: a.delete(r), ok)
    step("release pri=20 delay=1", lambda: a.release(held, priority=20, delay=1), ok)
    step("stats-job (released delayed)", lambda: a.stats_job(held), stats_job)
    step("reserve-with-timeout 0 (nothing ready)", lambda: a.reserve(timeout=0), job)
    back = step(f"reserve-with-timeout {WAKE_TIMEOUT} (the delay runs out)",
                lambda: a.reserve(timeout=WAKE_TIMEOUT), job)
    step("delete", lambda: a.delete(back), ok)
    step("stats-tube flow", lambda: a.stats_tube("flow"), stats_tube)

    # --- TTR: 0 becomes 1; DEADLINE_SOON in the last second; the job times out to another
    step("use short", lambda: a.use("short"), ok)
    step("watch short", lambda: a.watch("short"))
    step("ignore flow", lambda: a.ignore("flow"))
    j7 = step("put quick ttr=0", lambda: a.put("quick", ttr=0), ids)
    step("stats-job j7 (ttr 1)", lambda: a.stats_job(j7), stats_job)
    quick = step("reserve", a.reserve, job)
    step("reserve-with-timeout 2 (in the safety margin)", lambda: a.reserve(timeout=2), job)
    step("touch (in the safety margin)", lambda: a.touch(quick), ok)
    # Polled on a, the connection holding the job: beanstalkd 1.12 checks a connection's
    # deadlines when that connection acts, and misses them while it idles (measured: a job of
    # TTR 1 left alone was still reserved after 4 s in most runs, watched from another
    # connection or waited for by one).
    wait_for("the TTR of a's job to run out", lambda: a.stats_job(quick)["state"] == "ready")
    step("stats-job (timed out)", lambda: a.stats_job(quick), stats_job)
    b = connect(host, port)
    step("b: watch short", lambda: b.watch("short"))
    step("b: ignore default", lambda: b.ignore("default"))
    late = step("b: reserve-with-timeout 0 (the timed-out job)", lambda: b.reserve(timeout=0), job)
    step("delete (no longer a's)", lambda: a.delete(quick), ok)
    step("touch (no longer a's)", lambda: a.touch(quick), ok)
    step("stats-job (reserved by b)", lambda: b.stats_job(late), stats_job)
    step("b: delete", lambda: b.delete(late), ok)
    step("stats (a timeout)", a.stats, stats)

    # --- a reserve waiting on a gets the job b puts
    step("watch wait", lambda: a.watch("wait"))
    step("ignore short", lambda: a.ignore("short"))
    join = in_thread(lambda: a.reserve(timeout=WAKE_TIMEOUT))
    wait_for("a's reserve waiting on tube wait",
             lambda: b.stats_tube("wait")["current-waiting"] == 1)
    step("b: use wait", lambda: b.use("wait"), ok)
    step("b: put from-b", lambda: b.put("from b"), ids)
    got, err = join()
    say(f"reserve-with-timeout {WAKE_TIMEOUT} (waiting for b's put)",
        type(err).__name__ if err else job(got))
    step("delete", lambda: a.delete(got), ok)

    # --- c's reservation goes back when c disconnects, to b waiting for it
    c = connect(host, port)
    step("c: use gone", lambda: c.use("gone"), ok)
    step("c: put held", lambda: c.put("held"), ids)
    step("c: watch gone", lambda: c.watch("gone"))
    step("c: ignore default", lambda: c.ignore("default"))
    held = step("c: reserve", c.reserve, job)
    step("b: watch gone", lambda: b.watch("gone"))
    step("b: ignore short", lambda: b.ignore("short"))
    step("b: list-tubes-watched", b.watching)
    step("stats-tube gone", lambda: a.stats_tube("gone"), stats_tube)
    step("b: delete (c's)", lambda: b.delete(held), ok)
    c.close()
    back = step(f"b: reserve-with-timeout {WAKE_TIMEOUT} (c disconnected)",
                lambda: b.reserve(timeout=WAKE_TIMEOUT), job)
    step("stats-job (reserved again)", lambda: b.stats_job(back), stats_job)
    step("b: delete", lambda: b.delete(back), ok)

    # --- pause-tube holds reserves back for its time
    step("pause-tube nosuch", lambda: a.pause_tube("nosuch", 1), ok)
    step("use paused", lambda: a.use("paused"), ok)
    step("watch paused", lambda: a.watch("paused"))
    step("ignore wait", lambda: a.ignore("wait"))
    step("put after-pause", lambda: a.put("after pause"), ids)
    step("pause-tube paused 1", lambda: a.pause_tube("paused", 1), ok)
    step("stats-tube paused", lambda: a.stats_tube("paused"), stats_tube)
    step("reserve-with-timeout 0 (paused)", lambda: a.reserve(timeout=0), job)
    after = step(f"reserve-with-timeout {WAKE_TIMEOUT} (the pause runs out)",
                 lambda: a.reserve(timeout=WAKE_TIMEOUT), job)
    step("delete", lambda: a.delete(after), ok)

    # --- the max job size; the connection goes on after JOB_TOO_BIG
    limit = a.stats()["max-job-size"]
    step("put max-job-size + 1 bytes", lambda: a.put("x" * (limit + 1)), ids)
    step("list-tube-used (after JOB_TOO_BIG)", a.using)
    step("put max-job-size bytes", lambda: a.put("y" * limit), ids)
    r = step("reserve (the biggest job)", a.reserve,
             lambda j: f"job {ids(j.id)} {len(j.body)} bytes {set(j.body)}")
    step("delete", lambda: a.delete(r), ok)

    # --- every tube this flow made, watched at once, so that none is gone on beanstalkd
    for t in TUBES:
        step(f"watch {t}", lambda t=t: a.watch(t))
    step("list-tubes-watched", a.watching, lambda ts: repr(sorted(ts)))
    step("list-tubes", a.tubes, tubes)
    step("stats (end)", a.stats, stats)
    b.close()
    a.close()
    print("end of flow", flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: greenstalk_flow.py <host> <port>")
    main(sys.argv[1], int(sys.argv[2]))
