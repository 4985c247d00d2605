return {
  name = "bad_syntax"
  run = function() end,
}
