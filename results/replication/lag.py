"""Replication delay probe: every 10 ms put a task on the primary, then peek its id on the
replica until it is there; the delay is from the put's acknowledgement to the first peek that
finds it. Prints JSON: samples and percentiles (ms)."""
import json, sys, time, tarantool
p_port, r_port, secs = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
p = tarantool.connect('127.0.0.1', p_port)
r = tarantool.connect('127.0.0.1', r_port)
p.call('queue.create_tube', 'probe', 'fifo', {'if_not_exists': True})
time.sleep(0.5)
delays = []
end = time.monotonic() + secs
n = 0
while time.monotonic() < end:
    t = p.call('queue.tube.probe:put', 'probe-%d' % n)[0]
    n += 1
    tid = t[0]
    acked = time.monotonic()
    while True:
        try:
            r.call('queue.tube.probe:peek', tid)
            break
        except tarantool.error.DatabaseError:
            if time.monotonic() - acked > 10:
                sys.exit('task %d never reached the replica' % tid)
    delays.append((time.monotonic() - acked) * 1000)
    time.sleep(0.01)
delays.sort()
q = lambda f: delays[min(len(delays) - 1, int(f * len(delays)))]
print(json.dumps({"samples": len(delays), "p50_ms": q(0.5), "p90_ms": q(0.9), "p99_ms": q(0.99), "max_ms": delays[-1]}))
