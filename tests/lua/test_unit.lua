-- Pure-Lua parts of the harness (lua/qinfer/sweep.lua, stats.lua) against
-- hand-computed values, and the qinfer module's argument checks that need
-- no model. arg[1] == "embedded": the modules must come from the copies
-- compiled into qinfer (the runner hides the source tree's).
local T = require "testlib"
local sweep, where = require "qinfer.sweep"
local stats = require "qinfer.stats"
local qinfer = require "qinfer"

if arg[1] == "embedded" then
  T.ok(tostring(where):find("compiled in", 1, true), "qinfer.sweep from the compiled-in copy, got " .. tostring(where))
else
  T.ok(tostring(where):find("lua/qinfer/sweep.lua", 1, true), "qinfer.sweep from the source tree, got " .. tostring(where))
end

-- sweep: product order (order first, then sorted; last key fastest)
local params = { model = { "m" }, kv_policy = { "full", "h2o" }, kv_budget = { 0.25, 0.5 }, n = 3 }
local cfgs, keys = sweep.product(params, { "model" })
T.eq(table.concat(keys, ","), "model,kv_budget,kv_policy,n", "key order")
T.eq(#cfgs, 4, "configurations")
local got = {}
for i, c in ipairs(cfgs) do got[i] = sweep.describe(c, { "kv_budget", "kv_policy" }) end
T.eq(table.concat(got, "|"),
  "kv_budget=0.25 kv_policy=full|kv_budget=0.25 kv_policy=h2o|kv_budget=0.5 kv_policy=full|kv_budget=0.5 kv_policy=h2o",
  "product order")
T.eq(cfgs[1].n, 3, "a scalar is a list of one")
T.eq(#sweep.product({}), 1, "no parameters: one empty configuration")
T.eq(table.concat(sweep.varying(params, keys), ","), "kv_budget,kv_policy", "varying keys")
T.raises(function() sweep.product({ a = {} }) end, "params.a is not a list")
T.raises(function() sweep.product({ a = { x = 1 } }) end, "params.a is not a list")
T.raises(function() sweep.product({ a = { 1 } }, { "b" }) end, "order names 'b'")

-- sweep: JSON (canonical order, integer vs float, escapes)
T.eq(sweep.json({ b = 1, a = 0.5, c = "x\"\n", d = true, e = { 1, 2.0 } }),
  '{"a":0.5,"b":1,"c":"x\\"\\n","d":true,"e":[1,2.0]}', "json")
T.eq(sweep.json(0.1), "0.1", "shortest float")
T.eq(sweep.json(0.1 + 0.2), "0.30000000000000004", "17 digits when needed")
T.eq(sweep.json(16.0), "16.0", "an integral float stays a float")
T.raises(function() sweep.json(0 / 0) end, "cannot be stored as JSON")
T.raises(function() sweep.json({ [true] = 1 }) end, "boolean key")

-- sweep: --set pins, converted like the list's values
local p2 = sweep.pin(params, { "kv_budget=1", "n=7", "kv_policy=window" })
T.eq(math.type(p2.kv_budget[1]), "float", "float list -> float")
T.eq(p2.kv_budget[1], 1.0, "pinned value")
T.eq(math.type(p2.n[1]), "integer", "integer list -> integer")
T.eq(p2.kv_policy[1], "window", "string")
T.eq(#sweep.product(p2), 1, "everything pinned: one configuration")
T.eq(sweep.pin({ flag = { true, false } }, { "flag=false" }).flag[1], false, "boolean")
T.raises(function() sweep.pin(params, { "bogus=1" }) end, "unknown parameter 'bogus'", "kv_budget, kv_policy, model, n")
T.raises(function() sweep.pin(params, { "n=1.5" }) end, "not an integer")
T.raises(function() sweep.pin(params, { "kv_budget=half" }) end, "not a number")
T.raises(function() sweep.pin({ flag = { true } }, { "flag=maybe" }) end, "not true or false")
T.raises(function() sweep.pin(params, { "novalue" }) end, "is not key=value")

-- sweep.prepare: the experiment table
local plan = sweep.prepare({ name = "x", params = params, repetitions = 3, run = function() end }, { "n=4" })
T.eq(#plan.configs, 4, "prepare configurations")
T.eq(plan.repetitions, 3, "repetitions")
T.eq(plan.warmup, 0, "default warm-up")
T.eq(plan.json[1], '{"kv_budget":0.25,"kv_policy":"full","model":"m","n":4}', "prepare json")
T.raises(function() sweep.prepare({ name = "x" }) end, "needs a run function")
T.raises(function() sweep.prepare({ run = print }) end, "needs a name")
T.raises(function() sweep.prepare({ name = "x", run = print, repetitons = 2 }) end, "unknown field 'repetitons'")
T.raises(function() sweep.prepare({ name = "x", run = print, repetitions = 0 }) end, "'repetitions' must be")
T.raises(function() sweep.prepare(nil) end, "gave no experiment")

-- sweep.assign / prepare with a shard: for every N up to 16, with equal,
-- ragged and zero costs, the shards are disjoint, their union is the whole
-- sweep, each keeps sweep order, and no shard's cost exceeds another's by
-- more than the largest single cost (the greedy rule's bound)
local function lcg(seed)
  local x = seed
  return function(m) x = (x * 1103515245 + 12345) % 2147483648; return x % m end
end
local rnd = lcg(7)
local cost_sets = { equal = nil, ragged = function(c) return (c.a * 7 + c.b * 3) % 11 + 0.5 end,
  zero = function(c) return c.a == 2 and 0 or 1 end, random = function() return rnd(1000) / 10 end }
for cname, cost in pairs(cost_sets) do
  for n = 1, 16 do
    local exp = { name = "x", params = { a = { 1, 2, 3, 4, 5 }, b = { 1, 2, 3, 4, 5, 6, 7 } }, run = print, cost = cost }
    if cname == "random" then rnd = lcg(n) end
    local whole = sweep.prepare(exp, {})
    local seen, loads, maxc = {}, {}, 0
    for i = 0, n - 1 do
      if cname == "random" then rnd = lcg(n) end -- every shard computes the same costs
      local p = sweep.prepare(exp, {}, i, n)
      T.eq(p.total, 35, "total")
      local load, last = 0, 0
      for j, text in ipairs(p.json) do
        local g = p.index[j]
        T.ok(g > last, string.format("%s n=%d shard %d: sweep order", cname, n, i))
        last = g
        T.ok(seen[g] == nil, string.format("%s n=%d: configuration %d in shards %s and %d", cname, n, g, tostring(seen[g]), i))
        seen[g] = i
        T.eq(text, whole.json[g], "the shard's configuration is the sweep's")
        T.eq(p.shard[g], i, "shard of a kept configuration")
        load = load + p.cost[j]
        if p.cost[j] > maxc then maxc = p.cost[j] end
      end
      T.near(load, p.load, 1e-9, "load")
      loads[#loads + 1] = load
    end
    local count = 0
    for g = 1, 35 do if seen[g] ~= nil then count = count + 1 end end
    T.eq(count, 35, string.format("%s n=%d: union of the shards", cname, n))
    T.ok(math.max(table.unpack(loads)) - math.min(table.unpack(loads)) <= maxc + 1e-9,
      string.format("%s n=%d: balance %s", cname, n, table.concat(loads, ",")))
  end
end
local sh = sweep.assign({ 1, 1, 1, 1, 1 }, 2)
T.eq(table.concat(sh, ","), "0,1,0,1,0", "equal costs: round robin")
sh = sweep.assign({ 1, 5, 2, 4 }, 2)
T.eq(table.concat(sh, ","), "0,0,1,1", "largest first to the least loaded shard")
T.eq(#sweep.prepare({ name = "x", params = { a = { 1, 2 } }, run = print }, {}, 5, 8).configs, 0, "an empty shard")
T.raises(function() sweep.prepare({ name = "x", run = print }, {}, 2, 2) end, "shard 2/2: want I/N with 0 <= I < N")
T.raises(function() sweep.prepare({ name = "x", run = print, cost = 3 }, {}) end, "cost must be a function")
T.raises(function() sweep.prepare({ name = "x", params = { a = { 1, 2 } }, run = print, cost = function(c) return -c.a end }, {}) end,
  "cost(a=1) returned -1: a finite number >= 0 expected")
T.raises(function() sweep.prepare({ name = "x", params = { a = { 1 } }, run = print, cost = function(c) return c.x.y end }, {}) end,
  "cost(a=1):", "attempt to index a nil value")
T.raises(function() sweep.assign({ 1 }, 0) end, "integer >= 1")

-- stats: known values (sample standard deviation; t with n - 1 df)
local xs = { 2, 4, 4, 4, 5, 5, 7, 9 }
T.eq(stats.mean(xs), 5.0, "mean")
T.eq(stats.median(xs), 4.5, "median, even n")
T.eq(stats.median({ 3, 1, 2 }), 2.0, "median, odd n")
T.near(stats.stddev(xs), 2.138089935299395, 1e-12, "stddev")
local lo, hi, h = stats.ci95(xs)
T.near(h, 1.787487917032178, 1e-7, "95% CI half-width, n = 8")
T.near(lo, 5 - 1.787487917032178, 1e-7, "CI low")
T.near(hi, 5 + 1.787487917032178, 1e-7, "CI high")
local s3 = stats.summary({ 1.5, 2.5, 10.0 })
T.eq(s3.median, 2.5, "summary median")
T.near(s3.stddev, 4.645786621588785, 1e-12, "summary stddev")
T.near(s3.ci95, 11.540773748105867, 1e-6, "95% CI half-width, n = 3")
T.eq(s3.min, 1.5, "min")
T.eq(s3.max, 10.0, "max")
T.eq(stats.stddev({ 4 }), nil, "no spread from one value")
T.eq(stats.t95(1), 12.7062047, "t, 1 df")
T.near(stats.t95(31), 2.039513446396346, 1e-5, "t, 31 df (expansion)")
T.near(stats.t95(100), 1.9839715185235882, 1e-6, "t, 100 df")
T.raises(function() stats.mean({}) end, "non-empty list")
T.raises(function() stats.mean({ 1, "x" }) end, "element 2 is a string")
local calls = {}
local vals, sm = stats.measure(function(i) calls[#calls + 1] = i; return i * 2 end, { warmup = 2, repetitions = 3 })
T.eq(table.concat(calls, ","), "-1,-2,1,2,3", "measure: warm-ups then repetitions")
T.eq(table.concat(vals, ","), "2,4,6", "measure: values")
T.eq(sm.mean, 4.0, "measure: summary")
T.raises(function() stats.measure(function() return "x" end, { warmup = 0, repetitions = 1 }) end, "not a number")

-- qinfer: argument checks that need no model, with the caller's file:line
T.raises(function() qinfer.load({}) end, "test_unit.lua:", "bad argument #1 to 'load'", "string expected")
T.raises(function() qinfer.load("/nonexistent/model.gguf") end, "test_unit.lua:", "/nonexistent/model.gguf")
T.raises(function() qinfer.load("x", { thread = 2 }) end, "unknown option 'thread'", "options: threads")
T.raises(function() qinfer.load("x", { threads = "2" }) end, "option 'threads': integer expected, got string")
T.raises(function() qinfer.perplexity(nil, "devil") end, "bad argument #1 to 'perplexity'")
T.raises(function() qinfer.generate(42, "x") end, "bad argument #1 to 'generate'", "qinfer engine or model expected")
T.eq(type(qinfer.sysinfo().cores), "number", "sysinfo")
local t0 = qinfer.now()
qinfer.sleep(0.01)
T.ok(qinfer.now() - t0 >= 0.009, "now/sleep")

T.done("test_unit")
