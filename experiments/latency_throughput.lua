-- latency_throughput.lua - the serving trade-off between latency and
-- throughput on the default model (smollm2-135m): requests arrive over
-- time (Poisson) at a rising rate and are served with continuous batching
-- (qinfer.serve); each KV policy gives a frontier of output-token
-- throughput against p99 time per output token, and the rate where the
-- latency bounds break. And the paper's large-batch comparison: the same
-- 64 requests all at once (offline), served one at a time and 64 at once,
-- their mean end-to-end latency and throughput.
--
-- Workload: prompts of 16-64 tokens taken from the devil corpus, 16 output
-- tokens each, greedy; the workload's seed is the configuration's, so every
-- policy and rate sees the same requests in the same order. Latency bounds
-- (for goodput): TTFT <= 2 s, TPOT <= 0.25 s (this model on 2 cores).
--
-- Sweep: kv_policy full, h2o and qinfer (h2o and qinfer at kv_budget 0.5,
-- which full ignores) x rate 0 (offline), 1, 2, 4, 8, 16 requests per
-- second: 18 configurations. Online: 24 requests, at most 16 admitted at
-- once. Offline: 64 requests served at max_batch 1 and at max_batch 64 in
-- the same run (the batch is the metrics' params). Takes about 20 minutes
-- on 2 cores, most of it offline at batch 1; --set kv_policy=full about 7.
--
-- Metrics (one value per configuration; every one with params {max_batch = B};
-- names and definitions: results/README.md):
--   ttft.*_s, tpot.*_s, itl.*_s, e2e.*_s, queue.*_s   mean, median, p90, p99   (s)
--   throughput.requests_per_s, throughput.output_tokens_per_s,
--   throughput.total_tokens_per_s, goodput.requests_per_s, requests.done,
--   requests.rejected, run.duration_s
--   serve.preemptions     requests preempted                       (1)
--   request.ttft_s, request.tpot_s, request.e2e_s, request.queue_s   each request's own (s),
--   request.preemptions, request.rejected (1): params {max_batch = B, request = i}
--   request.swaps, request.recomputes, request.prefill_tokens (1): a preempted request's
--     preemptions by kind and the tokens it fed as prompts, params as above
--
--   qinfer run experiments/latency_throughput.lua -t 2          -> results/latency_throughput.db
--   qinfer run experiments/latency_throughput.lua -t 2 --set kv_policy=full
--   qinfer results latency_throughput --by kv_policy,rate --metric "throughput.output_tokens_per_s[max_batch=16],tpot.p99_s[max_batch=16]"
--   bash plots/make_all.sh      -> plots/out/latency_throughput.png
--
-- Needs models/fetch.sh smollm2-135m devil.
local qinfer = require "qinfer"

local SLO = { ttft_slo_s = 2.0, tpot_slo_s = 0.25 }

local function record(ctx, r, batch)
  local p = { params = { max_batch = batch } }
  for _, mt in ipairs(r.metrics) do ctx.metric(mt[1], mt[2], mt[3], p) end
  ctx.metric("serve.preemptions", r.n_preemptions, "1", p)
  -- each request's own figures, params {max_batch, request}
  for i, q in ipairs(r.requests) do
    local pq = { params = { max_batch = batch, request = i } }
    for _, k in ipairs({ "ttft", "tpot", "e2e", "queue" }) do
      if q[k .. "_s"] then ctx.metric("request." .. k .. "_s", q[k .. "_s"], "s", pq) end
    end
    ctx.metric("request.preemptions", q.preemptions, "1", pq)
    if q.preemptions > 0 then
      ctx.metric("request.swaps", q.swaps, "1", pq)
      ctx.metric("request.recomputes", q.recomputes, "1", pq)
      ctx.metric("request.prefill_tokens", q.prefill_tokens, "1", pq)
    end
    ctx.metric("request.rejected", q.rejected and 1 or 0, "1", pq)
  end
end

return {
  name = "latency_throughput",
  params = {
    model = { "smollm2-135m" },
    kv_policy = { "full", "h2o", "qinfer" },
    kv_budget = { 0.5 },
    rate = { 0, 1, 2, 4, 8, 16 },
  },
  order = { "model", "kv_policy", "rate" },
  cost = function(cfg) return cfg.rate == 0 and 8 or 1 end,
  run = function(cfg, ctx)
    local m = qinfer.load(cfg.model)
    local kv = cfg.kv_policy ~= "full" and { kv_policy = cfg.kv_policy, kv_budget = cfg.kv_budget } or {}
    local function serve(w, batch)
      local o = { max_batch = batch, n_ctx = 96, corpus = "devil", ttft_slo_s = SLO.ttft_slo_s,
        tpot_slo_s = SLO.tpot_slo_s, kv_policy = kv.kv_policy, kv_budget = kv.kv_budget }
      return qinfer.serve(m, w, o)
    end
    if cfg.rate == 0 then
      local w = qinfer.workload{ n = 64, prompt_len = "uniform:16-64", output_len = 16, seed = 1,
        model = m, corpus = "devil" }
      for _, batch in ipairs({ 1, 64 }) do record(ctx, serve(w, batch), batch) end
    else
      local w = qinfer.workload{ n = 24, rate = cfg.rate, prompt_len = "uniform:16-64", output_len = 16, seed = 1,
        model = m, corpus = "devil" }
      record(ctx, serve(w, 16), 16)
    end
  end,
}
