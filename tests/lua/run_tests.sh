#!/usr/bin/env bash
# run_tests.sh - the Lua harness tests; CTest runs one mode per test:
#   unit        test_unit.lua (sweep, stats, argument checks) from the source
#               tree and again with only the modules compiled into qinfer,
#               plus a planted failure that must fail
#   api         test_api.lua on the cached default model, against `qinfer
#               generate --temp 0` and `qinfer ppl` (QI_TEST_ERRORS_ONLY=1,
#               ../cli/lib.sh: its argument errors and the engines they use)
#   run_resume  `qinfer run` SIGKILLed mid-sweep, then resumed: one done run
#               per configuration, nothing left of the killed run; SIGINT
#               rolls back; --set, --list, --fresh
#   run_errors  scripts that must fail: exit code, file:line on stderr, and
#               a consistent database (failed rows, no half-written run)
#   shard       `qinfer run --shard I/N`: for every N up to 16 the shards'
#               configurations are disjoint and together the whole sweep;
#               a sharded run into its default database; bad --shard values
#   merge       `qinfer results merge` of shard databases: the same runs and
#               numbers as the unsharded sweep; idempotence; overlapping
#               inputs; a done run replacing a failed one; a shard killed
#               mid-run (its WAL left behind) and resumed; refusals, with
#               nothing written, of another schema version, another
#               experiment definition, truncated, corrupt and foreign files
#   submit      `qinfer submit --slurm` against a stand-in sbatch that
#               records its arguments: the batch script (its #SBATCH lines,
#               quoting), run here as array tasks would run it; resubmission
#               of only the unfinished shards; nothing when all are done;
#               sbatch failing or missing; bad flags (tests/slurm/ runs it on
#               a real Slurm)
#   measure     qinfer.measure_requests on a hand-made timeline (the C
#               definitions, the metric names, refusals); then, with the
#               model, bench's batched rate and qinfer.throughput's under
#               the fake clock (QINFER_FAKE_CLOCK): one definition, one number;
#               test_serve.lua: workloads (seeds, traces, refusals) and,
#               with the model, qinfer.serve (nothing lost, reasons)
#   results     `qinfer results` on a database of synthetic numbers with known
#               means (results_exp.lua, no model): the listing, per-run and
#               grouped tables, CSV and JSON, the full export, the marking of
#               simulated values, and the errors (missing file, unknown
#               experiment, parameter or metric, bad flags)
# Skips (77) without Lua/SQLite in the build, and where the model is needed
# but not cached. Databases are read with the sqlite3 shell, else python3.
# Usage: run_tests.sh PATH/TO/qinfer MODE
set -uo pipefail
Q=${1:?usage: run_tests.sh PATH/TO/qinfer MODE}
MODE=${2:?usage: run_tests.sh PATH/TO/qinfer MODE}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=../cli/lib.sh
source "$here/../cli/lib.sh"
cd "$here" || exit 1

if "$Q" run --help | grep "built without Lua/SQLite" >/dev/null; then
  expect_fail 1 "built without Lua/SQLite" "$Q" run x.lua
  echo "$passes passed, $fails failed (skipped: qinfer built without Lua/SQLite)"
  [[ $fails -eq 0 ]] && exit 77 || exit 1
fi

cache=${QINFER_CACHE:-$HOME/.cache/qinfer}
have_model=0
[[ -f $cache/models/SmolLM2-135M-Instruct.Q4_1.gguf ]] && have_model=1

# sql DB QUERY: rows as a|b lines
sql() {
  if command -v sqlite3 >/dev/null; then
    sqlite3 -batch "$1" "$2"
  else
    python3 -c 'import sqlite3, sys
for row in sqlite3.connect(sys.argv[1]).execute(sys.argv[2]):
    print("|".join("" if v is None else str(v) for v in row))' "$1" "$2"
  fi
}
# expect_sql DB QUERY WANT
expect_sql() {
  local got
  got=$(sql "$1" "$2" 2>&1 | tr '\n' ' ' | sed 's/ $//')
  [[ $got == "$3" ]] && ok || bad "$2 -> '$got', want '$3'"
}
# the invariants of any results database after any invocation
consistent() {
  expect_sql "$1" "PRAGMA integrity_check" "ok"
  expect_sql "$1" "PRAGMA foreign_key_check" ""
  expect_sql "$1" "SELECT count(*) FROM runs WHERE status NOT IN ('done', 'failed')" "0"
  expect_sql "$1" "SELECT count(*) FROM metrics WHERE run_id NOT IN (SELECT id FROM runs)" "0"
  expect_sql "$1" "SELECT count(*) FROM (SELECT 1 FROM runs GROUP BY experiment_id, config_key HAVING count(*) > 1)" "0"
}
# run_expect CODE SCRIPT [ARGS...]: qinfer run exits CODE; output in $tmp/out, $tmp/err
run_expect() {
  local code=$1; shift
  "$Q" run "$@" >"$tmp/out" 2>"$tmp/err"; local rc=$?
  [[ $rc -eq $code ]] && ok || bad "qinfer run $* -> exit $rc, want $code: $(head -c 600 "$tmp/err")"
}
err_has() { grep -qF -- "$1" "$tmp/err" && ok || bad "stderr lacks '$1': $(head -c 600 "$tmp/err")"; }

case $MODE in
unit)
  expect_ok "$Q" lua test_unit.lua
  QINFER_LUA_PATH="/nonexistent/?.lua" expect_ok "$Q" lua test_unit.lua embedded
  # the checks can fail: a planted failure exits non-zero, naming its line
  "$Q" lua selftest_fail.lua >"$tmp/out" 2>"$tmp/err" && bad "the planted failure passed"
  grep -q "selftest_fail.lua:4: planted" "$tmp/err" && ok || bad "planted failure not reported: $(cat "$tmp/err")"
  expect_fail 2 "no script given" "$Q" lua
  expect_fail 1 "cannot open" "$Q" lua /nonexistent/x.lua
  expect_fail 2 "no experiment script given" "$Q" run
  expect_fail 2 "unknown option '--bogus'" "$Q" run x.lua --bogus
  expect_fail 2 "is not KEY=VALUE" "$Q" run x.lua --set novalue
  ;;
