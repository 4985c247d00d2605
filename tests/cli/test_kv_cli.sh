#!/usr/bin/env bash
# End-to-end checks of the KV policy commands, `qinfer agree` and `qinfer
# needle`: --help mentions the KV flags, bad values are one-line usage errors,
# then short runs on the cached default model (agree with the full policy must
# match the full cache exactly; a windowed run and a small needle table must
# complete; quest, whose budget counts attended tokens, says so in every
# command). Exits 77 (skip) after the flag checks when the model is not
# cached; QI_TEST_ERRORS_ONLY=1 runs the errors only (lib.sh). Usage:
# test_kv_cli.sh PATH/TO/qinfer
set -uo pipefail
Q=${1:?usage: test_kv_cli.sh PATH/TO/qinfer}
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

for c in agree needle; do
  if expect_ok "$Q" $c --help; then
    grep -q "usage: qinfer $c" "$tmp/out" || bad "$c --help prints no usage"
    for f in --kv-policy --kv-budget --kv-param pyramid=B ada=F "quest " "for quest and sparq, the tokens attention reads" "sparq "; do
      grep -q -- "$f" "$tmp/out" || bad "$c --help does not mention $f"
    done
  fi
  "$Q" --help | grep "^  $c " >/dev/null && ok || bad "qinfer --help does not list $c"
  expect_fail 2 "unknown policy 'nope'" "$Q" $c --kv-policy nope
  expect_fail 2 "kv-budget: '0'" "$Q" $c --kv-budget 0
  expect_fail 2 "kv-budget: '150%'" "$Q" $c --kv-budget 150%
  expect_fail 2 "unknown option '--bogus'" "$Q" $c --bogus
done
expect_fail 2 "no prompt given" "$Q" agree
expect_fail 2 "both given" "$Q" agree -p x -f y
expect_fail 2 "not an integer" "$Q" agree -p x -n 0
expect_fail 2 "not an output format" "$Q" agree -p x -o xml
"$Q" needle --help | grep -- "--repack" >/dev/null && ok || bad "needle --help does not mention --repack"
expect_fail 2 "option --lengths: '1024,abc'" "$Q" needle --lengths 1024,abc
expect_fail 2 "option --lengths: '512,'" "$Q" needle --lengths 512,
expect_fail 2 "option --depths: '1.5'" "$Q" needle --depths 1.5
expect_fail 2 "not an integer" "$Q" needle --trials 0
expect_fail 2 "not an output format" "$Q" needle -o xml

cache=${QINFER_CACHE:-$HOME/.cache/qinfer}
if [[ ! -f $cache/models/SmolLM2-135M-Instruct.Q4_1.gguf ]]; then
  echo "$passes passed, $fails failed (model checks skipped: smollm2-135m not cached; run models/fetch.sh smollm2-135m)"
  [[ $fails -eq 0 ]] && exit 77 || exit 1
fi

M=(-m smollm2-135m -t 2)
# The policy reports its own parameter errors, and a budgeted policy needs a budget.
expect_fail 2 "h2o: parameter 'heavy'" "$Q" agree "${M[@]}" -p x --kv-policy h2o --kv-budget 50% --kv-param heavy=abc
expect_fail 2 "needs a budget" "$Q" agree "${M[@]}" -p x --kv-policy window
expect_fail 2 "window: parameter 'ada' shares a layer's budget among its KV heads by the policy's scores" \
  "$Q" agree "${M[@]}" -p x --kv-policy window --kv-budget 50% --kv-param ada=0.5
# A budget for a policy that keeps every token is refused, naming the ones that take it.
for c in "agree -p x" "needle" "ppl -f devil"; do
  # shellcheck disable=SC2086 # the command and its own arguments
  expect_fail 2 "policy 'full' keeps every token on every layer and would ignore it; name a policy that takes a budget with --kv-policy (window, streaming, h2o, qinfer" \
    "$Q" $c "${M[@]}" --kv-budget 50%
done
# quest's parameters, its budget, and the devices it runs on
expect_fail 2 "quest: parameter 'first'" "$Q" agree "${M[@]}" -p x --kv-policy quest --kv-budget 50% --kv-param first=2
expect_fail 2 "quest: parameter 'full_layers'" "$Q" agree "${M[@]}" -p x --kv-policy quest --kv-budget 50% \
  --kv-param full_layers=31
expect_fail 2 "quest: unknown parameter 'heavy' (quest takes: first, recent, full_layers, page, full_share)" "$Q" agree "${M[@]}" -p x --kv-policy quest --kv-budget 50% --kv-param heavy=1
expect_fail 2 "quest: parameter 'ada' shares a layer's budget" "$Q" agree "${M[@]}" -p x --kv-policy quest \
  --kv-budget 50% --kv-param ada=0.5
