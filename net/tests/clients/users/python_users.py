"""Users and grants driven by tarantool-python against tarq started with `--user admin
--password boot` on the port given: the administrator creates a user and grants it a tube's
take, the user takes what the administrator put, and a put is refused with Tarantool's code and
words. Prints `OK: ...` at the end; any other outcome raises."""
import sys

import tarantool

port = int(sys.argv[1])
admin = tarantool.connect("127.0.0.1", port, user="admin", password="boot")
admin.call("queue.create_tube", "mail", "fifo")
admin.call("box.schema.user.create", "carol", {"password": "pw"})
admin.call("box.schema.user.grant", "carol", "take", "tube", "mail")
admin.call("queue.tube.mail:put", "letter")

carol = tarantool.connect("127.0.0.1", port, user="carol", password="pw")
task = carol.call("queue.tube.mail:take", 0).data[0]
assert task[2] == "letter", task
carol.call("queue.tube.mail:ack", task[0])
try:
    carol.call("queue.tube.mail:put", "x")
    raise AssertionError("the put was not refused")
except tarantool.error.DatabaseError as e:
    want = "Execute access to function 'queue.tube.mail:put' is denied for user 'carol'"
    assert e.args[0] == 42 and e.args[1] == want, e.args
print("OK: tarantool-python created carol, took as carol, and read the refusal of a put")
