"""The PyPI `tarantool` connector over TLS (transport='ssl', the server's chain checked against
the test CA): puts, takes and acks; then a plain connection to the same port, which must be
refused at once with the server's message rather than hang. Argument: the port, the CA file,
and `required` or `optional` (an optional port serves the plain client instead)."""
import sys
import time

import tarantool

port, ca, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3]

tls = tarantool.connect("127.0.0.1", port, transport="ssl", ssl_ca_file=ca)
put = tls.call("queue.put", "over tls")[0]
taken = tls.call("queue.take", 1)[0]
assert taken["id"] == put["id"] and taken["data"] == "over tls", (put, taken)
acked = tls.call("queue.ack", taken["id"])[0]
assert acked["id"] == put["id"], acked
print("TLS put/take/ack", put["id"], "peer", tls._socket.getpeercert()["subject"])

started = time.monotonic()
try:
    plain = tarantool.connect("127.0.0.1", port)
    got = plain.call("queue.put", "in the clear")[0]
except tarantool.error.Error as e:
    assert mode == "required", f"an optional port refused a plain client: {e}"
    took = time.monotonic() - started
    assert "requires TLS" in str(e), e
    assert took < 5, f"refused only after {took:.1f}s"
    print(f"plain client refused after {took:.2f}s: {e}")
else:
    assert mode == "optional", f"a required port served a plain client: {got}"
    print("plain client served:", got)
print("OK: tls flow", mode)
