#!/usr/bin/env bash
# End-to-end checks of `qinfer neuron-plan`, the neuron policies' view:
# --help, one-line usage errors for bad flags (exit 2), runtime errors for
# missing or malformed profiles (exit 1, naming the file and line), then on
# a hand-made profile of 2 layers x 4 neurons the placements of static,
# qinfer and none against figures worked out by hand (groups, bytes, the
# share kept, recall and precision), and --eval against a second profile.
# With the cached SmolLM2-135M, a profile of its shape that names it: the
# bytes per neuron come from the model (gate + up + down share, 1080 at
# Q4_1) and static fills the budget; the engine runs its split (ppl on
# cpu,testdev; left out with QI_TEST_ERRORS_ONLY=1, tests/cli/lib.sh), and
# the split's flags are refused where they do not fit.
# Exits 77 (skip) after the model-free checks when the model is not cached.
# Usage: test_neuron_cli.sh PATH/TO/qinfer
set -uo pipefail
Q=${1:?usage: test_neuron_cli.sh PATH/TO/qinfer}
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if expect_ok "$Q" neuron-plan --help; then
  grep -q "usage: qinfer neuron-plan" "$tmp/out" || bad "neuron-plan --help prints no usage"
  for f in --profile --policy --budget --budget-frac --group --ratio --model --neuron-bytes --by --eval none qinfer; do
    grep -q -- "$f" "$tmp/out" || bad "neuron-plan --help does not mention $f"
  done
fi
"$Q" --help | grep "^  neuron-plan " >/dev/null && ok || bad "qinfer --help does not list neuron-plan"

# Layer 0: mass 8 4 2 2, active 10 5 2 1; layer 1: mass 6 1 1 0, active 9 1 1 0; 10 tokens.
p=$tmp/p.txt
cat >"$p" <<'P'
# qinfer ffn-profile 1
# model -
# n_layer 2 n_ff 4 tokens 10 ctx 64 threshold 0.1 top 0.25 k 1 window 4
# columns: layer neuron active hot mass
0 0 10 9 8
0 1 5 1 4
0 2 2 0 2
0 3 1 0 2
1 0 9 8 6
1 1 1 1 1
1 2 1 1 1
1 3 0 0 0
P
NB=(--profile "$p" --neuron-bytes 10 --group 1)

