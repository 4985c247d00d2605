-- kv_budget_sweep.lua - what each KV cache policy costs in accuracy as its
-- budget shrinks: perplexity of the devil corpus against the KV budget, for
-- the policies window, streaming, h2o and qinfer, with the full cache as the
-- control, on the default model (smollm2-135m).
--
-- Perplexity is computed in decode mode (one token per step, so a policy
-- evicts as it would while generating), the chunks of a configuration
-- decoded together as a batch. The budget is a fraction of each sequence's
-- length (0.25, 0.5, 0.75, 1.0). The full cache ignores the budget (every
-- layer keeps everything), so its perplexity is computed once per sweep and
-- recorded at every budget: the control line of the figure.
--
-- Metrics (one value per configuration: perplexity is deterministic, so
-- repetitions = 1):
--   ppl.value         perplexity                                  (1)
--   ppl.err           its standard error, as qinfer ppl reports it (1)
--   kv.work_tokens    working KV tokens per (layer, KV head) stream, mean
--                     over the scored positions                   (tok)
--   ppl.seconds       time of the perplexity run                  (s)
--
-- Parameters: ctx (tokens per chunk, default 512) and chunks (default 2);
-- the defaults take about 10 minutes on 2 cores (about 35 s per
-- configuration). For the figure of record use longer chunks:
--
--   qinfer run experiments/kv_budget_sweep.lua -t 2            -> results/kv_budget_sweep.db
--   qinfer run experiments/kv_budget_sweep.lua --set ctx=2048 --set chunks=4
--   qinfer run experiments/kv_budget_sweep.lua --set kv_policy=h2o --set kv_budget=0.5
--   qinfer results kv_budget_sweep --by kv_policy,kv_budget --metric ppl.value
--   bash plots/make_all.sh                                     -> plots/out/ppl_vs_kv_budget.png
--
-- Needs models/fetch.sh smollm2-135m devil.
local qinfer = require "qinfer"

return {
  name = "kv_budget_sweep",
  params = {
    model = { "smollm2-135m" },
    kv_policy = { "full", "window", "streaming", "h2o", "qinfer" },
    kv_budget = { 0.25, 0.5, 0.75, 1.0 },
    ctx = { 512 },
    chunks = { 2 },
  },
  order = { "model", "ctx", "chunks", "kv_policy", "kv_budget" },
  -- relative run time, to balance shards (qinfer run --shard, qinfer submit):
  -- the tokens decoded
  cost = function(cfg) return cfg.ctx * cfg.chunks end,
  repetitions = 1,
  warmup = 0,
  run = function(cfg, ctx)
    local m = qinfer.load(cfg.model)
    local key = string.format("full/%s/%d/%d", cfg.model, cfg.ctx, cfg.chunks)
    local r = cfg.kv_policy == "full" and ctx.cache[key]
    if not r then
      r = qinfer.perplexity(m, "devil", { ctx = cfg.ctx, chunks = cfg.chunks, batch = cfg.chunks, decode = true,
        kv_policy = cfg.kv_policy, kv_budget = cfg.kv_budget })
      if cfg.kv_policy == "full" then ctx.cache[key] = r end
    end
    ctx.metric("ppl.value", r.ppl, "1")
    ctx.metric("ppl.err", r.err, "1")
    ctx.metric("kv.work_tokens", r.work_tokens, "tok")
    ctx.metric("ppl.seconds", r.seconds, "s")
  end,
}
