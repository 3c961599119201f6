"""The tarantool/queue API through `asynctnt-queue` (a client written for tarantool/queue).

    python3 asynctnt_queue_flow.py <port> [reference]

Needs a fresh server (no tubes) on 127.0.0.1:<port>. Drives the package's Queue / Tube / Task
API end to end on each type it serves (it has no create_tube: the tubes are created with a plain
call, as its users do). Prints one line per step and "OK" at the end; on the first mismatch
prints "FAIL: <what>" to stderr and exits 1. `reference` (the original, serve.lua) allows task
ids to be reused; without it a new task must get an id never seen before in its tube (each
tube numbers its own tasks).
"""

import asyncio
import sys

import asynctnt
import asynctnt_queue
from asynctnt_queue.task import Status

# Bound on every request, so that a server that never answers fails the script.
CALL_TIMEOUT = 20.0
# How long a take waits for an event that must come (a delay, a TTR): the events come in well
# under a second; this leaves room on a loaded machine.
WAKE_TIMEOUT = 5.0
# Short server-side times, in seconds.
DELAY = 0.2
TTR = 0.3
# A take timeout that must run out.
SHORT_TIMEOUT = 0.1

REFERENCE = False
STEP = "(start)"
SEEN = set()


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


def new_task(task, data, what):
    expect((task.status, task.data), (Status.READY, data), what)
    key = (task.tube.name, task.task_id)
    if not REFERENCE and key in SEEN:
        fail(f"{what}: id {task.task_id} was used before in {key[0]}")
    SEEN.add(key)
    return task


async def expect_error(coro, text, what):
    try:
        got = await coro
    except asynctnt.exceptions.TarantoolDatabaseError as e:
        if text not in e.message:
            fail(f"{what}: error {e.message!r} does not contain {text!r}")
        return
    fail(f"{what}: returned {got!r}, want the error {text!r}")


async def common(queue, name):
    """What every type serves: put, take, release, ack, peek, bury, kick, delete, statistics."""
    step(f"{name}: put, take, release, ack, peek, bury, kick, delete")
    tube = queue.tube(name)
    utube = "utube" in name
    a = new_task(await (put_utube(tube, "a") if utube else tube.put("a")), "a", "put a")
    b = new_task(await (put_utube(tube, "b") if utube else tube.put("b")), "b", "put b")
    t = await tube.take(0)
    expect((t.task_id, t.status, t.data), (a.task_id, Status.TAKEN, "a"), "take")
    if utube:  # b shares a's utube: nothing else to take while a is taken
        expect(await tube.take(SHORT_TIMEOUT), None, "take with the utube busy")
    r = await t.release()
    expect(r.status, Status.READY, "release")
    t = await tube.take(0)
    expect(t.task_id, a.task_id, "take after release")
    done = await t.ack()
    expect((done.task_id, done.status), (a.task_id, Status.EXECUTED), "ack")
    await expect_error(t.ack(), "Task was not taken", "second ack")
    await expect_error(t.peek(), f"Task {a.task_id} not found", "peek of an acked task")
    buried = await b.bury()
    expect(buried.status, Status.BURIED, "bury")
    expect(await tube.take(0), None, "take with only a buried task")
    # kick(1) with one task buried: on utube types the original fails any kick that finds
    # fewer buried tasks than asked for (its transaction is left open), see NOTES.md.
    expect(await tube.kick(1), 1, "kick")
    expect((await b.peek()).status, Status.READY, "peek after kick")
    gone = await b.delete()
    expect((gone.task_id, gone.status), (b.task_id, Status.EXECUTED), "delete")
    s = await tube.statistics()
    expect(s["tasks"]["total"], 0, "statistics tasks.total")
    expect((s["calls"]["put"], s["calls"]["ack"], s["calls"]["kick"]), (2, 1, 1), "statistics calls")


async def put_utube(tube, data):
    # asynctnt-queue's put has no utube option: the call it makes, with the option added.
    res = await tube.conn.call(f"{tube.queue.namespace}.tube.{tube.name}:put", [data, {"utube": "k"}])
    return asynctnt_queue.Task(tube, res.body)


async def ttl_options(queue, name):
    step(f"{name}: pri, delay, TTR, touch, release with delay")
    tube = queue.tube(name)
    low = new_task(await tube.put("low", pri=5), "low", "put pri 5")
    high = new_task(await tube.put("high", pri=1), "high", "put pri 1")
    expect((await tube.take(0)).task_id, high.task_id, "the higher priority first")
    expect((await tube.take(0)).task_id, low.task_id, "then the lower")
    for t in (high, low):
        expect((await tube.ack(t.task_id)).status, Status.EXECUTED, "ack")
    d = await tube.put("later", delay=DELAY, ttr=TTR)
    expect(d.status, Status.DELAYED, "put with delay")
    expect(await tube.take(0), None, "take before the delay")
    t = await tube.take(WAKE_TIMEOUT)
    expect((t.task_id, t.status), (d.task_id, Status.TAKEN), "take after the delay")
    again = await tube.take(WAKE_TIMEOUT)  # back to ready after the TTR
    expect(again.task_id, d.task_id, "take after the TTR")
    expect((await again.touch(60)).status, Status.TAKEN, "touch")
    expect(await tube.take(SHORT_TIMEOUT), None, "take while the touched task runs")
    expect((await again.release(delay=DELAY)).status, Status.DELAYED, "release with delay")
    t = await tube.take(WAKE_TIMEOUT)
    expect(t.task_id, d.task_id, "take after the release delay")
    await t.ack()


async def run(port):
    conn = asynctnt.Connection(host="127.0.0.1", port=port, request_timeout=CALL_TIMEOUT)
    await conn.connect()
    try:
        queue = asynctnt_queue.Queue(conn)
        expect(await queue.statistics() in ({}, []), True, "a fresh server has no tubes")
        for name, kind in [("fifo", "fifo"), ("fifottl", "fifottl"), ("limfifottl", "limfifottl"),
                           ("utube", "utube"), ("utubettl", "utubettl")]:
            await conn.call("queue.create_tube", [name, kind, {"if_not_exists": True}])
            await common(queue, name)
            # asynctnt-queue's put has no utube option: on utubettl every task would share one
            # utube, so the option flow runs on the fifo types.
            if kind in ("fifottl", "limfifottl"):
                await ttl_options(queue, name)
        await expect_error(queue.tube("fifo").touch(0, 1), "Task was not taken", "touch of a missing task")
        await expect_error(queue.tube("nope").put("x"), "Procedure 'queue.tube.nope:put' is not defined",
                           "put into a missing tube")
        stats = await queue.statistics()
        expect(set(stats), {"fifo", "fifottl", "limfifottl", "utube", "utubettl"}, "statistics() tubes")
    finally:
        await conn.disconnect()


def main():
    global REFERENCE
    if len(sys.argv) < 2:
        print("usage: python3 asynctnt_queue_flow.py <port> [reference]", file=sys.stderr)
        sys.exit(2)
    REFERENCE = sys.argv[2:] == ["reference"]
    try:
        asyncio.run(run(int(sys.argv[1])))
    except Failure as e:
        print(f"FAIL: {e}", file=sys.stderr)
        sys.exit(1)
    except asynctnt.exceptions.TarantoolError as e:
        print(f"FAIL: [{STEP}] unexpected error {e!r}", file=sys.stderr)
        sys.exit(1)
    print("\nOK: asynctnt-queue flow passed", flush=True)


if __name__ == "__main__":
    main()