expect_fail 2 "no profile given" "$Q" neuron-plan --policy none
expect_fail 2 "no policy given" "$Q" neuron-plan --profile "$p"
expect_fail 2 "unknown option '--bogus'" "$Q" neuron-plan "${NB[@]}" --policy none --bogus
expect_fail 2 "unexpected argument 'extra'" "$Q" neuron-plan "${NB[@]}" --policy none extra
expect_fail 2 "unknown neuron policy 'bogus' (known: none, " "$Q" neuron-plan "${NB[@]}" --policy bogus --budget 1
expect_fail 2 "no budget given" "$Q" neuron-plan "${NB[@]}" --policy qinfer --ratio 2
expect_fail 2 "option --budget: '-1' is not a size" "$Q" neuron-plan "${NB[@]}" --policy qinfer --ratio 2 --budget -1
expect_fail 2 "option --budget: '1.5' is not a size" "$Q" neuron-plan "${NB[@]}" --policy qinfer --ratio 2 --budget 1.5
expect_fail 2 "option --budget: '10X' is not a size" "$Q" neuron-plan "${NB[@]}" --policy qinfer --ratio 2 --budget 10X
expect_fail 2 "option --budget-frac: '1.5' is not a share in \[0, 1\]" "$Q" neuron-plan "${NB[@]}" --policy qinfer --ratio 2 --budget-frac 1.5
expect_fail 2 "option --budget-frac: 'nan' is not a share" "$Q" neuron-plan "${NB[@]}" --policy qinfer --ratio 2 --budget-frac nan
expect_fail 2 "--budget and --budget-frac both set the budget" "$Q" neuron-plan "${NB[@]}" --policy none --budget 1 --budget-frac 0.5
expect_fail 2 "option --group: '0' is not an integer" "$Q" neuron-plan "${NB[@]}" --policy none --group 0
expect_fail 2 "option --ratio needs a value" "$Q" neuron-plan "${NB[@]}" --policy qinfer --ratio
expect_fail 2 "--ratio is the qinfer policy's; policy 'none' takes none" "$Q" neuron-plan "${NB[@]}" --policy none --ratio 2
expect_fail 2 "--ratio and the policy's ratio= both give the ratio" "$Q" neuron-plan "${NB[@]}" --policy qinfer:ratio=2 --ratio 3 --budget 1
expect_fail 2 "qinfer: needs ratio=R" "$Q" neuron-plan "${NB[@]}" --policy qinfer --budget 1
expect_fail 2 "qinfer: parameter 'ratio' must be a number" "$Q" neuron-plan "${NB[@]}" --policy qinfer --ratio 0 --budget 1
expect_fail 2 "option --by: 'bogus' is not a column" "$Q" neuron-plan "${NB[@]}" --policy none --by bogus
expect_fail 2 "option --neuron-bytes: '0' is not a size of at least 1 byte" "$Q" neuron-plan --profile "$p" --neuron-bytes 0 --policy none
expect_fail 2 "-m and --neuron-bytes both give" "$Q" neuron-plan "${NB[@]}" -m x.gguf --policy none
expect_fail 2 "names no model: give -m MODEL or --neuron-bytes N" "$Q" neuron-plan --profile "$p" --policy none
expect_fail 1 "nonexistent.txt: cannot open" "$Q" neuron-plan --profile "$tmp/nonexistent.txt" --neuron-bytes 1 --policy none
sed 's/^0 2 2 0 2$/0 2 2 0 -2/' "$p" >"$tmp/bad.txt"
expect_fail 1 "bad.txt:7: mass '-2' is not a finite number >= 0" "$Q" neuron-plan --profile "$tmp/bad.txt" --neuron-bytes 1 --policy none
head -7 "$p" >"$tmp/short.txt"
expect_fail 1 "short.txt:8: the file ends with layer 0 neuron 3 missing" "$Q" neuron-plan --profile "$tmp/short.txt" --neuron-bytes 1 --policy none
printf '# qinfer ffn-profile 1\n# n_layer 1 n_ff 4 tokens 10\n0 0 1 1 1\n0 1 1 1 1\n0 2 1 1 1\n0 3 1 1 1\n' >"$tmp/other.txt"
expect_fail 2 "other.txt is 1 layers x 4 neurons" "$Q" neuron-plan "${NB[@]}" --policy none --eval "$tmp/other.txt"

# static (built with GLPK; without, it says so), 30 bytes: the three largest masses (8 and 4 of layer 0, 6 of layer 1).
# Layer 0: fast {0, 1}: recall 15/18, precision 15/20; layer 1: {0}: 9/11, 9/10.
if "$Q" neuron-plan --help | grep -q "^  static "; then
  expect_fail 2 "static: unknown parameter 'bogus'" "$Q" neuron-plan "${NB[@]}" --policy static:bogus=1 --budget 30
  if expect_ok "$Q" neuron-plan "${NB[@]}" --policy static --budget 30; then
    grep -q "^policy static  profile .*p.txt (2 layers x 4 neurons, 10 tokens)  by mass$" "$tmp/out" || bad "static header: $(head -1 "$tmp/out")"
    grep -q "budget 30 bytes (37.5% of all 80)  groups of 1, 4 a layer$" "$tmp/out" || bad "static budget line: $(sed -n 2p "$tmp/out")"
    grep -Eq "^ +0 +2/4 +2 +20 +0\.750 +0\.833 +0\.750$" "$tmp/out" || bad "static layer 0: $(cat "$tmp/out")"
    grep -Eq "^ +1 +1/4 +1 +10 +0\.750 +0\.818 +0\.900$" "$tmp/out" || bad "static layer 1: $(cat "$tmp/out")"
    grep -q "^total: 3/8 groups, 3 neurons, 30 bytes (100.0% of the budget), kept 0.750 of the activity, recall 0.828, precision 0.800, optimal$" "$tmp/out" ||
      bad "static total: $(tail -1 "$tmp/out")"
  fi
  # by active counts: 10, 9, 5 are the same neurons; by budget fraction 0.25 (20 bytes): 8 and 6
  if expect_ok "$Q" neuron-plan "${NB[@]}" --policy static --budget-frac 0.25 --by active; then
    grep -q "^total: 2/8 groups, 2 neurons, 20 bytes" "$tmp/out" || bad "static by active: $(tail -1 "$tmp/out")"
  fi
  expect_ok "$Q" neuron-plan "${NB[@]}" --policy static --budget 0 && { grep -q "^total: 0/8 groups, 0 neurons, 0 bytes" "$tmp/out" || bad "static budget 0: $(tail -1 "$tmp/out")"; }
