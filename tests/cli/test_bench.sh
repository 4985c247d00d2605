#!/usr/bin/env bash
# End-to-end checks of `qinfer bench`: --help, one-line errors with exit 2 for
# bad flags and impossible sizes, then tiny runs on the cached default model
# (markdown table, CSV, JSON, and --db rows when built with SQLite). Exits 77
# (skip) after the flag checks when the model is not cached.
# Usage: test_bench.sh PATH/TO/qinfer
set -uo pipefail
Q=${1:?usage: test_bench.sh PATH/TO/qinfer}
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

expect_ok "$Q" bench --help && { grep -q "usage: qinfer bench" "$tmp/out" || bad "bench --help prints no usage"; }
grep -q "built without SQLite" "$tmp/out" && sqlite=0 || sqlite=1
"$Q" --help | grep -q "^  bench " && ok || bad "qinfer --help does not list bench"
expect_fail 2 "unknown option '--bogus'" "$Q" bench --bogus
expect_fail 2 "needs a value" "$Q" bench -p
expect_fail 2 "not an integer" "$Q" bench -p 12x
expect_fail 2 "not an integer" "$Q" bench -t 0
expect_fail 2 "not an integer" "$Q" bench -n -1
expect_fail 2 "at least one repetition" "$Q" bench -r 0
expect_fail 2 "not an output format" "$Q" bench -o xml
expect_fail 2 "nothing to run" "$Q" bench -p 0 -n 0
expect_fail 2 "unexpected argument" "$Q" bench stray
expect_fail 2 "no such file" "$Q" bench -m /nonexistent/model.gguf
((sqlite)) || expect_fail 2 "built without SQLite" "$Q" bench --db "$tmp/x.db"

cache=${QINFER_CACHE:-$HOME/.cache/qinfer}
if [[ ! -f $cache/models/SmolLM2-135M-Instruct.Q4_1.gguf ]]; then
  echo "$passes passed, $fails failed (model checks skipped: smollm2-135m not cached; run models/fetch.sh smollm2-135m)"
  [[ $fails -eq 0 ]] && exit 77 || exit 1
fi

# Sizes beyond the model's context (8192 for SmolLM2) are refused before any run.
expect_fail 2 "exceeds the model's context" "$Q" bench -m smollm2-135m -p 8000 -n 500 --probe-mib 0

# A tiny run: a markdown table with pp16 and tg4 rows and positive rates.
T=(-m smollm2-135m -t 2 -p 16 -n 4 -r 2)
if expect_ok "$Q" bench "${T[@]}" --probe-mib 64; then
  cp "$tmp/out" "$tmp/md"
  grep -Eq '^\| model +\| +size \| +params \| backend +\| threads \| +test \| +t/s \|$' "$tmp/md" || bad "md: no table header: $(cat "$tmp/md")"
  for test in pp16 tg4; do
    row=$(grep "| *$test |" "$tmp/md")
    [[ -n $row ]] || { bad "md: no $test row"; continue; }
    awk -F'|' '{ split($8, v, " "); exit !(v[1] + 0 > 0 && v[2] == "±") }' <<<"$row" || bad "md: $test rate not positive: $row"
    grep -q "CPU (" <<<"$row" || bad "md: $test row names no backend: $row"
  done
  grep -q "^memory read bandwidth: [0-9.]* GB/s" "$tmp/md" || bad "md: no bandwidth line"
  grep -q "^weights read per decoded token: " "$tmp/md" || bad "md: no bytes-per-token line"
  grep -q "^tg4: .* of the measured read bandwidth" "$tmp/md" || bad "md: no roofline line"
  grep -q "^peak RSS: [0-9.]* MiB" "$tmp/md" || bad "md: no peak RSS"
  grep -q "^hardware: " "$tmp/md" || bad "md: no hardware line"
  grep -q "tg4 run 2/2" "$tmp/err" || bad "no progress lines on stderr"
fi

# CSV: a header and two rows with the same number of fields; sane values.
if expect_ok "$Q" bench "${T[@]}" --probe-mib 0 -o csv; then
  python3 - "$tmp/out" <<'EOF' || bad "csv rows do not parse: $(cat "$tmp/out")"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
assert [r["test"] for r in rows] == ["pp16", "tg4"], rows
for r in rows:
    assert float(r["avg_ts"]) > 0 and int(r["n_reps"]) == 2 and int(r["n_threads"]) == 2
    assert len(r["samples_ts"].split(";")) == 2
    assert len(r["model_sha256"]) == 64 and int(r["peak_rss_bytes"]) > 0
    assert r["backend"].startswith("CPU (") and r["cpu"]
assert rows[0]["n_prompt"] == "16" and rows[1]["n_gen"] == "4"
assert rows[0]["mem_bw_gbs"] == ""  # --probe-mib 0: not measured
EOF
  ok
fi

if expect_ok "$Q" bench "${T[@]}" --probe-mib 0 -o json; then
  python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); assert [r["test"] for r in d] == ["pp16", "tg4"] and all(r["avg_ts"] > 0 and len(r["samples_ts"]) == 2 for r in d)' "$tmp/out" \
    && ok || bad "json does not parse: $(cat "$tmp/out")"
fi

# --db: rows readable by SQLite, appended on a second run.
if ((sqlite)); then
  db="$tmp/bench.db"
  expect_ok "$Q" bench "${T[@]}" -n 0 --probe-mib 0 --db "$db"
  expect_ok "$Q" bench "${T[@]}" --probe-mib 0 --db "$db"
  query="SELECT test || ' ' || n_reps || ' ' || (avg_ts > 0) || ' ' || (samples_ts LIKE '[%,%]') FROM bench ORDER BY id"
  if command -v sqlite3 >/dev/null; then
    got=$(sqlite3 "$db" "$query")
  else
    got=$(python3 -c 'import sqlite3, sys; print("\n".join(r[0] for r in sqlite3.connect(sys.argv[1]).execute(sys.argv[2])))' "$db" "$query")
  fi
  want=$'pp16 2 1 1\npp16 2 1 1\ntg4 2 1 1'
  [[ $got == "$want" ]] && ok || bad "db rows: got '$got', want '$want'"
  expect_fail 1 "x.db" "$Q" bench "${T[@]}" --probe-mib 0 --db "$tmp/no/such/dir/x.db"
fi

echo "$passes passed, $fails failed"
[[ $fails -eq 0 ]]
