-- The experiment of the shard, merge and submit tests (run_tests.sh) and of
-- the Slurm tests (tests/slurm/): 22 configurations (k = 1..11 x p = a, b)
-- of synthetic numbers, no model, two repetitions, a cost estimate (k).
--   test.value       k * 10 + repetition (+ 0.5 for p = "b")          (1)
--   test.invocation  $QI_TEST_INVOCATION (0 when unset): which process  (1)
--   test.task        $SLURM_ARRAY_TASK_ID (-1 when unset): which task   (1)
-- $QI_TEST_DELAY: seconds each configuration sleeps. $QI_TEST_STALL=k: that
-- k's p = "a" configuration writes $SLURM_ARRAY_TASK_ID into
-- $QI_TEST_MARKER and sleeps 300 s, for a kill to land mid-run.
-- $QI_TEST_FAIL=k: that k's p = "a" configuration fails (a Lua error);
-- p = $QI_TEST_FAIL_P instead of "a" when set.
local qinfer = require "qinfer"
local ks = {}
for k = 1, 11 do ks[k] = k end
return {
  name = "shard_test",
  params = { k = ks, p = { "a", "b" } },
  repetitions = 2,
  cost = function(cfg) return cfg.k end,
  run = function(cfg, ctx)
    local task = tonumber(os.getenv("SLURM_ARRAY_TASK_ID") or "-1")
    ctx.metric("test.value", cfg.k * 10 + ctx.repetition + (cfg.p == "b" and 0.5 or 0), "1")
    ctx.metric("test.invocation", tonumber(os.getenv("QI_TEST_INVOCATION") or "0"), "1")
    ctx.metric("test.task", task, "1")
    if tonumber(os.getenv("QI_TEST_FAIL") or "") == cfg.k and cfg.p == (os.getenv("QI_TEST_FAIL_P") or "a") then
      error("planted failure")
    end
    if ctx.repetition == 0 and tonumber(os.getenv("QI_TEST_STALL") or "") == cfg.k and cfg.p == "a" then
      local f = assert(io.open(os.getenv("QI_TEST_MARKER"), "w"))
      f:write(tostring(task), "\n")
      f:close()
      qinfer.sleep(300)
    end
    local delay = tonumber(os.getenv("QI_TEST_DELAY") or "0")
    if delay > 0 then qinfer.sleep(delay) end
  end,
}
