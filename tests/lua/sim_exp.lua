-- The simulated-machine experiment of run_tests.sh: decode throughput of
-- the default model on the A100 server's profile (all-CPU and every layer
-- on the GPU) and on this host's real CPU. Every metric of a configuration
-- that ran a simulated engine is stored simulated, whatever the script
-- says; the measured one is not.
local qinfer = require "qinfer"
local PROFILE = "../../engine/backend/sim/profiles/a100-pcie-2xeon.profile"
return {
  name = "sim_test",
  params = { where = { "sim-cpu", "sim-gpu", "real" } },
  run = function(cfg, ctx)
    local m = qinfer.load("smollm2-135m", { threads = 2 })
    local o = { batch = 2, n_gen = 4, prompt = 16 }
    if cfg.where ~= "real" then
      o.sim = PROFILE
      o.devices = "cpu,gpu"
      o.placement = cfg.where == "sim-gpu" and "ngl=31" or "all-cpu"
    end
    local r = qinfer.throughput(m, o)
    ctx.metric("decode.tokens_per_s", r.tokens_per_s, "tok/s", { simulated = false })
  end,
}
