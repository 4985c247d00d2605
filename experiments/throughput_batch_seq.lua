-- throughput_batch_seq.lua - how decoding speed scales with the batch and
-- with the sequence length, with the full KV cache and with Q-Infer's
-- multi-window policy keeping 50% of each sequence, on the default model
-- (smollm2-135m).
--
-- Each call of qinfer.throughput gives `batch` sequences a prompt of
-- `prompt` pseudo-random tokens (distinct per sequence), prefills them
-- together, then decodes n_gen tokens per sequence greedily, one token per
-- sequence per step. Repeated 3 times after 1 short warm-up call (same
-- batch and policy, a 16-token prompt).
--
-- Metrics (one value per repetition):
--   decode.tokens_per_s          aggregate decode rate, batch x n_gen / time    (tok/s)
--   decode.per_seq_tokens_per_s  the rate of each sequence, n_gen / time        (tok/s)
--   decode.tpot_s                time per output token: one decode step         (s)
--   prefill.ttft_s               time to first token: prefill of the whole batch
--                                until every sequence's first token             (s)
-- (definitions: results/README.md; databases written with the older
-- decode.tpot_ms and prefill.ttft_ms read under these names)
--
-- Sweep: kv_policy full and qinfer (kv_budget 0.5, which full ignores) x
-- prompt 64, 256, 1024 tokens x batch 1, 2, 4, 8, 16; n_gen 32: 30
-- configurations. The whole sweep takes about 30 minutes on 2 cores, most
-- of it in the prefills of 1024-token prompts at batch 8 and 16 (16k tokens
-- each); a part takes a few minutes: --set prompt=64 (throughput against
-- batch, about 3 minutes) or --set batch=1 (time per token against length,
-- about 2 minutes):
--
--   qinfer run experiments/throughput_batch_seq.lua -t 2       -> results/throughput_batch_seq.db
--   qinfer run experiments/throughput_batch_seq.lua -t 2 --set prompt=64
--   qinfer run experiments/throughput_batch_seq.lua -t 2 --set batch=1
--   qinfer results throughput_batch_seq --by kv_policy,prompt,batch --metric decode.tokens_per_s
--   bash plots/make_all.sh        -> plots/out/throughput_vs_batch.png, plots/out/tpot_vs_seq_len.png
--
-- --set repack=true packs the weights (bench/README.md, "Packed weights");
-- --set model=PATH takes any GGUF, e.g. a synthetic one of a larger shape
-- (qinfer synth) whose weights outgrow the last-level cache:
--
--   qinfer synth -o /tmp/tl.gguf --preset tinyllama-1.1b
--   qinfer run experiments/throughput_batch_seq.lua -t 2 --set model=/tmp/tl.gguf --set repack=true \
--       --set prompt=64 --set kv_policy=full --db /tmp/tl.db
--
-- Needs models/fetch.sh smollm2-135m.
local qinfer = require "qinfer"

return {
  name = "throughput_batch_seq",
  params = {
    model = { "smollm2-135m" },
    repack = { false },
    kv_policy = { "full", "qinfer" },
    kv_budget = { 0.5 },
    prompt = { 64, 256, 1024 },
    batch = { 1, 2, 4, 8, 16 },
    n_gen = { 32 },
  },
  order = { "model", "repack", "kv_policy", "kv_budget", "prompt", "batch" },
  -- relative run time, to balance shards (qinfer run --shard, qinfer submit):
  -- the tokens run, prompts and generated ones, over the batch
  cost = function(cfg) return cfg.batch * (cfg.prompt + cfg.n_gen) end,
  repetitions = 3,
  warmup = 1,
  run = function(cfg, ctx)
    local m = qinfer.load(cfg.model, { repack = cfg.repack })
    if ctx.warmup then
      -- threads started, weights paged in, the policy's code run: a short
      -- call does it, the full-size prefill would only cost time
      qinfer.throughput(m, { batch = cfg.batch, prompt = 16, n_gen = 4,
        kv_policy = cfg.kv_policy, kv_budget = cfg.kv_budget })
      return
    end
    local t = qinfer.throughput(m, { batch = cfg.batch, prompt = cfg.prompt, n_gen = cfg.n_gen,
      kv_policy = cfg.kv_policy, kv_budget = cfg.kv_budget })
    ctx.metric("decode.tokens_per_s", t.tokens_per_s, "tok/s")
    ctx.metric("decode.per_seq_tokens_per_s", t.per_seq_tokens_per_s, "tok/s")
    ctx.metric("decode.tpot_s", t.tpot_s, "s")
    ctx.metric("prefill.ttft_s", t.ttft_s, "s")
  end,
}