else
  expect_fail 1 "neuron policy 'static' solves with GLPK, and this build has none" "$Q" neuron-plan "${NB[@]}" --policy static --budget 30
fi

# qinfer, ratio 1 (balance at half the activity): 8 brings layer 0 to 0.5,
# 6 brings layer 1 to 0.75; nothing more, whatever the budget.
if expect_ok "$Q" neuron-plan "${NB[@]}" --policy qinfer --ratio 1 --budget 1K; then
  grep -Eq "^ +0 +1/4 +1 +10 +0\.500 +0\.556 +1\.000$" "$tmp/out" || bad "qinfer layer 0: $(cat "$tmp/out")"
  grep -Eq "^ +1 +1/4 +1 +10 +0\.750 +0\.818 +0\.900$" "$tmp/out" || bad "qinfer layer 1: $(cat "$tmp/out")"
  grep -q "^policy qinfer:ratio=1 " "$tmp/out" || bad "qinfer header: $(head -1 "$tmp/out")"
fi
expect_ok "$Q" neuron-plan "${NB[@]}" --policy qinfer:ratio=3 --budget 1K && { grep -q "^total: 3/8 groups" "$tmp/out" || bad "qinfer ratio 3: $(tail -1 "$tmp/out")"; }

# none: nothing on the fast device; precision undefined ("-")
if expect_ok "$Q" neuron-plan "${NB[@]}" --policy none; then
  grep -Eq "^ +0 +0/4 +0 +0 +0\.000 +0\.000 +-$" "$tmp/out" || bad "none layer 0: $(cat "$tmp/out")"
fi

# --eval: the same placement judged on another profile's active counts
sed -e 's/^0 0 10 9 8$/0 0 0 0 8/' -e 's/^0 3 1 0 2$/0 3 10 0 2/' "$p" >"$tmp/eval.txt"
if expect_ok "$Q" neuron-plan "${NB[@]}" --policy qinfer --ratio 1 --budget 1K --eval "$tmp/eval.txt"; then
  grep -q "^recall and precision against .*eval.txt (10 tokens)$" "$tmp/out" || bad "eval line: $(sed -n 3p "$tmp/out")"
  grep -Eq "^ +0 +1/4 +1 +10 +0\.500 +0\.000 +0\.000$" "$tmp/out" || bad "eval layer 0: $(cat "$tmp/out")"
fi

cache=${QINFER_CACHE:-$HOME/.cache/qinfer}
if [[ ! -f $cache/models/SmolLM2-135M-Instruct.Q4_1.gguf ]]; then
  echo "$passes passed, $fails failed (model checks skipped: smollm2-135m not cached; run models/fetch.sh smollm2-135m)"
  [[ $fails -eq 0 ]] && exit 77 || exit 1
fi

# A profile of SmolLM2's shape (30 x 1536) naming the model by its short name.
big=$tmp/big.txt
{ printf '# qinfer ffn-profile 1\n# model smollm2-135m\n# n_layer 30 n_ff 1536 tokens 100\n'
  awk 'BEGIN { for (l = 0; l < 30; l++) for (j = 0; j < 1536; j++) printf "%d %d %d 0 %d\n", l, j, (j * 7 + l) % 101, (j * 13 + l * 5) % 97 }'
} >"$big"
if expect_ok "$Q" neuron-plan --profile "$big" --policy qinfer --ratio 4 --budget 10M; then
  grep -q "^bytes per neuron from .*SmolLM2-135M-Instruct.Q4_1.gguf (layer 0: 1080)  budget 10485760 bytes (21.1% of all 49766400)  groups of 256, 6 a layer$" "$tmp/out" ||
    bad "model bytes line: $(sed -n 2p "$tmp/out")"
  [[ $(grep -Ec "^ +[0-9]+ +[0-6]/6 " "$tmp/out") -eq 30 ]] || bad "not 30 layer rows: $(cat "$tmp/out")"
fi
if "$Q" neuron-plan --help | grep -q "^  static "; then
  expect_ok "$Q" neuron-plan --profile "$big" -m smollm2-135m --policy static --budget 10M &&
    { grep -q "^total: 37/180 groups, 9472 neurons, 10229760 bytes (97.6% of the budget)" "$tmp/out" || bad "static on SmolLM2: $(tail -1 "$tmp/out")"; }
fi
expect_fail 2 "has 30 layers x 1536 neurons, the profile 2 x 4: not the same model" "$Q" neuron-plan --profile "$p" -m smollm2-135m --policy none

