-- qinfer.workload and qinfer.serve: seeded workloads reproduce (and another
-- seed changes them), offline arrivals are all at 0, traces are read, bad
-- options are refused naming the key; then, on the cached default model, a
-- workload served with continuous batching under a KV memory budget and a
-- queue limit: every request done with all its tokens or rejected with a
-- reason, the run's figures under the canonical names.
local T = require "testlib"
local qinfer = require "qinfer"

local a = qinfer.workload{ n = 50, rate = 10, prompt_len = "uniform:8-64", output_len = "lognormal:16,0.5", seed = 4 }
local b = qinfer.workload{ n = 50, rate = 10, prompt_len = "uniform:8-64", output_len = "lognormal:16,0.5", seed = 4 }
local c = qinfer.workload{ n = 50, rate = 10, prompt_len = "uniform:8-64", output_len = "lognormal:16,0.5", seed = 5 }
local same, differ = true, false
for i = 1, 50 do
  for _, k in ipairs({ "arrival", "n_prompt", "n_out" }) do
    same = same and a[i][k] == b[i][k]
    differ = differ or a[i][k] ~= c[i][k]
  end
  T.ok(a[i].n_prompt >= 8 and a[i].n_prompt <= 64, "uniform prompt length in range")
  if i > 1 then T.ok(a[i].arrival >= a[i - 1].arrival, "arrivals in order") end
end
T.ok(same, "one seed, one workload")
T.ok(differ, "another seed, another workload")
local off = qinfer.workload{ n = 5, prompt_len = 12, output_len = 3 }
for i = 1, 5 do T.ok(off[i].arrival == 0 and off[i].n_prompt == 12 and off[i].n_out == 3, "offline: all at 0") end

local path = os.tmpname()
local f = assert(io.open(path, "w"))
f:write("arrival_s prompt output\n0 10 4\n0.5 20 2 # late\n")
f:close()
local tr = qinfer.workload{ trace = path }
T.eq(#tr, 2, "trace requests")
T.eq(tr[2].arrival, 0.5, "trace arrival")
T.eq(tr[2].n_prompt, 20, "trace prompt length")
f = assert(io.open(path, "w"))
f:write("0 10 4\n0 x 4\n")
f:close()
T.raises(function() qinfer.workload{ trace = path } end, ":2: expected")
os.remove(path)
T.raises(function() qinfer.workload{ trace = "x", n = 3 } end, "'n' does not apply to a trace")
T.raises(function() qinfer.workload{ n = 3, prompt_len = "zipf:2" } end, "prompt_len", "unknown kind")
T.raises(function() qinfer.workload{ n = 3, rate = -1 } end, "rate")
T.raises(function() qinfer.workload{ n = 0 } end, "'n'")
T.raises(function() qinfer.workload{ bogus = 1 } end, "bogus")
T.raises(function() qinfer.workload{ corpus = "devil" } end, "needs option 'model'")

if arg[1] ~= "model" then T.done("test_serve (no model)") return end
local m = qinfer.load("smollm2-135m", { threads = 2 })
local w = qinfer.workload{ n = 6, rate = 50, prompt_len = "uniform:8-24", output_len = "uniform:2-5", seed = 7,
  model = m, corpus = "devil" }
local r = qinfer.serve(m, w, { max_batch = 3, n_ctx = 64, corpus = "devil", queue_limit = 2,
  ttft_slo_s = 30, tpot_slo_s = 30 })
T.eq(r.n_requests, 6, "every request accounted for")
T.eq(r.n_done + r.n_rejected, 6, "done or rejected")
for i, q in ipairs(r.requests) do
  if q.rejected then
    T.ok(q.reason ~= nil and #q.reason > 0, "request " .. i .. " rejected with a reason")
  else
    T.eq(q.n_out, w[i].n_out, "request " .. i .. " got every token")
    T.eq(#q.tokens, q.n_out, "a time per token")
    T.eq(#q.ids, q.n_out, "an id per token")
    T.ok(q.start >= q.arrival, "scheduled after it arrived")
    T.near(q.ttft_s, q.tokens[1] - q.arrival, 1e-9, "its TTFT")
    T.near(q.e2e_s, q.tokens[#q.tokens] - q.arrival, 1e-9, "its e2e")
    T.near(q.queue_s, q.start - q.arrival, 1e-9, "its queueing delay")
    if q.n_out > 1 then T.near(q.tpot_s, (q.e2e_s - q.ttft_s) / (q.n_out - 1), 1e-9, "its TPOT") end
  end
end
local names = {}
for _, mt in ipairs(r.metrics) do names[mt[1]] = mt[2] end
T.ok(names["ttft.p99_s"] ~= nil and names["throughput.output_tokens_per_s"] > 0, "run figures under their names")
T.eq(names["requests.done"], r.n_done + 0.0, "requests.done")
-- a queue of 1: of 4 arriving at once, the first waits and 3 are turned away
local burst = qinfer.workload{ n = 4, prompt_len = 8, output_len = 2 }
local rb = qinfer.serve(m, burst, { max_batch = 1, n_ctx = 32, queue_limit = 1 })
T.eq(rb.n_rejected, 3, "queue limit")
T.ok(not rb.requests[1].rejected, "the first is served")
T.eq(rb.requests[4].reason, "queue full", "its reason")
T.raises(function() qinfer.serve(m, { { arrival = 1, n_prompt = 4, n_out = 2 }, { arrival = 0, n_prompt = 4, n_out = 2 } }) end,
  "before the previous one")
T.raises(function() qinfer.serve(m, {}) end, "a workload of 1.. requests")
T.raises(function() qinfer.serve(m, burst, { kv_memory = -1 }) end, "kv_memory")
-- preemption under a KV budget of 3 block sets (a block: 64 tokens of K and V
-- in every layer x KV-head stream): by recompute, and by swap to the offload
-- tier, which gives the same outputs, swaps every preemption and feeds only
-- the prompts
local set = 30 * 3 * 64 * 64 * 2 * 2
local wp = qinfer.workload{ n = 4, prompt_len = 60, output_len = 8, seed = 3 }
local rr = qinfer.serve(m, wp, { max_batch = 3, n_ctx = 160, kv_memory = 3 * set })
local rs = qinfer.serve(m, wp, { max_batch = 3, n_ctx = 160, kv_memory = 3 * set, preempt = "swap" })
T.ok(rr.n_preemptions > 0 and rr.n_recomputes == rr.n_preemptions and rr.n_swaps == 0, "recompute preempts")
T.ok(rs.n_preemptions > 0 and rs.n_swaps == rs.n_preemptions and rs.n_recomputes == 0, "swap preempts by swap")
T.eq(rs.prefill_tokens, 4 * 60, "swap feeds the prompts alone")
T.ok(rr.prefill_tokens > rs.prefill_tokens, "recompute feeds more prompt tokens")
T.ok(rs.peak_swap_bytes > 0 and rs.peak_kv_bytes <= 3 * set, "swapped KV apart from the budget")
for i, q in ipairs(rs.requests) do
  T.eq(table.concat(q.ids, ","), table.concat(rr.requests[i].ids, ","), "request " .. i .. ": the same output")
  T.eq(q.swaps, q.preemptions, "request " .. i .. ": its preemptions swaps")
  T.eq(q.prefill_tokens, 60, "request " .. i .. ": its prompt fed once")
end
T.raises(function() qinfer.serve(m, burst, { preempt = "drop" }) end, "preempt", "'recompute' or 'swap'")
T.raises(function() qinfer.serve(m, burst, { preempt = 1 }) end, "preempt")
T.done("test_serve")
