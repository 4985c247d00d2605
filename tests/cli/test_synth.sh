#!/usr/bin/env bash
# End-to-end checks of `qinfer synth`: --help, every bad flag a one-line usage
# error, then small models of each weight type written, loaded, inspected,
# decoded and benchmarked, with the synthetic mark in the file and in bench's
# model column; the same seed gives the same file, another seed another.
# Needs no cached model. Usage: test_synth.sh PATH/TO/qinfer
set -uo pipefail
Q=${1:?usage: test_synth.sh PATH/TO/qinfer}
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if expect_ok "$Q" synth --help; then
  grep -q "usage: qinfer synth" "$tmp/out" || bad "synth --help prints no usage"
  grep -q "tinyllama-1.1b" "$tmp/out" || bad "synth --help does not list the presets"
fi
"$Q" --help | grep "^  synth " >/dev/null && ok || bad "qinfer --help does not list synth"
expect_fail 2 "no output file given" "$Q" synth
expect_fail 2 "unknown preset 'nope'" "$Q" synth -o "$tmp/m.gguf" --preset nope
expect_fail 2 "unsupported weight type 'q5_0'" "$Q" synth -o "$tmp/m.gguf" --type q5_0
expect_fail 2 "unsupported weight type 'x'" "$Q" synth -o "$tmp/m.gguf" --type x
expect_fail 2 "the heads must divide" "$Q" synth -o "$tmp/m.gguf" --n-head 7
expect_fail 2 "the heads must divide" "$Q" synth -o "$tmp/m.gguf" --n-head-kv 2
expect_fail 2 "head size 33" "$Q" synth -o "$tmp/m.gguf" --n-embd 66 --n-head 2 --n-head-kv 1 --type f16
expect_fail 2 "multiples of q4_k.s block of 256" "$Q" synth -o "$tmp/m.gguf" --type q4_K
expect_fail 2 "option --n-layer: '0'" "$Q" synth -o "$tmp/m.gguf" --n-layer 0
expect_fail 2 "option --n-vocab: '100'" "$Q" synth -o "$tmp/m.gguf" --n-vocab 100
expect_fail 2 "option --n-embd: 'abc'" "$Q" synth -o "$tmp/m.gguf" --n-embd abc
expect_fail 2 "option --seed" "$Q" synth -o "$tmp/m.gguf" --seed -1
expect_fail 2 "unknown option '--bogus'" "$Q" synth -o "$tmp/m.gguf" --bogus
expect_fail 1 "cannot write $tmp/no/such/dir/m.gguf" "$Q" synth -o "$tmp/no/such/dir/m.gguf" --n-layer 1 --n-vocab 300
[[ -e "$tmp/m.gguf" ]] && bad "a failed synth left a file behind"

small=(--n-layer 2 --n-vocab 600 --n-ctx 256)
for t in q4_0 q4_1 q8_0 f16 q4_K q6_K; do
  f="$tmp/$t.gguf"
  shape=("${small[@]}")
  [[ $t == q4_K || $t == q6_K ]] && shape+=(--n-embd 512 --n-ff 1024 --n-head 8 --n-head-kv 2)
  expect_ok "$Q" synth -o "$f" --type "$t" "${shape[@]}" || continue
  grep -qi "wrote $f: synthetic smollm2-135m-shaped (random weights), .* $t," "$tmp/err" || bad "$t: no summary line: $(cat "$tmp/err")"
  if expect_ok "$Q" inspect "$f"; then
    grep -q "qinfer.synthetic .* true" "$tmp/out" || bad "$t: inspect shows no synthetic mark"
    grep -q "blk.1.ffn_down.weight" "$tmp/out" || bad "$t: inspect lists no ffn_down of layer 1"
  fi
  if expect_ok "$Q" generate -m "$f" -p "abc" -n 6 -t 2 --ignore-eos; then
    grep -q "generated 6 tokens" "$tmp/err" || bad "$t: generate did not decode 6 tokens: $(cat "$tmp/err")"
  fi
done
# the bench label, batched rows, and packed weights on a synthetic model
if expect_ok "$Q" bench -m "$tmp/q4_1.gguf" -p 8 -n 4 -r 1 --batch 1,4 --probe-mib 0 --repack; then
  grep -q "| llama [0-9.]*M Q4_1 synthetic *|" "$tmp/out" || bad "bench model column lacks the synthetic mark: $(cat "$tmp/out")"
  grep -q "| *tg4 @ b4 |" "$tmp/out" || bad "bench: no batched row on a synthetic model"
fi
# deterministic in the seed
expect_ok "$Q" synth -o "$tmp/a.gguf" "${small[@]}" --seed 7 && expect_ok "$Q" synth -o "$tmp/b.gguf" "${small[@]}" --seed 7 &&
  expect_ok "$Q" synth -o "$tmp/c.gguf" "${small[@]}" --seed 8
cmp -s "$tmp/a.gguf" "$tmp/b.gguf" && ok || bad "the same seed wrote different files"
cmp -s "$tmp/a.gguf" "$tmp/c.gguf" && bad "different seeds wrote the same file" || ok

echo "test_synth: $passes passed, $fails failed"
((fails == 0))