expect_fail 2 "quest: parameter 'recent'" "$Q" agree "${M[@]}" -p x --kv-policy quest --kv-budget 50% --kv-param recent=-1
expect_fail 2 "quest: parameter 'page' must be a power of two" "$Q" agree "${M[@]}" -p x --kv-policy quest --kv-budget 50% \
  --kv-param page=24
expect_fail 2 "quest: parameter 'full_share'" "$Q" agree "${M[@]}" -p x --kv-policy quest --kv-budget 50% \
  --kv-param full_share=2
expect_fail 2 "qinfer: parameter 'catch_up'" "$Q" agree "${M[@]}" -p x --kv-policy qinfer --kv-budget 50% \
  --kv-param catch_up=2
expect_fail 2 "KV policy 'quest' needs a budget" "$Q" agree "${M[@]}" -p x --kv-policy quest
# sparq's parameters, and the devices it runs on
expect_fail 2 "sparq: parameter 'dims' must be in (0, 1]" "$Q" agree "${M[@]}" -p x --kv-policy sparq --kv-budget 50% \
  --kv-param dims=0
expect_fail 2 "sparq: unknown parameter 'page' (sparq takes: dims, full_layers, mean)" "$Q" agree "${M[@]}" -p x \
  --kv-policy sparq --kv-budget 50% --kv-param page=16
expect_fail 1 "KV policy 'sparq' reads the keys on the host .* runs on testdev, which the host cannot read" \
  "$Q" generate "${M[@]}" -p x -n 2 --kv-policy sparq --kv-budget 50% --devices cpu,testdev --placement ngl=30
expect_fail 1 "KV policy 'quest' keeps its key bounds on the host .* runs on testdev, which the host cannot read (implemented for the CPU only)" \
  "$Q" generate "${M[@]}" -p x -n 2 --kv-policy quest --kv-budget 50% --devices cpu,testdev --placement ngl=30
expect_fail 2 "kv-budget 512: KV policy 'qinfer'" "$Q" ppl "${M[@]}" -f devil --kv-policy qinfer --kv-budget 512 \
  --kv-param full_layers=30
expect_fail 2 "more than the context of 16" "$Q" agree "${M[@]}" -p "one two three" --n 32 --ctx 16
expect_fail 2 "training context" "$Q" needle "${M[@]}" --lengths 1024,100000

