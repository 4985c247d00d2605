-- placement_ablation.lua - placement policies compared at the paper's scale:
-- LLaMA-2-70B (Q4_0) on a simulated A100-80GB PCIe server with two Xeon
-- sockets (engine/backend/sim/profiles/a100-pcie-2xeon.profile), the GPU's
-- memory capped at 24 GiB so that the model does not fit and every policy
-- has to choose what goes where.
--
-- Every figure here is SIMULATED (engine/backend/sim/README.md): no
-- arithmetic runs, op times come from the profile's figures and the
-- simulator's efficiencies, and the results database marks every value
-- simulated. They compare policies on one machine model; they are not
-- measurements of an A100.
--
-- Each configuration is one qinfer.throughput call: `batch` sequences with
-- prompts of `prompt` tokens, prefilled, then n_gen decode steps. The
-- policy plans for that workload before the prompts (placement =
-- "policy:NAME") and, for the policies that learn (gdcost, ratio), is
-- shown the block times after every step and may re-plan
-- (qi_placement_ctl_tick);
-- a re-plan's moves are part of the timed run.
--
-- Metrics (one value per repetition):
--   decode.tokens_per_s          aggregate decode rate, batch x n_gen / time       (tok/s)
--   decode.per_seq_tokens_per_s  each sequence's rate                               (tok/s)
--   decode.tpot_s                time per output token (one decode step)            (s)
--   prefill.ttft_s               time to first token: the whole batch's prefill     (s)
--   placement.replans            plans applied during the run, the first included   (1)
--   placement.moved_bytes        weights and KV moved by them                       (B)
--   placement.predicted_step_s   the policy's predicted step time, last observation (s; gdcost)
--   placement.measured_step_s    the measured step time of that observation         (s)
--
-- Sweep: placement static (llama.cpp's -ngl), flexgen (FlexGen's LP),
-- ratio (the split-ratio rule of the authors' released code), gdcost
-- (Q-Infer's online cost model) x prompt 128, 512, 2048 x batch 1, 4, 16,
-- 64; n_gen 32; the full KV cache: 48 configurations, about ten minutes
-- of wall time on 2 cores (the engine's host work is real: the
-- prefills of 64 x 2048 tokens take the longest). --set kv_policy=qinfer
-- runs Q-Infer's KV policy at 50% instead, far slower in wall time (its
-- decisions over 80 layers x 8 KV heads x every sequence are real host
-- work: a minute per configuration at batch 16 and 512 tokens); no policy
-- splits a layer's attention then (split layers cannot run an evicting
-- KV policy).
--
-- The GPU's efficiencies are the calibration on published measurements
-- (profiles/gpu-published.cal; --set sim_cal=none: the defaults, as the
-- runs before it); the host CPU's are the defaults.
--
-- The model is a file of shapes only (a few hundred KB):
--
--   qinfer synth --preset llama-2-70b --type q4_0 --shapes-only -o ~/.cache/qinfer/shapes/llama-2-70b-q4_0.gguf
--   qinfer run experiments/placement_ablation.lua          -> results/placement_ablation.db
--   qinfer run experiments/placement_ablation.lua --set batch=16 --set prompt=512
--   qinfer results placement_ablation --by placement,kv_policy,batch --metric decode.tokens_per_s
--   bash plots/make_all.sh        -> plots/out/placement_ablation.png
local qinfer = require "qinfer"

local cache = os.getenv("QINFER_CACHE") or ((os.getenv("HOME") or ".") .. "/.cache/qinfer")
-- the profiles, found from this script's own path
local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local profiles = here .. "/../engine/backend/sim/profiles/"

return {
  name = "placement_ablation",
  params = {
    model = { cache .. "/shapes/llama-2-70b-q4_0.gguf" },
    profile = { "a100-pcie-2xeon" },
    -- the GPU's calibration on published measurements (engine/backend/sim/README.md)
    sim_cal = { "gpu-published" },
    gpu_mem = { "24G" },
    placement = { "static", "flexgen", "ratio", "gdcost" },
    kv_policy = { "full" },
    kv_budget = { 0.5 },
    prompt = { 128, 512, 2048 },
    batch = { 1, 4, 16, 64 },
    n_gen = { 32 },
  },
  order = { "model", "profile", "sim_cal", "gpu_mem", "placement", "kv_policy", "kv_budget", "prompt", "batch" },
  cost = function(cfg) return cfg.batch * (cfg.prompt + cfg.n_gen) end,
  repetitions = 1, -- simulated without noise: a second run gives the same figures
  warmup = 0,
  run = function(cfg, ctx)
    local f = io.open(cfg.model, "rb")
    if not f then
      error("no model at " .. cfg.model .. ": write it with qinfer synth --preset llama-2-70b --type q4_0 "
        .. "--shapes-only -o " .. cfg.model)
    end
    f:close()
    local m = qinfer.load(cfg.model)
    local o = {
      batch = cfg.batch, prompt = cfg.prompt, n_gen = cfg.n_gen,
      sim = profiles .. cfg.profile .. ".profile",
      sim_cal = cfg.sim_cal ~= "none" and profiles .. cfg.sim_cal .. ".cal" or nil,
      devices = "cpu,gpu:" .. cfg.gpu_mem,
      placement = "policy:" .. cfg.placement,
      kv_policy = cfg.kv_policy,
    }
    if cfg.kv_policy ~= "full" then o.kv_budget = cfg.kv_budget end
    local t = qinfer.throughput(m, o)
    ctx.metric("decode.tokens_per_s", t.tokens_per_s, "tok/s")
    ctx.metric("decode.per_seq_tokens_per_s", t.per_seq_tokens_per_s, "tok/s")
    ctx.metric("decode.tpot_s", t.tpot_s, "s")
    ctx.metric("prefill.ttft_s", t.ttft_s, "s")
    ctx.metric("placement.replans", t.replans, "1")
    ctx.metric("placement.moved_bytes", t.moved_bytes, "B")
    if t.predicted_step_s == t.predicted_step_s then -- not NaN: a policy with a cost model
      ctx.metric("placement.predicted_step_s", t.predicted_step_s, "s")
    end
    if t.measured_step_s == t.measured_step_s then
      ctx.metric("placement.measured_step_s", t.measured_step_s, "s")
    end
  end,
}
