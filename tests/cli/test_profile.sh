#!/usr/bin/env bash
# End-to-end checks of `qinfer profile`, the FFN neuron profiler: --help,
# one-line usage errors for bad flags and missing files (exit 2), then on
# the cached SmolLM2-135M runtime errors (exit 1; a plan with an MLP on a
# device the host cannot read is refused), and a tiny run (2 chunks of 64
# tokens) prints a row per layer and a summary, and writes a profile file
# whose header and neuron lines agree with the model (30 layers x 1536
# neurons) and the run; --sparsity-out writes an activation-sparsity
# calibration that ppl --sparsity reads (0: the dense perplexity exactly),
# and bench --vs-dense, its steps alternating with the dense path, reads.
# Exits 77 (skip) after the flag checks when the model is not cached;
# QI_TEST_ERRORS_ONLY=1 runs the errors only (lib.sh), and the one run whose
# file they read. Usage: test_profile.sh PATH/TO/qinfer
set -uo pipefail
Q=${1:?usage: test_profile.sh PATH/TO/qinfer}
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if expect_ok "$Q" profile --help; then
  grep -q "usage: qinfer profile" "$tmp/out" || bad "profile --help prints no usage"
  for f in --tokens --skip --ctx --threshold --top --window --output --devices --placement; do
    grep -q -- "$f" "$tmp/out" || bad "profile --help does not mention $f"
  done
fi
"$Q" --help | grep "^  profile " >/dev/null && ok || bad "qinfer --help does not list profile"
expect_fail 2 "no corpus given" "$Q" profile
expect_fail 2 "unknown option '--bogus'" "$Q" profile -f devil --bogus
expect_fail 2 "unexpected argument 'extra'" "$Q" profile -f devil extra
expect_fail 2 "option --tokens: '0' is not an integer" "$Q" profile -f devil --tokens 0
expect_fail 2 "option --tokens: '-5' is not an integer" "$Q" profile -f devil --tokens -5
expect_fail 2 "option --tokens: '12x' is not an integer" "$Q" profile -f devil --tokens 12x
expect_fail 2 "option --ctx: '1' is not an integer" "$Q" profile -f devil --ctx 1
expect_fail 2 "option --skip: '-1' is not an integer" "$Q" profile -f devil --skip -1
expect_fail 2 "option --window: '0' is not an integer" "$Q" profile -f devil --window 0
expect_fail 2 "option --top: '0' is not a fraction in (0, 1\]" "$Q" profile -f devil --top 0
expect_fail 2 "option --top: '1.5' is not a fraction in (0, 1\]" "$Q" profile -f devil --top 1.5
expect_fail 2 "option --top: 'abc' is not a fraction" "$Q" profile -f devil --top abc
expect_fail 2 "option --threshold: '-1' is not a number" "$Q" profile -f devil --threshold -1
expect_fail 2 "option --threshold: 'nan' is not a number" "$Q" profile -f devil --threshold nan
expect_fail 2 "option --top needs a value" "$Q" profile -f devil --top
expect_fail 2 "option -o: empty file name" "$Q" profile -f devil -o ""
expect_fail 2 "option --sparsity-out: empty file name" "$Q" profile -f devil --sparsity-out ""
expect_fail 2 "option --sparsity-mode: sparsity mode 'relu': expected teal or cats" "$Q" profile -f devil --sparsity-mode relu
expect_fail 2 "option --sparsity" "$Q" ppl -f devil --sparsity 1.5
expect_fail 2 "option --sparsity" "$Q" ppl -f devil --sparsity abc
# a file that is not there and no cached name: a usage error, as in qinfer ppl
expect_fail 2 "nonexistent.gguf: no such file, and not a known model name" "$Q" profile -m "$tmp/nonexistent.gguf" -f devil
expect_fail 2 "nonexistent.txt: no such file, and not a known corpus name" "$Q" profile -f "$tmp/nonexistent.txt"

cache=${QINFER_CACHE:-$HOME/.cache/qinfer}
if [[ ! -f $cache/models/SmolLM2-135M-Instruct.Q4_1.gguf ]]; then
  echo "$passes passed, $fails failed (model checks skipped: smollm2-135m not cached; run models/fetch.sh smollm2-135m)"
  [[ $fails -eq 0 ]] && exit 77 || exit 1
