"""A TLS connection that outlives a certificate change: connects and prints the certificate's
subject, waits for a line on stdin (the test replaces the files and sends SIGHUP meanwhile),
connects again and prints the new subject, then uses the first connection, which must still
work. Arguments: the port and the CA file."""
import sys

import tarantool

port, ca = int(sys.argv[1]), sys.argv[2]


def subject(conn):
    return dict(x[0] for x in conn._socket.getpeercert()["subject"])["commonName"]


old = tarantool.connect("127.0.0.1", port, transport="ssl", ssl_ca_file=ca)
print("first", subject(old), flush=True)
sys.stdin.readline()
new = tarantool.connect("127.0.0.1", port, transport="ssl", ssl_ca_file=ca)
print("second", subject(new), flush=True)
put = old.call("queue.put", "after the reload")[0]
taken = new.call("queue.take", 1)[0]
assert taken["id"] == put["id"], (put, taken)
print("old connection still", subject(old), flush=True)
print("OK: reload", flush=True)
