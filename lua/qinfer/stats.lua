-- stats.lua - summaries of repeated measurements: mean, median, sample
-- standard deviation, and a 95% confidence interval for the mean from
-- Student's t distribution (repetitions are few: 3 to 10), and a
-- repeat-with-warm-up helper.
--
-- The t quantiles are a table for 1..30 degrees of freedom (exact to the
-- digits shown) and, beyond, the Cornish-Fisher expansion around the normal
-- quantile, within 1e-4 of the exact value from 31 on.
local stats = {}

local function check(xs, fn)
  if type(xs) ~= "table" or #xs == 0 then error("stats." .. fn .. ": a non-empty list of numbers expected", 3) end
  for i = 1, #xs do
    if type(xs[i]) ~= "number" then
      error(string.format("stats.%s: element %d is a %s, not a number", fn, i, type(xs[i])), 3)
    end
  end
end

function stats.mean(xs)
  check(xs, "mean")
  local s = 0.0
  for i = 1, #xs do s = s + xs[i] end
  return s / #xs
end

function stats.median(xs)
  check(xs, "median")
  local c = table.move(xs, 1, #xs, 1, {})
  table.sort(c)
  local n = #c
  if n % 2 == 1 then return c[(n + 1) // 2] + 0.0 end
  return (c[n // 2] + c[n // 2 + 1]) / 2
end

-- Sample variance (n - 1 in the denominator); nil for one value.
function stats.variance(xs)
  check(xs, "variance")
  local n = #xs
  if n < 2 then return nil end
  local m, s = stats.mean(xs), 0.0
  for i = 1, n do s = s + (xs[i] - m) ^ 2 end
  return s / (n - 1)
end

function stats.stddev(xs)
  local v = stats.variance(xs)
  return v and math.sqrt(v)
end

local t975 = { 12.7062047, 4.30265273, 3.18244631, 2.77644511, 2.57058184, 2.44691185, 2.36462425, 2.30600414,
  2.26215716, 2.22813885, 2.20098516, 2.17881283, 2.16036866, 2.14478669, 2.13144955, 2.11990530, 2.10981558,
  2.10092204, 2.09302405, 2.08596345, 2.07961384, 2.07387307, 2.06865761, 2.06389856, 2.05953855, 2.05552944,
  2.05183052, 2.04840714, 2.04522964, 2.04227246 }

-- The 97.5% quantile of Student's t with df degrees of freedom: the
-- half-width factor of a two-sided 95% interval.
function stats.t95(df)
  if math.type(df) ~= "integer" or df < 1 then error("stats.t95: degrees of freedom must be an integer >= 1", 2) end
  if df <= #t975 then return t975[df] end
  local z = 1.959963984540054
  local z3, z5, z7 = z ^ 3, z ^ 5, z ^ 7
  return z + (z3 + z) / (4 * df) + (5 * z5 + 16 * z3 + 3 * z) / (96 * df ^ 2)
      + (3 * z7 + 19 * z5 + 17 * z3 - 15 * z) / (384 * df ^ 3)
end

-- 95% confidence interval of the mean: lo, hi, half-width; nil for one value.
function stats.ci95(xs)
  check(xs, "ci95")
  local n = #xs
  if n < 2 then return nil end
  local m = stats.mean(xs)
  local h = stats.t95(n - 1) * stats.stddev(xs) / math.sqrt(n)
  return m - h, m + h, h
end

-- { n, mean, median, stddev, min, max, ci95 (half-width), lo, hi }; the
-- spread fields are nil for one value.
function stats.summary(xs)
  check(xs, "summary")
  local lo, hi, h = stats.ci95(xs)
  local mn, mx = math.huge, -math.huge
  for i = 1, #xs do
    mn = math.min(mn, xs[i])
    mx = math.max(mx, xs[i])
  end
  return { n = #xs, mean = stats.mean(xs), median = stats.median(xs), stddev = stats.stddev(xs), min = mn, max = mx,
    ci95 = h, lo = lo, hi = hi }
end

-- Call fn(i) opts.warmup times (default 1), results discarded, then
-- opts.repetitions times (default 5), i = 1..repetitions; fn returns a
-- number. Returns the list of numbers and their summary.
function stats.measure(fn, opts)
  opts = opts or {}
  local warmup, reps = opts.warmup or 1, opts.repetitions or 5
  if math.type(warmup) ~= "integer" or warmup < 0 then error("stats.measure: warmup must be an integer >= 0", 2) end
  if math.type(reps) ~= "integer" or reps < 1 then error("stats.measure: repetitions must be an integer >= 1", 2) end
  for i = 1, warmup do fn(-i) end
  local xs = {}
  for i = 1, reps do
    local v = fn(i)
    if type(v) ~= "number" then error(string.format("stats.measure: repetition %d gave a %s, not a number", i,
        type(v)), 2) end
    xs[i] = v
  end
  return xs, stats.summary(xs)
end

return stats
