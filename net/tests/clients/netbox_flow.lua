-- The seed's queue flow driven through Tarantool's own net.box, unchanged.
--
--   tarantool netbox_flow.lua <port> [reference]
--
-- Needs a fresh (empty) queue on 127.0.0.1:<port>; leaves it empty. Prints one line per step
-- and "OK" at the end; on the first mismatch prints "FAIL: <what>" to stderr and exits 1.
--
-- `reference` runs the same checks against the seed queue on a real Tarantool, which differs
-- from tarq only where API.md / IPROTO.md say it does: ids are wall-clock nanoseconds (cdata
-- in Lua, printed with an `ULL` suffix in messages), Lua errors carry a "file:line: " prefix,
-- and net.box reports their code as nil (type LuajitError) instead of 32.

local net_box = require('net.box')
local clock = require('clock')
local json = require('json')

local port = tonumber(arg[1])
local reference = arg[2] == 'reference'
if not port then
    io.stderr:write('usage: tarantool netbox_flow.lua <port> [reference]\n')
    os.exit(2)
end
local uri = '127.0.0.1:' .. port

-- Bound on every call, so that a server that never answers fails the script instead of
-- hanging it. Blocking takes pass their own, shorter timeout plus this margin.
local CALL_TIMEOUT = 10
-- How long a take waits for a task that should become ready (a disconnect, a put, a delay):
-- the seed polls delays once a second, so this leaves room on a loaded machine.
local WAKE_TIMEOUT = 5
-- The delay of the delayed put, in seconds: long enough for a few calls to see it waiting.
local DELAY = 1
-- A take timeout that must run out (nothing will be put): short, to keep the flow fast.
local SHORT_TIMEOUT = 0.2
-- Clock slack when comparing the client's clock with a runat the server computed.
local CLOCK_SLACK = 0.05
-- An id no fresh queue holds: tarq counts from 1, the seed's ids are ~1.8e18.
local MISSING_ID = 99999999999

local step_name = '(start)'
local function step(name)
    step_name = name
    print('== ' .. name)
end

local function fail(fmt, ...)
    error({ failure = string.format('[%s] ' .. fmt, step_name, ...) }, 2)
end

local function show(v)
    local ok, s = pcall(json.encode, v)
    return ok and s or tostring(v)
end

-- Deep equality for decoded MessagePack values (tables compared key by key).
local function same(a, b)
    if type(a) ~= 'table' or type(b) ~= 'table' then return a == b end
    for k, v in pairs(a) do if not same(v, b[k]) then return false end end
    for k in pairs(b) do if a[k] == nil then return false end end
    return true
end

local function expect(got, want, what)
    if not same(got, want) then fail('%s: got %s, want %s', what, show(got), show(want)) end
end

-- An id as decimal digits: tarq's are plain numbers; the seed's are uint64 cdata ("123ULL").
local function idstr(id)
    return (tostring(id):gsub('U?LL$', ''))
end

local function check_id(id, what)
    if type(id) == 'number' then
        if id < 1 or id ~= math.floor(id) or id >= 1e14 then
            fail('%s: id %s is not a positive integer below 1e14', what, show(id))
        end
    elseif not (reference and type(id) == 'cdata') then
        fail('%s: id %s is a %s, want a number', what, tostring(id), type(id))
    end
end

-- Checks the four keys every task carries; `want` gives the expected status/data/id.
local function check_task(t, want, what)
    if type(t) ~= 'table' then fail('%s: got %s, want a task map', what, show(t)) end
    check_id(t.id, what)
    if want.id ~= nil and t.id ~= want.id then
        fail('%s: id %s, want %s', what, tostring(t.id), tostring(want.id))
    end
    expect(t.status, want.status, what .. ': status')
    if want.status ~= 'W' then expect(t.runat, 0, what .. ': runat') end
    if want.data ~= nil then expect(t.data, want.data, what .. ': data') end
    return t
end

local function connect()
    local c = net_box.connect(uri, { wait_connected = CALL_TIMEOUT })
    if not c:is_connected() then fail('cannot connect to %s: %s', uri, tostring(c.error)) end
    return c
end

