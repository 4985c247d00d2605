#!/usr/bin/env bash
# Compare batched decode: qinfer's engine (`qinfer bench --batch`) against
# llama.cpp's llama-batched-bench on the same model file and threads, in
# alternating rounds.
#
#   bench/compare_llama_batched.sh [-m MODEL] [-t N] [-n N] [-b LIST] [--rounds N]
#                                  [--qinfer PATH] [--llama-args "ARGS"] [--qinfer-args "ARGS"]
#
#   -m MODEL        GGUF path or cached short name (default smollm2-135m)
#   -t N            threads for both (default: physical cores)
#   -n N            decode steps per sequence (default 64)
#   -b LIST         batch sizes, a comma list (default 1,4,16)
#   --rounds N      alternating rounds (default 3); each round runs both
#                   programs once, the first program alternating per round
#   --qinfer PATH   the qinfer binary (default build/qinfer)
#   --llama-args A  extra llama-batched-bench arguments (e.g. "--poll 0")
#   --qinfer-args A extra qinfer bench arguments (e.g. "--repack")
#
# Both sides run B sequences of a 4-token prompt each and then time N
# steps that decode one token for every sequence: llama-batched-bench with
# -npp 4 -ntg N -npl LIST (its S_TG t/s is B x N / the steps' seconds) and
# qinfer bench -p 0 -n N -b LIST (its tg<N> @ b<B> rows, one repetition per
# round). llama.cpp runs with flash attention off and without repacked
# weights, as in compare_llama_bench.sh. Prints every round, the medians, each
# program's batch-B rate over its own batch-1 rate, and qinfer / llama.cpp.
# llama-batched-bench is built from the llama-cpp-python sdist
# (tests/golden/build_llama.sh, run when it is missing).
set -euo pipefail
cd "$(dirname "$0")/.."

model=smollm2-135m threads="" n_gen=64 batches=1,4,16 rounds=3 qinfer=build/qinfer llama_args="" qinfer_args=""
prog=compare_llama_batched
# shellcheck source=bench/compare_common.sh
source bench/compare_common.sh
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) sed -n '2,28p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -m) need_val "$@"; model=$2; shift ;;
    -t) need_val "$@"; posint "$1" "$2" 1; threads=$2; shift ;;
    -n) need_val "$@"; posint "$1" "$2" 1; n_gen=$2; shift ;;
    -b) need_val "$@"; [[ $2 =~ ^[0-9]+(,[0-9]+)*$ ]] || die "option -b: '$2' is not a comma list of batch sizes"
        batches=$2; shift ;;
    --rounds) need_val "$@"; posint "$1" "$2" 1; rounds=$2; shift ;;
    --qinfer) need_val "$@"; qinfer=$2; shift ;;
    --llama-args) need_val "$@"; llama_args=$2; shift ;;
    --qinfer-args) need_val "$@"; qinfer_args=$2; shift ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
  shift
done
IFS=, read -ra blist <<<"$batches"
for b in "${blist[@]}"; do ((b >= 1 && b <= 256)) || die "option -b: batch size $b is outside 1..256"; done

[[ -x $qinfer ]] || die "no qinfer binary at $qinfer (build it: cmake -S . -B build && cmake --build build, or pass --qinfer)"
command -v python3 >/dev/null || die "python3 is needed to read the result rows"

path=$(model_path "$model")
[[ -n $threads ]] || threads=$(physical_cores)
llama_bb=$(llama_tool llama-batched-bench)
maxb=0
for b in "${blist[@]}"; do ((b > maxb)) && maxb=$b; done
ctx=$(((4 + n_gen) * maxb + 64))

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