api)
  if ((!have_model)); then echo "skipped: smollm2-135m not cached (models/fetch.sh smollm2-135m)"; exit 77; fi
  if ! full_runs; then # test_api.lua's errors and the engines they need, without the runs it compares
    "$Q" lua -t 2 test_api.lua && ok || bad "test_api.lua (QI_TEST_ERRORS_ONLY=1) failed"
    summary
    [[ $fails -eq 0 ]]
    exit
  fi
  prompt="The quick brown fox jumps over the lazy dog. Then"
  "$Q" generate -t 2 -p "$prompt" -n 24 --temp 0 >"$tmp/gen.txt" 2>"$tmp/err" || bad "qinfer generate failed"
  ppl=$("$Q" ppl -t 2 -f devil --ctx 64 --chunks 2 2>"$tmp/err" | sed -n 's/.*PPL = \([0-9.]*\).*/\1/p')
  [[ -n $ppl ]] || bad "qinfer ppl printed no PPL: $(cat "$tmp/err")"
  "$Q" lua -t 2 test_api.lua "$tmp/gen.txt" "$ppl" && ok || bad "test_api.lua failed"
  # the plan each run's engines ran under is stored with the run, and a plan
  # on the test device gives the all-CPU text
  run_expect 0 placement_exp.lua --db "$tmp/place.db"
  expect_sql "$tmp/place.db" "SELECT json_extract(config_json, '$.placement'), placement FROM runs ORDER BY id" \
    "all-cpu|{\"devices\":[\"cpu\",\"testdev\"],\"embd\":0,\"head\":0,\"layers\":[$(printf '[0,0],%.0s' {1..29})[0,0]]} ngl=31|{\"devices\":[\"cpu\",\"testdev\"],\"embd\":0,\"head\":1,\"layers\":[$(printf '[1,1],%.0s' {1..29})[1,1]]}"
  expect_sql "$tmp/place.db" "SELECT count(DISTINCT value) FROM metrics WHERE name = 'gen.hash'" "1"
  # a simulated machine's figures are stored simulated, the real one's not;
  # simulated figures are the same when run again
  run_expect 0 sim_exp.lua --db "$tmp/sim.db"
  expect_sql "$tmp/sim.db" "SELECT json_extract(config_json, '$.where'), r.simulated, m.simulated FROM runs r JOIN metrics m ON m.run_id = r.id ORDER BY r.id" \
    "sim-cpu|1|1 sim-gpu|1|1 real|0|0"
  sql "$tmp/sim.db" "SELECT value FROM metrics WHERE run_id < 3 ORDER BY run_id" >"$tmp/sim1"
  run_expect 0 sim_exp.lua --db "$tmp/sim.db" --fresh
  sql "$tmp/sim.db" "SELECT value FROM metrics m JOIN runs r ON r.id = m.run_id WHERE r.simulated ORDER BY r.id" >"$tmp/sim2"
  diff -q "$tmp/sim1" "$tmp/sim2" >/dev/null && ok || bad "simulated figures differ between runs: $(cat "$tmp/sim1" "$tmp/sim2" | tr '\n' ' ')"
  ;;
run_resume)
  db=$tmp/resume.db marker=$tmp/marker
  run_expect 0 resume_exp.lua --list
  [[ $(grep -c '^\[[1-6]/6\] k=' "$tmp/out") -eq 6 ]] && ok || bad "--list: $(cat "$tmp/out")"
  grep -qF '[3/6] k=3  {"k":3,"tag":"x"}' "$tmp/out" && ok || bad "--list lacks k=3's JSON: $(cat "$tmp/out")"
  [[ ! -e $db ]] && ok || bad "--list made a database"

  # Killed during the third configuration's run.
  QI_TEST_INVOCATION=1 QI_TEST_STALL=1 QI_TEST_MARKER=$marker "$Q" run resume_exp.lua --db "$db" -t 1 \
    >"$tmp/o1" 2>"$tmp/e1" &
  pid=$!
  for _ in $(seq 300); do [[ -f $marker ]] && break; sleep 0.1; done
  [[ -f $marker ]] && ok || bad "configuration k=3 never started: $(cat "$tmp/e1")"
  { kill -KILL $pid; wait $pid; } 2>/dev/null; rc=$?
  [[ $rc -eq 137 ]] && ok || bad "killed qinfer run exited $rc, not 137"
  consistent "$db"
  expect_sql "$db" "SELECT group_concat(json_extract(config_json, '\$.k')) FROM (SELECT * FROM runs ORDER BY id)" "1,2"
  expect_sql "$db" "SELECT count(*) FROM runs WHERE status = 'done'" "2"
  expect_sql "$db" "SELECT count(*) FROM metrics" "8"

  # Resumed: the two done configurations are skipped, the rest run once.
  QI_TEST_INVOCATION=2 run_expect 0 resume_exp.lua --db "$db" -t 1
  err_has "6 configurations, 4 done, 2 skipped (already done), 0 failed"
  consistent "$db"
  expect_sql "$db" "SELECT count(*), count(DISTINCT config_key) FROM runs WHERE status = 'done'" "6|6"
  expect_sql "$db" "SELECT group_concat(v) FROM (SELECT CAST(m.value AS INT) v FROM runs r JOIN metrics m
    ON m.run_id = r.id WHERE m.name = 'test.invocation' AND m.repetition = 0 ORDER BY json_extract(r.config_json, '\$.k'))" \
    "1,1,2,2,2,2"
  expect_sql "$db" "SELECT group_concat(v) FROM (SELECT CAST(m.value AS INT) v FROM runs r JOIN metrics m
    ON m.run_id = r.id WHERE m.name = 'test.value' AND json_extract(r.config_json, '\$.k') = 3 ORDER BY m.repetition)" \
    "30,31"
  expect_sql "$db" "SELECT count(*) FROM metrics" "24"
  expect_sql "$db" "SELECT count(*) FROM runs WHERE model_sha256 IS NOT NULL OR seed != 42 OR cpu IS NULL" "0"
  grep -q "^\[6/6\] k=6 .*: test.value 60.5 ±0.71, test.invocation 2 ±0$" "$tmp/out" && ok ||
    bad "no result line for k=6: $(cat "$tmp/out")"

  # Again: nothing to do. --fresh with a pin redoes one configuration.
  QI_TEST_INVOCATION=3 run_expect 0 resume_exp.lua --db "$db" -t 1
  err_has "0 done, 6 skipped"
  old=$(sql "$db" "SELECT id FROM runs WHERE json_extract(config_json, '\$.k') = 2")
  QI_TEST_INVOCATION=4 run_expect 0 resume_exp.lua --db "$db" -t 1 --fresh --set k=2
  err_has "1 configuration, 1 done, 0 skipped"
  consistent "$db"
  expect_sql "$db" "SELECT count(*) FROM runs" "6"
  expect_sql "$db" "SELECT id > $old, (SELECT CAST(value AS INT) FROM metrics WHERE run_id = runs.id AND
    name = 'test.invocation' AND repetition = 1) FROM runs WHERE json_extract(config_json, '\$.k') = 2" "1|4"
  run_expect 2 resume_exp.lua --db "$db" --set bogus=1
  err_has "unknown parameter 'bogus' (parameters: k, tag)"
  run_expect 2 resume_exp.lua --db "$db" --set k=x
  err_has "--set k=x: not a number"

  # SIGINT during a run: that run is rolled back, the sweep stops, exit 130.
  db2=$tmp/int.db
  rm -f "$marker"
  QI_TEST_INVOCATION=5 QI_TEST_STALL=1 QI_TEST_MARKER=$marker "$Q" run resume_exp.lua --db "$db2" -t 1 \
    >"$tmp/o2" 2>"$tmp/e2" &
  pid=$!
  for _ in $(seq 300); do [[ -f $marker ]] && break; sleep 0.1; done
  kill -INT $pid; wait $pid; rc=$?
  [[ $rc -eq 130 ]] && ok || bad "interrupted qinfer run exited $rc, not 130: $(cat "$tmp/e2")"
  grep -q "interrupted during \[3/6\] k=3; that run was rolled back" "$tmp/e2" && ok || bad "no interrupt message: $(cat "$tmp/e2")"
  consistent "$db2"
  expect_sql "$db2" "SELECT count(*), sum(status = 'done') FROM runs" "2|2"
  ;;
