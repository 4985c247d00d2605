#!/usr/bin/env bash
# End-to-end checks of the simulated machine (--sim) on a model of shapes
# only: `qinfer synth --shapes-only` writes a LLaMA-2-70B of a few hundred
# KB; bench and generate run it on the A100 server's profile in seconds,
# every row labelled simulated (CSV column, the results database's marks),
# the same figures twice; the commands that measure what a model computes
# refuse --sim; bad profiles, parameters and devices are one-line errors.
# Needs no model. Usage: test_sim.sh PATH/TO/qinfer
set -uo pipefail
Q=${1:?usage: test_sim.sh PATH/TO/qinfer}
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
P="$(dirname "${BASH_SOURCE[0]}")/../../engine/backend/sim/profiles/a100-pcie-2xeon.profile"
M=$tmp/l70.gguf

if expect_ok "$Q" synth --preset llama-2-70b --type q4_0 --shapes-only -o "$M"; then
  size=$(stat -c %s "$M")
  [[ $size -lt 2000000 ]] || bad "a shapes-only 70B is $size bytes"
  grep -q "shapes only" "$tmp/err" || bad "synth does not say shapes only: $(cat "$tmp/err")"
fi
expect_ok "$Q" synth --help && { grep -q -- "--shapes-only" "$tmp/out" || bad "synth --help lacks --shapes-only"; }

# quest picks blocks by their keys, which a simulated machine does not compute: refused at creation
expect_fail 1 "KV policy 'quest' picks blocks by their keys, and a simulated machine .* computes none" \
  "$Q" generate -m "$M" --sim "$P" --devices cpu,gpu --placement ngl=81 -p x -n 2 --kv-policy quest --kv-budget 50%

# qinfer's fetch scores offloaded tokens on the host for the CPU's attention: on a simulated machine its
# default is off (the run goes on), an explicit fetch is refused
expect_ok "$Q" generate -m "$M" --sim "$P" --devices cpu,gpu --placement ngl=81 -p x -n 2 --kv-policy qinfer \
  --kv-budget 50%
expect_fail 1 "KV policy 'qinfer' fetches offloaded tokens for attention, scoring them on the host, and this layer's attention runs on a simulated machine" \
  "$Q" generate -m "$M" --sim "$P" --devices cpu,gpu --placement ngl=81 -p x -n 2 --kv-policy qinfer --kv-budget 50% \
  --kv-param fetch=0.25

# the what-if density of the CPU's FFN neurons: faster than dense, only with --sim, in (0, 1]
g=(generate -m "$M" --sim "$P" --devices cpu,gpu --placement ngl=40 -p x -n 4)
if expect_ok "$Q" "${g[@]}" && cp "$tmp/err" "$tmp/dense.err" && expect_ok "$Q" "${g[@]}" --sim-cold-density 0.25; then
  rate() { sed -nE 's/.*generated [0-9]+ tokens in [0-9.]+ s \(([0-9.]+) t\/s\).*/\1/p' "$1" | head -1; }
  d=$(rate "$tmp/dense.err") s=$(rate "$tmp/err")
  awk -v d="$d" -v s="$s" 'BEGIN { exit !(d > 0 && s > d) }' || bad "density 0.25 not faster than dense: $s against $d tok/s"
fi
expect_fail 2 "option --sim-cold-density is a what-if of a simulated machine" "$Q" generate -m smollm2-135m -p x -n 2 \
  --sim-cold-density 0.5
expect_fail 2 "sim-cold-density" "$Q" "${g[@]}" --sim-cold-density 1.5
expect_fail 2 "sim-cold-density" "$Q" "${g[@]}" --sim-cold-density 0
expect_fail 2 "option --sim-cold-density: qinfer needle takes no neuron split" "$Q" needle -m "$M" --sim-cold-density 0.5

