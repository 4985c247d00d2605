-- neuron_split.lua - the FFN's hot neurons on the GPU against whole layers
-- there, at the paper's scale: LLaMA-2-70B (Q4_0) on the simulated
-- A100-80GB PCIe server with two Xeon sockets
-- (engine/backend/sim/profiles/a100-pcie-2xeon.profile); or a real model
-- by its short name or path (model=qwen2.5-coder-1.5b), its weights read
-- only for their shapes, placed by its measured profile (neuron_profile)
-- and carrying its measured recall (recall_of).
--
-- Every figure here is SIMULATED (engine/backend/sim/README.md): no
-- arithmetic runs and the results database marks every value simulated.
-- The simulator computes no activations, and the profile is "uniform":
-- which units are hot changes no time. What makes a hot-neuron split pay
-- is that the CPU skips the inactive cold neurons (cats), so the CPU's
-- sparsity is a what-if here (--sim-cold-density, sim_cold_density):
--   density=1    the CPU's FFN dense;
--   density=d    with whole layers on the GPU (ngl), the CPU reads up's
--                rows and down's columns of the share d of each layer's
--                neurons (its active share per step); with a split, of
--                the share d x (1 - recall(s)) / (1 - s) of its cold
--                neurons, recall(s) being the share of active neurons
--                the hot set holds: its neurons are the active ones the
--                GPU does not hold. recall(s) is SmolLM2-135M's, measured
--                (`qinfer neuron-plan --profile P --policy static
--                --budget-frac s` on a 4096-token profile of the Devil's
--                Dictionary: 0.186, 0.401, 0.690, 0.882 at s = 0.1, 0.25,
--                0.5, 0.75), carried over to the 70B as an assumption;
--                recall_of=qwen2.5-coder-1.5b takes Qwen2.5-Coder-1.5B's,
--                measured the same way on its own profile (below).
-- At batch 16 the share a step reads is the union over its rows, so a
-- density below 1 there assumes tokens that agree on their neurons.
--
-- Each configuration is one qinfer.throughput call (a 32-token prompt per
-- sequence, then n_gen decode steps) with either
--   mode=split  share s of the FFN's bytes as hot neurons on the GPU
--               (--neuron-policy static --neuron-budget s, placed by
--               neuron_profile: uniform, or a `qinfer profile -o` file of
--               the model, which picks the units the GPU holds), every
--               attention and the cold neurons on the CPU, or
--   mode=ngl    the last round(s * 80) layers whole on the GPU (-ngl),
-- so the figure sets the two against the GPU memory each takes.
--
-- Metrics (one value: the simulation has no noise):
--   decode.tokens_per_s  aggregate decode rate                   (tok/s)
--   decode.tpot_s        time per output token                   (s)
--   gpu.peak_bytes       the GPU's peak memory (weights, activations, KV) (B)
--   cpu.ffn_density      the share of the CPU's FFN neurons read (the what-if) (share)
--
--   qinfer synth --preset llama-2-70b --type q4_0 --shapes-only -o ~/.cache/qinfer/shapes/llama-2-70b-q4_0.gguf
--   qinfer run experiments/neuron_split.lua          -> results/neuron_split.db
--   qinfer profile -m qwen2.5-coder-1.5b -f devil --skip 65536 --tokens 4096 -o results/calib/qwen2.5-coder-1.5b.nprof
--   qinfer run experiments/neuron_split.lua --set model=qwen2.5-coder-1.5b \
--       --set neuron_profile=results/calib/qwen2.5-coder-1.5b.nprof --set recall_of=qwen2.5-coder-1.5b
--   qinfer results neuron_split --by mode,share,batch --metric decode.tokens_per_s,gpu.peak_bytes
--   bash plots/make_all.sh                           -> plots/out/neuron_split.png
local qinfer = require "qinfer"