run_errors)
  b=$here/bad
  # The script itself is broken: no database is made.
  run_expect 1 "$b/syntax.lua" --db "$tmp/syntax.db"
  err_has "syntax.lua:3: '}' expected (to close '{' at line 1) near 'run'"
  [[ ! -e $tmp/syntax.db ]] && ok || bad "a script with a syntax error made a database"
  run_expect 1 "$b/toplevel.lua" --db "$tmp/top.db"
  err_has "toplevel.lua:2: attempt to index a nil value (local 'x')"
  run_expect 2 "$b/norun.lua" --db "$tmp/norun.db"
  err_has "norun.lua: the experiment needs a run function"
  run_expect 1 "$tmp/none.lua" --db "$tmp/none.db"
  err_has "cannot open"

  # A configuration fails: recorded 'failed' with file:line, the sweep goes on.
  run_expect 1 "$b/runtime.lua" --db "$tmp/rt.db"
  err_has "runtime.lua:6: attempt to call a nil value (global 'undefined_function')"
  err_has "2 configurations, 1 done, 0 skipped (already done), 1 failed"
  consistent "$tmp/rt.db"
  expect_sql "$tmp/rt.db" "SELECT json_extract(config_json, '\$.k'), status, ifnull(error, '') LIKE '%runtime.lua:6: attempt to call%'
    FROM runs ORDER BY id" "1|done|0 2|failed|1"
  # rerun: the failed configuration is tried again and replaces its row
  run_expect 1 "$b/runtime.lua" --db "$tmp/rt.db"
  err_has "1 skipped (already done), 1 failed"
  consistent "$tmp/rt.db"
  expect_sql "$tmp/rt.db" "SELECT count(*), sum(status = 'failed') FROM runs" "2|1"

  run_expect 1 "$b/metric.lua" --db "$tmp/metric.db"
  err_has "metric.lua:5: ctx.metric:"
  err_has "Not A Name"
  consistent "$tmp/metric.db"
  expect_sql "$tmp/metric.db" "SELECT status FROM runs" "failed"

  run_expect 1 "$b/model.lua" --db "$tmp/model.db"
  err_has "model.lua:6:"
  err_has "no-such-model"
  consistent "$tmp/model.db"
  expect_sql "$tmp/model.db" "SELECT status, model_path IS NULL, error LIKE '%model.lua:6:%' FROM runs" "failed|1|1"

  if ((!have_model)); then
    echo "$passes passed, $fails failed (policy and type checks skipped: smollm2-135m not cached)"
    [[ $fails -eq 0 ]] && exit 77 || exit 1
  fi
  run_expect 1 "$b/policy.lua" --db "$tmp/policy.db" -t 1
  err_has "policy.lua:6:"
  err_has "no_such_policy"
  consistent "$tmp/policy.db"
  expect_sql "$tmp/policy.db" "SELECT status, error LIKE '%policy.lua:6:%no_such_policy%' FROM runs" "failed|1"
  run_expect 1 "$b/type.lua" --db "$tmp/type.db" -t 1
  err_has "type.lua:6: bad argument #1 to 'engine' (option 'max_seqs': integer expected, got string)"
  consistent "$tmp/type.db"
  expect_sql "$tmp/type.db" "SELECT status FROM runs" "failed"
  ;;
