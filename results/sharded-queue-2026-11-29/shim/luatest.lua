-- The part of luatest's interface that tarantool/sharded-queue's test files use, written for
-- this run (luatest itself cannot be installed here): groups with their hooks, the assertions,
-- skip_if and helpers.retrying. run.lua runs what the files register.

local fiber = require('fiber')
local json = require('json')

local t = {groups = {}, suite_hooks = {before = {}, after = {}}}

local SKIP = {}

function t.group(name)
    local g = {name = name, hooks = {}}
    for _, hook in ipairs({'before_all', 'after_all', 'before_each', 'after_each'}) do
        g[hook] = function(f) g.hooks[hook] = f end
    end
    table.insert(t.groups, g)
    return g
end

function t.before_suite(f) table.insert(t.suite_hooks.before, f) end
function t.after_suite(f) table.insert(t.suite_hooks.after, f) end

local function show(v)
    local ok, s = pcall(json.encode, v)
    return ok and s or tostring(v)
end

local function fail(msg, level)
    error(msg, (level or 1) + 2)
end

local function equal(a, b)
    if type(a) == 'table' and type(b) == 'table' then
        for k, v in pairs(a) do
            if not equal(v, b[k]) then return false end
        end
        for k, _ in pairs(b) do
            if a[k] == nil then return false end
        end
        return true
    end
    if a == nil or b == nil then return a == b end
    return a == b
end

function t.assert_equals(got, want, msg)
    if not equal(got, want) then
        fail(('%sexpected: %s, actual: %s'):format(msg and msg .. ': ' or '', show(want), show(got)))
    end
end

function t.assert_not_equals(got, want, msg)
    if equal(got, want) then
        fail(('%sunexpected equality: %s'):format(msg and msg .. ': ' or '', show(got)))
    end
end

function t.assert(v, msg)
    if not v then fail(msg or ('expected a true value, actual: ' .. show(v))) end
    return v
end

function t.assert_not(v, msg)
    if v then fail(msg or ('expected a false value, actual: ' .. show(v))) end
end

function t.assert_type(v, want, msg)
    if type(v) ~= want then
        fail(('%sexpected type %s, actual %s'):format(msg and msg .. ': ' or '', want, type(v)))
    end
end

function t.assert_covers(actual, subset)
    for k, v in pairs(subset) do
        if not equal(actual[k], v) then
            fail(('%s does not cover %s'):format(show(actual), show(subset)))
        end
    end
end

function t.assert_almost_equals(got, want, margin)
    if math.abs(got - want) > margin then
        fail(('expected %s within %s, actual: %s'):format(want, margin, got))
    end
end

function t.assert_str_contains(s, part)
    if not tostring(s):find(part, 1, true) then
        fail(('%q does not contain %q'):format(tostring(s), part))
    end
end

function t.assert_error_msg_contains(part, f, ...)
    local ok, err = pcall(f, ...)
    if ok then fail(('expected an error containing %q, none raised'):format(part)) end
    if not tostring(err):find(part, 1, true) then
        fail(('expected an error containing %q, actual: %s'):format(part, tostring(err)))
    end
end

function t.skip_if(cond, msg)
    if cond then error({[SKIP] = true, msg = msg}) end
end

function t.is_skip(err)
    return type(err) == 'table' and err[SKIP] == true
end

t.helpers = {}

-- luatest's default: retry for 5 s, 0.1 s apart, then raise the last error.
function t.helpers.retrying(opts, f, ...)
    local timeout, delay = opts.timeout or 5, opts.delay or 0.1
    local deadline = fiber.clock() + timeout
    while true do
        local ok, err = pcall(f, ...)
        if ok then return err end
        if fiber.clock() > deadline then error(err, 0) end
        fiber.sleep(delay)
    end
end

return t
