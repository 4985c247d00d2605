-- sparsity_sweep.lua - what training-free activation sparsity costs in
-- accuracy and buys in decode speed on the CPU: perplexity of a text and
-- decode tokens/s against the target sparsity, for both modes (teal: every
-- matmul's input thresholded; cats: the MLP's neurons by |act(gate)|), on
-- SmolLM2-135M, Gemma 3 270M and Qwen2.5-Coder-1.5B. Sparsity 0 is the
-- dense engine (bit for bit), the control.
--
-- Thresholds come from a calibration per model, made first from another
-- part of the corpus than the one scored (the perplexity reads the first
-- ctx * chunks tokens; the calibration 4096 tokens from token 65536 on,
-- ppl's chunks 128-135 at ctx 512):
--   qinfer profile -m MODEL -f devil --skip 65536 --tokens 4096 --sparsity-out results/calib/MODEL.spc
-- (the directory is the parameter calib_dir).
--
-- Metrics per configuration (measured on this machine, never simulated):
--   ppl.value          perplexity, as qinfer ppl --sparsity: decode mode
--                      (one token a step, the chunks batched) or, with
--                      decode=false, a chunk a batch: the same per-token
--                      thresholds and 8-bit activations, 4-8x faster; the
--                      two differ in rounding (the dense kernels' wide form
--                      for many rows), which thresholds amplify: SmolLM2
--                      over 2 chunks, dense 40.9009 a chunk a batch against
--                      40.7371 decoded, teal 0.3 43.2277 against 42.2209.
--                      The Qwen2.5-Coder-1.5B grid in paper-repro is a
--                      chunk a batch                                (1)
--   ppl.err            its standard error                          (1)
--   sparsity.measured  share of the thresholded activations zeroed (1)
--   decode.tokens_per_s  (speed=true) decode rate at batch `batch` (aggregate),
--                      qinfer.throughput (n_gen tokens after a 32-token
--                      prompt)                                    (tok/s)
--   decode.sparse_over_dense  (sparsity above 0) a sparse step's time over
--                      a dense one's, the median over pairs of steps
--                      alternating in one engine (vs_dense), with
--   decode.sparse_over_dense_q1, _q3  its quartiles              (1)
--   ppl.seconds        time of the perplexity run                  (s)
--
-- Decode speed is timed `repetitions` times per configuration. The rows'
-- rates move with the machine's load; decode.sparse_over_dense does not
-- (each pair's two steps run back to back): it is the speed figure to
-- compare.
--
--   qinfer run experiments/sparsity_sweep.lua -t 2            -> results/sparsity_sweep.db
--   qinfer run experiments/sparsity_sweep.lua --set model=smollm2-135m --set mode=teal
--   qinfer run experiments/sparsity_sweep.lua --set model=qwen2.5-coder-1.5b --set corpus=devil
--   qinfer run experiments/sparsity_sweep.lua --set model=qwen2.5-coder-1.5b --set corpus=/usr/share/common-licenses/GPL-3
--   qinfer run experiments/sparsity_sweep.lua --set model=qwen2.5-coder-1.5b --set decode=false --set speed=false
--                                             (the perplexity grid alone, a chunk a batch; --set sparsity=S for one point)
--   qinfer results sparsity_sweep --by model,corpus,mode,sparsity --metric ppl.value
--   bash plots/make_all.sh                                    -> plots/out/sparsity_sweep.png
--
-- Needs models/fetch.sh smollm2-135m gemma3-270m qwen2.5-coder-1.5b devil.
local qinfer = require "qinfer"

return {
  name = "sparsity_sweep",
  params = {
    model = { "smollm2-135m", "gemma3-270m", "qwen2.5-coder-1.5b" },
    -- the text scored: a cached corpus's short name or a file's path
    corpus = { "devil" },
    mode = { "teal", "cats" },
    sparsity = { 0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6 },
    ctx = { 512 },
    chunks = { 8 },
    decode = { true },
    batch = { 1 },
    n_gen = { 64 },
    -- false: perplexity only (no decode-speed metrics), for the grid
    speed = { true },
    calib_dir = { "results/calib" },
  },
  order = { "model", "corpus", "mode", "sparsity", "ctx", "chunks", "decode", "batch", "n_gen", "speed", "calib_dir" },
  cost = function(cfg) return cfg.ctx * cfg.chunks + (cfg.speed and 8 * cfg.n_gen or 0) end,
  repetitions = 3,
  warmup = 1,
  run = function(cfg, ctx)
    local m = qinfer.load(cfg.model)
    local calib = string.format("%s/%s.spc", cfg.calib_dir, cfg.model)
    local f = io.open(calib, "r")
    if not f then
      error(string.format("no calibration %s: make it with qinfer profile -m %s -f devil --skip 65536 "
        .. "--tokens 4096 --sparsity-out %s", calib, cfg.model, calib), 0)
    end
    f:close()
    local sp = { sparsity = cfg.sparsity, sparsity_mode = cfg.mode, sparsity_calib = calib }
    -- perplexity is deterministic: once per configuration, cached across repetitions
    local key = string.format("%s/%s/%s/%g/%d/%d/%s", cfg.model, cfg.corpus, cfg.mode, cfg.sparsity, cfg.ctx,
      cfg.chunks, tostring(cfg.decode))
    local r = ctx.cache[key]
    if not r then
      r = qinfer.perplexity(m, cfg.corpus, { ctx = cfg.ctx, chunks = cfg.chunks, batch = cfg.chunks, decode = cfg.decode,
        sparsity = sp.sparsity, sparsity_mode = sp.sparsity_mode, sparsity_calib = sp.sparsity_calib })
      ctx.cache[key] = r
    end
    ctx.metric("ppl.value", r.ppl, "1")
    ctx.metric("ppl.err", r.err, "1")
    ctx.metric("sparsity.measured", r.sparsity < 0 and 0 or r.sparsity, "1")
    ctx.metric("ppl.seconds", r.seconds, "s")
    if not cfg.speed then return end
    local t = qinfer.throughput(m, { batch = cfg.batch, n_gen = cfg.n_gen, prompt = 32, sparsity = sp.sparsity,
      sparsity_mode = sp.sparsity_mode, sparsity_calib = sp.sparsity_calib, vs_dense = cfg.sparsity > 0 })
    ctx.metric("decode.tokens_per_s", t.tokens_per_s, "tok/s")
    if t.vs_dense then
      ctx.metric("decode.sparse_over_dense", t.vs_dense.ratio_median, "1")
      ctx.metric("decode.sparse_over_dense_q1", t.vs_dense.ratio_q1, "1")
      ctx.metric("decode.sparse_over_dense_q3", t.vs_dense.ratio_q3, "1")
    end
  end,
}