shard)
  # --list of every shard, for every N up to 16 (shard_exp.lua: 22 configurations)
  "$Q" run shard_exp.lua --list >"$tmp/all" 2>"$tmp/err" && ok || bad "--list: $(cat "$tmp/err")"
  sed 's/^\[[0-9]*\/[0-9]*\] //' "$tmp/all" | sort >"$tmp/all.sorted"
  [[ $(wc -l <"$tmp/all.sorted") -eq 22 ]] && ok || bad "--list: $(cat "$tmp/all")"
  for n in $(seq 1 16); do
    : >"$tmp/union"
    for ((i = 0; i < n; i++)); do
      "$Q" run shard_exp.lua --list --shard "$i/$n" >"$tmp/s" 2>"$tmp/err" || bad "--shard $i/$n: $(cat "$tmp/err")"
      sed 's/^\[[0-9]*\/[0-9]*\] #[0-9]* //' "$tmp/s" >>"$tmp/union"
    done
    # disjoint: no line twice; union: exactly the whole sweep
    [[ -z $(sort "$tmp/union" | uniq -d) ]] && ok || bad "N=$n: a configuration in two shards: $(sort "$tmp/union" | uniq -d)"
    sort "$tmp/union" | cmp -s - "$tmp/all.sorted" && ok || bad "N=$n: the shards' union is not the sweep"
  done
  # the split is the cost estimate's: k = 11 (cost 11) of p=a leads shard 0 of 2
  "$Q" run shard_exp.lua --list --shard 0/2 >"$tmp/s" 2>&1
  [[ $(wc -l <"$tmp/s") -eq 11 ]] && ok || bad "--shard 0/2: $(cat "$tmp/s")"
  grep -qF '#21 k=11 p=a  {"k":11,"p":"a"}' "$tmp/s" && ok || bad "--shard 0/2 lacks k=11 p=a: $(cat "$tmp/s")"
  # with a pin, the pinned sweep is split
  "$Q" run shard_exp.lua --list --set p=b --shard 1/3 >"$tmp/s" 2>&1
  [[ $(grep -c '"p":"b"' "$tmp/s") -eq $(wc -l <"$tmp/s") && $(wc -l <"$tmp/s") -ge 3 ]] && ok || bad "--set with --shard: $(cat "$tmp/s")"

  # a shard run: its default database, only its configurations, resumable
  mkdir "$tmp/w" && cd "$tmp/w" || exit 1
  run_expect 0 "$here/shard_exp.lua" --shard 1/4 -t 1
  err_has "shard_test, shard 1/4 (5 of 22 configurations, cost 33)"
  db=results/shards/shard_test.shard-1-of-4.db
  consistent "$db"
  expect_sql "$db" "SELECT count(*), sum(status = 'done') FROM runs" "5|5"
  "$Q" run "$here/shard_exp.lua" --list --shard 1/4 | sed 's/.*  //' | sort >"$tmp/want"
  sql "$db" "SELECT config_json FROM runs ORDER BY config_json" | cmp -s - "$tmp/want" && ok ||
    bad "shard 1/4 ran other configurations: $(sql "$db" "SELECT config_json FROM runs")"
  run_expect 0 "$here/shard_exp.lua" --shard 1/4 -t 1
  err_has "5 configurations, 0 done, 5 skipped (already done)"
  run_expect 0 "$here/shard_exp.lua" --shard 2/4 --db "$tmp/named.db" -t 1
  expect_sql "$tmp/named.db" "SELECT count(*) FROM runs WHERE status = 'done'" "6"
  cd "$here" || exit 1

  expect_fail 2 "option --shard: '4/4' is not I/N with 0 <= I < N" "$Q" run shard_exp.lua --shard 4/4
  expect_fail 2 "option --shard: '1/0' is not I/N" "$Q" run shard_exp.lua --shard 1/0
  expect_fail 2 "option --shard: '-1/2' is not I/N" "$Q" run shard_exp.lua --shard -1/2
  expect_fail 2 "option --shard: '1' is not I/N" "$Q" run shard_exp.lua --shard 1
  expect_fail 2 "option --shard: '1/2x' is not I/N" "$Q" run shard_exp.lua --shard 1/2x
  expect_fail 2 "option --shard needs a value" "$Q" run shard_exp.lua --shard
  ;;
