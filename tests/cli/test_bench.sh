#!/usr/bin/env bash
# End-to-end checks of `qinfer bench`: --help, one-line errors with exit 2 for
# bad flags and impossible sizes, then tiny runs on the cached default model
# (markdown table, CSV, JSON, batched decode rows, and --db runs in a
# results database when built with SQLite; a file of the older bench table
# refused). Exits 77
# (skip) after the flag checks when the model is not cached; with
# QI_TEST_ERRORS_ONLY=1 the errors only (lib.sh). --attn-blas is checked by
# test_attn_blas.sh.
# Usage: test_bench.sh PATH/TO/qinfer
set -uo pipefail
Q=${1:?usage: test_bench.sh PATH/TO/qinfer}
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

expect_ok "$Q" bench --help && { grep -q "usage: qinfer bench" "$tmp/out" || bad "bench --help prints no usage"; }
grep -q "built without SQLite" "$tmp/out" && sqlite=0 || sqlite=1
"$Q" --help | grep "^  bench " >/dev/null && ok || bad "qinfer --help does not list bench"
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
"$Q" bench --help >"$tmp/help" && grep -q -- "--batch LIST" "$tmp/help" && ok || bad "bench --help lacks --batch"
expect_fail 2 "batch size 0 is not in 1..256" "$Q" bench --batch 0
expect_fail 2 "batch size 257 is not in 1..256" "$Q" bench --batch 1,257
expect_fail 2 "'1,x' is not a comma list" "$Q" bench --batch 1,x
expect_fail 2 "'4,' is not a comma list" "$Q" bench --batch 4,
expect_fail 2 "'' is not a comma list" "$Q" bench --batch ""
expect_fail 2 "'-4' is not a comma list" "$Q" bench -b -4
expect_fail 2 "listed twice" "$Q" bench --batch 4,1,4
expect_fail 2 "needs a value" "$Q" bench --batch
expect_fail 2 "-n is 0" "$Q" bench --batch 4 -n 0
expect_fail 2 "--depth applies to the batched rows only" "$Q" bench -d 64
expect_fail 2 "not an integer in 1.." "$Q" bench --batch 2 -d 0
expect_fail 2 "not an integer" "$Q" bench --batch 2 --depth 1k
expect_fail 2 "apply to the batched rows only" "$Q" bench --kv-policy window --kv-budget 8
expect_fail 2 "--sparsity applies to the batched rows only: add --batch" "$Q" bench --sparsity 0.3 \
  --sparsity-calib "$tmp/none.spc"
expect_fail 2 "--neuron-policy applies to the batched rows only: add --batch" "$Q" bench --neuron-policy static \
  --neuron-profile uniform --neuron-budget 30% --devices cpu,testdev
expect_fail 2 "unknown policy" "$Q" bench --batch 4 --kv-policy nope
((sqlite)) || expect_fail 2 "built without SQLite" "$Q" bench --db "$tmp/x.db"
# --cupti needs a CUDA device in the run
grep -q -- "--cupti" "$tmp/help" && ok || bad "bench --help lacks --cupti"
expect_fail 2 "--cupti records a CUDA device's kernels and copies, and --devices cpu (the default) has none" \
  "$Q" bench --cupti
expect_fail 2 "--devices cpu,testdev:64M has none: add cuda" "$Q" bench --cupti --devices cpu,testdev:64M
# The comparison scripts refuse bad arguments before they need llama.cpp.
root=$(cd "$(dirname "$0")/../.." && pwd)
for script in compare_llama_bench.sh compare_llama_batched.sh; do
  name=${script%.sh}
  expect_fail 2 "$name: unknown option '--bogus'" bash "$root/bench/$script" --bogus
  expect_fail 2 "option -t: '0' is not an integer >= 1" bash "$root/bench/$script" -t 0 --qinfer "$Q"
  expect_fail 2 "needs a value" bash "$root/bench/$script" -m
  expect_fail 2 "neither a file nor a model name" bash "$root/bench/$script" -m "$tmp/none.gguf" --qinfer "$Q"
  expect_fail 2 "no qinfer binary" bash "$root/bench/$script" --qinfer "$tmp/no-qinfer"
