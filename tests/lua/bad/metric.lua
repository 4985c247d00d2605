return {
  name = "bad_metric",
  run = function(cfg, ctx)
    ctx.metric("test.ok", 1, "1")
    ctx.metric("Not A Name", 1, "1")
  end,
}