merge)
  # run_q DB ARGS...: shard_exp.lua into DB
  run_q() { local db=$1; shift; "$Q" run shard_exp.lua --db "$db" -t 1 "$@" >/dev/null 2>"$tmp/err"; }
  # content DB: every run and metric, by configuration (no ids, no times)
  content() {
    sql "$1" "SELECT e.name, r.config_key, r.config_json, r.status, ifnull(r.error, ''), m.name, m.repetition, m.value, m.unit
      FROM runs r JOIN experiments e ON e.id = r.experiment_id LEFT JOIN metrics m ON m.run_id = r.id
      ORDER BY e.name, r.config_key, m.name, m.repetition"
  }
  # same DB: the file and its content are as they were (saved by snap)
  snap() { content "$1" >"$tmp/snap.content"; sha256sum <"$1" >"$tmp/snap.sha"; }
  same() {
    content "$1" | cmp -s - "$tmp/snap.content" && ok || bad "$1: content changed"
    sha256sum <"$1" | cmp -s - "$tmp/snap.sha" && ok || bad "$1: file changed"
  }
  merge_expect() { # CODE ARGS...
    local code=$1; shift
    "$Q" results merge "$@" >"$tmp/out" 2>"$tmp/err"; local rc=$?
    [[ $rc -eq $code ]] && ok || bad "qinfer results merge $* -> exit $rc, want $code: $(cat "$tmp/err")"
  }
  run_q "$tmp/full.db" && ok || bad "unsharded run: $(cat "$tmp/err")"
  for i in 0 1 2 3; do run_q "$tmp/s$i.db" --shard "$i/4" && ok || bad "shard $i: $(cat "$tmp/err")"; done
  content "$tmp/full.db" >"$tmp/full.content"
  [[ $(wc -l <"$tmp/full.content") -eq 132 ]] && ok || bad "full.db: $(wc -l <"$tmp/full.content") rows, want 22 x 3 x 2"

  # the shards merged equal the unsharded sweep
  m=$tmp/m.db
  merge_expect 0 "$m" "$tmp"/s{0,1,2,3}.db
  err_has "m.db: 22 runs added from 4 databases (0 already there)"
  grep -qF "s2.db: 6 runs, 6 added" "$tmp/out" && ok || bad "merge report: $(cat "$tmp/out")"
  consistent "$m"
  content "$m" | cmp -s - "$tmp/full.content" && ok || bad "merged content differs from the unsharded sweep's"
  expect_sql "$m" "SELECT count(*), count(DISTINCT config_key), sum(status = 'done') FROM runs" "22|22|22"
  expect_sql "$m" "SELECT count(*) FROM experiments" "1"
  expect_sql "$m" "SELECT count(*) FROM runs WHERE cpu IS NULL OR engine_version IS NULL OR started IS NULL OR finished IS NULL" "0"
  expect_ok "$Q" results shard_test --db "$m" --by k --metric test.value -o csv
  [[ $(tr -d '\r' <"$tmp/out" | sed -n '2p;12p' | cut -d, -f1-3 | tr '\n' ' ') == "1,2,10.75 11,2,110.75 " ]] && ok ||
    bad "qinfer results on the merged database: $(cat "$tmp/out")"

  # idempotent: again, nothing added, nothing changed
  snap "$m"
  merge_expect 0 "$m" "$tmp"/s{0,1,2,3}.db
  err_has "0 runs added from 4 databases (22 already there)"
  same "$m"
  # overlapping inputs: the whole sweep and a shard, twice the same shard
  merge_expect 0 "$tmp/o.db" "$tmp/s1.db" "$tmp/full.db" "$tmp/s1.db"
  err_has "o.db: 22 runs added from 3 databases (10 already there)"
  consistent "$tmp/o.db"
  content "$tmp/o.db" | cmp -s - "$tmp/full.content" && ok || bad "overlapping merge differs from the sweep"
  # an output that already holds some runs: only the others are added
  merge_expect 0 "$tmp/p.db" "$tmp/s0.db"
  merge_expect 0 "$tmp/p.db" "$tmp/m.db"
  grep -qF "m.db: 22 runs, $((22 - $(sql "$tmp/s0.db" "SELECT count(*) FROM runs"))) added" "$tmp/out" && ok ||
    bad "partial output: $(cat "$tmp/out")"
  content "$tmp/p.db" | cmp -s - "$tmp/full.content" && ok || bad "merge into a partial output differs from the sweep"

  # failed and done: a done run replaces a failed one, never the reverse
  QI_TEST_FAIL=3 run_q "$tmp/f.db" --set p=a
  expect_sql "$tmp/f.db" "SELECT count(*), sum(status = 'failed') FROM runs" "11|1"
  merge_expect 0 "$tmp/fd.db" "$tmp/f.db" "$tmp/full.db"
  grep -qF "full.db: 22 runs, 12 added (1 replacing failed runs), 10 already there" "$tmp/out" && ok ||
    bad "failed replaced: $(cat "$tmp/out")"
  consistent "$tmp/fd.db"
  expect_sql "$tmp/fd.db" "SELECT count(*), sum(status = 'done') FROM runs" "22|22"
  merge_expect 0 "$tmp/df.db" "$tmp/full.db" "$tmp/f.db"
  grep -qF "f.db: 11 runs, 0 added, 11 already there" "$tmp/out" && ok || bad "failed after done: $(cat "$tmp/out")"
  merge_expect 0 "$tmp/fo.db" "$tmp/f.db"
  expect_sql "$tmp/fo.db" "SELECT status, error LIKE '%planted failure%' FROM runs WHERE status = 'failed'" "failed|1"

  # a shard killed mid-run (its WAL left as a kill leaves it): what it
  # committed is merged; resumed, the rest follows, nothing twice
  marker=$tmp/marker
  QI_TEST_STALL=11 QI_TEST_MARKER=$marker "$Q" run shard_exp.lua --db "$tmp/k.db" --shard 0/2 -t 1 >/dev/null 2>&1 &
  pid=$!
  for _ in $(seq 300); do [[ -f $marker ]] && break; sleep 0.1; done
  [[ -f $marker ]] && ok || bad "the stalled configuration never started"
  kill -KILL $pid; wait $pid 2>/dev/null
  merge_expect 0 "$tmp/km.db" "$tmp/k.db"
  consistent "$tmp/km.db"
  expect_sql "$tmp/km.db" "SELECT count(*) FROM runs WHERE json_extract(config_json, '\$.k') = 11 AND json_extract(config_json, '\$.p') = 'a'" "0"
  run_q "$tmp/k.db" --shard 0/2 && ok || bad "resumed shard: $(cat "$tmp/err")"
  run_q "$tmp/k1.db" --shard 1/2 && ok || bad "shard 1/2: $(cat "$tmp/err")"
  merge_expect 0 "$tmp/km.db" "$tmp/k.db" "$tmp/k1.db"
  consistent "$tmp/km.db"
  content "$tmp/km.db" | cmp -s - "$tmp/full.content" && ok || bad "killed, resumed and merged: differs from the sweep"

  # refusals: one line, exit 1, nothing written (an existing output
  # unchanged, a new one not created)
  snap "$m"
  refused() { # PATTERN INPUT
    merge_expect 1 "$m" "$tmp/s0.db" "$2"
    err_has "$1"; [[ $(wc -l <"$tmp/err") -eq 1 ]] && ok || bad "not one line: $(cat "$tmp/err")"
    same "$m"
    merge_expect 1 "$tmp/new.db" "$tmp/s0.db" "$2"
    [[ ! -e $tmp/new.db ]] && ok || bad "a refused merge created its output"
  }
  cp "$tmp/s1.db" "$tmp/v.db"; sql "$tmp/v.db" "PRAGMA user_version = 4"
  refused "v.db: schema version 4, but this merge writes version 3" "$tmp/v.db"
  # another definition: the same experiment run from an edited script
  cp shard_exp.lua "$tmp/edited_exp.lua"; echo "-- edited" >>"$tmp/edited_exp.lua"
  "$Q" run "$tmp/edited_exp.lua" --db "$tmp/x.db" -t 1 --shard 3/4 >/dev/null 2>&1
  refused "experiment 'shard_test': $tmp/x.db was run from another script than $tmp/s0.db" "$tmp/x.db"
  merge_expect 1 "$m" "$tmp/x.db"
  err_has "$tmp/x.db was run from another script than $m"
  same "$m"
  cp "$tmp/s2.db" "$tmp/t.db"; truncate -s $(($(stat -c %s "$tmp/t.db") / 2)) "$tmp/t.db"
  refused "t.db: cannot open (truncated or corrupt?): database disk image is malformed" "$tmp/t.db"
  cp "$tmp/s2.db" "$tmp/c.db"
  printf '\377%.0s' $(seq 64) | dd of="$tmp/c.db" bs=1 seek=8192 conv=notrunc 2>/dev/null
  refused "c.db: the database is corrupt (integrity_check: Page" "$tmp/c.db"
  echo "not a database" >"$tmp/junk.db"
  refused "junk.db: cannot open: file is not a database" "$tmp/junk.db"
  refused "none.db: cannot open: No such file or directory" "$tmp/none.db"
  sqlite3 "$tmp/other.db" "CREATE TABLE t (x)" 2>/dev/null || python3 -c 'import sqlite3, sys; sqlite3.connect(sys.argv[1]).execute("CREATE TABLE t (x)")' "$tmp/other.db"
  refused "other.db: not a qinfer results database" "$tmp/other.db"
  merge_expect 1 "$m" "$tmp/s1.db" "$m"
  err_has "m.db: is the output itself"
  same "$m"

  expect_fail 2 "no input database given" "$Q" results merge "$m"
  expect_fail 2 "no output and no input database given" "$Q" results merge
  expect_fail 2 "unknown option '--bogus'" "$Q" results merge "$m" --bogus "$tmp/s0.db"
  expect_ok "$Q" results merge --help
  grep -q "usage: qinfer results merge OUT.db IN.db" "$tmp/out" && ok || bad "merge --help: $(cat "$tmp/out")"
  ;;
