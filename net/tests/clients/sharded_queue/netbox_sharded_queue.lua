-- What a client of tarantool/sharded-queue does, through Tarantool's own net.box: tubes made
-- with its `queue.create_tube(name, options)` (the type in `options.driver`), then put, peek,
-- take (with its option forms), ack, release, delete, bury, kick, touch, truncate, drop and
-- `queue.statistics`, the scenarios its own test suite walks through, told here in our words.
--
--   tarantool netbox_sharded_queue.lua <router port> <creator port> [<extra options JSON>]
--
-- Every tube is made (and dropped) through the creator and used through the router at once,
-- with no pause: on a sharded cluster they are nodes of different replica sets, so each call
-- lands on a node that did not make the tube. The extra options go into every create (on a
-- sharded cluster `{"partitions": 2}`, so each tube spans both sets, as sharded-queue spreads a
-- tube over its storages).
--
-- Prints `check <name> <value>` for each figure and answer it checks, in a fixed order and
-- free of ids and timings, so the runs against one node and against a cluster can be compared
-- line by line; "OK: ..." at the end. On the first wrong answer: "FAIL: ..." on stderr, exit 1.

local net_box = require('net.box')
local fiber = require('fiber')
local json = require('json')

local router_port, creator_port = tonumber(arg[1]), tonumber(arg[2])
if not router_port or not creator_port then
    io.stderr:write('usage: tarantool netbox_sharded_queue.lua <router> <creator> [json]\n')
    os.exit(2)
end
local extra = json.decode(arg[3] or '{}')

-- Bound on every call, so that a server that never answers fails the script.
local CALL_TIMEOUT = 20
-- How long a figure may take to come true (a delay or a TTR running out).
local SETTLE = 10

local function connect(port)
    local c = net_box.connect('127.0.0.1:' .. port, {wait_connected = true})
    if not c:is_connected() then
        io.stderr:write(('FAIL: cannot connect to port %d: %s\n'):format(port, tostring(c.error)))
        os.exit(1)
    end
    return c
end
local router, creator = connect(router_port), connect(creator_port)

local scenario = '(start)'

local function show(v)
    local ok, s = pcall(json.encode, v)
    return ok and s or tostring(v)
end

local function fail(msg)
    io.stderr:write(('FAIL: [%s] %s\n'):format(scenario, msg))
    os.exit(1)
end

local function same(a, b)
    if type(a) ~= 'table' or type(b) ~= 'table' then
        return a == b
    end
    for k, v in pairs(a) do
        if not same(v, b[k]) then return false end
    end
    for k in pairs(b) do
        if a[k] == nil then return false end
    end
    return true
end

-- Records `got` under `name` and fails unless it is `want`.
local function check(name, got, want)
    print(('check %s.%s %s'):format(scenario, name, show(got)))
    if not same(got, want) then
        fail(('%s: expected %s, got %s'):format(name, show(want), show(got)))
    end
end

local function call(conn, fn, args)
    local ok, res = pcall(conn.call, conn, fn, args or {}, {timeout = CALL_TIMEOUT})
    if not ok then
        fail(('%s%s raised: %s'):format(fn, show(args or {}), tostring(res)))
    end
    return res
end

-- Records `got` under `name`, a figure whose value only has to be the same on one node and on
-- a cluster.
local function record(name, got)
    print(('check %s.%s %s'):format(scenario, name, show(got)))
end

-- The error `fn(args)` raises; fails if it answers.
local function refusal(conn, fn, args)
    local ok, res = pcall(conn.call, conn, fn, args or {}, {timeout = CALL_TIMEOUT})
    if ok then
        fail(('%s%s answered %s, expected an error'):format(fn, show(args or {}), show(res)))
    end
    return tostring(res)
end

local function contains(s, part)
    return s:find(part, 1, true) ~= nil
end

local function create(name, options)
    local opts = table.deepcopy(options or {})
    for k, v in pairs(extra) do opts[k] = v end
    return call(creator, 'queue.create_tube', {name, opts})
end

local function tube(name, method, args)
    return call(router, ('queue.tube.%s:%s'):format(name, method), args)
end

local function stats(name, conn)
    return call(conn or router, 'queue.statistics', {name})
end

-- Waits until `cond()` holds, polling, failing after SETTLE seconds with `what`.
local function settle(what, cond)
    local deadline = fiber.clock() + SETTLE
    while not cond() do
        if fiber.clock() > deadline then
            fail('timed out waiting for ' .. what)
        end
        fiber.sleep(0.05)
    end
end

-- A task id as a table key. Ids of a tube's later partitions carry the partition in their
-- high bits, and net.box hands ids above 2^32 over as uint64 cdata, which compare with == but
-- are each a key of their own in a table: a Lua client keys by the number.
local function key(id)
    return tonumber(id)
