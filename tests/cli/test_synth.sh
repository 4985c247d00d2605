#!/usr/bin/env bash
# End-to-end checks of `qinfer synth`: --help, every bad flag a one-line usage
# error, then small models of each weight type written, loaded, inspected,
# decoded and benchmarked, with the synthetic mark in the file and in bench's
# model column; the same seed gives the same file, another seed another.
# The gemma3 preset: its extra keys and tensors, a SentencePiece vocabulary,
# decode and bench at a small vocabulary, and once at its full 262144 tokens.
# The qwen2 preset: its biases and output head, decoded small; its full
# shape with --shapes-only, loaded by the simulator.
# Needs no cached model. Usage: test_synth.sh PATH/TO/qinfer
set -uo pipefail
Q=${1:?usage: test_synth.sh PATH/TO/qinfer}
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if expect_ok "$Q" synth --help; then
  grep -q "usage: qinfer synth" "$tmp/out" || bad "synth --help prints no usage"
  grep -q "tinyllama-1.1b" "$tmp/out" || bad "synth --help does not list the presets"
  grep -q "gemma3-270m .*4/1 heads of 256.*gemma3" "$tmp/out" || bad "synth --help does not list gemma3-270m"
  grep -q "qwen2-1.5b .*embd 1536, ff 8960, 28 layers, 12/2 heads, vocab 151936, qwen2" "$tmp/out" ||
    bad "synth --help does not list qwen2-1.5b"
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
expect_fail 2 "only gemma3 models have local layers" "$Q" synth -o "$tmp/m.gguf" --sliding-window 64
expect_fail 2 "opt models have heads of n_embd / n_head" "$Q" synth -o "$tmp/m.gguf" --preset opt-30b --shapes-only --head-dim 64
expect_fail 2 "head size 33 (--head-dim)" "$Q" synth -o "$tmp/m.gguf" --preset gemma3-270m --head-dim 33
expect_fail 2 "gemma3 vocabulary needs at least 262 tokens" "$Q" synth -o "$tmp/m.gguf" --preset gemma3-270m --n-vocab 261
expect_fail 2 "n_embd 640, n_ff 2048 and n_head x head size 1024 must be multiples of q4_k" \
  "$Q" synth -o "$tmp/m.gguf" --preset gemma3-270m --type q4_K
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
# heads of their own size on llama: the file says so, the loader follows
if expect_ok "$Q" synth -o "$tmp/hd.gguf" --n-layer 1 --n-vocab 300 --head-dim 128; then
  expect_ok "$Q" inspect "$tmp/hd.gguf" && { grep -q "llama.attention.key_length .* 128" "$tmp/out" || bad "--head-dim: no key_length 128"; }
  expect_ok "$Q" generate -m "$tmp/hd.gguf" -p "abc" -n 3 -t 2 --ignore-eos
fi

# gemma3, small: six layers (the sixth global, the rest local), 600 tokens
g="$tmp/gemma.gguf"
if expect_ok "$Q" synth -o "$g" --preset gemma3-270m --n-layer 6 --n-vocab 600 --n-ctx 1024; then
  grep -q "wrote $g: synthetic gemma3-270m-shaped (random weights), .* q4_1," "$tmp/err" || bad "gemma3: no summary line: $(cat "$tmp/err")"
  if expect_ok "$Q" inspect "$g"; then
    for want in 'general.architecture .* "gemma3"' "qinfer.synthetic .* true" "gemma3.attention.key_length .* 256" \
      "gemma3.attention.head_count_kv .* 1" "gemma3.attention.sliding_window .* 512" "gemma3.rope.freq_base .* 1e+06" \
      "gemma3.rope.freq_base_swa .* 10000" 'tokenizer.ggml.model .* "llama"' "tokenizer.ggml.scores .* f32\[600\]" \
      "blk.5.attn_q.weight .* 640 x 1024" "blk.5.attn_output.weight .* 1024 x 640" "blk.5.attn_q_norm.weight .* 256 " \
      "blk.5.attn_k_norm.weight" "blk.5.post_attention_norm.weight .* 640 " "blk.5.post_ffw_norm.weight"; do
      grep -q -- "$want" "$tmp/out" || bad "gemma3: inspect lacks '$want'"
    done
    grep -q " output.weight" "$tmp/out" && bad "gemma3: an output matrix in a tied model"
  fi
  # SentencePiece: BOS 2, then byte fallback (h = 0x68 at 6 + 0x68 = 110)
  if expect_ok "$Q" tokenize -m "$g" -p "hi"; then
    [[ $(tr -s ' \n' ' ' <"$tmp/out") == "2 110 111 " ]] || bad "gemma3: 'hi' tokenizes as $(cat "$tmp/out"), want 2 110 111"
  fi
  if expect_ok "$Q" generate -m "$g" -p "hello" -n 8 -t 2 --ignore-eos; then
    grep -q "generated 8 tokens" "$tmp/err" || bad "gemma3: generate did not decode 8 tokens: $(cat "$tmp/err")"
  fi
  # Gemma's chat turns: the markers are tokens of the vocabulary
  expect_ok "$Q" generate -m "$g" -p "hi" --chat -n 2 -t 2 --ignore-eos
  if expect_ok "$Q" bench -m "$g" -p 16 -n 8 -r 1 -t 2 --probe-mib 0; then
    grep -q "| gemma3 [0-9.]*M Q4_1 synthetic *|" "$tmp/out" || bad "gemma3: bench model column: $(cat "$tmp/out")"
    grep -q "| *tg8 |" "$tmp/out" || bad "gemma3: bench has no tg8 row"
  fi
