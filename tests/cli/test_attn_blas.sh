#!/usr/bin/env bash
# End-to-end checks of --attn-blas (prompts' attention through OpenBLAS
# sgemm): the commands that take it document it; a library that cannot be
# loaded is a one-line error and exit 1, before any work; on the cached
# default model, greedy text equal to the exact path's for a short prompt,
# perplexity close to it, and bench's header line, CSV field and --db
# column. Exits 77 (skip) after the flag checks when the model is not
# cached or OpenBLAS (libopenblas0) cannot be loaded.
# Usage: test_attn_blas.sh PATH/TO/qinfer
set -uo pipefail
Q=${1:?usage: test_attn_blas.sh PATH/TO/qinfer}
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

for c in generate ppl bench needle; do
  # read from a file: with pipefail, grep -q closing the pipe early fails a help longer than a pipe write
  "$Q" $c --help >"$tmp/help" && grep -q -- "--attn-blas" "$tmp/help" && ok || bad "qinfer $c --help lacks --attn-blas"
done
# bench loads the library before the model, so no model is needed here
nolib=/nonexistent/libopenblas.so.0
expect_fail 1 "--attn-blas: cannot load OpenBLAS ($nolib): .*; install libopenblas0" \
  env QI_OPENBLAS_LIB=$nolib "$Q" bench --attn-blas -m /nonexistent/model.gguf

cache=${QINFER_CACHE:-$HOME/.cache/qinfer}
if [[ ! -f $cache/models/SmolLM2-135M-Instruct.Q4_1.gguf ]]; then
  echo "$passes passed, $fails failed (model checks skipped: smollm2-135m not cached; run models/fetch.sh smollm2-135m)"
  [[ $fails -eq 0 ]] && exit 77 || exit 1
fi
M=(-m smollm2-135m -t 2)
expect_fail 1 "cannot load OpenBLAS ($nolib)" env QI_OPENBLAS_LIB=$nolib "$Q" generate "${M[@]}" -p hi --attn-blas
if ! "$Q" generate "${M[@]}" -p hi -n 1 --attn-blas >"$tmp/out" 2>"$tmp/err"; then
  if grep -q "cannot load OpenBLAS" "$tmp/err"; then
    echo "$passes passed, $fails failed (OpenBLAS checks skipped: $(cat "$tmp/err"))"
    [[ $fails -eq 0 ]] && exit 77 || exit 1
  fi
  bad "generate --attn-blas: $(cat "$tmp/err")"
fi

# Greedy text: the same words as the exact path for a short prompt (the two
# differ by float rounding only, so a near-tie could flip a later token; this
# prompt and length have none).
P=(-p "The capital of France is" -n 16 --temp 0)
expect_ok "$Q" generate "${M[@]}" "${P[@]}" && cp "$tmp/out" "$tmp/exact"
expect_ok "$Q" generate "${M[@]}" "${P[@]}" --attn-blas && cp "$tmp/out" "$tmp/blas"
cmp -s "$tmp/exact" "$tmp/blas" && ok || bad "greedy text differs: '$(cat "$tmp/exact")' against '$(cat "$tmp/blas")'"
grep -q "prompt attention through OpenBLAS" "$tmp/err" && ok || bad "generate --attn-blas does not say so: $(cat "$tmp/err")"

# Perplexity over whole chunks (prompt attention throughout): within 2%.
if [[ -f $cache/corpora/devils-dictionary.txt ]]; then
  for f in "" --attn-blas; do
    expect_ok "$Q" ppl "${M[@]}" -f devil --ctx 128 --chunks 2 $f &&
      sed -n 's/^Final estimate: PPL = \([0-9.]*\) .*/\1/p' "$tmp/out" >"$tmp/ppl${f:+_blas}"
  done
  awk -v a="$(cat "$tmp/ppl")" -v b="$(cat "$tmp/ppl_blas")" 'BEGIN { d = (b - a) / a; exit !(a > 0 && d < 0.02 && d > -0.02) }' &&
    ok || bad "ppl with --attn-blas $(cat "$tmp/ppl_blas") is not within 2% of $(cat "$tmp/ppl")"
fi

# bench: a header line naming OpenBLAS and its core, attn_blas in the rows.
B=(bench "${M[@]}" -p 64 -n 0 -r 1 --warmup 0 --probe-mib 0)
if expect_ok "$Q" "${B[@]}" --attn-blas; then
  grep -q "^attention: OpenBLAS sgemm for prompts (core [A-Za-z0-9_]*; not bit-exact with llama.cpp)$" "$tmp/out" &&
    ok || bad "bench md: no attention line: $(cat "$tmp/out")"
  grep -q "| *pp64 |" "$tmp/out" || bad "bench md: no pp64 row"
fi
expect_ok "$Q" "${B[@]}" && { grep -q "^attention:" "$tmp/out" && bad "bench md: an attention line without --attn-blas"; }
for f in "" --attn-blas; do
  if expect_ok "$Q" "${B[@]}" -o csv $f; then
    python3 - "$tmp/out" "${f:+1}" <<'EOF' && ok || bad "bench csv attn_blas ($f): $(cat "$tmp/out")"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
assert [r["test"] for r in rows] == ["pp64"], rows
assert rows[0]["attn_blas"] == (sys.argv[2] or "0"), rows[0]["attn_blas"]
EOF
  fi
done
"$Q" bench --help >"$tmp/help"
if ! grep -q "built without SQLite" "$tmp/help"; then
  db="$tmp/bench.db"
  expect_ok "$Q" "${B[@]}" --db "$db"
  expect_ok "$Q" "${B[@]}" --attn-blas --db "$db"
  got=$(python3 -c 'import sqlite3, sys; print(" ".join(str(r[0]) for r in sqlite3.connect(sys.argv[1]).execute("SELECT json_extract(config_json, \x27$.attn_blas\x27) FROM runs ORDER BY id")))' "$db")
  [[ $got == "0 1" ]] && ok || bad "db runs' attn_blas setting: got '$got', want '0 1'"
fi

echo "$passes passed, $fails failed"
[[ $fails -eq 0 ]]