submit)
  mkdir -p "$tmp/bin" "$tmp/w" && cd "$tmp/w" || exit 1
  cat >"$tmp/bin/sbatch" <<'EOF'
#!/bin/bash
# a stand-in for Slurm's sbatch: records its arguments, prints a job id
printf '%s\n' "$@" >>"$SBATCH_LOG"
[[ -n ${SBATCH_FAIL:-} ]] && { echo "sbatch: error: $SBATCH_FAIL" >&2; exit 1; }
echo "4242;qitest"
EOF
  chmod +x "$tmp/bin/sbatch"
  export SBATCH_LOG=$tmp/sbatch.log
  dir="$tmp/my shards'x"
  sub() { PATH="$tmp/bin:$PATH" "$Q" submit "$here/shard_exp.lua" --slurm --db-dir "$dir" "$@" >"$tmp/out" 2>"$tmp/err"; }

  # --dry-run: the script on stdout, nothing written or run
  sub --array 4 --partition gpu --time 0:30:00 --gpus 1 -t 2 --dry-run --set p=a -- --mem=2G --account=lab && ok ||
    bad "dry run: $(cat "$tmp/err")"
  for line in '#!/bin/bash' '#SBATCH --job-name=qinfer-shard_test' '#SBATCH --partition=gpu' '#SBATCH --time=0:30:00' \
    '#SBATCH --gpus=1' '#SBATCH --cpus-per-task=2' '#SBATCH --mem=2G' '#SBATCH --account=lab' \
    "#SBATCH --chdir=$tmp/w" "#SBATCH --output=\"$dir/logs/shard_test.shard-%a-of-4.job-%A.log\"" \
    "# sbatch --parsable --array=0-3 $dir/shard_test.sbatch"; do
    grep -qxF -- "$line" "$tmp/out" && ok || bad "dry run lacks '$line': $(cat "$tmp/out")"
  done
  grep -qF -- "--shard \"\$i/4\" " "$tmp/out" && grep -qF -- " -t 2 --set 'p=a'" "$tmp/out" && ok || bad "dry run's command: $(cat "$tmp/out")"
  grep -qF "11 configurations in 4 shards, 11 left to run in 4 shards (dry run" "$tmp/err" && ok || bad "dry run: $(cat "$tmp/err")"
  [[ ! -e $dir && ! -e $SBATCH_LOG ]] && ok || bad "a dry run wrote or submitted something"

  # submitted: sbatch --parsable --array=0-3 SCRIPT; the job id on stdout
  sub --array 4 && ok || bad "submit: $(cat "$tmp/err")"
  [[ $(cat "$tmp/out") == 4242 ]] && ok || bad "job id: '$(cat "$tmp/out")'"
  [[ $(tr '\n' ' ' <"$SBATCH_LOG") == "--parsable --array=0-3 $dir/shard_test.sbatch " ]] && ok || bad "sbatch args: $(cat "$SBATCH_LOG")"
  grep -qF "job 4242, tasks 0-3 (4 of 4 shards, 22 of 22 configurations to run)" "$tmp/err" && ok || bad "submit: $(cat "$tmp/err")"
  [[ -x $dir/shard_test.sbatch && -d $dir/logs ]] && ok || bad "no batch script or logs folder"
  # run as Slurm would run two of its tasks (from elsewhere: its paths are absolute)
  bash "$dir/shard_test.sbatch" >/dev/null 2>&1 && bad "the batch script ran outside an array task" || ok
  for i in 0 2; do
    (cd / && SLURM_ARRAY_TASK_ID=$i bash "$dir/shard_test.sbatch") >/dev/null 2>"$tmp/err.$i" && ok || bad "task $i: $(cat "$tmp/err.$i")"
    consistent "$dir/shard_test.shard-$i-of-4.db"
  done
  expect_sql "$dir/shard_test.shard-0-of-4.db" "SELECT count(*) FROM runs WHERE status = 'done'" "$("$Q" run "$here/shard_exp.lua" --list --shard 0/4 | wc -l)"
  # resubmitted: only the shards with work left
  : >"$SBATCH_LOG"
  sub --array 4 && ok || bad "resubmit: $(cat "$tmp/err")"
  grep -qx -- "--array=1,3" "$SBATCH_LOG" && ok || bad "resubmit: $(cat "$SBATCH_LOG")"
  grep -qF "tasks 1,3 (2 of 4 shards, 11 of 22 configurations to run)" "$tmp/err" && ok || bad "resubmit: $(cat "$tmp/err")"
  # a shard half done (one configuration failed): resubmitted for that one
  cfg=$("$Q" run "$here/shard_exp.lua" --list --shard 1/4 | sed -n '1s/.*{"k":\([0-9]*\),"p":"\([ab]\)"}$/\1 \2/p')
  [[ -n $cfg ]] && ok || bad "shard 1/4's first configuration not found"
  QI_TEST_FAIL=${cfg% *} QI_TEST_FAIL_P=${cfg#* } SLURM_ARRAY_TASK_ID=1 bash "$dir/shard_test.sbatch" >/dev/null 2>&1
  SLURM_ARRAY_TASK_ID=3 bash "$dir/shard_test.sbatch" >/dev/null 2>&1 || bad "task 3 failed"
  : >"$SBATCH_LOG"
  sub --array 4 && ok || bad "resubmit: $(cat "$tmp/err")"
  grep -qx -- "--array=1" "$SBATCH_LOG" && ok || bad "resubmit of a failed configuration: $(cat "$SBATCH_LOG")"
  grep -qF "tasks 1 (1 of 4 shards, 1 of 22 configurations to run)" "$tmp/err" && ok || bad "resubmit: $(cat "$tmp/err")"
  SLURM_ARRAY_TASK_ID=1 bash "$dir/shard_test.sbatch" >/dev/null 2>&1 || bad "task 1, again, failed"
  # all done: nothing submitted
  : >"$SBATCH_LOG"
  sub --array 4 && ok || bad "submit when done: $(cat "$tmp/err")"
  [[ ! -s $tmp/out && ! -s $SBATCH_LOG ]] && ok || bad "a finished sweep was submitted: $(cat "$tmp/out" "$SBATCH_LOG")"
  grep -qF "every configuration of the 4 shards in $dir is done; nothing submitted" "$tmp/err" && ok || bad "done: $(cat "$tmp/err")"
  "$Q" results merge "$tmp/m.db" "$dir"/shard_test.shard-*-of-4.db >/dev/null 2>&1 && ok || bad "merge of the tasks' shards"
  expect_sql "$tmp/m.db" "SELECT count(*), count(DISTINCT config_key), sum(status = 'done') FROM runs" "22|22|22"
  # without --array: one task per configuration
  sub --dry-run && grep -qF "# sbatch --parsable --array=0-21 " "$tmp/out" && ok || bad "default --array: $(cat "$tmp/out")"

  # sbatch failing, or missing
  SBATCH_FAIL="invalid partition specified: nope" sub --array 2
  [[ $? -eq 1 ]] && ok || bad "a failing sbatch: exit not 1"
  grep -qF "sbatch: error: invalid partition specified: nope" "$tmp/err" && grep -qF "qinfer submit: sbatch failed (exit 1)" "$tmp/err" &&
    ok || bad "a failing sbatch: $(cat "$tmp/err")"
  expect_fail 1 "cannot run sbatch" env PATH=/nonexistent "$Q" submit "$here/shard_exp.lua" --slurm --array 2 --db-dir "$tmp/x"

  expect_fail 2 "name the scheduler: --slurm" "$Q" submit "$here/shard_exp.lua"
  expect_fail 2 "no experiment script given" "$Q" submit --slurm
  expect_fail 2 "more tasks than the sweep has configurations (22)" "$Q" submit "$here/shard_exp.lua" --slurm --array 23 --dry-run
  expect_fail 2 "option --array" "$Q" submit "$here/shard_exp.lua" --slurm --array 0
  expect_fail 2 "sbatch option 'mem=2G' after -- does not start with '-'" "$Q" submit "$here/shard_exp.lua" --slurm -- mem=2G
  expect_fail 2 "unknown parameter 'q'" "$Q" submit "$here/shard_exp.lua" --slurm --set q=1 --dry-run
  expect_fail 2 "unknown option '--bogus'" "$Q" submit "$here/shard_exp.lua" --slurm --bogus
  expect_fail 2 "cannot be given to sbatch" "$Q" submit "$here/shard_exp.lua" --slurm --dry-run --db-dir "$tmp/a\"b"
  expect_ok "$Q" submit --help
  cd "$here" || exit 1
  ;;
results)
  # results/ relative to the working directory, as qinfer run makes it
  mkdir "$tmp/w" && cd "$tmp/w" || exit 1
  expect_fail 1 "no results databases in results/" "$Q" results
  expect_fail 1 "results/results_test.db: no such file" "$Q" results results_test
  "$Q" run "$here/results_exp.lua" -t 1 >"$tmp/out" 2>"$tmp/err" && ok || bad "results_exp.lua: $(cat "$tmp/err")"
  db=results/results_test.db
  [[ -f $db ]] && ok || bad "qinfer run did not write $db"

  # the listing: every results/*.db, or the one --db names
  expect_ok "$Q" results
  grep -qE '^results_test +4 +0 +20[0-9-]+T[0-9:.]+Z +results/results_test\.db$' "$tmp/out" && ok ||
    bad "listing: $(cat "$tmp/out")"
  expect_ok "$Q" results --db "$db" -o csv
  [[ $(tr -d '\r' <"$tmp/out" | sed -n 2p | cut -d, -f1-4) == "$db,results_test,4,0" ]] && ok ||
    bad "listing as CSV: $(cat "$tmp/out")"

  # grouped: means over runs and repetitions, sd, n; simulated marked
  expect_ok "$Q" results results_test --by policy
  grep -qE '^full +2 +172 ±55 \(6\) sim +15 ±5.5 \(6\) +86 ±27 \(6\)$' "$tmp/out" && ok ||
    bad "grouped by policy: $(cat "$tmp/out")"
  grep -qE '^h2o +2 +192 ±55 \(6\) sim +- +96 ±27 \(6\)$' "$tmp/out" && ok || bad "h2o row: $(cat "$tmp/out")"
  grep -q "^sim: simulated" "$tmp/out" && ok || bad "no note on simulated values: $(cat "$tmp/out")"
  expect_ok "$Q" results results_test --by kv_budget,policy --metric test.ppl,test.tok_s -o csv
  want=$'kv_budget,policy,runs,test.ppl,test.ppl:sd,test.ppl:n,test.ppl:simulated,test.tok_s,test.tok_s:sd,test.tok_s:n,test.tok_s:simulated