end

local function count(set)
    local n = 0
    for _ in pairs(set) do n = n + 1 end
    return n
end

local FIFO = 'sharded_queue.drivers.fifo'
local FIFOTTL = 'sharded_queue.drivers.fifottl'

-- Put, peek, take every task, peek again, count, ack: for each of its two drivers.
for _, driver in ipairs({FIFOTTL, FIFO}) do
    scenario = 'every_task_once_' .. driver:match('[^.]+$')
    local name = 'sq_once_' .. driver:match('[^.]+$')
    create(name, {driver = driver, temporary = driver == FIFO})
    local n, put = 40, {}
    local statuses = {}
    for i = 1, n do
        local task = tube(name, 'put', {{name = 'task_' .. i, raw = '*'}})
        statuses[tube(name, 'peek', {task[1]})[2]] = true
        put[key(task[1])] = true
    end
    check('status_after_put', statuses, {r = true})
    local taken = {}
    statuses = {}
    for _ = 1, n do
        local task = tube(name, 'take', {1})
        if task == nil then fail('a take found no task') end
        statuses[tube(name, 'peek', {task[1]})[2]] = true
        taken[key(task[1])] = true
    end
    check('status_after_take', statuses, {t = true})
    check('taken_are_put', same(taken, put), true)
    local s = stats(name)
    check('ready', s.tasks.ready, 0)
    check('taken', s.tasks.taken, n)
    check('calls_put', s.calls.put, n)
    check('calls_take', s.calls.take, n)
    for id in pairs(taken) do
        local acked = tube(name, 'ack', {id})
        if acked[2] ~= "-" then fail("ack answered " .. show(acked)) end
    end
    check('total_after_ack', stats(name).tasks.total, 0)
end

-- A take with each of the argument forms its clients send.
scenario = 'take_forms'
create('sq_take_forms', {driver = FIFO, temporary = true})
for i, args in ipairs({{}, {1}, {1, {}}, {box.NULL, {}}}) do
    tube('sq_take_forms', 'put', {'data'})
    local task = tube('sq_take_forms', 'take', args)
    check('form_' .. i, task and task[3], 'data')
end

-- A driver it does not have is refused, in sharded-queue's words.
scenario = 'unknown_driver'
local why = refusal(creator, 'queue.create_tube', {'sq_invalid', {driver = 'unexistent'}})
check('refused', contains(why, 'Driver unexistent could not be loaded'), true)
why = refusal(creator, 'queue.create_tube', {'sq_invalid', {wait_factor = 0.5}})
check('wait_factor', contains(why, 'wait_factor'), true)
why = refusal(creator, 'queue.create_tube', {'sq_invalid', {wait_max = 0}})
check('wait_max', contains(why, 'wait_max'), true)
why = refusal(router, 'queue.tube.sq_invalid:put', {'x'})
check('no_tube', contains(why, "Procedure 'queue.tube.sq_invalid:put' is not defined"), true)

-- Creating a tube that is there already answers it: its applications create at every start.
scenario = 'create_again'
create('sq_again', {})
tube('sq_again', 'put', {'kept'})
create('sq_again', {driver = FIFO})
check('total', stats('sq_again').tasks.total, 1)

-- Delete half, take the rest.
scenario = 'delete'
create('sq_delete', {})
local ids = {}
for i = 1, 20 do
    table.insert(ids, tube('sq_delete', 'put', {i})[1])
end
local deleted = {}
for i = 1, 10 do
    local task = tube('sq_delete', 'delete', {ids[i]})
    deleted[key(task[1])] = true
end
check('deleted', count(deleted), 10)
local rest, taken = {}, {}
for i = 11, 20 do rest[key(ids[i])] = true end
for _ = 1, 10 do
    taken[key(tube('sq_delete', 'take', {1})[1])] = true
end
check('taken_are_the_rest', same(taken, rest), true)
local s = stats('sq_delete')
check('ready', s.tasks.ready, 0)
check('taken', s.tasks.taken, 10)
check('calls_delete', s.calls.delete, 10)

-- Release what was taken: it is taken again.
scenario = 'release'
create('sq_release', {})
local put = {}
for i = 1, 10 do
    local task = tube('sq_release', 'put', {i})
    check('put_status', task[2], 'r')
    put[key(task[1])] = true
end
local first = {}
for _ = 1, 5 do
    local task = tube('sq_release', 'take', {1})
    check('take_status', task[2], 't')
    first[task[1]] = true
end
for id in pairs(first) do
    check('release_status', tube('sq_release', 'release', {id})[2], 'r')
