#!/usr/bin/env bash
# test_slurm.sh - `qinfer submit --slurm` on a real Slurm cluster of one
# machine (testbed.sh: munged, slurmctld and slurmd on loopback, started
# for the test and stopped at its end, whatever happens). CTest runs one
# mode per test:
#   array   tests/lua/shard_exp.lua (22 configurations, no model) submitted
#           as an array of 4; each task must really run under Slurm
#           (COMPLETED, its log written, $SLURM_ARRAY_TASK_ID recorded in
#           every run of its shard); the shards merged must hold the same
#           configurations and numbers as the sweep run unsharded, one run
#           each, integrity_check ok; submitting again submits nothing
#   cancel  one task scancelled while a configuration of it runs; it must
#           end CANCELLED with that run rolled back; submitting again must
#           submit that task alone, which runs only what it lacks; merged,
#           nothing is lost or duplicated
# Exits 77 (skipped, with the reason) when qinfer lacks Lua/SQLite or the
# test bed cannot start (not root, slurm-wlm or munge missing, daemons that
# do not come up); with QI_SLURM_REQUIRED=1 a test bed that cannot start
# fails instead.
# Usage: test_slurm.sh PATH/TO/qinfer MODE
set -uo pipefail
Q=${1:?usage: test_slurm.sh PATH/TO/qinfer MODE}
MODE=${2:?usage: test_slurm.sh PATH/TO/qinfer MODE}
Q=$(cd "$(dirname "$Q")" && pwd)/$(basename "$Q")
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
exp=$here/../lua/shard_exp.lua
# shellcheck source-path=SCRIPTDIR source=../cli/lib.sh
source "$here/../cli/lib.sh"
# shellcheck source-path=SCRIPTDIR source=testbed.sh
source "$here/testbed.sh"
trap 'tb_stop; rm -rf "$tmp"' EXIT
trap 'exit 143' TERM INT

if "$Q" run --help | grep "built without Lua/SQLite" >/dev/null; then
  echo "skipped: qinfer built without Lua/SQLite"
  exit 77
fi
command -v sqlite3 >/dev/null || { echo "skipped: the sqlite3 shell is missing (scripts/setup.sh installs it)"; exit 77; }
if ! tb_start; then
  if [[ ${QI_SLURM_REQUIRED:-0} == 1 ]]; then echo "FAIL: the Slurm test bed did not start: $tb_reason"; exit 1; fi
  echo "skipped: the Slurm test bed did not start: $tb_reason"
  exit 77
fi
echo "Slurm test bed up ($(sinfo -h -o '%P %D node(s) %c CPUs %t'), $(sbatch --version))"

sql() { sqlite3 -batch "$1" "$2"; }
expect_sql() {
  local got
  got=$(sql "$1" "$2" 2>&1 | tr '\n' ' ' | sed 's/ $//')
  [[ $got == "$3" ]] && ok || bad "$1: $2 -> '$got', want '$3'"
}
consistent() {
  expect_sql "$1" "PRAGMA integrity_check" "ok"
  expect_sql "$1" "PRAGMA foreign_key_check" ""
  expect_sql "$1" "SELECT count(*) FROM runs WHERE status <> 'done'" "0"
  expect_sql "$1" "SELECT count(*) FROM (SELECT 1 FROM runs GROUP BY experiment_id, config_key HAVING count(*) > 1)" "0"
}
# the sweep's numbers, by configuration (test.task and test.invocation say
# where and when a run ran, so they differ between sharded and not)
values() {
  sql "$1" "SELECT r.config_json, m.repetition, m.value FROM runs r JOIN metrics m ON m.run_id = r.id
    WHERE m.name = 'test.value' ORDER BY r.config_key, m.repetition"
}
# submit ARGS...: qinfer submit; the job id in $job
submit() {
  "$Q" submit "$exp" --slurm --array 4 --db-dir "$w/shards" -t 1 "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  job=$(cat "$tmp/out")
  [[ $rc -eq 0 ]] && ok || bad "qinfer submit $* -> exit $rc: $(cat "$tmp/err")"
}
# the shard I each configuration belongs to, as the tasks split the sweep
shard_of() { "$Q" run "$exp" --list --shard "$1/4" | sed 's/.*  //'; }
# the array tasks' states must be exactly WANT ("0 COMPLETED 1 COMPLETED ...")
expect_states() {
  local got
  got=$(tb_task_state "$1" | tr '\n' ' ' | sed 's/ $//')
  [[ $got == "$2" ]] && ok || bad "job $1: task states '$got', want '$2'"
}
# each run of shard I's database ran in array task I (its test.task metric)
ran_in_tasks() {
  local i
  for i in 0 1 2 3; do
    local db=$w/shards/shard_test.shard-$i-of-4.db
    consistent "$db"
    expect_sql "$db" "SELECT count(*) FROM metrics WHERE name = 'test.task' AND value <> $i" "0"
    sql "$db" "SELECT config_json FROM runs ORDER BY config_json" | cmp -s - <(shard_of $i | sort) && ok ||
      bad "shard $i's database holds other configurations than its part of the sweep"
  done
}

w="$tmp/work dir#1"   # sbatch reads blanks and '#' in #SBATCH lines: they must be escaped
mkdir -p "$w" && cd "$w" || exit 1
"$Q" run "$exp" --db "$w/full.db" -t 1 >/dev/null 2>"$tmp/err" && ok || bad "unsharded run: $(cat "$tmp/err")"
values "$w/full.db" >"$tmp/full.values"
t0=$(date +%s)