if full_runs; then
  # The full policy against the full cache: the same arithmetic, so exactly equal.
  if expect_ok "$Q" agree "${M[@]}" -p "The old lighthouse keeper climbed the stairs every evening" --n 8; then
    grep -q "^agree: model smollm2-135m, policy full, prompt [0-9]* tokens, 8 steps" "$tmp/out" || bad "agree header: $(cat "$tmp/out")"
    grep -q "^agree: top-1 100.00% (8/8), mean KL 0.0000e+00 nats, max KL 0.0000e+00, " "$tmp/out" ||
      bad "agree with the full policy is not exact: $(cat "$tmp/out")"
  fi
  if expect_ok "$Q" agree "${M[@]}" -p "The old lighthouse keeper" --n 4 -o json; then
    { grep -q '"top1_agree": 4,' "$tmp/out" && grep -q '"max_kl": 0.000000e+00,' "$tmp/out"; } || bad "agree json: $(cat "$tmp/out")"
  fi

  # A window of 16 on a corpus prompt: a result line, 16 working tokens per stream
  # (30 layers x 3 KV heads x 16 = 1440 for SmolLM2-135M).
  if expect_ok "$Q" agree "${M[@]}" -f devil --prompt-tokens 64 --n 16 --kv-policy window --kv-budget 16; then
    grep -q "policy window, budget 16 tokens, prompt 64 tokens, 16 steps" "$tmp/out" || bad "agree window header: $(cat "$tmp/out")"
    grep -Eq "^agree: top-1 [0-9.]+% \([0-9]+/16\), mean KL [0-9.]+e[-+][0-9]+ nats, max KL [0-9.]+e[-+][0-9]+, working KV tokens at end 1440 \(of [0-9]+ for full\)$" "$tmp/out" ||
      bad "agree window result: $(cat "$tmp/out")"
  fi

  # Head budgets (ada=) move tokens between a layer's KV heads, never add any:
  # still 1440 working tokens.
  if expect_ok "$Q" agree "${M[@]}" -f devil --prompt-tokens 64 --n 16 --kv-policy h2o --kv-budget 16 --kv-param ada=0.8; then
    grep -Eq "working KV tokens at end 1440 \(of [0-9]+ for full\)$" "$tmp/out" || bad "agree h2o ada=0.8: $(cat "$tmp/out")"
  fi

  # quest at 50% in every command: the budget is labelled attended, and the kv lines count what attention read.
  if expect_ok "$Q" generate "${M[@]}" -p "The old lighthouse keeper climbed the stairs" -n 4 --kv-policy quest \
    --kv-budget 50% --kv-stats; then
    grep -Eq "^qinfer generate: kv quest, budget 50% attended: [0-9]+ positions; per layer and KV head [0-9.]+ attended \(last step\), [0-9.]+ working" "$tmp/err" ||
      bad "generate quest kv line: $(cat "$tmp/err")"
  fi
  if expect_ok "$Q" ppl "${M[@]}" -f devil --ctx 256 --chunks 1 --decode --kv-policy quest --kv-budget 50%; then
    grep -q "decode mode  kv quest, budget 50% attended$" "$tmp/out" || bad "ppl quest header: $(cat "$tmp/out")"
    grep -Eq "^kv: attended tokens per layer and KV head [0-9.]+, of 192.0 working, offloaded 0.0 " "$tmp/out" ||
      bad "ppl quest kv line: $(cat "$tmp/out")"
    att=$(sed -nE 's/^kv: attended tokens per layer and KV head ([0-9.]+),.*/\1/p' "$tmp/out")
    awk -v a="$att" 'BEGIN { exit !(a > 0 && a < 192) }' || bad "ppl quest attended $att of 192"
  fi
  # 200 prompt tokens and 3 fed: 203 positions, x 30 layers x 3 KV heads = 18270 working tokens, none evicted;
  # the last step (budget ceil(0.5 x 203) = 102) reads, with pages of 16 (the default), the newest page
  # (positions 192..202, 11 tokens), page 0 (16), the page before the newest (recent=1, 16) and the 3 best
  # others (48): 91 x 90 = 8190 attended; with page=64, the newest block (11) and block 0 (64), and no room
  # is left for the block before the newest: 75 x 90 = 6750
  if expect_ok "$Q" agree "${M[@]}" -f devil --prompt-tokens 200 --n 4 --kv-policy quest --kv-budget 50%; then
    grep -q "policy quest, budget 50% attended, prompt 200 tokens, 4 steps" "$tmp/out" || bad "agree quest header: $(cat "$tmp/out")"
    grep -Eq "working KV tokens at end 18270 \(of 18270 for full\), attended at the last step 8190$" "$tmp/out" ||
      bad "agree quest result: $(cat "$tmp/out")"
  fi
  if expect_ok "$Q" agree "${M[@]}" -f devil --prompt-tokens 200 --n 4 --kv-policy quest --kv-budget 50% --kv-param page=64; then
    grep -Eq "working KV tokens at end 18270 \(of 18270 for full\), attended at the last step 6750$" "$tmp/out" ||
      bad "agree quest page=64 result: $(cat "$tmp/out")"
  fi
  # sparq reads single tokens: at the last step (203 positions, budget ceil(0.5 x 203) = 102) exactly 102
  # per stream, 102 x 90 = 9180 attended, none evicted
  if expect_ok "$Q" agree "${M[@]}" -f devil --prompt-tokens 200 --n 4 --kv-policy sparq --kv-budget 50%; then
    grep -q "policy sparq, budget 50% attended, prompt 200 tokens, 4 steps" "$tmp/out" || bad "agree sparq header: $(cat "$tmp/out")"
    grep -Eq "working KV tokens at end 18270 \(of 18270 for full\), attended at the last step 9180$" "$tmp/out" ||
      bad "agree sparq result: $(cat "$tmp/out")"
  fi
  if expect_ok "$Q" needle "${M[@]}" --lengths 256 --depths 0.5 --trials 1 --kv-policy quest --kv-budget 50%; then
    grep -q "^needle: model smollm2-135m, policy quest, budget 50% attended, lengths 256" "$tmp/out" ||
      bad "needle quest header: $(cat "$tmp/out")"
    grep -Eq '^overall: [0-9.]+% \([01]/1\)' "$tmp/out" || bad "needle quest overall: $(cat "$tmp/out")"
  fi

  # A small needle run: a table with one row and the overall line (accuracy not asserted).
  if expect_ok "$Q" needle "${M[@]}" --lengths 256 --depths 0.5 --trials 1; then
    grep -q "^needle: model smollm2-135m, policy full, lengths 256, depths 0.5, 1 trial per cell" "$tmp/out" || bad "needle header: $(cat "$tmp/out")"
    grep -Eq '^\| 256 \| [0-9]+-[0-9]+ \| [0-9.]+% \([01]/1\) \| [0-9.]+% \([01]/1\) \|$' "$tmp/out" || bad "needle row: $(cat "$tmp/out")"
    grep -Eq '^overall: [0-9.]+% \([01]/1\)' "$tmp/out" || bad "needle overall: $(cat "$tmp/out")"
    tokens=$(sed -nE 's/^\| 256 \| ([0-9]+)-.*/\1/p' "$tmp/out")
    [[ -n $tokens && $tokens -le 256 && $tokens -ge 200 ]] || bad "needle prompt not sized to 256 tokens: $tokens"
  fi
fi

summary
[[ $fails -eq 0 ]]
