-- The tarantool/queue API driven through Tarantool's own net.box, as Lua users call it.
--
--   tarantool netbox_tubes.lua <port> [reference]
--
-- Needs a fresh server (no tubes) on 127.0.0.1:<port>. Prints one line per step and "OK" at
-- the end; on the first mismatch prints "FAIL: <what>" to stderr and exits 1. `reference` (the
-- original, serve.lua) allows task ids to be reused; without it a new task must get an id new
-- in its tube (each tube numbers its own tasks).
-- Errors are matched as substrings, as clients do (the original adds a "file:line: " prefix,
-- and net.box reports the code of its Lua errors as nil instead of 32).

local net_box = require('net.box')
local fiber = require('fiber')
local json = require('json')

local port = tonumber(arg[1])
local reference = arg[2] == 'reference'
if not port then
    io.stderr:write('usage: tarantool netbox_tubes.lua <port> [reference]\n')
    os.exit(2)
end
local uri = '127.0.0.1:' .. port

-- Bound on every call, so that a server that never answers fails the script.
local CALL_TIMEOUT = 20
-- How long a take waits for an event that must come (a delay, a TTR, a disconnect).
local WAKE_TIMEOUT = 5
-- Short server-side times, in seconds.
local DELAY = 0.2
local TTR = 0.3
-- A take timeout that must run out.
local SHORT_TIMEOUT = 0.1

local step_name = '(start)'
local seen = {}

local function fail(msg)
    io.stderr:write(('FAIL: [%s] %s\n'):format(step_name, msg))
    os.exit(1)
end

local function step(name)
    step_name = name
    print('== ' .. name)
end

local function show(v)
    local ok, s = pcall(json.encode, v)
    return ok and s or tostring(v)
end

-- Deep equality of two decoded values (maps compare by content, not by key order).
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

local function expect(got, want, what)
    if not same(got, want) then
        fail(('%s: got %s, want %s'):format(what, show(got), show(want)))
    end
end

local function connect()
    local c = net_box.connect(uri, {wait_connected = CALL_TIMEOUT})
    if not c:is_connected() then
        fail('cannot connect to ' .. uri .. ': ' .. tostring(c.error))
    end
    return c
end

-- All results of a call as a table (a take that times out returns none).
local function call(c, name, args, timeout)
    local res = {pcall(c.call, c, name, args, {timeout = timeout or CALL_TIMEOUT})}
    if not res[1] then
        fail(('%s%s failed: %s'):format(name, show(args), tostring(res[2])))
    end
    table.remove(res, 1)
    return res
end

local function call_err(c, name, args, text, code)
    local ok, err = pcall(c.call, c, name, args, {timeout = CALL_TIMEOUT})
    if ok then
        fail(('%s%s returned %s, want the error %q'):format(name, show(args), show(err), text))
    end
    local msg = tostring(err)
    if not msg:find(text, 1, true) then
        fail(('%s%s: error %q does not contain %q'):format(name, show(args), msg, text))
    end
    -- net.box shows a Lua error() raised by the original with code nil (type LuajitError);
    -- a server that sends code 32 shows 32.
    if reference and code == 32 then code = nil end
    if code ~= nil and err.code ~= code then
        fail(('%s%s: error code %s, want %s'):format(name, show(args), tostring(err.code), code))
    end
end

local function task(res, status, what)
    local t = res[1]
    if #res ~= 1 or type(t) ~= 'cdata' and type(t) ~= 'table' or #t ~= 3 then
        fail(what .. ': want one task {id, status, data}, got ' .. show(res))
    end
    expect(t[2], status, what .. ': status')
    return t
end

local function put(c, tube, data, opts, status)
    local t = task(call(c, 'queue.tube.' .. tube .. ':put', {data, opts}), status or 'r',
        'put into ' .. tube)
    expect(t[3], data, 'put into ' .. tube .. ': data')
    local key = tube .. '#' .. tostring(t[1])
    if not reference and seen[key] then
        fail(('put into %s: id %s was used before in it'):format(tube, t[1]))
    end
    seen[key] = true
    return t[1]
end

