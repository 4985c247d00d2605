#!/usr/bin/env bash
# kv_ppl_table.sh - decode-mode perplexity of every KV policy at several
# budgets, one model, one context: the accuracy-vs-budget table.
#
#   bench/kv_ppl_table.sh [-m MODEL] [-f CORPUS] [--ctx N] [--chunks N]
#                         [--budgets 25%,50%,75%] [--policies LIST] [-t N]
#
# Runs `qinfer ppl --decode` once with the full cache, then once per
# (policy, budget), the chunks of each run decoded together as a batch, and
# prints a markdown table: perplexity +/- its error, the change against the
# full cache, and the mean working KV tokens per layer and KV head (for quest,
# whose budget counts what attention reads, the attended tokens, marked so).
# Each run's output is kept in the folder given by --out (default a temporary
# one).
set -euo pipefail
cd "$(dirname "$0")/.."
Q=${QINFER:-./build/qinfer}
model=smollm2-135m corpus=devil ctx=2048 chunks=4 budgets=25%,50%,75% threads=2 out=""
policies=window,streaming,h2o,qinfer
while [[ $# -gt 0 ]]; do
  case $1 in
    -m) model=$2; shift 2 ;;
    -f) corpus=$2; shift 2 ;;
    --ctx) ctx=$2; shift 2 ;;
    --chunks) chunks=$2; shift 2 ;;
    --budgets) budgets=$2; shift 2 ;;
    --policies) policies=$2; shift 2 ;;
    -t) threads=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "kv_ppl_table.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ -x $Q ]] || { echo "kv_ppl_table.sh: $Q not built" >&2; exit 1; }
[[ -n $out ]] || out=$(mktemp -d)
mkdir -p "$out"
run() { # NAME ARGS...: one ppl run, its output in $out/NAME.txt
  local name=$1; shift
  local t0=$SECONDS
  "$Q" ppl -m "$model" -f "$corpus" --ctx "$ctx" --chunks "$chunks" --batch "$chunks" -t "$threads" --decode "$@" \
    >"$out/$name.txt" 2>"$out/$name.err" || { echo "kv_ppl_table.sh: run $name failed: $(tail -1 "$out/$name.err")" >&2; exit 1; }
  echo "$name: $(grep 'Final estimate' "$out/$name.txt") ($((SECONDS - t0)) s)" >&2
}
field() { # NAME -> "ppl err work"
  awk '/Final estimate/ {p=$5; e=$7} /^kv: working/ {w=$9; sub(",", "", w)}
       /^kv: attended/ {w=$9; sub(",", "", w); w = w "_attended"} END {print p, e, w}' "$out/$1.txt"
}
echo "kv_ppl_table.sh: $model, $corpus, ctx $ctx, $chunks chunks, budgets $budgets, outputs in $out" >&2
run full
read -r fp fe fw < <(field full)
echo "| policy | budget | PPL | vs full | working KV tokens per layer and KV head |"
echo "|---|---|---|---|---|"
printf '| full | - | %s +/- %s | - | %s |\n' "$fp" "$fe" "$fw"
IFS=, read -ra P <<<"$policies"
IFS=, read -ra B <<<"$budgets"
for b in "${B[@]}"; do
  for p in "${P[@]}"; do
    name="${p}-${b%\%}"
    run "$name" --kv-policy "$p" --kv-budget "$b"
    read -r pp pe pw < <(field "$name")
    printf '| %s | %s | %s +/- %s | %+.2f%% | %s |\n' "$p" "$b" "$pp" "$pe" \
      "$(awk -v a="$pp" -v b="$fp" 'BEGIN { print (a / b - 1) * 100 }')" "${pw/_/ }"
  done
done
