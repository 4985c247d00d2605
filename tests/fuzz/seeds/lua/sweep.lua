local sweep = require("qinfer.sweep")
return {name = "bad", params = {a = {}, b = "x"}, order = {"c"}, warmup = -1, seed = 1.5,
  cost = function(cfg) return -1 end, run = 3}
