-- The qinfer module on the cached default model: load and info, a
-- tokenize/detokenize round trip, an H2O engine that keeps its budget,
-- logits helpers, greedy generation equal to `qinfer generate --temp 0`,
-- the attn_blas option, perplexity equal to `qinfer ppl`, throughput, and
-- argument errors that name the caller's file:line and the bad key.
-- arg[1]: a file holding `qinfer generate -p PROMPT -n 24 --temp 0`'s stdout
-- arg[2]: the PPL `qinfer ppl -f devil --ctx 64 --chunks 2` printed
-- QI_TEST_ERRORS_ONLY=1 (the sanitizer build; tests/cli/lib.sh): no
-- arguments; the checks of generation, perplexity and throughput are left
-- out (FULL), the argument errors and the engines they use are run.
local T = require "testlib"
local qinfer = require "qinfer"
local FULL = os.getenv("QI_TEST_ERRORS_ONLY") ~= "1"
local PROMPT = "The quick brown fox jumps over the lazy dog. Then"

local m = qinfer.load("smollm2-135m", { threads = 2 })
T.ok(qinfer.load("smollm2-135m", { threads = 2 }) == m, "a second load of the same model is the same object")
local info = m:info()
T.eq(info.arch, "llama", "arch")
T.eq(info.n_layer, 30, "n_layer")
T.eq(info.n_ctx_train, 8192, "n_ctx_train")
T.ok(info.n_params > 1e8 and info.n_params < 2e8, "n_params")
T.eq(info.sha256, "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", "sha256 from the manifest")
local by_path = qinfer.load(info.path, { threads = 2 })
T.eq(by_path:info().sha256, info.sha256, "sha256 computed for a path")
T.eq(info.packed, 0, "not repacked by default")
local packed = qinfer.load("smollm2-135m", { threads = 2, repack = true })
T.ok(packed ~= m, "repack=true is another model")
T.eq(packed:info().packed, 7 * 30 + 1, "repack=true packs every layer matrix and the output head")
T.eq(qinfer.load("smollm2-135m", { threads = 2, repack = true }), packed, "and is cached too")
do -- the engines run what the option says
  local ep <close> = packed:engine { max_seqs = 1, n_ctx = 64 }
  T.eq(ep:packed(), 7 * 30 + 1, "an engine of a repack=true model runs packed")
  local id = ep:add()
  ep:feed(id, m:tokenize("The capital of France is"))
  while ep:pending(id) > 0 do ep:step() end
  T.ok(ep:argmax(id) >= 0, "and steps")
  local eoff <close> = packed:engine { max_seqs = 1, n_ctx = 64, repack = false }
  T.eq(eoff:packed(), 0, "repack=false on the engine overrides the model's default")
  local eon <close> = m:engine { max_seqs = 1, n_ctx = 64, repack = true }
  T.eq(eon:packed(), 7 * 30 + 1, "repack=true on an engine of a plain model")
  local eplain <close> = m:engine { max_seqs = 1, n_ctx = 64 }
  T.eq(eplain:packed(), 0, "a plain model's engine does not pack")
end

-- tokenize / detokenize
for _, s in ipairs({ "Hello world", " leading space", "héllo wörld, 日本語 ✓", "a\nb\tc", "" }) do
  local ids = m:tokenize(s, { add_special = false })
  T.eq(m:detokenize(ids), s, "round trip of '" .. s .. "'")