run_llama() {
  local r=$1
  echo "round $r: llama-batched-bench -npp 4 -ntg $n_gen -npl $batches -t $threads -c $ctx -fa off --no-repack $llama_args" >&2
  # shellcheck disable=SC2086  # llama_args is split on purpose
  "$llama_bb" -m "$path" -npp 4 -ntg "$n_gen" -npl "$batches" -t "$threads" -c "$ctx" -fa off --no-repack \
    $llama_args --output-format jsonl >"$tmp/llama.$r.jsonl" 2>"$tmp/llama.$r.err" ||
    { tail -n 5 "$tmp/llama.$r.err" >&2; die "llama-batched-bench failed in round $r"; }
}
run_qinfer() {
  local r=$1
  echo "round $r: qinfer bench -p 0 -n $n_gen -b $batches -r 1 -t $threads --probe-mib 0 $qinfer_args" >&2
  # shellcheck disable=SC2086  # qinfer_args is split on purpose
  "$qinfer" bench -m "$path" -p 0 -n "$n_gen" -b "$batches" -r 1 -t "$threads" --probe-mib 0 $qinfer_args -o csv \
    >"$tmp/qinfer.$r.csv" 2>"$tmp/qinfer.$r.err" ||
    { tail -n 5 "$tmp/qinfer.$r.err" >&2; die "qinfer bench failed in round $r"; }
}

run_rounds "$rounds"

python3 - "$tmp" "$rounds" "$n_gen" "$batches" "$threads" "$path" "$load0" "$load1" "$secs" <<'EOF'
import csv, json, statistics, sys
tmp, rounds, n_gen, batches, threads, path, load0, load1, secs = sys.argv[1:]
rounds, bl = int(rounds), [int(b) for b in batches.split(",")]
res = {"llama.cpp": [], "qinfer": []}
for k in range(1, rounds + 1):
    lr = {}
    for line in open("%s/llama.%d.jsonl" % (tmp, k)):
        line = line.strip()
        if line.startswith("{"):
            j = json.loads(line)
            if "pl" in j:
                lr[int(j["pl"])] = float(j["speed_tg"])
    qrows = list(csv.DictReader(open("%s/qinfer.%d.csv" % (tmp, k))))
    qr = {int(r["batch"]): float(r["avg_ts"]) for r in qrows if r["test"].startswith("tg") and "@" in r["test"]}
    res["llama.cpp"].append(lr)
    res["qinfer"].append(qr)
q0 = qrows[0]
print("model: %s (%s); threads: %s; %d alternating rounds; %s decode steps after a 4-token prompt per sequence"
      % (path, q0["model_type"], threads, rounds, n_gen))
print("hardware: %s, %s physical cores (%s logical); load average %s at the start, %s at the end; %s s in all"
      % (q0["cpu"], q0["n_cores"], q0["n_logical"], load0, load1, secs))
print("llama.cpp: llama-batched-bench, flash attention off, no repacked weights; qinfer: %s, backend %s"
      % (q0["qinfer_version"], q0["backend"]))
print()
print("| round | program   | " + " | ".join("b%d t/s" % b for b in bl) + " |")
print("| ----: | --------- | " + " | ".join("-" * 7 + ":" for b in bl) + " |")
for k in range(rounds):
    for p in ("llama.cpp", "qinfer"):
        print("| %5d | %-9s | " % (k + 1, p) + " | ".join("%8.1f" % res[p][k].get(b, float("nan")) for b in bl) + " |")
print()
med = {p: {b: statistics.median(r[b] for r in res[p] if b in r) for b in bl} for p in res}
print("| batch | llama.cpp t/s (median) | qinfer t/s (median) | qinfer / llama.cpp | llama.cpp / own b%d | qinfer / own b%d |" % (bl[0], bl[0]))
print("| ----: | ---------------------: | ------------------: | -----------------: | ----------------: | --------------: |")
for b in bl:
    print("| %5d | %22.1f | %19.1f | %18.2f | %17.2f | %15.2f |" % (
        b, med["llama.cpp"][b], med["qinfer"][b], med["qinfer"][b] / med["llama.cpp"][b],
        med["llama.cpp"][b] / med["llama.cpp"][bl[0]], med["qinfer"][b] / med["qinfer"][bl[0]]))
EOF
