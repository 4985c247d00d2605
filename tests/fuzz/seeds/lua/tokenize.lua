local m = qinfer.load(MODEL, {threads = 1})
local ids = m:tokenize("Hello, world!", {add_special = false})
local text = m:detokenize(ids, {special = true})
local info = m:info()
return {name = "x", params = {a = {1, 2}, b = {"p", "q"}}, order = {"b"}, repetitions = 2, run = function(cfg, ctx) end}