end
local ids = m:tokenize(PROMPT)
T.ok(#ids > 5, "prompt tokens")
T.eq(ids[1], m:tokenize(PROMPT, { add_special = false })[1], "smollm2 adds no BOS")
T.eq(m:detokenize({ info.eos }, { special = true }) ~= "", true, "special tokens shown on request")
T.eq(m:detokenize({ info.eos }), "", "and hidden by default")

-- an H2O engine with a budget of 16 tokens per stream
local e = m:engine { max_seqs = 2, n_ctx = 128, kv_policy = "h2o", kv_budget = 16, kv_params = { heavy = 0.5 } }
T.eq(e:policy(), "h2o", "policy")
local a, b = e:add(), e:add()
e:feed(a, ids)
e:feed(b, ids)
while e:pending(a) > 0 or e:pending(b) > 0 do e:step() end
local max_work = 0
for _ = 1, 12 do
  for _, id in ipairs({ a, b }) do e:feed(id, e:argmax(id)) end
  T.eq(e:step(), 2, "one decode token per sequence")
  for _, id in ipairs({ a, b }) do
    local ks = e:kv_stats(id)
    max_work = math.max(max_work, ks.work_tokens_per_stream)
  end
end
local ks = e:kv_stats(a)
T.eq(ks.n_past, #ids + 12, "positions")
T.ok(max_work <= 16, "h2o keeps <= 16 working tokens per stream (saw " .. max_work .. ")")
T.ok(ks.work_tokens <= 16 * ks.streams, "h2o: summed working tokens within budget")
T.ok(ks.work_bytes > 0, "working bytes")
local top, lps = e:topk(a, 3)
T.eq(#top, 3, "topk")
T.eq(top[1], e:argmax(a), "topk[1] is the argmax")
T.ok(lps[1] >= lps[2] and lps[2] >= lps[3], "topk sorted")
T.near(e:logprob(a, top[1]), lps[1], 1e-12, "logprob agrees with topk")
T.ok(lps[1] <= 0, "log-probabilities are <= 0")
T.ok(e:pool_stats().work_blocks > 0, "pool stats")
e:remove(b)
T.raises(function() e:feed(b, 1) end, "test_api.lua:", "no sequence " .. b)
T.raises(function() e:argmax(a, 5) end, "bad argument #2 to 'argmax'", "row out of range")
e:close()
T.raises(function() e:step() end, "engine is closed")

-- a new plan between steps: the same greedy tokens, what moved reported
local function greedy_with(replan)
  local g = m:engine { max_seqs = 1, n_ctx = 64, devices = "cpu,testdev" }
  local id = g:add()
  g:feed(id, ids)
  while g:pending(id) > 0 do g:step() end
  local out, moved = {}, 0
  for i = 1, 4 do
    if replan then
      local c = g:replan(i % 2 == 1 and "ngl=31" or "all-cpu")
      T.ok(c.seconds >= 0 and c.kv_blocks >= 0, "replan cost")
      moved = moved + c.weight_bytes
    end
    out[i] = g:argmax(id)
    g:feed(id, out[i])
    g:step()
  end
  if replan then
    T.ok(moved > 0, "weights moved to testdev")
    T.eq(g:profile().replans, 4, "replans counted")
    T.ok(g:plan():find("head cpu", 1, true), "plan() gives the plan in force")
    T.raises(function() g:replan("ngl=-1") end, "N must be an integer")
    T.raises(function() g:replan({}) end, "bad argument #1 to 'replan'")
  end
  g:close()
  return table.concat(out, ",")
end
T.eq(greedy_with(true), greedy_with(false), "greedy tokens unchanged by new plans")

-- the full policy keeps everything
local f = m:engine { max_seqs = 1, n_ctx = 64 }
local s = f:add()
f:feed(s, ids, true)
f:step()
T.eq(f:kv_stats(s).work_tokens_per_stream, #ids + 0.0, "full keeps every token")
T.eq(f:kv_stats(s).attn_tokens_per_stream, #ids + 0.0, "full: attention read every token")
T.ok(f:logprob(s, ids[2], 1) < 0, "logits_all: a row per token")

-- argument errors name the key, with this file's line
T.raises(function() m:engine { kv_policy = "nope" } end, "test_api.lua:", "nope")
T.raises(function() m:engine { max_seqs = "four" } end, "test_api.lua:",
  "bad argument #1 to 'engine' (option 'max_seqs': integer expected, got string)")
T.raises(function() m:engine { kv_policy = "h2o", kv_budget = 16.0 } end, "option 'kv_budget'", "fraction")
T.raises(function() m:engine { kv_policy = "h2o", kv_budget = "lots" } end, "option 'kv_budget'")
T.raises(function() m:engine { kv_policy = "h2o", kv_budget = 8, kv_params = { heavy = {} } } end,
  "kv_params.heavy", "got table")
T.raises(function() m:engine { kv_policy = "h2o", kv_budget = 8, kv_params = { bogus = 1 } } end, "bogus")
T.raises(function() m:engine { kv_policy = "window" } end, "needs a budget")
T.raises(function() m:engine { bogus = 1 } end, "unknown option 'bogus'")
T.raises(function() m:tokenize(42 and {}) end, "bad argument #1 to 'tokenize'")
T.raises(function() qinfer.perplexity(m, "devil", { ctx = "64" }) end, "option 'ctx': integer expected")
T.raises(function() qinfer.generate(f, "x", { kv_policy = "h2o" }) end, "applies only when a model is given")

if FULL then
  -- greedy generation: the same text as `qinfer generate --temp 0`
  local want = assert(io.open(arg[1], "rb")):read("a")
  local text, gen_ids, tm = qinfer.generate(m, PROMPT, { n = 24 })
  T.eq(text .. "\n", want, "generate == qinfer generate --temp 0")
  T.eq(#gen_ids, 24, "generated ids")
  T.ok(tm.ttft_s > 0 and tm.tpot_s > 0 and tm.tokens_per_s > 0, "timing")
  local eng = m:engine { max_seqs = 1 }
  local text2 = qinfer.generate(eng, PROMPT, { n = 24 })
  T.eq(text2, text, "generate on an engine == on the model")
  T.eq(eng:pending(0), 0, "the call's sequence is removed")
end
-- attn_blas: taken by the engine options (or refused, naming the library,
-- where OpenBLAS is missing); a wrong type names the key
local blas_ok, eb = pcall(function() return m:engine { max_seqs = 1, attn_blas = true } end)
if blas_ok then
  if FULL then
    local _, blas_ids = qinfer.generate(eb, PROMPT, { n = 8 })
    T.eq(#blas_ids, 8, "generate with attn_blas")
  end
  eb:close()
else
  T.ok(tostring(eb):find("cannot load OpenBLAS", 1, true), "attn_blas refused for another reason: " .. tostring(eb))
end
T.raises(function() m:engine { attn_blas = 1 } end, "option 'attn_blas': boolean expected")
if FULL then
  local text3 = qinfer.generate(m, PROMPT, { n = 24, greedy = false, seed = 7 })
  T.eq(qinfer.generate(m, PROMPT, { n = 24, greedy = false, seed = 7 }), text3, "sampling is seeded")
end

-- perplexity: whole chunks equal `qinfer ppl`; decode mode close to it
local rd
if FULL then
  local want_ppl = tonumber(arg[2])
  local r = qinfer.perplexity(m, "devil", { ctx = 64, chunks = 2 })
  T.eq(string.format("%.4f", r.ppl), string.format("%.4f", want_ppl), "perplexity == qinfer ppl")
  T.eq(r.chunks, 2, "chunks")
  T.eq(r.count, 2 * (64 / 2 - 1), "scored tokens")
  rd = qinfer.perplexity(m, "devil", { ctx = 64, chunks = 2, decode = true, batch = 2 })
  T.ok(rd.decode and math.abs(rd.ppl - r.ppl) / r.ppl < 0.05, "decode-mode full policy within 5% (one-token attention order)")
  local rw = qinfer.perplexity(m, "devil", { ctx = 64, chunks = 2, kv_policy = "window", kv_budget = 8 })
  T.ok(rw.decode, "a KV policy implies decode mode")
  T.ok(rw.work_tokens <= 8, "window: working tokens per stream within the budget")
end

-- activation sparsity: a hand-made calibration (every site's quantile k is
-- k / 2000, so 0.3 thresholds at 0.015); 0 is the dense engine exactly
local calib = os.tmpname()
do
  local f = assert(io.open(calib, "w"))
  local sites = { "attn_in", "attn_out", "ffn_in", "ffn_act", "gate" }
  for l = 0, m:info().n_layer - 1 do
    for _, s in ipairs(sites) do
      local q = {}
      for k = 0, 100 do q[#q + 1] = string.format("%g", k / 2000) end
      f:write(l, " ", s, " ", table.concat(q, " "), "\n")
    end
  end
  f:close()
end
if FULL then
  local r0 = qinfer.perplexity(m, "devil", { ctx = 64, chunks = 2, batch = 2, sparsity = 0, sparsity_calib = calib })
  T.eq(r0.ppl, rd.ppl, "sparsity 0: the dense decode-mode perplexity exactly")
  T.eq(r0.sparsity, -1, "sparsity 0 thresholds nothing")
  for _, mode in ipairs({ "teal", "cats" }) do
    local rs = qinfer.perplexity(m, "devil", { ctx = 64, chunks = 2, batch = 2, sparsity = 0.3, sparsity_mode = mode,
      sparsity_calib = calib })
    T.ok(rs.decode and rs.sparsity > 0 and rs.sparsity < 1 and rs.ppl > 0, mode .. ": zeroed " .. rs.sparsity)
  end
  -- vs_dense: 8 steps in 4 pairs of a sparse and a dense step
  local ta = qinfer.throughput(m, { batch = 1, n_gen = 8, prompt = 4, sparsity = 0.3, sparsity_calib = calib,
    vs_dense = true })
  local v = ta.vs_dense
  T.ok(v and v.pairs == 4, "vs_dense: 4 pairs")
  T.ok(v.ratio_q1 <= v.ratio_median and v.ratio_median <= v.ratio_q3 and v.ratio_q1 > 0, "vs_dense: quartiles in order")
  T.ok(v.sparse_step_s > 0 and v.dense_step_s > 0, "vs_dense: both sides' steps timed")
  T.ok(math.abs(ta.tpot_s - v.sparse_step_s) < 1e-12, "vs_dense: the row's figures are the sparse steps'")
end
T.raises(function() qinfer.throughput(m, { n_gen = 8, vs_dense = true }) end, "option 'vs_dense'")
T.raises(function() qinfer.throughput(m, { n_gen = 8, sparsity = 0.3, sparsity_calib = calib, vs_dense = 1 }) end,
  "vs_dense")
T.raises(function() qinfer.perplexity(m, "devil", { ctx = 64, chunks = 2, sparsity = 0.3 }) end, "sparsity_calib")
T.raises(function() qinfer.perplexity(m, "devil", { ctx = 64, chunks = 2, sparsity = 1.5, sparsity_calib = calib }) end,
  "option 'sparsity'")
T.raises(function() m:engine { sparsity = 0.3, sparsity_calib = calib, sparsity_mode = "relu" } end, "sparsity_mode")
T.raises(function() m:engine { sparsity = "half", sparsity_calib = calib } end, "option 'sparsity'")
T.raises(function() m:engine { sparsity = 0.3, sparsity_calib = "/nonexistent/calib" } end, "cannot open")
local es = m:engine { max_seqs = 1, n_ctx = 32, sparsity = 0.3, sparsity_calib = calib }
os.remove(calib) -- the engine holds its own copy of the thresholds
local id = es:add()
es:feed(id, m:tokenize("The river"))
while es:pending(id) > 0 do es:step() end
T.ok(es:argmax(id) >= 0, "an engine under sparsity steps after its calibration file is gone")
es:close()

-- the FFN neuron split: every neuron hot on testdev is the unsplit run exactly
if FULL then
  local rn = qinfer.perplexity(m, "devil", { ctx = 64, chunks = 2, decode = true, batch = 2, devices = "cpu,testdev",
    neuron_policy = "static", neuron_profile = "uniform", neuron_budget = "100%" })
  T.eq(rn.ppl, rd.ppl, "every neuron hot: the unsplit perplexity exactly")
  local rh = qinfer.perplexity(m, "devil", { ctx = 64, chunks = 2, decode = true, batch = 2, devices = "cpu,testdev",
    neuron_policy = "qinfer:ratio=3", neuron_profile = "uniform", neuron_budget = "30%", neuron_swap_every = 2 })
  T.ok(math.abs(rh.ppl - rd.ppl) / rd.ppl < 0.02, "a 30% split with swaps within 2% of unsplit: " .. rh.ppl)
  local rw = qinfer.perplexity(m, "devil", { ctx = 64, chunks = 2, decode = true, batch = 2, devices = "cpu,testdev",
    neuron_policy = "qinfer:ratio=3", neuron_profile = "uniform", neuron_budget = "30%", neuron_swap_every = 2,
    neuron_swap_worker = true })
  T.ok(math.abs(rw.ppl - rd.ppl) / rd.ppl < 0.02, "the same swaps by the background worker within 2%: " .. rw.ppl)
end
T.raises(function() m:engine { devices = "cpu,testdev", neuron_policy = "qinfer:ratio=3", neuron_profile = "uniform",
  neuron_budget = "30%", neuron_swap_worker = true } end, "needs 'neuron_swap_every'")
T.raises(function() m:engine { neuron_swap_worker = true } end, "'neuron_swap_worker' without 'neuron_policy'")
T.raises(function() m:engine { neuron_swap_stream = "main" } end, "'neuron_swap_stream' without 'neuron_policy'")
T.raises(function() m:engine { devices = "cpu,testdev", neuron_policy = "qinfer:ratio=3", neuron_profile = "uniform",
  neuron_budget = "30%", neuron_swap_every = 2, neuron_swap_stream = "main" } end, "there is none ('neuron_swap_worker')")
T.raises(function() m:engine { devices = "cpu,testdev", neuron_policy = "qinfer:ratio=3", neuron_profile = "uniform",
  neuron_budget = "30%", neuron_swap_every = 2, neuron_swap_worker = true, neuron_swap_stream = "side" } end,
  "'side' is not a stream (copy or main)")
T.raises(function() m:engine { devices = "cpu,testdev", neuron_policy = "qinfer:ratio=3", neuron_profile = "uniform",
  neuron_budget = "30%", neuron_swap_every = 2, neuron_swap_worker = 1 } end, "neuron_swap_worker")
T.raises(function() m:engine { neuron_policy = "static", neuron_profile = "uniform" } end, "neuron_budget")
T.raises(function() m:engine { neuron_budget = "30%" } end, "without 'neuron_policy'")
T.raises(function() m:engine { devices = "cpu,testdev", neuron_policy = "static", neuron_profile = "uniform",
  neuron_budget = "30%", neuron_swap_every = 2 } end, "swapping is the qinfer policy's")
T.raises(function() m:engine { devices = "cpu,testdev", neuron_policy = "static", neuron_profile = "/nonexistent/p",
  neuron_budget = "30%" } end, "cannot open")
T.raises(function() m:engine { devices = "cpu,testdev", neuron_policy = "static", neuron_profile = "uniform",
  neuron_budget = "lots" } end, "neuron budget 'lots'")
T.raises(function() m:engine { neuron_policy = "static", neuron_profile = "uniform", neuron_budget = "30%" } end,
  "fast device 1")

local SIM = "../../engine/backend/sim/profiles/a100-pcie-2xeon.profile"
if FULL then
  -- throughput
  local tp = qinfer.throughput(m, { batch = 2, n_gen = 4, prompt = 8 })
  T.ok(tp.tokens_per_s > 0 and tp.ttft_s > 0 and tp.tpot_s > 0, "throughput")
  T.near(tp.tokens_per_s, 2 / tp.tpot_s, 1e-6 * tp.tokens_per_s, "aggregate rate = batch / tpot")
  local tq = qinfer.throughput(m, { batch = 1, n_gen = 4, prompt = PROMPT, kv_policy = "h2o", kv_budget = "50%" })
  T.ok(tq.tokens_per_s > 0, "throughput with a policy and a text prompt")
  -- prompts longer in all than one step's tokens (512) end in different steps
  local tl = qinfer.throughput(m, { batch = 3, n_gen = 2, prompt = 200 })
  T.ok(tl.tokens_per_s > 0 and tl.n_prompt == 200, "throughput when the prompts span several steps")

  -- placement policies on a simulated machine: planned for the workload, re-planned as it runs
  for _, pol in ipairs({ "static", "gdcost" }) do
    local ts = qinfer.throughput(m, { batch = 2, n_gen = 6, prompt = 16, sim = SIM, devices = "cpu,gpu:40M",
      placement = "policy:" .. pol })
    T.ok(ts.tokens_per_s > 0 and ts.replans >= 1 and type(ts.plan) == "string", pol .. ": planned (" .. ts.plan .. ")")
    T.ok(ts.measured_step_s > 0, pol .. ": the ticks measured the steps")
    if pol == "gdcost" then T.ok(ts.predicted_step_s > 0, "gdcost predicts its step time") end
  end
end
-- the what-if density of the CPU's FFN neurons on a simulated machine: fewer bytes read, a faster step
-- (against density 1, the same ops: on a model this small an op's launch outweighs a quarter of its bytes)
if FULL then
  local tone = qinfer.throughput(m, { batch = 1, n_gen = 4, prompt = 8, sim = SIM, devices = "cpu,gpu",
    placement = "ngl=10", sim_cold_density = 1 })
  local tsparse = qinfer.throughput(m, { batch = 1, n_gen = 4, prompt = 8, sim = SIM, devices = "cpu,gpu",
    placement = "ngl=10", sim_cold_density = 0.25 })
  T.ok(tsparse.tokens_per_s > tone.tokens_per_s, "density 0.25 faster than 1: " .. tsparse.tokens_per_s ..
    " against " .. tone.tokens_per_s)
end
T.raises(function() m:engine { sim_cold_density = 0.5 } end, "what-if of a simulated machine")
T.raises(function() m:engine { sim = SIM, devices = "cpu,gpu", sim_cold_density = 2 } end, "outside (0, 1]")
T.raises(function() m:engine { sim_cold_density = "half" } end, "sim_cold_density")
-- the activity model of a predictor-gated FFN (sim_activity): a bad spec and a real machine refused
T.raises(function() m:engine { sim = SIM, devices = "cpu,gpu", sim_activity = "gpt" } end, "no preset 'gpt'")
T.raises(function() m:engine { sim_activity = "opt" } end, "this one is real")
T.raises(function() m:engine { sim = SIM, devices = "cpu,gpu", sim_activity = 3 } end, "sim_activity")
local ok_p, err_p = pcall(qinfer.throughput, m, { batch = 1, n_gen = 2, prompt = 4, sim = SIM, devices = "cpu,gpu",
  placement = "policy:nope" })
T.ok(not ok_p and tostring(err_p):find("unknown placement policy 'nope'", 1, true), "an unknown policy: " .. tostring(err_p))

-- engines made and dropped are collected without leaking (ASan build)
for _ = 1, 3 do m:engine { max_seqs = 1, n_ctx = 32 } end
collectgarbage()
T.done("test_api")
