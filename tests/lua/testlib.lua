-- testlib.lua - checks for the Lua tests: each failed check prints its line
-- and the test ends with an error (non-zero exit) if any failed.
local T = { fails = 0, passes = 0 }

local function where()
  local info = debug.getinfo(3, "Sl")
  return string.format("%s:%d", info.short_src, info.currentline)
end

local function record(ok, msg)
  if ok then
    T.passes = T.passes + 1
  else
    T.fails = T.fails + 1
    io.stderr:write("FAIL ", where(), ": ", msg, "\n")
  end
  return ok
end

function T.ok(cond, msg) return record(cond and true or false, msg or "condition is false") end

function T.eq(got, want, msg)
  return record(got == want, string.format("%s: got %s, want %s", msg or "eq", tostring(got), tostring(want)))
end

function T.near(got, want, tol, msg)
  local ok = type(got) == "number" and math.abs(got - want) <= tol
  return record(ok, string.format("%s: got %s, want %s +/- %g", msg or "near", tostring(got), tostring(want), tol))
end

-- fn must raise an error whose message contains every plain string given.
function T.raises(fn, ...)
  local ok, err = pcall(fn)
  if ok then return record(false, "no error raised (expected: " .. table.concat({ ... }, " ... ") .. ")") end
  err = tostring(err)
  for _, s in ipairs({ ... }) do
    if not err:find(s, 1, true) then return record(false, string.format("error '%s' lacks '%s'", err, s)) end
  end
  return record(true)
end

function T.done(name)
  if T.fails > 0 then error(string.format("%s: %d of %d checks failed", name, T.fails, T.fails + T.passes), 0) end
  print(string.format("%s: %d checks passed", name, T.passes))
end

return T
