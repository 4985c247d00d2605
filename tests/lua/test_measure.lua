-- qinfer.measure_requests on the hand-made timeline of tests/unit/test_measure.c:
-- the Lua API gives the C definitions' figures (TTFT, TPOT, ITL, e2e,
-- queueing delay, percentiles, throughput, goodput), the canonical metric
-- names, and refuses what is not a timeline. With arg[1] = "throughput"
-- (and the model cached) it prints qinfer.throughput's rate instead, for
-- run_tests.sh to hold against bench's under the fake clock.
local T = require "testlib"
local qinfer = require "qinfer"

if arg[1] == "throughput" then
  local m = qinfer.load("smollm2-135m", { threads = 2 })
  local t = qinfer.throughput(m, { batch = 3, n_gen = 6, prompt = 4 })
  print(string.format("%.6f %.6f", t.tokens_per_s, t.decode_s))
  return
end

local reqs = {
  { arrival = 0.0, start = 0.5, tokens = { 1.0, 1.2, 1.5, 2.0 }, n_prompt = 10 },
  { arrival = 1.0, start = 1.0, tokens = { 1.5 }, n_prompt = 20 },
  { arrival = 2.0, start = 3.0, tokens = { 4.0, 4.5 }, n_prompt = 30 },
  { arrival = 2.5, n_prompt = 40, rejected = true },
}
local tol = 1e-12
local r = qinfer.measure_requests(reqs)
T.eq(r.n_requests, 4, "requests")
T.eq(r.n_done, 3, "done")
T.eq(r.n_rejected, 1, "rejected")
T.eq(r.output_tokens, 7, "output tokens")
T.eq(r.prompt_tokens, 60, "prompt tokens of the requests done")
T.near(r.duration_s, 4.5, tol, "duration: first arrival to last token")
T.near(r.requests_per_s, 3 / 4.5, tol, "request throughput")
T.near(r.output_tokens_per_s, 7 / 4.5, tol, "output token throughput")
T.near(r.total_tokens_per_s, 67 / 4.5, tol, "total token throughput")
T.near(r.ttft.mean, 3.5 / 3, tol, "ttft mean")
T.near(r.ttft.p90, 1.8, tol, "ttft p90 (linear between ranks)")
T.eq(r.tpot.n, 2, "a one-token request has no TPOT")
T.near(r.tpot.mean, 5 / 12, tol, "tpot = (e2e - ttft) / (n - 1)")
T.eq(r.itl.n, 4, "every inter-token gap")
T.near(r.itl.median, 0.4, tol, "itl median")
T.near(r.e2e.median, 2.0, tol, "e2e median")
T.near(r.queue.mean, 0.5, tol, "queueing delay")

local g = qinfer.measure_requests(reqs, { ttft_slo_s = 1.0, tpot_slo_s = 0.4 })
T.eq(g.n_good, 2, "two requests meet TTFT <= 1 s and TPOT <= 0.4 s")
T.near(g.goodput_req_per_s, 2 / 4.5, tol, "goodput")

local names = {}
for _, mt in ipairs(r.metrics) do
  T.ok(mt[1]:match("^[a-z0-9_]+%.[a-z0-9_%.]+$") ~= nil, "metric name " .. mt[1])
  T.ok(names[mt[1]] == nil, "metric named once: " .. mt[1])
  names[mt[1]] = mt
end
T.near(names["tpot.p99_s"][2], r.tpot.p99, tol, "tpot.p99_s in the list")
T.eq(names["tpot.p99_s"][3], "s", "its unit")
T.near(names["goodput.requests_per_s"][2], r.goodput_req_per_s, tol, "goodput in the list")
T.near(names["throughput.output_tokens_per_s"][2], 7 / 4.5, tol, "token throughput in the list")

T.raises(function() qinfer.measure_requests({ { arrival = 1, tokens = { 0.5 } } }) end, "request 0", "token 0")
T.raises(function() qinfer.measure_requests({ { arrival = 1, tokens = { 2, 1.5 } } }) end, "token 1")
T.raises(function() qinfer.measure_requests({ { tokens = { 1 } } }) end, "no arrival time")
T.raises(function() qinfer.measure_requests({ { arrival = "x" } }) end, "'arrival'", "not a number")
T.raises(function() qinfer.measure_requests({ 7 }) end, "request 1 is not a table")
T.raises(function() qinfer.measure_requests({}, { bogus = 1 }) end, "bogus")
T.raises(function() qinfer.measure_requests({}, { ttft_slo_s = -1 }) end, "negative")
local empty = qinfer.measure_requests({})
T.eq(empty.n_done, 0, "no requests")
T.eq(empty.requests_per_s, 0.0, "no rate")
T.done("test_measure")
