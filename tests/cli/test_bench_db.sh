#!/usr/bin/env bash
# `qinfer bench --db` keeps a run's configuration whole: a simulated run
# (the shapes-only LLaMA-2-70B of `qinfer synth`, this machine's profile
# and calibration, no arithmetic: seconds) whose calibration file lies
# under a path of over 2 KiB adds its rows to a results database with the
# path in full, every row's configuration valid JSON. Needs no model;
# skips (77) without SQLite or the sqlite3 program.
# Usage: test_bench_db.sh PATH/TO/qinfer
set -uo pipefail
Q=${1:?usage: test_bench_db.sh PATH/TO/qinfer}
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
profiles="$(dirname "${BASH_SOURCE[0]}")/../../engine/backend/sim/profiles"

if "$Q" bench --help | grep -q "built without SQLite" || ! command -v sqlite3 >/dev/null; then
  echo "skipped: this qinfer has no SQLite, or there is no sqlite3 program"
  exit 77
fi
M=$tmp/l70.gguf
expect_ok "$Q" synth --preset llama-2-70b --type q4_0 --shapes-only -o "$M" || { summary; exit 1; }
# ten folders of 200 characters: a path of over 2 KiB
d=$tmp
for _ in 1 2 3 4 5 6 7 8 9 10; do d=$d/$(printf 'c%.0s' {1..200}); done
mkdir -p "$d" && cp "$profiles/epyc-2core-kvm.cal" "$d/x.cal"
if expect_ok "$Q" bench -m "$M" --sim "$profiles/epyc-2core-kvm.profile" --sim-cal "$d/x.cal" -p 8 -n 4 -b 2 -r 1 \
  --warmup 0 -o csv --db "$tmp/b.db"; then
  n=$(sqlite3 "$tmp/b.db" "SELECT count(*) FROM runs WHERE status = 'done'")
  [[ $n == 3 ]] && ok || bad "$n runs done in the database, want 3 (pp8, tg4, tg4 @ b2)"
  n=$(sqlite3 "$tmp/b.db" "SELECT count(*) FROM runs WHERE json_valid(config_json) \
    AND json_extract(config_json, '$.sim_cal') = '$d/x.cal' AND json_extract(config_json, '$.sim') = 'epyc-2core-kvm'")
  [[ $n == 3 ]] && ok || bad "$n of 3 runs hold the calibration's path of ${#d} characters whole"
fi
summary
[[ $fails -eq 0 ]]