0.5,full,1,20,0,3,0,61,1,3,0
0.5,h2o,1,,,0,0,71,1,3,0
1.0,full,1,10,0,3,0,111,1,3,0
1.0,h2o,1,,,0,0,121,1,3,0'
  [[ $(tr -d '\r' <"$tmp/out") == "$want" ]] && ok || bad "grouped CSV: $(cat "$tmp/out")"
  expect_ok "$Q" results results_test --by policy --metric sim.tok_s -o csv
  [[ $(tr -d '\r' <"$tmp/out" | sed -n 2p) == "full,2,172,54.801459834570096,6,1" ]] && ok ||
    bad "simulated column: $(cat "$tmp/out")"
  expect_ok "$Q" results results_test --by policy -o json --metric test.tok_s,sim.tok_s
  if command -v python3 >/dev/null; then
    python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
r = {row["config"]["policy"]: row for row in d["rows"]}
assert d["experiment"] == "results_test" and d["by"] == ["policy"], d
assert r["full"]["metrics"]["test.tok_s"] == {"mean": 86, "sd": r["full"]["metrics"]["test.tok_s"]["sd"], "n": 6,
                                             "unit": "tok/s", "simulated": False}, r["full"]
assert r["h2o"]["metrics"]["sim.tok_s"]["simulated"] is True and r["h2o"]["runs"] == 2, r["h2o"]' "$tmp/out" && ok ||
      bad "grouped JSON: $(cat "$tmp/out")"
  else
    grep -q '"simulated": true' "$tmp/out" && ok || bad "grouped JSON: $(cat "$tmp/out")"
  fi

  # per run: its configuration (a comma in a value quoted in CSV)
  expect_ok "$Q" results results_test
  [[ $(grep -cE '^ +[1-4] +(0\.5|1\.0) +(full|h2o) +a,b ' "$tmp/out") -eq 4 ]] && ok || bad "per run: $(cat "$tmp/out")"
  expect_ok "$Q" results results_test -o csv --metric test.tok_s
  [[ $(tr -d '\r' <"$tmp/out" | sed -n 1,2p | tr '\n' ' ') == 'run_id,kv_budget,policy,tag,test.tok_s,test.tok_s:sd,test.tok_s:n,test.tok_s:simulated 1,0.5,full,"a,b",61,1,3,0 ' ]] &&
    ok || bad "per run CSV: $(cat "$tmp/out")"

  # the full export: one line per (run, metric, repetition)
  expect_ok "$Q" results results_test --csv
  [[ $(wc -l <"$tmp/out") -eq 31 ]] && ok || bad "--csv: $(wc -l <"$tmp/out") lines, want 31"
  head -1 "$tmp/out" | grep -q ',config.kv_budget,config.policy,config.tag,metric,value,unit,repetition,simulated' && ok ||
    bad "--csv header: $(head -1 "$tmp/out")"

  # the numbers come from the file: a changed value changes the mean
  sql "$db" "UPDATE metrics SET value = value + 30 WHERE name = 'test.tok_s' AND run_id =
    (SELECT id FROM runs WHERE json_extract(config_json, '\$.policy') = 'h2o' AND json_extract(config_json, '\$.kv_budget') = 1.0)"
  expect_ok "$Q" results results_test --by policy --metric test.tok_s -o csv
  [[ $(tr -d '\r' <"$tmp/out" | sed -n 3p | cut -d, -f1-3) == "h2o,2,111" ]] && ok || bad "after the update: $(cat "$tmp/out")"

  # read-only: a file that cannot be written is still read
  chmod a-w "$db"
  expect_ok "$Q" results results_test --by policy
  chmod u+w "$db"

  # errors: one line, exit 2 for what the user named wrong, 1 for unreadable files
  expect_fail 2 "no experiment named 'nosuch' (experiments: results_test)" "$Q" results nosuch --db "$db"
  expect_fail 2 "has no parameter 'nope' (parameters: kv_budget, policy, tag)" "$Q" results results_test --by nope
  expect_fail 2 "has no metric 'x.y' (metrics: sim.tok_s, test.ppl, test.tok_s)" "$Q" results results_test --metric x.y
  expect_fail 2 "parameter 'policy' given twice" "$Q" results results_test --by policy,policy
  expect_fail 2 "option --by: an empty item" "$Q" results results_test --by policy,
  expect_fail 2 "'xml' is not an output format" "$Q" results results_test -o xml
  expect_fail 2 "takes no --by, --metric or -o" "$Q" results results_test --csv --by policy
  expect_fail 2 "--metric needs an experiment" "$Q" results --metric test.ppl
  expect_fail 2 "unknown option '--bogus'" "$Q" results --bogus
  expect_fail 1 "/nonexistent/x.db: cannot open" "$Q" results results_test --db /nonexistent/x.db
  echo "not a database" >"$tmp/junk.db"
  expect_fail 1 "junk.db: opening: file is not a database" "$Q" results results_test --db "$tmp/junk.db"
  expect_fail 1 "junk.db: opening: file is not a database" "$Q" results --db "$tmp/junk.db"
  expect_ok "$Q" results --help
  ;;
