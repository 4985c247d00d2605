local qinfer = require "qinfer"
return {
  name = "bad_model",
  params = { model = { "no-such-model" } },
  run = function(cfg, ctx)
    local m = qinfer.load(cfg.model)
  end,
}
