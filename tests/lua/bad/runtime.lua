return {
  name = "bad_runtime",
  params = { k = { 1, 2 } },
  run = function(cfg, ctx)
    ctx.metric("test.value", cfg.k, "1")
    if cfg.k == 2 then undefined_function() end
  end,
}