done
expect_fail 2 "not a comma list of batch sizes" bash "$root/bench/compare_llama_batched.sh" -b 1,,4
expect_fail 2 "batch size 300 is outside 1..256" bash "$root/bench/compare_llama_batched.sh" -b 1,300
# Their default thread count: a positive number on stdout, and no stray file
# (an unparenthesised awk ternary after print once redirected it to "1").
mkdir -p "$tmp/cores" && n=$(cd "$tmp/cores" && bash -c "prog=t; source '$root/bench/compare_common.sh'; physical_cores")
[[ $n =~ ^[1-9][0-9]*$ && -z $(ls -A "$tmp/cores") ]] && ok || bad "physical_cores gave '$n', left: $(ls -A "$tmp/cores")"

cache=${QINFER_CACHE:-$HOME/.cache/qinfer}
if [[ ! -f $cache/models/SmolLM2-135M-Instruct.Q4_1.gguf ]]; then
  echo "$passes passed, $fails failed (model checks skipped: smollm2-135m not cached; run models/fetch.sh smollm2-135m)"
  [[ $fails -eq 0 ]] && exit 77 || exit 1
fi

# Sizes beyond the model's context (8192 for SmolLM2) are refused before any run.
expect_fail 2 "exceeds the model's context" "$Q" bench -m smollm2-135m -p 8000 -n 500 --probe-mib 0

# No GPU here: --cupti on a CUDA run fails with the CUDA device's own error
# (the device fails before CUPTI is started).
if ! nvidia-smi -L >/dev/null 2>&1; then
  expect_fail 1 "cuda: " "$Q" bench -m smollm2-135m -p 16 -n 4 -r 1 --probe-mib 0 --devices cpu,cuda \
    --placement ngl=31 --cupti
fi

# The batched rows' positions (4 prompt tokens + -n) must fit too, and the
# policy must be usable: both refused before any run.
expect_fail 2 "exceed the model's context" "$Q" bench -m smollm2-135m -p 0 -n 8190 --batch 2 --probe-mib 0
expect_fail 2 "8000 prompt + 500 decoded" "$Q" bench -m smollm2-135m -p 0 -n 500 -d 8000 --batch 2 --probe-mib 0
expect_fail 2 "needs a budget" "$Q" bench -m smollm2-135m -p 0 -n 8 --batch 2 --kv-policy window --probe-mib 0

T=(-m smollm2-135m -t 2 -p 16 -n 4 -r 2)
if full_runs; then
  # A tiny run: a markdown table with pp16 and tg4 rows and positive rates.
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

  # Batched decode: tg8 (qi_ctx), then tg8 @ b1 and tg8 @ b4 (the engine), and
  # the aggregate / per-sequence lines; in CSV, batch and avg_seq_ts fields.
  B=(-m smollm2-135m -t 2 -p 0 -n 8 -r 1 --batch "1,4")
  if expect_ok "$Q" bench "${B[@]}" --probe-mib 0; then
    for test in tg8 "tg8 @ b1" "tg8 @ b4"; do
      row=$(grep "| *$test |" "$tmp/out")
      [[ -n $row ]] || { bad "md: no '$test' row: $(cat "$tmp/out")"; continue; }
      awk -F'|' '{ split($8, v, " "); exit !(v[1] + 0 > 0) }' <<<"$row" || bad "md: '$test' rate not positive: $row"
    done
    grep -q "^tg8 @ b4: 4 sequences, [0-9.]* t/s aggregate = [0-9.]* t/s per sequence; [0-9.]*x the aggregate of tg8 @ b1$" \
      "$tmp/out" || bad "md: no aggregate line for tg8 @ b4: $(cat "$tmp/out")"
    grep -q "KV policy" "$tmp/out" && bad "md: a KV policy line with the full cache"
    grep -q "tg8 @ b4 run 1/1" "$tmp/err" || bad "no progress line for the batched row"
  fi
  if expect_ok "$Q" bench "${B[@]}" --probe-mib 0 -o csv; then
    python3 - "$tmp/out" <<'EOF' && ok || bad "csv batched rows: $(cat "$tmp/out")"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
