local x = nil
local y = x.field
return { name = "bad_toplevel", run = function() end }
