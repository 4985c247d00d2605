-- needle.lua - passkey retrieval (a needle in a haystack) under a KV cache
-- policy: can the model still find a number hidden early in a long prompt
-- when the policy keeps only part of the cache? On the default model
-- (smollm2-135m), full cache against Q-Infer's policy at 50%.
--
-- Each trial hides "The pass key is NNNNN. Remember it. NNNNN is the pass
-- key." at a relative depth (0: the start, 1: the end) of a filler text of
-- plain sentences, sized so the whole prompt is at most `length` tokens of
-- the model, asks for the key at the end and generates 8 tokens greedily;
-- the trial is correct when the first 5-digit number of the answer is the
-- key. Keys come from math.random, which the runner seeds per
-- configuration, so every configuration sees the same keys.
--
-- Metrics (one value per configuration):
--   needle.accuracy       share of the trials answered correctly, 0..1   (1)
--   needle.prompt_tokens  mean prompt length of the trials               (tok)
--
-- Sweep: kv_policy full and qinfer (kv_budget 0.5, which full ignores) x
-- length 256, 512, 1024 tokens x depth 0, 0.25, 0.5, 0.75, 1; 3 trials
-- each. Takes about 10 minutes on 2 cores (a few seconds a trial).
--
--   qinfer run experiments/needle.lua -t 2             -> results/needle.db
--   qinfer run experiments/needle.lua --set kv_policy=full --set length=512
--   qinfer results needle --by kv_policy,length --metric needle.accuracy
--   bash plots/make_all.sh      -> plots/out/needle_accuracy_full.png, needle_accuracy_qinfer_50.png
--
-- (`qinfer needle` runs the same kind of test from the command line, with
-- batched trials and longer defaults.)
--
-- Needs models/fetch.sh smollm2-135m.
local qinfer = require "qinfer"

local filler = {
  "The hills are green in the spring and brown in the late summer.",
  "A fisherman mends his nets on the quiet harbour wall.",
  "The library opens at nine and closes when the lamps are lit.",
  "Snow settles on the roofs of the village during the long winter.",
  "An old road winds between the fields towards the market town.",
  "The teacher writes the lesson on the board in careful letters.",
  "Bees move from flower to flower in the afternoon sun.",
  "The ferry crosses the wide river twice every morning.",
}
local preamble = "There is an important piece of information hidden in the long text below. "
  .. "Find it and remember it, because you will be asked about it at the end.\n\n"
local question = "\n\nWhat is the pass key? The pass key is"

-- The prompt with n filler sentences and the needle after round(depth * n) of them.
local function prompt(n, depth, key)
  local parts, at = {}, math.floor(depth * n + 0.5)
  for i = 0, n do
    if i == at then
      parts[#parts + 1] = string.format("The pass key is %d. Remember it. %d is the pass key.", key, key)
    end
    if i < n then parts[#parts + 1] = filler[i % #filler + 1] end
  end
  return preamble .. table.concat(parts, " ") .. question
end

-- The most filler sentences whose prompt is at most `length` tokens: an
-- estimate from the tokens of one cycle of sentences, then corrected.
local function sentences_for(m, length, cache)
  local k = "n/" .. length
  if cache[k] then return cache[k] end
  local function tokens(n) return #m:tokenize(prompt(n, 0.5, 12345)) end
  local per = (tokens(#filler) - tokens(0)) / #filler
  local n = math.max(0, math.floor((length - tokens(0)) / per))
  while n > 0 and tokens(n) > length do n = n - 1 end
  while tokens(n + 1) <= length do n = n + 1 end
  cache[k] = n
  return n
end

return {
  name = "needle",
  params = {
    model = { "smollm2-135m" },
    kv_policy = { "full", "qinfer" },
    kv_budget = { 0.5 },
    length = { 256, 512, 1024 },
    depth = { 0.0, 0.25, 0.5, 0.75, 1.0 },
    trials = { 3 },
  },
  order = { "model", "kv_policy", "kv_budget", "length", "depth" },
  -- relative run time, to balance shards (qinfer run --shard, qinfer submit):
  -- the prompt tokens of all trials
  cost = function(cfg) return cfg.length * cfg.trials end,
  repetitions = 1,
  warmup = 0,
  run = function(cfg, ctx)
    local m = qinfer.load(cfg.model)
    local n = sentences_for(m, cfg.length, ctx.cache)
    local correct, tokens = 0, 0
    for _ = 1, cfg.trials do
      local key = math.random(10000, 99999)
      local p = prompt(n, cfg.depth, key)
      local text, _, t = qinfer.generate(m, p, { n = 8, n_ctx = cfg.length + 16,
        kv_policy = cfg.kv_policy, kv_budget = cfg.kv_budget })
      if tonumber(text:match("%d%d%d%d%d")) == key then correct = correct + 1 end
      tokens = tokens + t.n_prompt
    end
    ctx.metric("needle.accuracy", correct / cfg.trials, "1")
    ctx.metric("needle.prompt_tokens", tokens / cfg.trials, "tok")
  end,
}
