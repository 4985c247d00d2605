-- quickstart.lua - a first comparison of KV cache policies on the default
-- model (smollm2-135m): what each costs in accuracy and what it buys in
-- decode speed when it keeps half of the cache.
--
-- Measures, for the policies full, window, h2o and qinfer at a budget of
-- 50% of each sequence's length:
--   ppl.value, ppl.err     perplexity of the devil corpus, 2 chunks of 256
--                          tokens decoded one token per step (so the policy
--                          evicts as it would while generating), 2 at once;
--                          deterministic, so measured once (repetition 0)
--   kv.work_tokens         working KV tokens per (layer, KV head) stream,
--                          averaged over the scored positions
--   decode.tokens_per_s    greedy decode rate, params {batch = 1} and
--                          {batch = 4} (aggregate over the 4 sequences;
--                          64-token prompts, 32 steps)
--   prefill.ttft_s         time to the first token of every sequence of
--                          the batch, params {batch = 4}
-- (shown by `qinfer results` as decode.tokens_per_s[batch=4]; names and
-- definitions: results/README.md)
-- Throughput is repeated 3 times after 1 warm-up.
--
-- Takes under a minute on 2 cores (about 10 s per policy; 43 s measured);
-- needs models/fetch.sh smollm2-135m devil.
--
--   qinfer run experiments/quickstart.lua            -> results/kv_quickstart.db
--   qinfer run experiments/quickstart.lua --set kv_policy=h2o
--   sqlite3 -header -column results/kv_quickstart.db "SELECT json_extract(r.config_json, '$.kv_policy') AS policy,
--     m.name, m.params, avg(m.value) FROM runs r JOIN metrics m ON m.run_id = r.id GROUP BY policy, m.name, m.params"
local qinfer = require "qinfer"

return {
  name = "kv_quickstart",
  params = {
    model = { "smollm2-135m" },
    kv_policy = { "full", "window", "h2o", "qinfer" },
    kv_budget = { 0.5 },
  },
  order = { "model", "kv_policy", "kv_budget" },
  repetitions = 3,
  warmup = 1,
  run = function(cfg, ctx)
    local m = qinfer.load(cfg.model)
    local kv = { kv_policy = cfg.kv_policy, kv_budget = cfg.kv_budget }
    if ctx.repetition == 0 and not ctx.warmup then
      local r = qinfer.perplexity(m, "devil", { ctx = 256, chunks = 2, decode = true, batch = 2,
        kv_policy = kv.kv_policy, kv_budget = kv.kv_budget })
      ctx.metric("ppl.value", r.ppl, "1")
      ctx.metric("ppl.err", r.err, "1")
      ctx.metric("kv.work_tokens", r.work_tokens, "tok")
    end
    for _, batch in ipairs({ 1, 4 }) do
      local t = qinfer.throughput(m, { batch = batch, n_gen = 32, prompt = 64,
        kv_policy = kv.kv_policy, kv_budget = kv.kv_budget })
      ctx.metric("decode.tokens_per_s", t.tokens_per_s, "tok/s", { params = { batch = batch } })
      if batch == 4 then ctx.metric("prefill.ttft_s", t.ttft_s, "s", { params = { batch = batch } }) end
    end
  end,
}