fi

M=(-m smollm2-135m -t 2)
expect_fail 1 "cannot write" "$Q" profile "${M[@]}" -f devil -o "$tmp/no/such/dir/p.txt"
expect_fail 2 "exceeds the model's training context" "$Q" profile "${M[@]}" -f devil --ctx 1000000
# An MLP on a device the host cannot read: the observer is refused.
expect_fail 1 "the FFN observer reads activations on the host, and the plan puts layer 0's MLP on device testdev" \
  "$Q" profile "${M[@]}" -f devil --devices cpu,testdev --placement ngl=30

if full_runs; then
  # A tiny real run: 128 tokens, 2 chunks of 64, windows of 16 (3 window pairs a chunk).
  if expect_ok "$Q" profile "${M[@]}" -f devil --tokens 128 --ctx 64 --window 16 -o "$tmp/p.txt"; then
    grep -q "^model .*SmolLM2-135M-Instruct.Q4_1.gguf  corpus .*devils-dictionary.txt  tokens 128  ctx 64  layers 30  n_ff 1536$" "$tmp/out" ||
      bad "profile header: $(head -3 "$tmp/out")"
    grep -q "^threshold 0.1  top 0.2 (k = 307 neurons; random hot sets overlap 0.200)  window 16$" "$tmp/out" ||
      bad "profile settings line: $(head -3 "$tmp/out")"
    [[ $(grep -Ec "^ +[0-9]+ +[01]\.[0-9]{3} +[01]\.[0-9]{3} +[01]\.[0-9]{3} +[01]\.[0-9]{3}$" "$tmp/out") -eq 30 ]] ||
      bad "profile table is not 30 layer rows: $(cat "$tmp/out")"
    grep -Eq "^summary: .*SmolLM2.*  layers 30  mean active [01]\.[0-9]{3}  tok_ov 0\.[0-9]{3}  win_ov [01]\.[0-9]{3}  mass_top 0\.[0-9]{3}  \(top 0.2, window 16, 128 tokens\)$" "$tmp/out" ||
      bad "profile summary: $(tail -1 "$tmp/out")"
    f=$tmp/p.txt
    [[ $(sed -n 1p "$f") == "# qinfer ffn-profile 1" ]] || bad "profile file magic: $(head -1 "$f")"
    grep -q "^# n_layer 30 n_ff 1536 tokens 128 ctx 64 threshold 0.1 top 0.2 k 307 window 16$" "$f" ||
      bad "profile file settings: $(head -4 "$f")"
    [[ $(grep -c "^# layer [0-9]* tokens 128 tok_overlap " "$f") -eq 30 ]] || bad "profile file layer lines"
    [[ $(grep -vc "^#" "$f") -eq $((30 * 1536)) ]] || bad "profile file has $(grep -vc "^#" "$f") neuron lines, want 46080"
    # every layer's hot counts sum to tokens x k = 128 x 307; counts within 0..128
    awk '!/^#/ { if ($3 < 0 || $3 > 128 || $4 < 0 || $4 > 128 || $5 < 0) bad = 1; hot[$1] += $4 }
         END { for (l = 0; l < 30; l++) if (hot[l] != 128 * 307) bad = 1; exit bad }' "$f" ||
      bad "profile file counts are inconsistent"
    # --skip: the run's second chunk alone (tokens 64..127) and its first
    # alone (--tokens 64) add up to the whole run, neuron by neuron
    if expect_ok "$Q" profile "${M[@]}" -f devil --skip 64 --tokens 64 --ctx 64 --window 16 -o "$tmp/p2.txt" &&
      expect_ok "$Q" profile "${M[@]}" -f devil --tokens 64 --ctx 64 --window 16 -o "$tmp/p1.txt"; then
      paste <(grep -v "^#" "$tmp/p1.txt") <(grep -v "^#" "$tmp/p2.txt") <(grep -v "^#" "$f") |
        awk '{ if ($3 + $8 != $13 || $4 + $9 != $14) bad = 1; n++ } END { exit bad || n != 30 * 1536 }' &&
        ok || bad "profile --skip 64: the two halves do not add up to the whole run"
    fi
  fi
  expect_fail 2 "the profile needs at least 2 after --skip 1000000000" "$Q" profile "${M[@]}" -f devil --skip 1000000000
