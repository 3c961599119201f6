-- Users and grants driven by net.box, Tarantool's own client, against tarq started with
-- `--user admin --password boot` on the port given: the administrator creates a user and grants
-- it a tube's put, the user puts, and a take is refused with Tarantool's code and words.
-- Prints `OK: ...` at the end; any other outcome raises.
local netbox = require('net.box')
local port = arg[1]

local admin = netbox.connect('127.0.0.1:' .. port, {user = 'admin', password = 'boot'})
assert(admin:is_connected(), 'admin connects: ' .. tostring(admin.error))
admin:call('queue.create_tube', {'jobs', 'fifo'})
admin:call('box.schema.user.create', {'bob', {password = 'pw'}})
admin:call('box.schema.user.grant', {'bob', 'put', 'tube', 'jobs'})

local bob = netbox.connect('127.0.0.1:' .. port, {user = 'bob', password = 'pw'})
assert(bob:is_connected(), 'bob connects: ' .. tostring(bob.error))
local task = bob:call('queue.tube.jobs:put', {'hello'})
assert(task[3] == 'hello', 'the put answers the task')
local ok, err = pcall(bob.call, bob, 'queue.tube.jobs:take', {0})
assert(not ok, 'the take is refused')
local want = "Execute access to function 'queue.tube.jobs:take' is denied for user 'bob'"
assert(err.code == 42, 'code 42, got ' .. tostring(err.code))
assert(tostring(err.message) == want, 'the text, got ' .. tostring(err.message))

local wrong = netbox.connect('127.0.0.1:' .. port, {user = 'bob', password = 'nope'})
assert(not wrong:is_connected(), 'a wrong password is refused')
assert(tostring(wrong.error):find("Incorrect password supplied for user 'bob'"), tostring(wrong.error))
print('OK: net.box created bob, put as bob, and read the refusal of a take as Tarantool words it')
os.exit(0)
