-- sweep.lua - the configurations of an experiment.
--
-- An experiment's `params` maps each parameter to a list of values; the
-- sweep is the cartesian product of those lists. Lua's pairs() order
-- depends on how a table was built, so the order here is fixed: the keys of
-- `order` first, as given, then the others sorted by name; the first key is
-- the outermost loop, the last varies fastest. A value that is not a table
-- is a list of one. `qinfer run --set key=value` pins one parameter to one
-- value, converted to the type of that parameter's list.
--
-- sweep.json writes a configuration as JSON for the results database, which
-- keys every run by a hash of its canonical form: integers and floats stay
-- apart (16 and 16.0 are different configurations, as Lua sees them).
--
-- sweep.assign splits the configurations into N shards (`qinfer run --shard
-- I/N`, one per Slurm array task). Every shard computes the whole split and
-- keeps its own part, so the shards need not talk to each other: the split
-- must depend on nothing but the configurations and their costs. It is the
-- greedy "longest processing time first" rule: configurations by estimated
-- cost, largest first (ties in sweep order), each to the shard with the
-- least cost so far (ties to the lowest shard). No shard then exceeds
-- another by more than the largest single cost. Without a cost estimate
-- every configuration costs 1 and the rule is a round robin in sweep order.
-- Considered: hashing each configuration's key to a shard (stable when the
-- sweep grows, but unbalanced for small sweeps and blind to cost), and
-- contiguous blocks (one shard would get all the long contexts).
local sweep = {}

local function fail(fmt, ...) error(string.format(fmt, ...), 0) end

-- The list of values of params[key].
function sweep.values(params, key)
  local v = params[key]
  if type(v) ~= "table" then return { v } end
  local n = #v
  if n == 0 then
    fail("params.%s is not a list of values (an empty table or a map; wrap a table value in a list: {{...}})", key)
  end
  for k in pairs(v) do
    if math.type(k) ~= "integer" or k < 1 or k > n then
      fail("params.%s mixes a list with other keys (wrap a table value in a list: {{...}})", key)
    end
  end
  return v
end

