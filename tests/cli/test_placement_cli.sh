#!/usr/bin/env bash
# --placement policy:NAME[:K=V,...] end to end (policies/placement/): the
# static policy's plan on the test device gives the all-CPU text, fills a
# small device only as far as it fits, and unknown policies, unknown
# parameters and forced plans that do not fit are one-line errors.
# Usage: test_placement_cli.sh PATH/TO/qinfer
set -uo pipefail
Q=${1:?usage: test_placement_cli.sh PATH/TO/qinfer}
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

expect_ok $Q generate --help && { grep -q "policy:NAME" "$tmp/out" && grep -q "static .*-ngl" "$tmp/out" ||
  bad "generate --help does not list the placement policies"; }
cache=${QINFER_CACHE:-$HOME/.cache/qinfer}
if [[ ! -f $cache/models/SmolLM2-135M-Instruct.Q4_1.gguf ]]; then
  echo "$passes passed, $fails failed (model checks skipped: smollm2-135m not cached; run models/fetch.sh smollm2-135m)"
  [[ $fails -eq 0 ]] && exit 77 || exit 1
fi
M="-m smollm2-135m -t 2"
P="The three laws of robotics are"
expect_ok $Q generate $M -p "$P" -n 8 --temp 0 && cp "$tmp/out" "$tmp/cpu.txt"
# room for everything: every layer and the head (ngl=31), the all-CPU text
expect_ok $Q generate $M -p "$P" -n 8 --temp 0 --devices cpu,testdev --placement policy:static --profile &&
  { cmp -s "$tmp/out" "$tmp/cpu.txt" || bad "policy:static: the text differs from all-cpu";
    grep -q "placement ngl=31 (testdev)" "$tmp/err" || bad "policy:static --profile: $(cat "$tmp/err")"; }
# 20 MiB: some layers, not all
expect_ok $Q generate $M -p "$P" -n 8 --temp 0 --devices cpu,testdev:20M --placement policy:static --profile &&
  { cmp -s "$tmp/out" "$tmp/cpu.txt" || bad "policy:static on 20M: the text differs from all-cpu";
    n=$(sed -n 's/.*placement ngl=\([0-9]*\) (testdev:20M).*/\1/p' "$tmp/err")
    [[ -n $n && $n -ge 1 && $n -lt 30 ]] || bad "policy:static on 20M: not some layers: $(cat "$tmp/err")"; }
# the CPU alone: all-cpu
expect_ok $Q generate $M -p "$P" -n 8 --temp 0 --placement policy:static --profile &&
  { grep -q "placement all-cpu" "$tmp/err" || bad "policy:static on the CPU alone: $(cat "$tmp/err")"; }
expect_fail 1 "plan does not fit device testdev:20M" $Q generate $M -p hi -n 1 --devices cpu,testdev:20M \
  --placement policy:static:ngl=31
expect_fail 2 "unknown placement policy 'nope'" $Q generate $M -p hi -n 1 --placement policy:nope
expect_fail 2 "colour" $Q generate $M -p hi -n 1 --placement policy:static:colour=1
# a command that does not run placement policies refuses one
for i in $(seq 40); do echo "the quick brown fox jumps over the lazy dog"; done >"$tmp/text.txt"
expect_fail 1 "placement policy's plan" $Q ppl $M -f "$tmp/text.txt" --ctx 32 --chunks 1 --placement policy:static
echo "$passes passed, $fails failed"
[[ $fails -eq 0 ]]