fi
# gemma3 at its full vocabulary (the 262144 x 640 embedding, of the matrices' type), one layer
g="$tmp/gemma-full.gguf"
if expect_ok "$Q" synth -o "$g" --preset gemma3-270m --n-layer 1 --type q4_0; then
  if expect_ok "$Q" inspect "$g"; then
    grep -q "token_embd.weight .* q4_0 .* 640 x 262144" "$tmp/out" || bad "gemma3: embedding not 640 x 262144 q4_0"
    grep -q "tokenizer.ggml.tokens .* string\[262144\]" "$tmp/out" || bad "gemma3: vocabulary not 262144 tokens"
  fi
  if expect_ok "$Q" generate -m "$g" -p "hello" -n 4 -t 2 --ignore-eos; then
    grep -q "generated 4 tokens" "$tmp/err" || bad "gemma3 full vocabulary: generate did not decode 4 tokens"
  fi
fi
rm -f "$g"

# qwen2, small: the q/k/v biases (random, not ones) and an output head of its own
g="$tmp/qwen2.gguf"
if expect_ok "$Q" synth -o "$g" --preset qwen2-1.5b --n-layer 2 --n-vocab 600 --n-embd 256 --n-ff 512 --n-head 4 \
  --n-head-kv 2 --type q4_K; then
  grep -q "wrote $g: synthetic qwen2-1.5b-shaped (random weights), .* q4_k," "$tmp/err" || bad "qwen2: no summary line: $(cat "$tmp/err")"
  if expect_ok "$Q" inspect "$g"; then
    for want in 'general.architecture .* "qwen2"' "qwen2.rope.freq_base .* 1e+06" "qwen2.attention.layer_norm_rms_epsilon .* 1e-06" \
      "blk.1.attn_q.bias .* f32 .* 256 " "blk.1.attn_k.bias .* f32 .* 128 " "blk.1.attn_v.bias .* f32 .* 128 " \
      " output.weight .* q4_k .* 256 x 600"; do
      grep -q -- "$want" "$tmp/out" || bad "qwen2: inspect lacks '$want'"
    done
  fi
  if expect_ok "$Q" generate -m "$g" -p "hello" -n 6 -t 2 --ignore-eos; then
    grep -q "generated 6 tokens" "$tmp/err" || bad "qwen2: generate did not decode 6 tokens: $(cat "$tmp/err")"
  fi
  # the biases travel with their layer's block: the last layer on testdev decodes the same text
  if expect_ok "$Q" generate -m "$g" -p "hello" -n 8 -t 2 --temp 0 --ignore-eos; then
    cp "$tmp/out" "$tmp/qwen2-cpu.txt"
    if expect_ok "$Q" generate -m "$g" -p "hello" -n 8 -t 2 --temp 0 --ignore-eos --devices cpu,testdev --placement ngl=1; then
      cmp -s "$tmp/out" "$tmp/qwen2-cpu.txt" || bad "qwen2: a layer on testdev decodes other text: $(cat "$tmp/out") vs $(cat "$tmp/qwen2-cpu.txt")"
    fi
  fi
fi
# qwen2 at its full shape, shapes only: a header, loaded by the simulator
g="$tmp/qwen2-shapes.gguf"
if expect_ok "$Q" synth -o "$g" --preset qwen2-1.5b --type q4_K --shapes-only; then
  [[ $(stat -c %s "$g") -lt 20000000 ]] || bad "qwen2 --shapes-only wrote $(stat -c %s "$g") bytes"
  if expect_ok "$Q" inspect "$g"; then
    grep -q "blk.27.attn_v.bias .* 256 " "$tmp/out" || bad "qwen2 shapes: no blk.27.attn_v.bias of 256"
    grep -q " output.weight .* q4_k .* 1536 x 151936" "$tmp/out" || bad "qwen2 shapes: no 1536 x 151936 output head"
  fi
  P="$(dirname "${BASH_SOURCE[0]}")/../../engine/backend/sim/profiles/a100-pcie-2xeon.profile"
  if expect_ok "$Q" bench -m "$g" --sim "$P" --devices cpu,gpu --placement ngl=29 -p 16 -n 4 -r 1; then
    grep -q "| qwen2 .*synthetic" "$tmp/out" || bad "qwen2 shapes: bench on the simulator: $(cat "$tmp/out")"
  fi
fi
rm -f "$g"

# deterministic in the seed
expect_ok "$Q" synth -o "$tmp/a.gguf" "${small[@]}" --seed 7 && expect_ok "$Q" synth -o "$tmp/b.gguf" "${small[@]}" --seed 7 &&
  expect_ok "$Q" synth -o "$tmp/c.gguf" "${small[@]}" --seed 8
cmp -s "$tmp/a.gguf" "$tmp/b.gguf" && ok || bad "the same seed wrote different files"
cmp -s "$tmp/a.gguf" "$tmp/c.gguf" && bad "different seeds wrote the same file" || ok

echo "test_synth: $passes passed, $fails failed"
((fails == 0))