end
taken = {}
for _ = 1, 10 do
    taken[key(tube('sq_release', 'take', {1})[1])] = true
end
check('all_taken', same(taken, put), true)
s = stats('sq_release')
check('taken', s.tasks.taken, 10)
check('calls_release', s.calls.release, 5)
check('calls_take', s.calls.take, 15)

-- Bury half, kick more than were buried.
scenario = 'bury_kick'
create('sq_bury', {})
ids = {}
for i = 1, 10 do
    table.insert(ids, tube('sq_bury', 'put', {i})[1])
end
for i = 1, 5 do
    check('bury_status', tube('sq_bury', 'bury', {ids[i]})[2], '!')
end
s = stats('sq_bury')
check('buried', s.tasks.buried, 5)
check('ready', s.tasks.ready, 5)
check('kicked', tube('sq_bury', 'kick', {8}), 5)
s = stats('sq_bury')
check('ready_after_kick', s.tasks.ready, 10)
check('calls_kick', s.calls.kick, 5)

-- Truncate: the tube is empty, and still there.
scenario = 'truncate'
create('sq_truncate', {})
for i = 1, 20 do tube('sq_truncate', 'put', {i}) end
tube('sq_truncate', 'truncate')
s = stats('sq_truncate')
check('total', s.tasks.total, 0)
check('calls_put', s.calls.put, 20)
check('put_after', tube('sq_truncate', 'put', {'again'})[2], 'r')

-- Delayed tasks become ready, a TTR gives a taken task back, an ack is done.
scenario = 'delay_and_ttr'
create('sq_timed', {})
for i = 1, 8 do
    local task = tube('sq_timed', 'put', {i, {delay = 0.3, ttl = 60, ttr = 0.5}})
    check('put_status', task[2], '~')
end
check('delayed', stats('sq_timed').tasks.delayed, 8)
check('no_take_while_delayed', tube('sq_timed', 'take', {0.001}), nil)
settle('the delayed tasks to be ready', function()
    return stats('sq_timed').tasks.ready == 8
end)
local held = {}
for _ = 1, 4 do
    table.insert(held, tube('sq_timed', 'take', {1})[1])
end
for i = 1, 2 do
    check('ack_status', tube('sq_timed', 'ack', {held[i]})[2], '-')
end
s = stats('sq_timed')
check('taken', s.tasks.taken, 2)
check('calls_ack', s.calls.ack, 2)
settle('the TTR to give two tasks back', function()
    local t = stats('sq_timed').tasks
    return t.taken == 0 and t.ready == 6
end)

-- Touch gives a taken task more time; on a task not taken it is refused (tarantool/queue's
-- rule, which tarq keeps; sharded-queue lets it through).
scenario = 'touch'
create('sq_touch', {})
local task = tube('sq_touch', 'put', {'t', {ttr = 60}})
why = refusal(router, 'queue.tube.sq_touch:touch', {task[1], 1})
check('not_taken', contains(why, 'Task was not taken'), true)
tube('sq_touch', 'take', {1})
check('touched', tube('sq_touch', 'touch', {task[1], 1})[2], 't')
record('calls_touch', stats('sq_touch').calls.touch)

-- A take with a timeout and nothing to take answers nil at its end; a waiting take is
-- answered by a put through the other node well before its timeout.
scenario = 'waiting_take'
create('sq_wait', {wait_factor = 1})
local began = fiber.clock()
check('empty', tube('sq_wait', 'take', {0.5}), nil)
check('waited_its_timeout', fiber.clock() - began >= 0.45, true)
local got = fiber.channel(1)
fiber.create(function()
    local t0 = fiber.clock()
    local t = call(router, 'queue.tube.sq_wait:take', {10})
    got:put({t and t[3], fiber.clock() - t0})
end)
-- (A take waiting through a node that owns no partition is counted once by each owner it
-- watches: 2 on the cluster, 1 on one node. So: at least one.)
settle('the take to wait', function()
    return ((stats('sq_wait').consumers or {}).waiting or 0) >= 1
end)
call(creator, 'queue.tube.sq_wait:put', {'woken'})
local woken = got:get(CALL_TIMEOUT)
check('woken_data', woken and woken[1], 'woken')
check('woken_before_timeout', woken ~= nil and woken[2] < 5, true)

-- Drop right after creating, through another node, with a task in it or none.
scenario = 'drop'
create('sq_drop', {})
check('dropped', call(router, 'queue.tube.sq_drop:drop'), true)
create('sq_drop2', {})
tube('sq_drop2', 'put', {'*'})
check('dropped_with_task', call(router, 'queue.tube.sq_drop2:drop'), true)

print('OK: the sharded-queue scenarios')
os.exit(0)
