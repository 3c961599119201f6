-- Runs tarantool/sharded-queue test files with the luatest shim beside this file, against the
-- tarq nodes test/helper/init.lua names. Usage:
--   SQ_SRC=<sharded-queue checkout> SQ_ROUTER=host:port [SQ_CREATOR=host:port] \
--     [SQ_CREATE_OPTS='{"partitions": 2}'] tarantool run.lua test/simple_test.lua ...
-- Prints one line per test: PASS, FAIL (with the assertion's words) or SKIP; exits 0.

local fio = require('fio')
local here = fio.dirname(fio.abspath(arg[0]))
local src = assert(os.getenv('SQ_SRC'), 'SQ_SRC: a sharded-queue checkout')
package.path = here .. '/?.lua;' .. here .. '/?/init.lua;' ..
    src .. '/?.lua;' .. src .. '/?/init.lua;' .. package.path

local t = require('luatest')
local counts = {PASS = 0, FAIL = 0, SKIP = 0}

local function report(status, name, msg)
    counts[status] = counts[status] + 1
    local text = ''
    if msg ~= nil then
        text = ': ' .. tostring(msg):gsub('\n', ' '):gsub('[^ ]*/shim/', ''):sub(1, 240)
    end
    print(('%s %s%s'):format(status, name, text))
end

for i = 1, #arg do
    local file = arg[i]
    local first = #t.groups + 1
    local ok, err = pcall(dofile, fio.pathjoin(src, file))
    if not ok then
        report('FAIL', file .. ' (loading)', err)
    end
    for gi = first, #t.groups do
        local g = t.groups[gi]
        local names = {}
        for k, v in pairs(g) do
            if type(v) == 'function' and k:find('^test') then table.insert(names, k) end
        end
        table.sort(names)
        local ready, why = true, nil
        if g.hooks.before_all then ready, why = pcall(g.hooks.before_all) end
        for _, name in ipairs(names) do
            local full = g.name .. '.' .. name
            if ready then
                if g.hooks.before_each then pcall(g.hooks.before_each) end
                local ok, err = pcall(g[name])
                if g.hooks.after_each then pcall(g.hooks.after_each) end
                if ok then report('PASS', full)
                elseif t.is_skip(err) then report('SKIP', full, err.msg)
                else report('FAIL', full, err) end
            elseif t.is_skip(why) then report('SKIP', full, why.msg)
            else report('FAIL', full, 'before_all: ' .. tostring(why)) end
        end
        if g.hooks.after_all then pcall(g.hooks.after_all) end
    end
end
print(('TOTAL pass %d, fail %d, skip %d'):format(counts.PASS, counts.FAIL, counts.SKIP))
os.exit(0)