fi

# Activation sparsity: the calibration file (30 layers x 5 sites, 101
# non-decreasing quantiles each), and ppl under it: 0 is the dense decode
# exactly; teal 0.3 zeroes about 0.3 of the activations; errors.
if expect_ok "$Q" profile "${M[@]}" -f devil --tokens 128 --ctx 64 --sparsity-out "$tmp/s.spc"; then
  f=$tmp/s.spc
  [[ $(sed -n 1p "$f") == "# qinfer sparsity calibration 1" ]] || bad "calibration magic: $(head -1 "$f")"
  [[ $(grep -vc "^#" "$f") -eq 150 ]] || bad "calibration has $(grep -vc "^#" "$f") lines, want 150"
  awk '!/^#/ { if (NF != 103) bad = 1; for (i = 4; i <= NF; i++) if ($i < $(i - 1)) bad = 1 } END { exit bad }' "$f" ||
    bad "calibration lines are not 101 non-decreasing quantiles"
  P=(ppl "${M[@]}" -f devil --ctx 64 --chunks 2)
  if full_runs; then # the file is made either way: the errors below read it
    expect_ok "$Q" "${P[@]}" --decode && grep "^Final" "$tmp/out" >"$tmp/dense"
    expect_ok "$Q" "${P[@]}" --sparsity 0 --sparsity-calib "$f" && grep "^Final" "$tmp/out" >"$tmp/zero"
    cmp -s "$tmp/dense" "$tmp/zero" && ok || bad "--sparsity 0: $(cat "$tmp/zero"), dense $(cat "$tmp/dense")"
    for mode in teal cats; do
      if expect_ok "$Q" "${P[@]}" --sparsity 0.3 --sparsity-mode $mode --sparsity-calib "$f"; then
        awk -v m=$mode '/^sparsity: / && $2 == m"," { z = $6 } END { exit !(z > 0.2 && z < 0.45) }' "$tmp/out" && ok ||
          bad "$mode 0.3: $(grep sparsity "$tmp/out")"
      fi
    done
    # bench --vs-dense: 8 steps a row, in 4 pairs of a sparse and a dense step
    if expect_ok "$Q" bench "${M[@]}" -p 0 -n 8 -b 1,2 -r 1 --warmup 0 --probe-mib 0 --sparsity 0.3 \
      --sparsity-calib "$f" --vs-dense; then
      for row in "tg8 @ b1" "tg8 @ b2"; do
        grep -Eq "^$row against its dense path .*: a sparse step takes [0-9.]+x a dense one \(median of 4 pairs" \
          "$tmp/out" && ok || bad "bench --vs-dense: no line for $row: $(grep against "$tmp/out")"
      done
    fi
  fi
  expect_fail 2 "--vs-dense compares the batched rows' activation sparsity" "$Q" bench "${M[@]}" -b 1,2 --vs-dense
  expect_fail 2 "--vs-dense compares the batched rows' activation sparsity" "$Q" bench "${M[@]}" --sparsity 0.3 \
    --sparsity-calib "$f" --vs-dense
  expect_fail 2 "option --sparsity needs --sparsity-calib FILE" "$Q" "${P[@]}" --sparsity 0.3
  expect_fail 2 "option --sparsity-calib without --sparsity" "$Q" "${P[@]}" --sparsity-calib "$f"
  expect_fail 1 "activation sparsity runs on the CPU only" "$Q" "${P[@]}" --sparsity 0.3 --sparsity-calib "$f" \
    --devices cpu,testdev --placement ngl=2
  head -3 "$f" >"$tmp/bad.spc"
  expect_fail 1 "bad.spc: no quantiles for layer 0 attn_in" "$Q" "${P[@]}" --sparsity 0.3 --sparsity-calib "$tmp/bad.spc"
fi

summary
[[ $fails -eq 0 ]]
