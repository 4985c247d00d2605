return { name = "bad_norun", params = { k = { 1 } } }
