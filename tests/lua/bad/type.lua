local qinfer = require "qinfer"
return {
  name = "bad_type",
  run = function(cfg, ctx)
    local m = qinfer.load("smollm2-135m")
    local e = m:engine { max_seqs = "four" }
  end,
}
