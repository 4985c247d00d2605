-- The kill-and-resume experiment of run_tests.sh: six fast configurations,
-- two repetitions each. With QI_TEST_STALL set, configuration k=3 records a
-- metric, touches $QI_TEST_MARKER and sleeps, so a SIGKILL lands mid-run.
-- Every metric carries $QI_TEST_INVOCATION, to tell which process wrote it.
local qinfer = require "qinfer"
return {
  name = "resume_test",
  params = { k = { 1, 2, 3, 4, 5, 6 }, tag = "x" },
  repetitions = 2,
  warmup = 1,
  run = function(cfg, ctx)
    ctx.metric("test.value", cfg.k * 10 + ctx.repetition, "1")
    ctx.metric("test.invocation", tonumber(os.getenv("QI_TEST_INVOCATION")), "1")
    if cfg.k == 3 and os.getenv("QI_TEST_STALL") and not ctx.warmup then
      assert(io.open(os.getenv("QI_TEST_MARKER"), "w")):close()
      qinfer.sleep(60)
    end
  end,
}
