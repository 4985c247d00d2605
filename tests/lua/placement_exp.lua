-- The placement experiment of run_tests.sh: the same greedy generation
-- under the all-CPU plan and under ngl=31 on the test device; each run
-- records the plan it ran under (runs.placement), and the text must not
-- depend on it.
local qinfer = require "qinfer"
return {
  name = "placement_test",
  params = { placement = { "all-cpu", "ngl=31" } },
  run = function(cfg, ctx)
    local m = qinfer.load("smollm2-135m", { threads = 2 })
    local text = qinfer.generate(m, "The three laws of robotics are",
      { n = 8, devices = "cpu,testdev", placement = cfg.placement })
    ctx.metric("gen.chars", #text, "1")
    ctx.metric("gen.hash", (text:byte(1) or 0) * 65536 + (text:byte(-1) or 0) * 256 + #text, "1")
  end,
}
