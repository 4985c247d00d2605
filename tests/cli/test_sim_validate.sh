#!/usr/bin/env bash
# End-to-end checks of the simulator's GPU side against published figures:
# `qinfer sim-validate` on the shipped rows (engine/backend/sim/profiles/
# gpu-published.tsv) with the shipped calibration prints every row
# SIMULATED beside its published figure, within the calibration's stated
# medians (decode <= 10%, prompt <= 20%), and stores them in a results
# database marked simulated; `qinfer calibrate --published` writes a file
# that reads back; bad flags and files are one line each. Needs no model
# (shapes only). Usage: test_sim_validate.sh PATH/TO/qinfer
set -uo pipefail
Q=${1:?usage: test_sim_validate.sh PATH/TO/qinfer}
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
sim="$(dirname "${BASH_SOURCE[0]}")/../../engine/backend/sim/profiles"
rows="$sim/gpu-published.tsv" cal="$sim/gpu-published.cal"

if expect_ok "$Q" sim-validate --help; then
  grep -q -- "--published FILE" "$tmp/out" || bad "sim-validate --help does not name --published"
fi
if expect_ok "$Q" sim-validate --published "$rows" --sim-cal "$cal" --profiles "$sim" --shapes "$tmp/shapes" \
  --db "$tmp/r.db"; then
  grep -q "^SIMULATED figures, calibration $cal" "$tmp/out" || bad "no SIMULATED header: $(head -1 "$tmp/out")"
  grep -q "| rtx4090-desktop | Llama-2-7B Q4_0 | tg128 | 186.21 | " "$tmp/out" || bad "no RTX 4090 tg128 row"
  grep -q "OPT-30B FP16 .* not simulated: FlexGen's offload" "$tmp/out" || bad "the OPT-30B row does not say why"
  line=$(grep "^median |error|" "$tmp/out")
  tg=$(sed -E 's/.*decode ([0-9.]+)%.*/\1/' <<<"$line") pp=$(sed -E 's/.*generation ([0-9.]+)%.*/\1/' <<<"$line")
  awk -v t="$tg" -v p="$pp" 'BEGIN { exit !(t <= 10 && p <= 20) }' ||
    bad "the shipped calibration misses its medians: $line"
  if command -v sqlite3 >/dev/null; then
    n=$(sqlite3 "$tmp/r.db" "SELECT count(*) FROM runs r JOIN experiments e ON e.id = r.experiment_id
      WHERE e.name = 'sim-validate' AND r.simulated = 1")
    [[ $n -ge 15 ]] || bad "--db: $n simulated runs of sim-validate stored, want >= 15"
    m=$(sqlite3 "$tmp/r.db" "SELECT group_concat(DISTINCT name || '=' || simulated) FROM metrics")
    [[ $m == *"published.tokens_per_s=0"* && $m == *"sim.tokens_per_s=1"* ]] ||
      bad "--db: the published figure must be a measurement, the simulated one simulated: $m"
  fi
fi
# bench prints the calibration's validated error beside its SIMULATED figures
if full_runs && expect_ok "$Q" bench -m "$tmp/shapes/llama-7b-q4_0.gguf" --sim "$sim/l40s.profile" --sim-cal "$cal" \
  --devices cpu,gpu --placement ngl=99 -p 64 -n 4 -r 1; then
  grep -q "^SIMULATED machine l40s: .*gpu-published.cal; validated: against 15 published GPU figures" "$tmp/out" ||
    bad "bench: no validated error beside the SIMULATED header: $(head -1 "$tmp/out")"
fi
if full_runs && expect_ok "$Q" calibrate --published "$rows" --profiles "$sim" --shapes "$tmp/shapes" --max-evals 3 --no-loo \
  -o "$tmp/q.cal"; then
  grep -q "^gpu_op_cycles = .*# source: fitted by qinfer calibrate --published" "$tmp/q.cal" ||
    bad "no gpu_op_cycles with its source in the written file"
  expect_ok "$Q" sim-validate --published "$rows" --sim-cal "$tmp/q.cal" --profiles "$sim" --shapes "$tmp/shapes"
fi
expect_fail 2 "--published FILE is required" "$Q" sim-validate
expect_fail 2 "--fit: 'bogus' is not a GPU parameter" "$Q" calibrate --published "$rows" --fit bogus \
  --profiles "$sim" --shapes "$tmp/shapes"
expect_fail 1 "none.tsv: cannot open" "$Q" sim-validate --published "$tmp/none.tsv"
printf 'train\tx\n' >"$tmp/bad.tsv"
expect_fail 1 "bad.tsv:1: 2 columns" "$Q" sim-validate --published "$tmp/bad.tsv"
summary
exit $((fails > 0))
