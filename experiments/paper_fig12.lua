-- paper_fig12.lua - the Q-Infer paper's Figure 12 on the simulated machine:
-- throughput of llama.cpp, FlexGen, PowerInfer and Q-Infer, each run as its
-- authors run it, on an A100 server with a host CPU, against batch size, one
-- panel per model and input length.
--
-- Every figure here is SIMULATED (engine/backend/sim/README.md): no
-- arithmetic runs; op times come from the profile's figures, the GPU
-- calibration on published measurements (profiles/gpu-published.cal, its
-- validated error in its `# validated:` line: stored beside every run as
-- the metric sim.validated_error) and the host CPU's default efficiencies
-- (not validated: the CPU side of a 56-core Xeon host is an uncalibrated
-- roofline). The database marks every value simulated. Accuracy is never
-- simulated.
--
-- The systems (the `system` parameter):
--   llamacpp    llama.cpp: the most whole layers that fit on the GPU
--               (placement policy static, its -ngl), dense FFN, full KV;
--   flexgen     FlexGen: its LP policy (placement policy flexgen) with the
--               layers it does not keep streamed over PCIe (stream=1), full
--               KV, dense FFN; `--set flexgen_schedule=block` runs it
--               with its zig-zag block schedule too (flexgen block=1: the
--               LP's GPU batch size, engine/engine_zigzag.c), the grid's
--               default stays `stream`;
--   powerinfer  PowerInfer: every attention on the GPU while it and its KV
--               fit, the hot FFN neurons on the GPU by its integer program
--               (neuron policy static) in the memory left (less its
--               predictors'), the cold ones on the CPU, the FFN gated by
--               its predictor at the union over the batch (the activity
--               model, sim_activity);
--   qinfer      Q-Infer: the same split by its own rule (neuron policy
--               qinfer, ratio = the GPU's over the CPU's memory bandwidth:
--               the balance of the two sides), the predictor-gated FFN, and
--               its KV policy at 50% with offload. Its run-time swaps follow
--               the activations, which a simulated machine does not have
--               (the engine refuses them there), and its per-layer gdcost
--               placement is not composed with a neuron split (the engine's
--               split, fixed at creation, keeps split layers' MLPs on the
--               CPU, and gdcost re-plans them): both are left out of this
--               system and gdcost is measured alone in the ablation.
-- The ablation (item 4), each against llamacpp:
--   q-hot       hot neurons alone: qinfer's split and the predictor-gated
--               FFN, full KV;
--   q-place     placement alone: gdcost, dense FFN, full KV;
--   q-kv        KV policy alone: llama.cpp's layers, Q-Infer's KV at 50%;
--   qinfer      all of them (above).
--
-- The activity model (qinfer/activity.h, its presets with their sources):
-- LLaMA-70B runs as ReGLU LLaMA-2-70B (82% sparse, 43% of neurons give 80%),
-- OPT-30B as OPT (97%, 26%:80%), Falcon-40B as ReLU Falcon-40B (95%). The
-- neuron split and the activity model need a gated, sequential MLP (the
-- engine's split), so PowerInfer, Q-Infer and q-hot run on LLaMA-70B only:
-- on OPT (no gate) and Falcon (MLP beside the attention) those rows are
-- recorded with the one metric system.not_run = 1 and nothing else; a
-- configuration cut for wall time (kv_cut, below) with system.not_run = 2.
--
-- Throughput: decode.tokens_per_s (batch x n_gen over the decode steps) and
-- e2e.tokens_per_s (batch x n_gen over prefill and decode, as FlexGen
-- counts it); the paper does not say which of the two its figure is.
--
-- Sweep: model x weights x profile x system x prompt x batch. Defaults: the
-- full grid of the figure on one setting; `--set` picks others:
--   qinfer run experiments/paper_fig12.lua                        -> results/paper_fig12.db
--   qinfer run experiments/paper_fig12.lua --set profile=a100-40gb-pcie --set weights=f16
--   qinfer run experiments/paper_fig12.lua --set dry=1     (one small configuration per system: seconds)
--   qinfer results paper_fig12 --by model,system,prompt,batch --metric e2e.tokens_per_s
--   bash plots/make_all.sh        -> plots/out/paper_fig12.png
-- The models are files of shapes only, written once:
--   qinfer synth --preset llama-2-70b --type q4_0 --shapes-only -o ~/.cache/qinfer/shapes/llama-2-70b-q4_0.gguf
--   (opt-30b, falcon-40b; f16 the same)
local qinfer = require "qinfer"

local cache = os.getenv("QINFER_CACHE") or ((os.getenv("HOME") or ".") .. "/.cache/qinfer")
local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local profiles = here .. "/../engine/backend/sim/profiles/"

local PRESET = { ["llama-70b"] = "llama-2-70b", ["opt-30b"] = "opt-30b", ["falcon-40b"] = "falcon-40b" }
local ACTIVITY = { ["llama-70b"] = "llama-reglu", ["opt-30b"] = "opt", ["falcon-40b"] = "falcon-relu" }
-- the predictors' share of the parameters (the presets' pred, qinfer/activity.h)
local PRED = { ["llama-70b"] = 0.0808, ["opt-30b"] = 0.0577, ["falcon-40b"] = 0.0868 }
local GATED = { ["llama-70b"] = true }
local SPLITS = { powerinfer = true, qinfer = true, ["q-hot"] = true }

-- a profile's figure (gpu.mem in bytes, bandwidths in B/s)
local function profile_fig(name, key)
  local f = assert(io.open(profiles .. name .. ".profile"))
  for line in f:lines() do
    local k, v, unit = line:match("^%s*([%w_.]+)%s*=%s*([%d.]+)%s*(%a*)")
    if k == key then
      f:close()
      local mul = { GiB = 2 ^ 30, GB = 1e9, ["GB/s"] = 1e9 }
      if unit == "GiB" then return tonumber(v) * 2 ^ 30 end
      if unit == "GB" then return tonumber(v) * 1e9 end
      return tonumber(v) * (mul[unit] or 1)
    end
  end
  f:close()
  error(name .. ".profile has no " .. key)
end

-- the calibration's validated error (its `# validated:` line): the median
-- |error| of decode and of prompts on the training rows, then leave-one-GPU-out
local function validated(cal)
  local f = io.open(profiles .. cal .. ".cal")
  if not f then return nil end
  for line in f:lines() do
    local d, p, ld, lp = line:match("^# validated:.-decode ([%d.]+)%%, prompt ([%d.]+)%%.-decode ([%d.]+)%%, prompt ([%d.]+)%%")
    if d then
      f:close()
      return { decode = d / 100, prompt = p / 100, loo_decode = ld / 100, loo_prompt = lp / 100 }
    end
  end
  f:close()
  return nil
end

-- PowerInfer's and Q-Infer's GPU: every attention (weights and its KV for
-- the workload) while it fits, the head, then the hot neurons in what is
-- left less the predictors and a margin for the activations. Writes the
-- plan file and returns its path and the neuron budget in bytes.
local function split_plan(m, cfg, cap, shrink)
  local i = m:info()
  local bpp = i.weight_bytes / i.n_params
  local E, HD, KD = i.n_embd, i.n_head * i.head_dim, i.n_head_kv * i.head_dim
  local attn = (2 * E * HD + 2 * E * KD) * bpp
  local ctx = math.ceil((cfg.prompt + cfg.n_gen) / 64) * 64
  local kv = cfg.batch * ctx * KD * 2 * 2
  if cfg.system == "qinfer" then kv = kv * 0.5 end -- its KV policy holds half on the GPU
  local head = i.n_vocab * E * bpp
  local margin = 2 * 2 ^ 30 + 0.05 * cap
  local free = cap - margin - head
  local n_attn = math.max(0, math.min(i.n_layer, math.floor(free / (attn + kv))))
  local pred = PRED[cfg.model] * i.n_params * bpp
  local budget = math.floor((free - n_attn * (attn + kv) - pred) * shrink)
  -- every FFN fits beside every attention: whole layers on the GPU, no split
  -- (a split keeps its MLPs on the CPU: two copies over PCIe a layer)
  local whole = n_attn == i.n_layer and budget >= 3 * E * i.n_ff * bpp * i.n_layer
  local path = os.tmpname()
  local f = assert(io.open(path, "w"))
  f:write("# paper_fig12: attention on the GPU for the last ", n_attn, " layers, MLPs on the ",
    whole and "GPU" or "cpu (hot neurons on the GPU)", "\n")
  for l = 0, i.n_layer - 1 do
    f:write(whole and "gpu gpu\n" or l >= i.n_layer - n_attn and "gpu cpu\n" or "cpu cpu\n")
  end
  f:write("head ", free > 0 and "gpu" or "cpu", "\n")
  f:close()
  return path, whole and 0 or budget, n_attn
end

local function shapes(cfg)
  local path = cache .. "/shapes/" .. PRESET[cfg.model] .. "-" .. cfg.weights .. ".gguf"
  local f = io.open(path, "rb")
  if not f then
    error("no model at " .. path .. ": write it with qinfer synth --preset " .. PRESET[cfg.model] .. " --type "
      .. cfg.weights .. " --shapes-only -o " .. path)
  end
  f:close()
  return path
end

return {
  name = "paper_fig12",
  params = {
    model = { "llama-70b", "opt-30b", "falcon-40b" },
    weights = { "q4_0" },
    profile = { "a100-pcie-2xeon" },
    sim_cal = { "gpu-published" },
    system = { "llamacpp", "flexgen", "powerinfer", "qinfer" },
    flexgen_schedule = { "stream" },
    prompt = { 128, 512, 1024, 2048 },
    batch = { 1, 4, 16, 64 },
    n_gen = { 32 },
    -- the systems with Q-Infer's KV policy (qinfer, q-kv) only where batch x
    -- prompt is at most this (0: everywhere): its per-token decisions are
    -- real host work, 70 s of wall time at 64 x 128 on 2 shared cores and
    -- growing with the tokens held (about 20 minutes at 64 x 2048)
    kv_cut = { 8192 },
    dry = { 0 },
  },
  order = { "dry", "model", "weights", "profile", "sim_cal", "system", "flexgen_schedule", "prompt", "batch", "n_gen",
            "kv_cut" },
  cost = function(cfg) return cfg.batch * (cfg.prompt + cfg.n_gen) end,
  repetitions = 1, -- simulated without noise
  warmup = 0,
  run = function(cfg, ctx)
    if SPLITS[cfg.system] and not GATED[cfg.model] then
      -- not run: the engine's neuron split and activity model need a gated,
      -- sequential MLP (OPT's has no gate, Falcon's runs beside its attention)
      ctx.metric("system.not_run", 1, "1")
      return
    end
    local kv_sys = cfg.system == "qinfer" or cfg.system == "q-kv"
    if kv_sys and cfg.kv_cut > 0 and cfg.batch * cfg.prompt > cfg.kv_cut then
      ctx.metric("system.not_run", 2, "1") -- 2: cut for wall time (kv_cut)
      return
    end
    if cfg.dry ~= 0 then -- one small configuration per system: the script's paths, in seconds
      cfg.prompt, cfg.batch, cfg.n_gen = 16, 2, 2
    end
    local m = qinfer.load(shapes(cfg))
    -- OPT has 2048 learned positions: its prompt is cut to leave room for
    -- the generated tokens (2016 at input 2048); the prompt run is stored
    local n_pos = m:info().n_ctx_train
    if cfg.model == "opt-30b" and cfg.prompt + cfg.n_gen > n_pos then cfg.prompt = n_pos - cfg.n_gen end
    ctx.metric("workload.prompt_tokens", cfg.prompt, "1")
    local cap = profile_fig(cfg.profile, "gpu.mem")
    local o = {
      batch = cfg.batch, prompt = cfg.prompt, n_gen = cfg.n_gen,
      sim = profiles .. cfg.profile .. ".profile",
      sim_cal = cfg.sim_cal ~= "none" and profiles .. cfg.sim_cal .. ".cal" or nil,
      devices = "cpu,gpu",
      kv_policy = "full",
    }
    local sys = cfg.system
    if sys == "llamacpp" or sys == "q-kv" then
      o.placement = "policy:static"
    elseif sys == "flexgen" then
      o.placement = "policy:flexgen:stream=1"
      if cfg.flexgen_schedule == "block" then
        o.placement = o.placement .. ",block=1"
      elseif cfg.flexgen_schedule ~= "stream" then
        error("flexgen_schedule must be stream or block, not " .. tostring(cfg.flexgen_schedule))
      end
    elseif sys == "q-place" then
      o.placement = "policy:gdcost"
    end
    if sys == "qinfer" or sys == "q-kv" then
      o.kv_policy = "qinfer"
      o.kv_budget = 0.5
    end
    local t, plan_path, n_attn
    if SPLITS[sys] then
      o.sim_activity = ACTIVITY[cfg.model]
      local ratio = profile_fig(cfg.profile, "gpu.mem_bw") / profile_fig(cfg.profile, "cpu.mem_bw")
      local shrink, err = 1.0, nil
      for _ = 1, 4 do -- a budget the engine refuses (its own sizes) is shrunk and tried again
        local budget
        plan_path, budget, n_attn = split_plan(m, cfg, cap, shrink)
        o.placement = plan_path
        if budget > 0 then
          o.neuron_policy = (sys == "powerinfer") and "static" or string.format("qinfer:ratio=%.3f", ratio)
          o.neuron_profile = "uniform"
          o.neuron_budget = string.format("%d", budget)
        end
        local ok, r = pcall(qinfer.throughput, m, o)
        os.remove(plan_path)
        if ok then t = r break end
        err = r
        if not tostring(r):find("fit") and not tostring(r):find("memory") then break end
        shrink = shrink * 0.85
      end
      if not t then error(err) end
      ctx.metric("plan.attn_layers_gpu", n_attn, "1")
      ctx.metric("plan.budget_shrink", shrink, "1")
    else
      t = qinfer.throughput(m, o)
    end
    ctx.metric("decode.tokens_per_s", t.tokens_per_s, "tok/s")
    ctx.metric("e2e.tokens_per_s", cfg.batch * cfg.n_gen / (t.ttft_s + t.decode_s), "tok/s")
    ctx.metric("decode.tpot_s", t.tpot_s, "s")
    ctx.metric("prefill.ttft_s", t.ttft_s, "s")
    if t.device1_peak_bytes then ctx.metric("gpu.peak_bytes", t.device1_peak_bytes, "B") end
    local v = validated(cfg.sim_cal)
    if v then
      for k, x in pairs(v) do ctx.metric("sim.validated_error." .. k, x, "share") end
    end
  end,
}