# The engine's neuron split (ppl, generate and bench take it): the hot
# units on testdev, the rest on the cpu. Every unit there, or none, is the
# unsplit run bit for bit; a partial split prints its units and runs.
PPL=(ppl -m smollm2-135m -f devil --ctx 128 --chunks 1 -t 2)
have_corpus=0
ls "$cache"/corpora/* >/dev/null 2>&1 && have_corpus=1
if full_runs && ((have_corpus)); then
  expect_ok "$Q" "${PPL[@]}" && grep "^Final" "$tmp/out" >"$tmp/dense"
  for b in 0% 100%; do
    expect_ok "$Q" "${PPL[@]}" --devices cpu,testdev --neuron-policy static --neuron-profile "$big" --neuron-budget $b &&
      { grep "^Final" "$tmp/out" | cmp -s - "$tmp/dense" && ok || bad "neuron split at $b is not the unsplit run: $(grep Final "$tmp/out")"; }
  done
  if expect_ok "$Q" "${PPL[@]}" --devices cpu,testdev --neuron-policy qinfer:ratio=3 --neuron-profile "$big" --neuron-budget 30%; then
    grep -Eq "neuron split qinfer: [0-9]+ of 1440 units of 32 neurons \([0-9.]+ MiB, (29|30)\.[0-9]% of the FFN\)" "$tmp/err" ||
      bad "no split line: $(cat "$tmp/err")"
    grep -q "^Final estimate: PPL = " "$tmp/out" || bad "split ppl printed nothing"
  fi
  # the hot set against the neurons active in the run: every unit hot is
  # recall 1; a 10% split, a row per layer
  if expect_ok "$Q" "${PPL[@]}" --devices cpu,testdev --neuron-policy static --neuron-profile "$big" --neuron-budget 100% --neuron-active 0.1; then
    [[ $(grep -Ec "^ +[0-9]+ +1536 +128 +1\.000 +0\.[0-9]{3}$" "$tmp/out") -eq 30 ]] || bad "recall table: $(cat "$tmp/out")"
    grep -Eq "^total: recall 1\.000, precision 0\.[0-9]{3}$" "$tmp/out" || bad "recall total: $(tail -1 "$tmp/out")"
  fi
  if expect_ok "$Q" "${PPL[@]}" --devices cpu,testdev --neuron-policy static --neuron-profile "$big" --neuron-budget 10% --neuron-active 0.1; then
    [[ $(grep -Ec "^ +[0-9]+ +[0-9]+ +128 +[01]\.[0-9]{3} +(0\.[0-9]{3}|-)$" "$tmp/out") -eq 30 ]] || bad "recall table at 10%: $(cat "$tmp/out")"
    grep -Eq "^total: recall 0\.[0-9]{3}, precision 0\.[0-9]{3}$" "$tmp/out" || bad "recall total at 10%: $(tail -1 "$tmp/out")"
  fi
fi
if ((have_corpus)); then # ppl resolves its corpus before it reads the flags
  expect_fail 2 "needs --neuron-profile FILE (or uniform) and --neuron-budget" "$Q" "${PPL[@]}" --devices cpu,testdev --neuron-policy static
  expect_fail 2 "option --neuron-budget without --neuron-policy" "$Q" "${PPL[@]}" --neuron-budget 10%
  expect_fail 2 "option --neuron-swap-worker without --neuron-policy" "$Q" "${PPL[@]}" --neuron-swap-worker
  expect_fail 2 "option --neuron-swap-worker needs --neuron-swap-every N" "$Q" "${PPL[@]}" --devices cpu,testdev --neuron-policy qinfer:ratio=3 --neuron-profile uniform --neuron-budget 30% --neuron-swap-worker
  expect_fail 2 "option --neuron-swap-stream without --neuron-policy" "$Q" "${PPL[@]}" --neuron-swap-stream main
  expect_fail 2 "option --neuron-swap-stream says where the background worker uploads, and there is none" "$Q" "${PPL[@]}" --devices cpu,testdev --neuron-policy qinfer:ratio=3 --neuron-profile uniform --neuron-budget 30% --neuron-swap-every 2 --neuron-swap-stream main
  expect_fail 2 "option --neuron-swap-stream: 'side' is not a stream (copy or main)" "$Q" "${PPL[@]}" --neuron-swap-stream side
  expect_fail 2 "neuron budget '120%' is not a share" "$Q" "${PPL[@]}" --devices cpu,testdev --neuron-policy static --neuron-profile uniform --neuron-budget 120%
  expect_fail 2 "the model 30 x 1536: not its profile" "$Q" "${PPL[@]}" --devices cpu,testdev --neuron-policy static --neuron-profile "$p" --neuron-budget 10%
  expect_fail 2 "puts the hot neurons on the second device of --devices, and there is none" "$Q" "${PPL[@]}" --neuron-policy static --neuron-profile uniform --neuron-budget 10%
fi
expect_fail 2 "option --neuron-policy: qinfer needle takes no neuron split" "$Q" needle -m smollm2-135m --neuron-policy static
expect_fail 2 "option --neuron-swap-worker: qinfer needle takes no neuron split" "$Q" needle -m smollm2-135m --neuron-swap-worker
expect_fail 2 "option --neuron-swap-stream: qinfer needle takes no neuron split" "$Q" needle -m smollm2-135m --neuron-swap-stream main
if full_runs && ((have_corpus)); then
  # the qinfer policy's swaps between steps (decode mode: a step a token)
  if expect_ok "$Q" "${PPL[@]}" --decode --devices cpu,testdev --neuron-policy qinfer:ratio=3 --neuron-profile uniform --neuron-budget 30% --neuron-swap-every 1; then
    grep -Eq "^neuron swaps: [0-9]+ rounds, [0-9]+ units moved to the second device \([0-9.]+ MiB copied\), [0-9.]+ ms in the rounds \([0-9.]+ ms a round\)$" "$tmp/out" ||
      bad "no swaps line: $(cat "$tmp/out")"
  fi
  # the same swaps made by the background worker, uploading on testdev's
  # copy stream, then on its main one
  for s in copy main; do
    if expect_ok "$Q" "${PPL[@]}" --decode --devices cpu,testdev --neuron-policy qinfer:ratio=3 --neuron-profile uniform --neuron-budget 30% --neuron-swap-every 1 --neuron-swap-worker $([[ $s == main ]] && echo --neuron-swap-stream main); then
      grep -Eq "^neuron swaps: [0-9]+ rounds, [1-9][0-9]* units moved to the second device \([0-9.]+ MiB copied\) by the background worker \(uploads on the device's $s stream\); the steps waited [0-9.]+ ms for its holds and met a layer mid-swap [0-9]+ times$" "$tmp/out" ||
        bad "no background swaps line ($s stream): $(cat "$tmp/out")"
    fi
  done
fi
if full_runs && ((have_corpus)); then
  if expect_ok "$Q" "${PPL[@]}" --devices cpu,testdev --neuron-policy qinfer:ratio=auto --neuron-profile uniform --neuron-budget 30%; then
    grep -Eq "neuron speed ratio calibrated: [0-9.e+-]+ \(seconds per neuron of up and down at batch 1," "$tmp/err" ||
      bad "no calibrated ratio: $(cat "$tmp/err")"
  fi
  # at the serving batch: decode mode's --batch
  if expect_ok "$Q" "${PPL[@]}" --decode --batch 3 --devices cpu,testdev --neuron-policy qinfer:ratio=auto --neuron-profile uniform --neuron-budget 30%; then
    grep -Eq "neuron speed ratio calibrated: [0-9.e+-]+ \(seconds per neuron of up and down at batch 3," "$tmp/err" ||
      bad "calibration not at the batch: $(cat "$tmp/err")"
  fi
fi
if ((have_corpus)); then # ppl resolves its corpus before it reads the flags
  expect_fail 2 "swapping is the qinfer policy's, and the policy is static" "$Q" "${PPL[@]}" --devices cpu,testdev --neuron-policy static --neuron-profile uniform --neuron-budget 30% --neuron-swap-every 4
  expect_fail 2 "option --neuron-swap-every without --neuron-policy" "$Q" "${PPL[@]}" --neuron-swap-every 4
  expect_fail 2 "option --neuron-active without --neuron-policy" "$Q" "${PPL[@]}" --neuron-active 0.1
fi
expect_fail 2 "option --neuron-active: qinfer generate does not count active neurons" "$Q" generate -p hi --neuron-active 0.1

if ((!have_corpus)); then
  echo "$passes passed, $fails failed (the engine's split runs skipped: no corpus; run models/fetch.sh devil)"
  [[ $fails -eq 0 ]] && exit 77 || exit 1
fi
summary
[[ $fails -eq 0 ]]
