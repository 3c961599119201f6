-- Replaces sharded-queue's cluster setup (test/helper/init.lua and its cartridge or
-- Tarantool 3 config) for a run against tarq: the nodes are already running. SQ_ROUTER is
-- the node every test talks to ('queue-router'); SQ_CREATOR the node that creates and drops
-- tubes (another node of the cluster, so nothing is asked where it was made); SQ_CREATE_OPTS
-- a JSON map added to every create's options (on a sharded cluster, {"partitions": 2}: each
-- tube spread over both replica sets, as sharded-queue spreads every tube over its storages).

local net_box = require('net.box')
local json = require('json')

local helper = {servers = {['queue-router'] = true, ['queue-router-1'] = true}}

local conns = {}
local function connect(uri)
    if conns[uri] == nil then
        conns[uri] = net_box.connect(uri, {wait_connected = true})
        assert(conns[uri]:is_connected(), 'cannot connect to ' .. uri)
    end
    return conns[uri]
end

local router = os.getenv('SQ_ROUTER')
local creator = os.getenv('SQ_CREATOR') or router
local extra = json.decode(os.getenv('SQ_CREATE_OPTS') or '{}')

function helper.get_evaler(name)
    if name == 'queue-router' then return connect(router) end
    if name == 'queue-router-1' then return connect(creator) end
    error(('no instance %s: tarq has no storage instances to evaluate Lua on'):format(name))
end

function helper.create_tube(name, options)
    local opts = table.deepcopy(options or {})
    for k, v in pairs(extra) do opts[k] = v end
    return connect(creator):call('queue.create_tube', {name, opts})
end

function helper.drop_tube(name)
    pcall(function() connect(creator):call(('queue.tube.%s:drop'):format(name)) end)
end

function helper.get_cfg() error('sharded_queue.api.cfg is a Cartridge role option') end
function helper.set_cfg() error('sharded_queue.api.cfg is a Cartridge role option') end

function helper.eval(name, ...) return helper.get_evaler(name):eval(...) end

return helper