case $MODE in
array)
  QI_TEST_INVOCATION=1 QI_TEST_DELAY=0.2 submit
  [[ $job =~ ^[0-9]+$ ]] && ok || bad "no job id: '$job'"
  grep -qF "tasks 0-3 (4 of 4 shards, 22 of 22 configurations to run)" "$tmp/err" && ok || bad "submit: $(cat "$tmp/err")"
  [[ -x $w/shards/shard_test.sbatch ]] && ok || bad "no batch script"
  tb_wait_job "$job" 240 && ok || bad "job $job still queued after 240 s: $(squeue)"
  expect_states "$job" "0 COMPLETED 1 COMPLETED 2 COMPLETED 3 COMPLETED"
  for i in 0 1 2 3; do
    log=$w/shards/logs/shard_test.shard-$i-of-4.job-$job.log
    grep -qF "qinfer run: shard_test, shard $i/4" "$log" && ok || bad "task $i's log: $(cat "$log" 2>&1 | head -5)"
  done
  ran_in_tasks

  "$Q" results merge "$w/merged.db" "$w"/shards/shard_test.shard-{0,1,2,3}-of-4.db >"$tmp/out" 2>"$tmp/err" && ok ||
    bad "merge: $(cat "$tmp/err")"
  consistent "$w/merged.db"
  expect_sql "$w/merged.db" "SELECT count(*), count(DISTINCT config_key) FROM runs" "22|22"
  sql "$w/merged.db" "SELECT config_key FROM runs ORDER BY 1" | cmp -s - <(sql "$w/full.db" "SELECT config_key FROM runs ORDER BY 1") &&
    ok || bad "the merged configurations differ from the unsharded sweep's"
  values "$w/merged.db" | cmp -s - "$tmp/full.values" && ok || bad "the merged numbers differ from the unsharded sweep's"
  expect_sql "$w/merged.db" "SELECT count(DISTINCT value) FROM metrics WHERE name = 'test.task'" "4"

  # everything done: nothing is submitted
  submit
  [[ -z $job ]] && ok || bad "a finished sweep was submitted again: job '$job'"
  grep -qF "every configuration of the 4 shards" "$tmp/err" && ok || bad "resubmit when done: $(cat "$tmp/err")"
  ;;
cancel)
  marker=$tmp/marker
  QI_TEST_INVOCATION=1 QI_TEST_STALL=11 QI_TEST_MARKER=$marker submit
  first=$job
  for _ in $(seq 600); do [[ -s $marker ]] && break; sleep 0.2; done
  [[ -s $marker ]] && ok || bad "the stalled configuration never started: $(squeue)"
  task=$(cat "$marker")
  [[ $task =~ ^[0-3]$ ]] && ok || bad "the stalled configuration ran outside the array: task '$task'"
  scancel "${first}_$task" && ok || bad "scancel ${first}_$task failed"
  tb_wait_job "$first" 240 && ok || bad "job $first still queued after 240 s: $(squeue)"
  want=""
  for i in 0 1 2 3; do [[ $i == "$task" ]] && want+="$i CANCELLED " || want+="$i COMPLETED "; done
  expect_states "$first" "${want% }"
  db=$w/shards/shard_test.shard-$task-of-4.db
  consistent "$db"
  expect_sql "$db" "SELECT count(*) FROM runs WHERE config_json = '{\"k\":11,\"p\":\"a\"}'" "0"
  n_task=$(shard_of "$task" | wc -l)
  expect_sql "$db" "SELECT count(*) FROM runs" "$((n_task - 1))"

  # submitted again: that task alone, for its one missing configuration
  QI_TEST_INVOCATION=2 submit
  grep -qF "tasks $task (1 of 4 shards, 1 of 22 configurations to run)" "$tmp/err" && ok || bad "resubmit: $(cat "$tmp/err")"
  [[ $job =~ ^[0-9]+$ && $job != "$first" ]] && ok || bad "resubmit: job id '$job'"
  tb_wait_job "$job" 240 && ok || bad "job $job still queued after 240 s: $(squeue)"
  expect_states "$job" "$task COMPLETED"
  ran_in_tasks

  "$Q" results merge "$w/merged.db" "$w"/shards/shard_test.shard-{0,1,2,3}-of-4.db >"$tmp/out" 2>"$tmp/err" && ok ||
    bad "merge: $(cat "$tmp/err")"
  consistent "$w/merged.db"
  expect_sql "$w/merged.db" "SELECT count(*), count(DISTINCT config_key) FROM runs" "22|22"
  values "$w/merged.db" | cmp -s - "$tmp/full.values" && ok || bad "the merged numbers differ from the unsharded sweep's"
  # the second submission ran the cancelled configuration and nothing else
  expect_sql "$w/merged.db" "SELECT r.config_json FROM runs r JOIN metrics m ON m.run_id = r.id
    WHERE m.name = 'test.invocation' AND m.value = 2 AND m.repetition = 0" '{"k":11,"p":"a"}'
  ;;
*)
  echo "test_slurm.sh: unknown mode '$MODE' (array, cancel)" >&2
  exit 2
  ;;
esac

echo "$passes passed, $fails failed ($(($(date +%s) - t0)) s of Slurm jobs)"
[[ $fails -eq 0 ]]
