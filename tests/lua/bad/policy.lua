local qinfer = require "qinfer"
return {
  name = "bad_policy",
  run = function(cfg, ctx)
    local m = qinfer.load("smollm2-135m")
    local e = m:engine { kv_policy = "no_such_policy", kv_budget = 16 }
  end,
}
