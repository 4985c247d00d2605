-- throughput_def.lua MODE - the Lua side of test_throughput.sh, on the
-- workload every front end runs there (4 sequences or requests, prompts of
-- 8 tokens, 8 greedy output tokens each):
--   decode  qinfer.throughput at batch 4: its rate must be B x N over its
--           own decode seconds; prints "decode RATE SECONDS"
--   serve   qinfer.serve of the 4 requests: its output-token throughput
--           must be the output tokens over first arrival to last token, as
--           its own exported timeline says, under the name and unit of
--           results/README.md; the same timeline given back to
--           qinfer.measure_requests must give the same figures, bit for
--           bit; prints "metric NAME UNIT" for each figure of the run.
--   timeline FILE  the server's recorded timelines (check_throughput.py
--           wrote them, with /metrics' figures) given to
--           qinfer.measure_requests: every figure must be the server's
--           (to the 9 digits /metrics prints); prints "timeline N" with the
--           number of figures compared.
-- Errors (a figure off its definition) raise, so the script exits non-zero.
local qinfer = require "qinfer"
local mode = arg[1]
local m = mode ~= "timeline" and qinfer.load("smollm2-135m", { threads = 2 }) or nil

local function near(a, b, what)
  if not (math.abs(a - b) <= 1e-12 * math.abs(b)) then
    error(string.format("%s: %.17g, by its definition %.17g", what, a, b), 0)
  end
end

if mode == "decode" then
  local t = qinfer.throughput(m, { batch = 4, n_gen = 8, prompt = 8 })
  near(t.tokens_per_s, 4 * 8 / t.decode_s, "qinfer.throughput: tokens_per_s")
  near(t.per_seq_tokens_per_s, 8 / t.decode_s, "qinfer.throughput: per_seq_tokens_per_s")
  print(string.format("decode %.17g %.17g", t.tokens_per_s, t.decode_s))
elseif mode == "serve" then
  local w = qinfer.workload { n = 4, prompt_len = 8, output_len = 8, seed = 7 }
  local r = qinfer.serve(m, w, { max_batch = 4, n_ctx = 64, seed = 7 })
  local first, last, out, reqs = math.huge, -math.huge, 0, {}
  for i, q in ipairs(r.requests) do
    assert(not q.rejected, "request " .. i .. " rejected: " .. tostring(q.reason))
    first = math.min(first, q.arrival)
    last = math.max(last, q.tokens[#q.tokens])
    out = out + q.n_out
    reqs[i] = { arrival = q.arrival, start = q.start, tokens = q.tokens, n_prompt = q.n_prompt }
  end
  assert(out == 32 and r.output_tokens == 32, "output tokens: " .. out .. ", the run says " .. r.output_tokens)
  near(r.duration_s, last - first, "qinfer.serve: duration_s")
  near(r.output_tokens_per_s, out / (last - first), "qinfer.serve: output_tokens_per_s")
  near(r.requests_per_s, 4 / (last - first), "qinfer.serve: requests_per_s")
  local again = qinfer.measure_requests(reqs)
  for _, k in ipairs { "duration_s", "output_tokens_per_s", "total_tokens_per_s", "requests_per_s" } do
    if again[k] ~= r[k] then
      error(string.format("%s: %.17g from the run, %.17g from its timeline", k, r[k], again[k]), 0)
    end
  end
  local seen = false
  for _, mt in ipairs(r.metrics) do
    print(string.format("metric %s %s", mt[1], mt[3]))
    if mt[1] == "throughput.output_tokens_per_s" then
      seen = true
      if mt[2] ~= r.output_tokens_per_s then error("the metric list's throughput is not the run's", 0) end
    end
  end
  assert(seen, "no throughput.output_tokens_per_s in the run's metrics")
elseif mode == "timeline" then
  local reqs, server = {}, {}
  for line in io.lines(arg[2]) do
    local name, v = line:match("^figure (%S+) (%S+)$")
    if name then
      server[name] = tonumber(v)
    else
      local x = {}
      for w in line:gmatch("%S+") do x[#x + 1] = tonumber(w) end
      reqs[#reqs + 1] = { arrival = x[1], start = x[2], n_prompt = math.tointeger(x[3]),
        tokens = table.move(x, 4, #x, 1, {}) }
    end
  end
  local r = qinfer.measure_requests(reqs)
  local n = 0
  for _, mt in ipairs(r.metrics) do
    local s = server["qinfer_" .. mt[1]:gsub("%.", "_")]
    if s == nil then error("/metrics lacks " .. mt[1], 0) end
    if not (math.abs(s - mt[2]) <= 1e-8 * math.abs(mt[2]) + 1e-12) then
      error(string.format("%s: the server says %.9g, its own timeline %.17g", mt[1], s, mt[2]), 0)
    end
    n = n + 1
  end
  assert(n > 10 and server.qinfer_throughput_output_tokens_per_s, "too few figures compared: " .. n)
  print("timeline " .. n)
else
  error("usage: throughput_def.lua decode|serve|timeline FILE", 0)
end