-- The parameter names in sweep order.
function sweep.keys(params, order)
  local keys, seen = {}, {}
  for i, k in ipairs(order or {}) do
    if type(k) ~= "string" then fail("order[%d] is not a parameter name", i) end
    if params[k] == nil then fail("order names '%s', which is not in params", k) end
    if seen[k] then fail("order names '%s' twice", k) end
    seen[k] = true
    keys[#keys + 1] = k
  end
  local rest = {}
  for k in pairs(params) do
    if type(k) ~= "string" then fail("params has a key that is not a string (%s)", tostring(k)) end
    if not seen[k] then rest[#rest + 1] = k end
  end
  table.sort(rest)
  for _, k in ipairs(rest) do keys[#keys + 1] = k end
  return keys
end

-- Every configuration (a table key -> value), in sweep order, and the keys.
function sweep.product(params, order)
  local keys = sweep.keys(params, order)
  local lists = {}
  for i, k in ipairs(keys) do lists[i] = sweep.values(params, k) end
  local out, idx = {}, {}
  for i = 1, #keys do idx[i] = 1 end
  while true do
    local cfg = {}
    for i, k in ipairs(keys) do cfg[k] = lists[i][idx[i]] end
    out[#out + 1] = cfg
    local j = #keys
    while j >= 1 do
      idx[j] = idx[j] + 1
      if idx[j] <= #lists[j] then break end
      idx[j] = 1
      j = j - 1
    end
    if j == 0 then break end
  end
  return out, keys
end

-- The keys with more than one value (what tells configurations apart).
function sweep.varying(params, keys)
  local out = {}
  for _, k in ipairs(keys) do
    if #sweep.values(params, k) > 1 then out[#out + 1] = k end
  end
  return out
end

-- text (from key=text) as a value of the same type as the list's values.
function sweep.convert(list, key, text)
  local kinds = {}
  for _, v in ipairs(list) do kinds[math.type(v) or type(v)] = true end
  if kinds.table or kinds["function"] or kinds.userdata then
    fail("--set %s: a parameter with table values cannot be set from the command line", key)
  end
  if kinds.integer or kinds.float then
    local n = tonumber(text)
    if n then
      if kinds.float and not kinds.integer then return n + 0.0 end
      if kinds.integer and not kinds.float then
        local i = math.tointeger(n)
        if not i then fail("--set %s=%s: not an integer, as the values of %s are", key, text, key) end
        return i
      end
      return n
    end
    if not (kinds.string or kinds.boolean) then
      fail("--set %s=%s: not a number, as the values of %s are", key, text, key)
    end
  end
  if kinds.boolean then
    if text == "true" then return true end
    if text == "false" then return false end
    if not kinds.string then fail("--set %s=%s: not true or false, as the values of %s are", key, text, key) end
  end
  return text
end

-- A copy of params with each "key=value" of sets pinned to its one value.
function sweep.pin(params, sets)
  local out = {}
  for k, v in pairs(params) do out[k] = v end
  for _, s in ipairs(sets or {}) do
    local k, text = s:match("^([^=]+)=(.*)$")
    if not k then fail("--set '%s' is not key=value", s) end
    if params[k] == nil then
      local names = sweep.keys(params)
      fail("--set %s: unknown parameter '%s' (parameters: %s)", s, k,
        #names > 0 and table.concat(names, ", ") or "none")
    end
    out[k] = { sweep.convert(sweep.values(params, k), k, text) }
  end
  return out
end

local escapes = { ['"'] = '\\"', ['\\'] = '\\\\', ['\b'] = '\\b', ['\f'] = '\\f', ['\n'] = '\\n',
  ['\r'] = '\\r', ['\t'] = '\\t' }

local function json_string(s)
  return '"' .. s:gsub('[%c"\\]', function(c)
    return escapes[c] or string.format("\\u%04x", c:byte())
  end) .. '"'
end

local function json_number(v)
  if math.type(v) == "integer" then return string.format("%d", v) end
  if v ~= v or v == math.huge or v == -math.huge then fail("%s cannot be stored as JSON", tostring(v)) end
  local s
  for digits = 15, 17 do -- the fewest digits that read back exactly
    s = string.format("%." .. digits .. "g", v)
    if tonumber(s) == v then break end
  end
  if not s:find("[.eE]") then s = s .. ".0" end
  return s
end

local function json(v, depth)
  if depth > 32 then fail("a configuration nests tables deeper than 32") end
  local t = type(v)
  if t == "string" then return json_string(v) end
  if t == "number" then return json_number(v) end
  if t == "boolean" then return tostring(v) end
  if t ~= "table" then fail("a %s value cannot be stored as JSON", t) end
  local n, count = #v, 0
  for _ in pairs(v) do count = count + 1 end
  if n > 0 and n == count then
    local parts = {}
    for i = 1, n do parts[i] = json(v[i], depth + 1) end
    return "[" .. table.concat(parts, ",") .. "]"
  end
  local keys = {}
  for k in pairs(v) do
    if type(k) ~= "string" then fail("a table with a %s key cannot be stored as a JSON object", type(k)) end
    keys[#keys + 1] = k
  end
  table.sort(keys)
  local parts = {}
  for i, k in ipairs(keys) do parts[i] = json_string(k) .. ":" .. json(v[k], depth + 1) end
  return "{" .. table.concat(parts, ",") .. "}"
end

-- v as JSON text (objects with sorted keys).
function sweep.json(v) return json(v, 0) end

local function show(v)
  if type(v) == "table" then return sweep.json(v) end
  if math.type(v) == "float" then return json_number(v) end
  return tostring(v)
end

-- "k=v k=v" over keys.
function sweep.describe(cfg, keys)
  local parts = {}
  for i, k in ipairs(keys) do parts[i] = k .. "=" .. show(cfg[k]) end
  return table.concat(parts, " ")
end

-- The shard (0 .. n-1) of each configuration, and each shard's total cost,
-- for costs[i] >= 0 of the configurations in sweep order.
function sweep.assign(costs, n)
  if math.type(n) ~= "integer" or n < 1 then fail("the number of shards must be an integer >= 1") end
  local order = {}
  for i = 1, #costs do order[i] = i end
  table.sort(order, function(a, b)
    if costs[a] ~= costs[b] then return costs[a] > costs[b] end
    return a < b
  end)
  local load, shard = {}, {}
  for s = 1, n do load[s] = 0 end
  for _, i in ipairs(order) do
    local best = 1
    for s = 2, n do
      if load[s] < load[best] then best = s end
    end
    shard[i] = best - 1
    load[best] = load[best] + costs[i]
  end
  return shard, load
end

-- cost(cfg) of every configuration: a number >= 0 (1 each without a cost function).
function sweep.costs(configs, keys, cost)
  local out = {}
  for i, cfg in ipairs(configs) do
    if cost == nil then
      out[i] = 1
    else
      local ok, c = pcall(cost, cfg)
      if not ok then fail("cost(%s): %s", sweep.describe(cfg, keys), tostring(c)) end
      if type(c) ~= "number" or c ~= c or c < 0 or c == math.huge then
        fail("cost(%s) returned %s: a finite number >= 0 expected", sweep.describe(cfg, keys), tostring(c))
      end
      out[i] = c
    end
  end
  return out
end

local function opt_int(exp, key, def, lo)
  local v = exp[key]
  if v == nil then return def end
  if math.type(v) ~= "integer" or v < lo then fail("'%s' must be an integer >= %d, not %s", key, lo, tostring(v)) end
  return v
end

-- Check an experiment table and lay out its sweep (pins applied):
-- { name, keys, shown (the keys that describe a configuration), configs,
--   json (configs as JSON), repetitions, warmup, seed, run, total (the
--   sweep's configurations), index (each configuration's place in the whole
--   sweep), shard (of each of the whole sweep's configurations, 0-based),
--   cost (of each configuration kept), load (the kept part's total cost) }.
-- With shard_count (an integer >= 1), only the configurations of shard
-- shard_index (0 .. shard_count - 1) are kept, in sweep order.
function sweep.prepare(exp, sets, shard_index, shard_count)
  if type(exp) ~= "table" then
    fail("the script gave no experiment: return a table { name = ..., params = {...}, run = function(cfg, ctx) " ..
      "... end } or set the global 'experiment'")
  end
  local known = { name = true, params = true, order = true, repetitions = true, warmup = true, seed = true,
    run = true, description = true, cost = true }
  for k in pairs(exp) do
    if not known[k] then
      fail("the experiment has an unknown field '%s' (fields: name, description, params, order, " ..
        "repetitions, warmup, seed, cost, run)", tostring(k))
    end
  end
  if type(exp.name) ~= "string" or exp.name == "" then fail("the experiment needs a name (a non-empty string)") end
  if type(exp.run) ~= "function" then fail("the experiment needs a run function: run = function(cfg, ctx) ... end") end
  local params = exp.params or {}
  if type(params) ~= "table" then fail("params must be a table of value lists") end
  if exp.order ~= nil and type(exp.order) ~= "table" then fail("order must be a list of parameter names") end
  if exp.cost ~= nil and type(exp.cost) ~= "function" then
    fail("cost must be a function(cfg) returning the configuration's estimated cost (a number >= 0)")
  end
  local count = shard_count or 1
  local index = shard_index or 0
  if math.type(count) ~= "integer" or count < 1 or math.type(index) ~= "integer" or index < 0 or index >= count then
    fail("shard %s/%s: want I/N with 0 <= I < N", tostring(index), tostring(count))
  end
  local pinned = sweep.pin(params, sets)
  local configs, keys = sweep.product(pinned, exp.order)
  local shown = sweep.varying(pinned, keys)
  if #shown == 0 then shown = keys end
  local texts = {}
  for i, cfg in ipairs(configs) do
    local ok, text = pcall(sweep.json, cfg)
    if not ok then fail("configuration %s: %s", sweep.describe(cfg, keys), text) end
    texts[i] = text
  end
  local costs = sweep.costs(configs, keys, exp.cost)
  local shard, loads = sweep.assign(costs, count)
  local kept, kept_json, kept_index, kept_cost = {}, {}, {}, {}
  for i = 1, #configs do
    if shard[i] == index then
      kept[#kept + 1] = configs[i]
      kept_json[#kept_json + 1] = texts[i]
      kept_index[#kept_index + 1] = i
      kept_cost[#kept_cost + 1] = costs[i]
    end
  end
  return {
    name = exp.name, keys = keys, shown = shown, configs = kept, json = kept_json,
    repetitions = opt_int(exp, "repetitions", 1, 1), warmup = opt_int(exp, "warmup", 0, 0),
    seed = opt_int(exp, "seed", 42, 0), run = exp.run,
    total = #configs, index = kept_index, shard = shard, cost = kept_cost, load = loads[index + 1],
  }
end

return sweep
