#!/usr/bin/env bash
# experiments/paper_fig12.lua's dry option from a fresh checkout: the three
# models of shapes only written into a scratch cache (QINFER_CACHE), then
# one small configuration (16-token prompts, 2 sequences, 2 steps) of each
# system at input 128 and batch 1 on the simulated A100 with the GPU
# calibration: every configuration done, none failed; every system that
# runs on a model stores decode and end-to-end rates marked simulated and
# the calibration's validated error; PowerInfer and Q-Infer on OPT-30B and
# Falcon-40B say they did not run (system.not_run); the ablation's systems
# run; a configuration over kv_cut is cut. Seconds. Needs SQLite (the
# harness). With QI_TEST_ERRORS_ONLY=1 (the sanitizer build) only the
# missing-model check runs. Usage: test_paper_fig12.sh PATH/TO/qinfer
set -uo pipefail
Q=${1:?usage: test_paper_fig12.sh PATH/TO/qinfer}
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
exp="$(dirname "${BASH_SOURCE[0]}")/../../experiments/paper_fig12.lua"
command -v sqlite3 >/dev/null || { echo "skipped: no sqlite3 shell to read the results"; exit 77; }

# shellcheck disable=SC2317 # called by name through expect_ok
run() { QINFER_CACHE="$tmp/cache" "$Q" run "$exp" --db "$db" --set dry=1 --set prompt=128 "$@"; }
q() { sqlite3 "$db" "$1"; }
db="$tmp/r.db"
if full_runs; then
  mkdir -p "$tmp/cache/shapes"
  for p in llama-2-70b opt-30b falcon-40b; do
    expect_ok "$Q" synth --preset $p --type q4_0 --shapes-only -o "$tmp/cache/shapes/$p-q4_0.gguf" || break
  done
  if expect_ok run --set batch=1; then
    grep -q "12 configurations, 12 done, 0 skipped (already done), 0 failed" "$tmp/err" ||
      bad "the dry run did not finish every configuration: $(tail -1 "$tmp/err")"
    n=$(q "SELECT count(*) FROM runs r JOIN metrics m ON m.run_id = r.id WHERE m.name = 'decode.tokens_per_s'
           AND m.value > 0 AND r.simulated = 1 AND m.simulated = 1")
    [[ $n == 8 ]] || bad "$n simulated decode rates stored, want 8 (4 systems on LLaMA, 2 on OPT and Falcon)"
    n=$(q "SELECT group_concat(json_extract(r.config_json, '\$.model') || ':' || json_extract(r.config_json, '\$.system'))
           FROM runs r JOIN metrics m ON m.run_id = r.id WHERE m.name = 'system.not_run' AND m.value = 1")
    for s in opt-30b:powerinfer opt-30b:qinfer falcon-40b:powerinfer falcon-40b:qinfer; do
      [[ ,$n, == *",$s,"* ]] || bad "$s is not marked not run: $n"
    done
    n=$(q "SELECT count(*) FROM metrics WHERE name = 'sim.validated_error.prompt' AND value > 0 AND value < 1")
    [[ $n == 8 ]] || bad "$n runs carry the calibration's validated error, want 8"
    n=$(q "SELECT count(*) FROM metrics WHERE name = 'plan.attn_layers_gpu' AND value = 80")
    [[ $n == 2 ]] || bad "PowerInfer and Q-Infer on LLaMA-70B: $n runs with every attention on the GPU, want 2"
  fi
  # the ablation's systems (one at a time, as the closing note runs them)
  for s in q-hot q-place q-kv; do
    if expect_ok run --set batch=1 --set model=llama-70b --set system=$s; then
      grep -q "1 done, 0 skipped (already done), 0 failed" "$tmp/err" || bad "system=$s: $(tail -1 "$tmp/err")"
    fi
  done
  # over kv_cut: cut, and says so
  if expect_ok run --set batch=64 --set model=llama-70b --set system=qinfer --set kv_cut=64; then
    n=$(sqlite3 "$db" "SELECT count(*) FROM metrics WHERE name = 'system.not_run' AND value = 2")
    [[ $n == 1 ]] || bad "a configuration over kv_cut is not marked cut ($n)"
  fi
fi
# no models: the configuration fails, naming the command that writes them
QINFER_CACHE="$tmp/none" "$Q" run "$exp" --db "$tmp/r2.db" --set dry=1 --set prompt=128 --set batch=1 --set model=opt-30b \
  --set system=llamacpp >"$tmp/out" 2>"$tmp/err"
rc=$?
if [[ $rc == 1 ]] && grep -q "no model at .*: write it with qinfer synth --preset opt-30b --type q4_0 --shapes-only" "$tmp/err"; then
  ok
else
  bad "a missing model: exit $rc, $(tail -2 "$tmp/err")"
fi
summary
exit $((fails > 0))