assert [(r["test"], r["batch"]) for r in rows] == [("tg8", "1"), ("tg8 @ b1", "1"), ("tg8 @ b4", "4")], rows
for r in rows:
    assert r["n_gen"] == "8" and r["kv_policy"] == "full" and float(r["avg_ts"]) > 0
    assert abs(float(r["avg_seq_ts"]) * int(r["batch"]) - float(r["avg_ts"])) < 1e-3 * float(r["avg_ts"])
EOF
  fi
  # --profile: one line per batched row, op shares summing to 100%, over the
  # timed steps only (-r 1, -n 8: 8 steps; not the warm-up's, not the prompts').
  if expect_ok "$Q" bench "${B[@]}" --probe-mib 0 --profile; then
    for test in "tg8 @ b1" "tg8 @ b4"; do
      line=$(grep "^qinfer bench: profile of $test over 8 steps" "$tmp/err")
      [[ -n $line ]] || { bad "no profile line for $test: $(cat "$tmp/err")"; continue; }
      python3 -c 'import re, sys; v = [float(x) for x in re.findall(r" ([0-9.]+)%", sys.argv[1])]; assert len(v) == 5 and abs(sum(v) - 100) < 0.5, v' "$line" \
        && ok || bad "profile shares of $test: $line"
    done
    grep -q "profile of tg8 over" "$tmp/err" && bad "a profile line for the single-sequence row"
  fi
  # -b 1 alone: the batch-1 row of the batched engine beside tg8
  if expect_ok "$Q" bench -m smollm2-135m -t 2 -p 0 -n 4 -r 1 --warmup 0 -b 1 --probe-mib 0; then
    grep -q "| *tg4 @ b1 |" "$tmp/out" && grep -q "| *tg4 |" "$tmp/out" && ok || bad "-b 1: $(cat "$tmp/out")"
  fi
  # --depth: the batched rows' prompts, in their names and the depth field; a
  # budget of half the sequence then evicts from the prompt on.
  if expect_ok "$Q" bench -m smollm2-135m -t 2 -p 0 -n 4 -r 1 --warmup 0 --batch 1,2 -d 40 --kv-policy h2o \
    --kv-budget 50% --probe-mib 0 -o csv; then
    python3 - "$tmp/out" <<'EOF' && ok || bad "csv rows with --depth: $(cat "$tmp/out")"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
assert [(r["test"], r["depth"]) for r in rows] == [("tg4", "0"), ("tg4 @ b1 d40", "40"), ("tg4 @ b2 d40", "40")], rows
EOF
  fi
  # A policy with a budget: named in the header and in the batched rows only.
  if expect_ok "$Q" bench -m smollm2-135m -t 2 -p 0 -n 8 -r 1 --warmup 0 --batch 2 --kv-policy window --kv-budget 4 \
    --probe-mib 0; then
    grep -q "^KV policy of the batched rows: window, budget 4 tokens$" "$tmp/out" || bad "md: no KV policy line: $(cat "$tmp/out")"
    grep -q "| *tg8 @ b2 |" "$tmp/out" || bad "md: no tg8 @ b2 row with the window policy"
  fi

  if expect_ok "$Q" bench "${T[@]}" --probe-mib 0 -o json; then
    python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); assert [r["test"] for r in d] == ["pp16", "tg4"] and all(r["avg_ts"] > 0 and len(r["samples_ts"]) == 2 for r in d)' "$tmp/out" \
      && ok || bad "json does not parse: $(cat "$tmp/out")"
  fi
fi