local function take(c, tube, timeout, want)
    local res = call(c, 'queue.tube.' .. tube .. ':take', {timeout}, timeout + CALL_TIMEOUT)
    if want == nil then
        expect(#res, 0, ('take(%s) from %s with nothing ready: results'):format(timeout, tube))
        return
    end
    expect(task(res, 't', 'take from ' .. tube)[1], want, 'take from ' .. tube .. ': id')
end

local function method(c, tube, name, args, status, want_id)
    local t = task(call(c, 'queue.tube.' .. tube .. ':' .. name, args), status,
        tube .. ':' .. name)
    if want_id ~= nil then expect(t[1], want_id, tube .. ':' .. name .. ': id') end
    return t
end

local c, o = connect(), connect()
local tubes = call(c, 'queue.statistics', {})[1]
if next(tubes) ~= nil then fail('the server is not fresh: it has tubes') end

step('create_tube: each type, errors')
for _, t in ipairs({{'f', 'fifo'}, {'ft', 'fifottl'}, {'l', 'limfifottl'}, {'u', 'utube'},
                    {'ut', 'utubettl'}}) do
    local res = call(c, 'queue.create_tube', {t[1], t[2], t[1] == 'l' and {capacity = 1} or nil})
    expect(type(res[1]), 'table', 'create_tube ' .. t[2])
end
call_err(c, 'queue.create_tube', {'f', 'fifo'}, "Space 'f' already exists", 32)
call_err(c, 'queue.create_tube', {'z', 'bogus'}, 'Unknown tube type bogus', 32)
call(c, 'queue.create_tube', {'f', 'fifo', {if_not_exists = true}})

step('fifo: order, release, ack, bury, kick, delete, the colon form on a missing tube')
local a = put(c, 'f', 'a')
local b = put(c, 'f', {x = 1})
take(c, 'f', 0, a)
call_err(o, 'queue.tube.f:ack', {a}, 'Task was not taken', 32)
method(c, 'f', 'release', {a}, 'r', a)
take(c, 'f', 0, a)
method(c, 'f', 'ack', {a}, '-', a)
call_err(c, 'queue.tube.f:peek', {a}, ('Task %s not found'):format(a), 32)
method(c, 'f', 'bury', {b}, '!', b)
take(c, 'f', 0, nil)
expect(call(c, 'queue.tube.f:kick', {3})[1], 1, 'kick(3) with one buried')
method(c, 'f', 'delete', {b}, '-', b)
call_err(c, 'queue.tube.f:touch', {b, 1}, 'Task was not taken', 32)
call_err(c, 'queue.tube.nope:put', {'x'}, "Procedure 'queue.tube.nope:put' is not defined", 33)

step('fifottl: priorities, delay, TTR, touch, release with delay')
local p5 = put(c, 'ft', 'p5', {pri = 5})
local p1 = put(c, 'ft', 'p1', {pri = 1})
take(c, 'ft', 0, p1)
take(c, 'ft', 0, p5)
method(c, 'ft', 'ack', {p1}, '-')
method(c, 'ft', 'ack', {p5}, '-')
local d = put(c, 'ft', 'later', {delay = DELAY, ttr = TTR}, '~')
take(c, 'ft', 0, nil)
take(c, 'ft', WAKE_TIMEOUT, d)
take(o, 'ft', WAKE_TIMEOUT, d) -- back to ready after the TTR
method(o, 'ft', 'touch', {d, 60}, 't', d)
take(c, 'ft', SHORT_TIMEOUT, nil)
method(o, 'ft', 'release', {d, {delay = DELAY}}, '~', d)
take(c, 'ft', WAKE_TIMEOUT, d)
method(c, 'ft', 'ack', {d}, '-')

step('limfifottl: a put into a full tube returns nil; a waiting put gets the freed room')
local l1 = put(c, 'l', 1)
local res = call(c, 'queue.tube.l:put', {2, {timeout = SHORT_TIMEOUT}})
expect(res[1], box.NULL, 'put into a full tube')
take(c, 'l', 0, l1)
local waiter = fiber.create(function()
    return call(o, 'queue.tube.l:put', {2, {timeout = WAKE_TIMEOUT}})
end)
waiter:set_joinable(true)
method(c, 'l', 'ack', {l1}, '-')
local _, got = waiter:join()
expect(task(got, 'r', 'the waiting put')[3], 2, 'the waiting put: data')

step('utube and utubettl: one taken task per utube')
for _, tube in ipairs({'u', 'ut'}) do
    local a1 = put(c, tube, 'a1', {utube = 'a'})
    local a2 = put(c, tube, 'a2', {utube = 'a'})
    local b1 = put(c, tube, 'b1', {utube = 'b'})
    take(c, tube, 0, a1)
    take(o, tube, 0, b1)
    take(o, tube, 0, nil)
    method(c, tube, 'ack', {a1}, '-')
    take(o, tube, 0, a2)
    method(o, tube, 'ack', {a2}, '-')
    method(o, tube, 'ack', {b1}, '-')
end
call_err(c, 'queue.tube.u:touch', {0, 1}, 'Task was not taken', 32)

step('sessions: cfg{ttr}, identify after reconnect, ack after reconnect')
call(c, 'queue.cfg', {{ttr = 60}})
local s1 = connect()
local uuid = call(s1, 'queue.identify', {})[1]
expect(#uuid, 16, 'identify(): bytes')
local r = put(c, 'ft', 'resume')
take(s1, 'ft', 0, r)
s1:close()
local s2 = connect()
expect(call(s2, 'queue.identify', {uuid})[1], uuid, 'identify(uuid)')
method(s2, 'ft', 'ack', {r}, '-', r)
s2:close()
call(c, 'queue.cfg', {{ttr = 0}})
call_err(c, 'queue.cfg', {{bogus = 1}}, 'Unknown option bogus', 32)
call_err(c, 'queue.identify', {'short'}, 'Invalid UUID format.', 32)

step('statistics, state, drop')
local s = call(c, 'queue.statistics', {'f'})[1]
expect(s.tasks, {ready = 0, taken = 0, done = 2, buried = 0, delayed = 0, total = 0},
    'statistics(f).tasks')
expect({s.calls.put, s.calls.take, s.calls.ack, s.calls.bury, s.calls.kick, s.calls.delete},
    {2, 2, 1, 1, 1, 1}, 'statistics(f).calls put/take/ack/bury/kick/delete')
expect(call(c, 'queue.state', {})[1], 'RUNNING', 'queue.state()')
expect(call(c, 'queue.tube.f:drop', {})[1], true, 'drop()')
call_err(c, 'queue.tube.f:put', {'x'}, "Procedure 'queue.tube.f:put' is not defined", 33)

c:close()
o:close()
print('\nOK: net.box tubes flow passed')
os.exit(0)
