-- The experiment of run_tests.sh's `results` mode: synthetic numbers, no
-- model, known means. Four configurations (policy x kv_budget), three
-- repetitions each:
--   test.tok_s   = base(policy) + 100 * kv_budget + repetition   (tok/s)
--   test.ppl     = 10 / kv_budget, only for the policy "full"    (1)
--   sim.tok_s    = 2 * test.tok_s, recorded as simulated      (tok/s)
return {
  name = "results_test",
  params = { policy = { "full", "h2o" }, kv_budget = { 0.5, 1.0 }, tag = "a,b" },
  order = { "policy", "kv_budget" },
  repetitions = 3,
  warmup = 1,
  run = function(cfg, ctx)
    local base = ({ full = 10, h2o = 20 })[cfg.policy]
    local v = base + 100 * cfg.kv_budget + ctx.repetition
    ctx.metric("test.tok_s", v, "tok/s")
    if cfg.policy == "full" then ctx.metric("test.ppl", 10 / cfg.kv_budget, "1") end
    ctx.metric("sim.tok_s", 2 * v, "tok/s", { simulated = true })
  end,
}