-- Calls `fn` and returns its values packed ({n = count, ...}); a server error fails the step.
local function call(c, fn, args, timeout)
    local res = { pcall(c.call, c, fn, args, { timeout = timeout or CALL_TIMEOUT }) }
    if not res[1] then
        fail('%s(%s) raised %s', fn, show(args), tostring(res[2]))
    end
    return { n = #res - 1, unpack(res, 2, #res) }
end

-- Calls `fn`, which must return exactly one task.
local function call_task(c, fn, args, want, timeout)
    local res = call(c, fn, args, timeout)
    if res.n ~= 1 then fail('%s(%s) returned %d values: %s', fn, show(args), res.n, show(res)) end
    return check_task(res[1], want, fn)
end

-- Calls queue.take, which must return no value at all.
local function take_none(c, timeout)
    local res = call(c, 'queue.take', { timeout })
    if res.n ~= 0 then fail('queue.take(%s) returned %s, want no value', show(timeout), show(res)) end
end

-- Calls `fn`, which must fail with error `code` and a message equal to `want`, or, when
-- `want` is a function, a message it accepts (it returns the captures it checked).
local function call_error(c, fn, args, code, want)
    local ok, err = pcall(c.call, c, fn, args, { timeout = CALL_TIMEOUT })
    if ok then fail('%s(%s) succeeded, want error %s', fn, show(args), show(want)) end
    if type(err) ~= 'cdata' or err.message == nil then
        fail('%s(%s) raised a %s, want a box error: %s', fn, show(args), type(err), tostring(err))
    end
    local msg = err.message
    if reference then
        msg = msg:gsub('^[^:]*:%d+: ', ''):gsub('(%d)U?LL', '%1')
    end
    local lua_error_in_reference = reference and err.type == 'LuajitError' and err.code == nil
    if err.code ~= code and not lua_error_in_reference then
        fail('%s(%s): error code %s (%s), want %d', fn, show(args), tostring(err.code),
             err.message, code)
    end
    if type(want) == 'function' then
        local captures = { want(msg) }
        if captures[1] == nil then fail('%s(%s): unexpected message %q', fn, show(args), msg) end
        return unpack(captures)
    end
    if msg ~= want then fail('%s(%s): message %q, want %q', fn, show(args), msg, want) end
end

local function stats(c)
    local res = call(c, 'queue.stats', {})
    if res.n ~= 1 or type(res[1]) ~= 'table' then fail('queue.stats returned %s', show(res)) end
    local s = {}
    for k, v in pairs(res[1]) do s[k] = tonumber(v) end
    return s
end

local function check_stats(c, want)
    local s = stats(c)
    for k, v in pairs(want) do
        if s[k] ~= v then fail('queue.stats: %s = %s, want %d (all: %s)', k, show(s[k]), v, show(s)) end
    end
end

-- "Task <id> taken by <owner>. Not you (<caller>)": returns owner and caller.
local function ownership(id)
    local pattern = '^Task ' .. idstr(id) .. ' taken by (%d+)%. Not you %((%d+)%)$'
    return function(msg)
        local owner, caller = msg:match(pattern)
        if owner then return tonumber(owner), tonumber(caller) end
    end
end

local function main()
    step('connect, ping, an empty queue')
    local c1 = connect()
    if not c1:ping() then fail('ping failed: %s', tostring(c1.error)) end
    check_stats(c1, { total = 0, ready = 0, taken = 0, waiting = 0 })

    step('put returns the task, data as sent')
    local t1 = call_task(c1, 'queue.put', { 'hello' }, { status = 'R', data = 'hello' })
    local nested = { 1, 'two', { three = 3, four = { 4.5, true } } }
    local t2 = call_task(c1, 'queue.put', { nested }, { status = 'R', data = nested })
    if not (t2.id > t1.id) then fail('ids not increasing: %s then %s', idstr(t1.id), idstr(t2.id)) end
    check_stats(c1, { total = 2, ready = 2, taken = 0, waiting = 0 })

    step('take, release, take again, ack')
    call_task(c1, 'queue.take', {}, { id = t1.id, status = 'T', data = 'hello' })
    check_stats(c1, { total = 2, ready = 1, taken = 1, waiting = 0 })
    call_task(c1, 'queue.release', { t1.id }, { id = t1.id, status = 'R', data = 'hello' })
    check_stats(c1, { total = 2, ready = 2, taken = 0, waiting = 0 })
    -- A released task goes back to its place by id: taken again before the newer t2.
    call_task(c1, 'queue.take', { 0 }, { id = t1.id, status = 'T' })
    call_task(c1, 'queue.ack', { t1.id }, { id = t1.id, status = 'T', data = 'hello' })
    check_stats(c1, { total = 1, ready = 1, taken = 0, waiting = 0 })

    step('errors: not found, not taken, id required, unknown procedure')
    call_error(c1, 'queue.ack', { t1.id }, 32, 'Task {' .. idstr(t1.id) .. '} was not found')
    call_error(c1, 'queue.ack', { MISSING_ID }, 32, 'Task {' .. MISSING_ID .. '} was not found')
    call_error(c1, 'queue.release', { tostring(MISSING_ID) }, 32,
               'Task {' .. MISSING_ID .. '} was not found')
    call_error(c1, 'queue.ack', { t2.id }, 32, 'Task ' .. idstr(t2.id) .. ' not taken by anybody')
    call_error(c1, 'queue.release', { t2.id }, 32,
               'Task ' .. idstr(t2.id) .. ' not taken by anybody')
    call_error(c1, 'queue.ack', {}, 32, 'Task id required')
    call_error(c1, 'queue.nope', {}, 33, "Procedure 'queue.nope' is not defined")
    check_stats(c1, { total = 1, ready = 1, taken = 0, waiting = 0 })

    step('ownership: only the session that took a task may ack or release it')
    local c2 = connect()
    call_task(c1, 'queue.take', {}, { id = t2.id, status = 'T', data = nested })
    local owner1, caller2 = call_error(c2, 'queue.ack', { t2.id }, 32, ownership(t2.id))
    local owner1b, caller2b = call_error(c2, 'queue.release', { t2.id }, 32, ownership(t2.id))
    expect({ owner1b, caller2b }, { owner1, caller2 }, 'session ids of the same two sessions')
    if owner1 == caller2 then fail('two connections share session id %d', owner1) end
    local t3 = call_task(c2, 'queue.put', { 'three' }, { status = 'R', data = 'three' })
    call_task(c2, 'queue.take', {}, { id = t3.id, status = 'T' })
    local owner2, caller1 = call_error(c1, 'queue.ack', { t3.id }, 32, ownership(t3.id))
    expect({ owner2, caller1 }, { caller2, owner1 }, 'session ids seen the other way round')
    check_stats(c1, { total = 2, ready = 0, taken = 2, waiting = 0 })

    step('id as a decimal string')
    call_task(c1, 'queue.release', { idstr(t2.id) }, { id = t2.id, status = 'R' })
    call_task(c1, 'queue.take', {}, { id = t2.id, status = 'T' })
    call_task(c1, 'queue.ack', { idstr(t2.id) }, { id = t2.id, status = 'T', data = nested })
    call_task(c2, 'queue.ack', { t3.id }, { id = t3.id, status = 'T', data = 'three' })
    check_stats(c1, { total = 0, ready = 0, taken = 0, waiting = 0 })

    step('auto-release: a task taken by a connection that closes is ready again')
    local t4 = call_task(c1, 'queue.put', { 'orphan' }, { status = 'R' })
    local c3 = connect()
    call_task(c3, 'queue.take', {}, { id = t4.id, status = 'T' })
    take_none(c1, 0)
    check_stats(c1, { total = 1, ready = 0, taken = 1, waiting = 0 })
    c3:close()
    call_task(c1, 'queue.take', { WAKE_TIMEOUT }, { id = t4.id, status = 'T', data = 'orphan' },
              WAKE_TIMEOUT + CALL_TIMEOUT)
    call_task(c1, 'queue.ack', { t4.id }, { id = t4.id, status = 'T' })

    step('a blocking take is woken by a put from another connection')
    local future = c1:call('queue.take', { WAKE_TIMEOUT }, { is_async = true })
    -- The server reads one connection's requests in order: once this ping is answered, the
    -- take has been read, found nothing ready, and is waiting.
    if not c1:ping() then fail('ping behind a parked take failed: %s', tostring(c1.error)) end
    local s = stats(c2)
    if s.parked_takes ~= nil and s.parked_takes ~= 1 then
        fail('queue.stats: parked_takes = %s, want 1', show(s.parked_takes))
    end
    if future:is_ready() then fail('take(%d) answered before any put: %s', WAKE_TIMEOUT,
                                   show(future:result())) end
    local t5 = call_task(c2, 'queue.put', { 'wake' }, { status = 'R' })
    local res, err = future:wait_result(WAKE_TIMEOUT + CALL_TIMEOUT)
    if res == nil then fail('parked take: %s', tostring(err)) end
    if #res ~= 1 then fail('parked take returned %s, want one task', show(res)) end
    check_task(res[1], { id = t5.id, status = 'T', data = 'wake' }, 'parked take')
    call_task(c1, 'queue.ack', { t5.id }, { id = t5.id, status = 'T' })

    step('delayed put: waiting until runat, then takeable')
    local before = clock.time()
    local t6 = call_task(c1, 'queue.put', { 'later', { delay = DELAY } }, { status = 'W' })
    local after = clock.time()
    if not (t6.runat >= before + DELAY - CLOCK_SLACK and t6.runat <= after + DELAY + CLOCK_SLACK) then
        fail('runat %.6f, want now + %d (now between %.6f and %.6f)', t6.runat, DELAY, before, after)
    end
    s = stats(c1)
    if clock.time() < t6.runat - CLOCK_SLACK then
        expect({ s.total, s.ready, s.waiting, s.taken }, { 1, 0, 1, 0 }, 'stats total/ready/waiting/taken')
    end
    -- Taking the task before runat is the failure; taking nothing is right until runat.
    local early = call(c1, 'queue.take', { 0 })
    local now = clock.time()
    if early.n ~= 0 and now < t6.runat - CLOCK_SLACK then
        fail('took %s at %.6f, before its runat %.6f', show(early[1]), now, t6.runat)
    end
    if early.n == 0 then
        call_task(c1, 'queue.take', { WAKE_TIMEOUT + DELAY }, { id = t6.id, status = 'T', data = 'later' },
                  WAKE_TIMEOUT + DELAY + CALL_TIMEOUT)
        now = clock.time()
        if now < t6.runat - CLOCK_SLACK then
            fail('took the delayed task at %.6f, before its runat %.6f', now, t6.runat)
        end
    end
    call_task(c1, 'queue.ack', { t6.id }, { id = t6.id, status = 'T', data = 'later' })

    step('call_16: every result is an array of tuples')
    local function call16(fn, ...)
        local ok, r = pcall(c1.call_16, c1, fn, ...)
        if not ok then fail('call_16 %s raised %s', fn, tostring(r)) end
        return r
    end
    local r = call16('queue.take')
    if #r ~= 0 then fail('call_16 queue.take on an empty queue returned %s, want []', show(r)) end
    r = call16('queue.put', 'c16')
    if #r ~= 1 or #r[1] ~= 1 then fail('call_16 queue.put returned %s, want [[task]]', show(r)) end
    local t7 = check_task(r[1][1], { status = 'R', data = 'c16' }, 'call_16 queue.put')
    r = call16('queue.take', 0)
    if #r ~= 1 or #r[1] ~= 1 then fail('call_16 queue.take returned %s, want [[task]]', show(r)) end
    check_task(r[1][1], { id = t7.id, status = 'T', data = 'c16' }, 'call_16 queue.take')
    r = call16('queue.ack', t7.id)
    if #r ~= 1 or #r[1] ~= 1 then fail('call_16 queue.ack returned %s, want [[task]]', show(r)) end
    check_task(r[1][1], { id = t7.id, status = 'T' }, 'call_16 queue.ack')
    r = call16('queue.stats')
    if #r ~= 1 or #r[1] ~= 1 or type(r[1][1]) ~= 'table' then
        fail('call_16 queue.stats returned %s, want [[stats]]', show(r))
    end
    expect(tonumber(r[1][1].total), 0, 'call_16 queue.stats total')

    step('a take that times out answers no value, after its timeout')
    before = clock.time()
    take_none(c1, SHORT_TIMEOUT)
    local waited = clock.time() - before
    if waited < SHORT_TIMEOUT - CLOCK_SLACK then
        fail('take(%s) answered after %.3f s, before its timeout', SHORT_TIMEOUT, waited)
    end

    step('the queue is empty again')
    check_stats(c1, { total = 0, ready = 0, taken = 0, waiting = 0 })
    c1:close()
    c2:close()
end

local ok, err = xpcall(main, function(e)
    if type(e) == 'table' and e.failure then return e.failure end
    return 'unexpected error: ' .. tostring(e) .. '\n' .. debug.traceback()
end)
if not ok then
    io.stderr:write('FAIL: ' .. err .. '\n')
    os.exit(1)
end
print('OK: net.box flow passed against ' .. uri .. (reference and ' (reference)' or ''))
os.exit(0)