measure)
  expect_ok "$Q" lua test_measure.lua
  expect_ok "$Q" lua test_serve.lua
  if ((!have_model)); then echo "skipped: smollm2-135m not cached (models/fetch.sh smollm2-135m)"; exit 77; fi
  # bench's batched row and qinfer.throughput run one definition: under the
  # fake clock (one tick a read) both give batch / tick exactly, 3 / 0.001
  bench=$(QINFER_FAKE_CLOCK=0.001 "$Q" bench -t 2 -p 0 -n 6 -b 3 -r 1 --warmup 0 --probe-mib 0 -o json 2>"$tmp/err" |
    python3 -c 'import json, sys; print("%.6f" % [r for r in json.load(sys.stdin) if r["batch"] == 3][0]["avg_ts"])')
  [[ $bench == "3000.000000" ]] && ok || bad "bench tg6 @ b3 under the fake clock: '$bench' t/s, want 3000.000000 $(head -c 300 "$tmp/err")"
  lua=$(QINFER_FAKE_CLOCK=0.001 "$Q" lua -t 2 test_measure.lua throughput 2>"$tmp/err")
  [[ $lua == "3000.000000 0.006000" ]] && ok || bad "qinfer.throughput under the fake clock: '$lua', want '3000.000000 0.006000' $(head -c 300 "$tmp/err")"
  [[ ${lua%% *} == "$bench" ]] && ok || bad "bench ($bench t/s) and Lua (${lua%% *} t/s) disagree on one run"
  expect_ok "$Q" lua -t 2 test_serve.lua model
  # qinfer generate's TTFT and TPOT are the module's: under the fake clock the
  # prompt spans one tick, each token one more
  gen=$(QINFER_FAKE_CLOCK=0.001 "$Q" generate -t 2 -p "Once upon a time" -n 4 --temp 0 --ignore-eos 2>&1 >/dev/null | tail -1)
  [[ $gen == "qinfer generate: TTFT 0.002 s, TPOT 0.0010 s (1000.0 t/s), end to end 0.005 s" ]] && ok ||
    bad "qinfer generate's timing under the fake clock: '$gen'"
  ;;
*)
  echo "run_tests.sh: unknown mode '$MODE' (unit, api, run_resume, run_errors, shard, merge, submit, results, measure)" >&2
  exit 2
  ;;
esac

summary
[[ $fails -eq 0 ]]
