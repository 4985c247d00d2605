-- A planted failure: the runner checks that this test fails, so a broken
-- check library (or a qinfer lua that always exits 0) cannot pass unseen.
local T = require "testlib"
T.eq(1 + 1, 3, "planted")
T.done("selftest_fail")