-- A model's recall of the static hot set at a share of the FFN's bytes
-- (above; `qinfer neuron-plan --profile P --policy static --budget-frac s`,
-- its total line); between the measured shares, linear
local RECALLS = {
  ["smollm2-135m"] = { { 0, 0 }, { 0.1, 0.186 }, { 0.25, 0.401 }, { 0.5, 0.690 }, { 0.75, 0.882 }, { 1, 1 } },
  -- placed from `qinfer profile -m qwen2.5-coder-1.5b -f devil --skip 65536 --tokens 4096 -o P`
  ["qwen2.5-coder-1.5b"] = { { 0, 0 }, { 0.1, 0.168 }, { 0.25, 0.385 }, { 0.5, 0.666 }, { 0.75, 0.875 }, { 1, 1 } },
}
local function recall(of, s)
  local RECALL = RECALLS[of]
  if not RECALL then error("recall_of=" .. of .. ": no measured recall for that model") end
  for i = 2, #RECALL do
    local a, b = RECALL[i - 1], RECALL[i]
    if s <= b[1] then return a[2] + (b[2] - a[2]) * (s - a[1]) / (b[1] - a[1]) end
  end
  return 1
end

local cache = os.getenv("QINFER_CACHE") or ((os.getenv("HOME") or ".") .. "/.cache/qinfer")
local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local profiles = here .. "/../engine/backend/sim/profiles/"

return {
  name = "neuron_split",
  params = {
    model = { cache .. "/shapes/llama-2-70b-q4_0.gguf" },
    neuron_profile = { "uniform" },
    recall_of = { "smollm2-135m" },
    profile = { "a100-pcie-2xeon" },
    -- the GPU's calibration on published measurements (engine/backend/sim/README.md);
    -- --set sim_cal=none: the default efficiencies, as the runs before it
    sim_cal = { "gpu-published" },
    mode = { "split", "ngl" },
    share = { 0, 0.1, 0.25, 0.5, 0.75, 1 },
    batch = { 1, 16 },
    density = { 1, 0.4, 0.2 },
    n_gen = { 16 },
  },
  order = { "model", "neuron_profile", "recall_of", "profile", "sim_cal", "mode", "share", "batch", "density",
            "n_gen" },
  cost = function(cfg) return cfg.batch * (32 + cfg.n_gen) end,
  repetitions = 1, -- simulated without noise
  warmup = 0,
  run = function(cfg, ctx)
    if cfg.model:find("/") then -- a path; a short name is the cache's (qinfer.load says what is missing)
      local f = io.open(cfg.model, "rb")
      if not f then
        error("no model at " .. cfg.model .. ": write it with qinfer synth --preset llama-2-70b --type q4_0 "
          .. "--shapes-only -o " .. cfg.model)
      end
      f:close()
    end
    local m = qinfer.load(cfg.model)
    local o = { batch = cfg.batch, prompt = 32, n_gen = cfg.n_gen, sim = profiles .. cfg.profile .. ".profile",
                devices = "cpu,gpu", sim_cal = cfg.sim_cal ~= "none" and profiles .. cfg.sim_cal .. ".cal" or nil }
    local d = cfg.density
    if cfg.mode == "split" then
      if cfg.share > 0 then
        o.neuron_policy = "static"
        o.neuron_profile = cfg.neuron_profile
        o.neuron_budget = string.format("%g%%", cfg.share * 100)
      end
      if cfg.share < 1 and d < 1 then d = d * (1 - recall(cfg.recall_of, cfg.share)) / (1 - cfg.share) end
    else
      o.placement = string.format("ngl=%d", math.floor(cfg.share * m:info().n_layer + 0.5))
    end
    if d < 1 then o.sim_cold_density = d end
    ctx.metric("cpu.ffn_density", d, "share")
    local t = qinfer.throughput(m, o)
    ctx.metric("decode.tokens_per_s", t.tokens_per_s, "tok/s")
    ctx.metric("decode.tpot_s", t.tpot_s, "s")
    ctx.metric("gpu.peak_bytes", t.device1_peak_bytes, "B")
  end,
}