# bench: simulated rows, deterministic, labelled, in seconds
bench=("$Q" bench -m "$M" --sim "$P" --devices cpu,gpu --placement ngl=81 -p 64 -n 8 -b 1,4 -r 2 -o csv)
start=$(date +%s)
if expect_ok "${bench[@]}"; then
  cp "$tmp/out" "$tmp/run1.csv"
  col() { head -1 "$1" | tr ',' '\n' | grep -nx "$2" | cut -d: -f1; }
  sc=$(col "$tmp/run1.csv" simulated)
  [[ -n $sc ]] || bad "bench CSV has no simulated column"
  rows=$(tail -n +2 "$tmp/run1.csv" | wc -l)
  [[ $rows -eq 4 ]] || bad "bench: $rows rows, want 4"
  n_sim=$(tail -n +2 "$tmp/run1.csv" | grep -c '"a100-pcie-2xeon"$')
  [[ $n_sim -eq 4 ]] || bad "bench: $n_sim of 4 rows labelled simulated on a100-pcie-2xeon"
  grep -q '"SIM a100-pcie-2xeon"' "$tmp/run1.csv" || bad "bench: backend not SIM a100-pcie-2xeon"
  grep -q 'AMD\|EPYC' "$tmp/run1.csv" && bad "bench: a simulated row names this host's CPU"
  # decode of 36 GiB of weights on one A100: tens of tokens per second
  ac=$(col "$tmp/run1.csv" avg_ts)
  rate=$(python3 -c "import csv,sys; r=[x for x in csv.DictReader(open('$tmp/run1.csv')) if x['test']=='tg8']; print(r[0]['avg_ts'])")
  python3 -c "import sys; v=float('$rate'); sys.exit(0 if 15 < v < 60 else 1)" || bad "bench: simulated tg8 $rate t/s"
  if expect_ok "${bench[@]}"; then
    diff <(cut -d, -f"$ac" "$tmp/run1.csv") <(cut -d, -f"$ac" "$tmp/out") >/dev/null ||
      bad "bench: two simulated runs differ: $(cut -d, -f"$ac" "$tmp/run1.csv" | tr '\n' ' ') vs $(cut -d, -f"$ac" "$tmp/out" | tr '\n' ' ')"
  fi
fi
el=$(( $(date +%s) - start ))
[[ $el -lt 60 ]] || bad "two simulated 70B benches took $el s"
if expect_ok "$Q" bench -m "$M" --sim "$P" --devices cpu,gpu --placement ngl=81 -p 16 -n 4 -r 1; then
  grep -q "^SIMULATED machine a100-pcie-2xeon" "$tmp/out" || bad "bench md: no SIMULATED header: $(head -1 "$tmp/out")"
fi
expect_ok "$Q" bench --help && { grep -q -- "--sim PROFILE" "$tmp/out" || bad "bench --help lacks --sim"; }

# generate: simulated times, said so
if expect_ok "$Q" generate -m "$M" --sim "$P" --devices cpu,gpu:40G --placement policy:static -p hi -n 4 --ignore-eos --ids --profile; then
  grep -q "SIMULATED on a100-pcie-2xeon" "$tmp/err" || bad "generate does not say simulated: $(cat "$tmp/err")"
  grep -q "gpu:40G" "$tmp/err" || bad "generate --profile: no gpu:40G device: $(cat "$tmp/err")"
fi

# placement policies on the batched rows, the learning one re-planning as it goes
for pol in static gdcost; do
  if expect_ok "$Q" bench -m "$M" --sim "$P" --devices cpu,gpu:24G --placement "policy:$pol" -p 0 -n 8 -b 4 -d 128 -r 1 \
      --warmup 0 -o csv; then
    rate=$(python3 -c "import csv; r=list(csv.DictReader(open('$tmp/out'))); print(r[-1]['avg_ts'])")
    python3 -c "import sys; sys.exit(0 if 20 < float('$rate') < 200 else 1)" || bad "bench policy:$pol: $rate t/s"
  fi