# --db: each row a run of experiment "bench" in a results database, its
# rates one metric per repetition; a second invocation adds runs.
if ((sqlite)); then
  db="$tmp/bench.db"
  rows() {
    if command -v sqlite3 >/dev/null; then sqlite3 "$1" "$2"
    else python3 -c 'import sqlite3, sys; print("\n".join("|".join(str(c) for c in r) for r in sqlite3.connect(sys.argv[1]).execute(sys.argv[2])))' "$1" "$2"
    fi
  }
  if full_runs; then
    expect_ok "$Q" bench "${T[@]}" -n 0 --probe-mib 0 --db "$db"
    expect_ok "$Q" bench "${T[@]}" --probe-mib 0 --db "$db"
    query="SELECT json_extract(r.config_json, '$.test') || ' ' || r.status || ' ' || m.name || ' ' || count(*) || ' '
             || (min(m.value) > 0) || ' ' || m.unit FROM runs r JOIN metrics m ON m.run_id = r.id
           WHERE m.name LIKE '%tokens_per_s' GROUP BY r.id, m.name ORDER BY r.id, m.name"
    got=$(rows "$db" "$query")
    want=$'pp16 done prefill.tokens_per_s 2 1 tok/s\npp16 done prefill.tokens_per_s 2 1 tok/s\ntg4 done decode.per_seq_tokens_per_s 2 1 tok/s\ntg4 done decode.tokens_per_s 2 1 tok/s'
    [[ $got == "$want" ]] && ok || bad "db runs: got '$got', want '$want'"
    got=$(rows "$db" "SELECT count(*) FROM metrics WHERE name IN ('decode.weight_bytes_per_token', 'mem.peak_rss_bytes') AND value > 0")
    [[ $got == 6 ]] && ok || bad "db: weight bytes and peak RSS of each run: $got, want 6"
    expect_ok "$Q" results bench --db "$db" --by test --metric decode.tokens_per_s,prefill.tokens_per_s -o csv
    grep -q '^"\?tg4"\?,' "$tmp/out" && ok || bad "qinfer results bench lacks the tg4 row: $(cat "$tmp/out")"
    # a batched row: the batch a configuration parameter, the aggregate and
    # per-sequence rates one definition apart (x batch)
    if expect_ok "$Q" bench -m smollm2-135m -t 2 -p 0 -n 4 -r 1 --warmup 0 --batch 2 --probe-mib 0 --db "$db"; then
      got=$(rows "$db" "SELECT json_extract(r.config_json, '$.batch') || '|' || json_extract(r.config_json, '$.kv_policy')
        || '|' || json_extract(r.config_json, '$.depth') || '|' || (abs(a.value - 2 * p.value) < 1e-9 * a.value)
        FROM runs r JOIN metrics a ON a.run_id = r.id AND a.name = 'decode.tokens_per_s'
        JOIN metrics p ON p.run_id = r.id AND p.name = 'decode.per_seq_tokens_per_s'
        WHERE json_extract(r.config_json, '$.test') = 'tg4 @ b2'")
      [[ $got == "2|full|4|1" ]] && ok || bad "batched db run: got '$got', want '2|full|4|1'"
    fi
  fi
  # a file of the older bench table is refused, untouched
  old="$tmp/old.db"
  python3 -c 'import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
db.execute("CREATE TABLE bench (id INTEGER PRIMARY KEY, timestamp TEXT NOT NULL, test TEXT NOT NULL, avg_ts REAL)")
db.execute("INSERT INTO bench (timestamp, test, avg_ts) VALUES (\"t\", \"tg4\", 10.0)")
db.commit()' "$old" || bad "cannot make the old-schema table"
  sum=$(cksum <"$old")
  expect_fail 1 "holds the bench table of an older qinfer" "$Q" bench "${T[@]}" --probe-mib 0 --db "$old"
  [[ $(cksum <"$old") == "$sum" ]] && ok || bad "the older bench file was changed"
  expect_fail 1 "x.db" "$Q" bench "${T[@]}" --probe-mib 0 --db "$tmp/no/such/dir/x.db"
fi

summary
[[ $fails -eq 0 ]]