done
expect_fail 2 "a placement policy runs on the batched rows only" "$Q" bench -m "$M" --sim "$P" --devices cpu,gpu \
  --placement policy:static -r 1
expect_fail 2 "unknown placement policy 'nope'" "$Q" bench -m "$M" --sim "$P" --devices cpu,gpu --placement policy:nope \
  -p 0 -n 4 -b 2 -r 1

# OPT and Falcon: shapes only, simulated only
O=$tmp/opt30.gguf
if expect_ok "$Q" synth --preset opt-30b --type f16 --shapes-only -o "$O"; then
  grep -q "opt-30b-shaped" "$tmp/err" || bad "synth opt-30b: $(cat "$tmp/err")"
  # 60 GB of fp16 weights on one A100: about 25 tokens/s
  if expect_ok "$Q" bench -m "$O" --sim "$P" --devices cpu,gpu --placement ngl=49 -p 64 -n 8 -r 1 -o csv; then
    rate=$(python3 -c "import csv; r=[x for x in csv.DictReader(open('$tmp/out')) if x['test']=='tg8']; print(r[0]['avg_ts'])")
    python3 -c "import sys; sys.exit(0 if 15 < float('$rate') < 35 else 1)" || bad "bench opt-30b: simulated tg8 $rate t/s"
  fi
  expect_ok "$Q" bench -m "$O" --sim "$P" --devices cpu,gpu --placement policy:static -p 0 -n 8 -b 4 -d 128 -r 1 \
    --warmup 0 -o csv
  expect_fail 1 "OPT runs on simulated devices only in this build" "$Q" generate -m "$O" -p hi -n 1
fi
if expect_ok "$Q" synth --preset falcon-40b --type q8_0 --shapes-only -o "$tmp/f40.gguf"; then
  expect_ok "$Q" bench -m "$tmp/f40.gguf" --sim "$P" --devices cpu,gpu --placement ngl=61 -p 64 -n 8 -r 1
fi
expect_fail 2 "preset falcon-40b is a falcon model, which runs on simulated devices only" \
  "$Q" synth --preset falcon-40b -o "$tmp/f.gguf"

# refusals
expect_fail 2 "has shapes only, no weights" "$Q" generate -m "$M" -p hi -n 1
expect_fail 2 "option --sim: qinfer ppl measures what the model computes" "$Q" ppl -m "$M" --sim "$P"
expect_fail 2 "option --sim: qinfer agree" "$Q" agree -m "$M" --sim "$P"
expect_fail 1 "$tmp/none.profile: cannot open" "$Q" bench -m "$M" --sim "$tmp/none.profile" -r 1
printf 'name = x\nkind = server\n' >"$tmp/bad.profile"
expect_fail 2 "bad.profile:2: .*missing" "$Q" generate -m "$M" --sim "$tmp/bad.profile" -p hi -n 1
expect_fail 2 "unknown parameter 'bogus'" "$Q" generate -m "$M" --sim "$P" --sim-param bogus=1 -p hi -n 1
expect_fail 2 "gpu_matmul_memory = 17 is not an efficiency in (0, 16\]" "$Q" generate -m "$M" --sim "$P" --sim-param gpu_matmul_memory=17 -p hi -n 1
expect_fail 2 "is a real device; a simulated machine has cpu and gpu" "$Q" generate -m "$M" --sim "$P" --devices cpu,testdev -p hi -n 1
expect_fail 1 "plan does not fit device gpu:10G" "$Q" generate -m "$M" --sim "$P" --devices cpu,gpu:10G --placement ngl=81 -p hi -n 1
if expect_ok "$Q" synth --n-layer 1 --n-vocab 300 -o "$tmp/small.gguf"; then
  expect_fail 2 "simulated machine's GPU: name its profile with --sim" "$Q" generate -m "$tmp/small.gguf" --devices cpu,gpu -p hi -n 1
fi

echo "test_sim: $passes passed, $fails failed"
[[ $fails -eq 0 ]]
