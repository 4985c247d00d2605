#!/usr/bin/env bash
# Compare `qinfer bench` with llama.cpp's llama-bench on the same model file,
# thread count and test sizes, in alternating rounds.
#
#   bench/compare_llama_bench.sh [-m MODEL] [-t N] [-p N] [-n N] [--rounds N] [-r N]
#                                [--qinfer PATH] [--llama-args "ARGS"]
#
#   -m MODEL        GGUF path or cached short name (default smollm2-135m)
#   -t N            threads for both (default: physical cores)
#   -p N, -n N      prompt and decode test sizes (default 512 and 128)
#   --rounds N      alternating rounds (default 3); each round runs both
#                   programs once, the first program alternating per round
#   -r N            repetitions per program per round (default 1)
#   --qinfer PATH   the qinfer binary (default build/qinfer)
#   --llama-args A  extra llama-bench arguments (e.g. "--poll 0")
#   --qinfer-args A extra qinfer bench arguments (e.g. "--attn-blas" or
#                   "--repack": options that leave llama.cpp's order)
#
# llama-bench is the one built from the llama-cpp-python sdist
# (tests/golden/build_llama.sh, run when it is missing). It runs with flash
# attention off (-fa 0: qinfer's attention follows llama.cpp's non-flash path)
# and --repack 0 (no repacked/AMX weight buffers: plain Q4/Q8 weights, as
# qinfer reads them; the AMX path also dies with SIGILL where the CPU
# advertises AMX that the OS has not enabled). Prints each round's figures,
# the medians over rounds and the ratio qinfer/llama.cpp, memory bandwidth
# and roofline share (qinfer's probe), and both programs' peak RSS.
set -euo pipefail
cd "$(dirname "$0")/.."

model=smollm2-135m threads="" n_prompt=512 n_gen=128 rounds=3 reps=1 qinfer=build/qinfer llama_args="" qinfer_args=""
prog=compare_llama_bench
# shellcheck source=bench/compare_common.sh
source bench/compare_common.sh
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -m) need_val "$@"; model=$2; shift ;;
    -t) need_val "$@"; posint "$1" "$2" 1; threads=$2; shift ;;
    -p) need_val "$@"; posint "$1" "$2" 1; n_prompt=$2; shift ;;
    -n) need_val "$@"; posint "$1" "$2" 1; n_gen=$2; shift ;;
    --rounds) need_val "$@"; posint "$1" "$2" 1; rounds=$2; shift ;;
    -r) need_val "$@"; posint "$1" "$2" 1; reps=$2; shift ;;
    --qinfer) need_val "$@"; qinfer=$2; shift ;;
    --llama-args) need_val "$@"; llama_args=$2; shift ;;
    --qinfer-args) need_val "$@"; qinfer_args=$2; shift ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
  shift
done

[[ -x $qinfer ]] || die "no qinfer binary at $qinfer (build it: cmake -S . -B build && cmake --build build, or pass --qinfer)"
command -v python3 >/dev/null || die "python3 is needed to read the CSV rows"

path=$(model_path "$model")
[[ -n $threads ]] || threads=$(physical_cores)
llama_bench=$(llama_tool llama-bench)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# peak_rss OUT CMD...: run CMD, writing its peak RSS in KiB (ru_maxrss) to OUT.
peak_rss() {
  local out=$1; shift
  if [[ -x /usr/bin/time ]]; then
    /usr/bin/time -v -o "$out.time" "$@" || return
    awk -F': ' '/Maximum resident set size/ { print $2 }' "$out.time" >"$out"
  else
    python3 -c 'import resource, subprocess, sys
rc = subprocess.call(sys.argv[2:])
open(sys.argv[1], "w").write("%d\n" % resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
sys.exit(rc)' "$out" "$@"
  fi
}

run_llama() {
  local r=$1
  echo "round $r: llama-bench -p $n_prompt -n $n_gen -r $reps -t $threads -fa 0 --repack 0 $llama_args" >&2
  # shellcheck disable=SC2086  # llama_args is split on purpose
  peak_rss "$tmp/llama.$r.rss" "$llama_bench" -m "$path" -p "$n_prompt" -n "$n_gen" -r "$reps" -t "$threads" \
    -fa 0 --repack 0 $llama_args -o csv >"$tmp/llama.$r.csv" 2>"$tmp/llama.$r.err" ||
    { tail -n 5 "$tmp/llama.$r.err" >&2; die "llama-bench failed in round $r"; }
}
run_qinfer() {
  local r=$1
  echo "round $r: qinfer bench -p $n_prompt -n $n_gen -r $reps -t $threads $qinfer_args" >&2
  # shellcheck disable=SC2086  # qinfer_args is split on purpose
  "$qinfer" bench -m "$path" -p "$n_prompt" -n "$n_gen" -r "$reps" -t "$threads" $qinfer_args -o csv \
    >"$tmp/qinfer.$r.csv" 2>"$tmp/qinfer.$r.err" ||
    { tail -n 5 "$tmp/qinfer.$r.err" >&2; die "qinfer bench failed in round $r"; }
}

run_rounds "$rounds"

python3 - "$tmp" "$rounds" "$n_prompt" "$n_gen" "$threads" "$path" "$load0" "$load1" "$secs" <<'EOF'
import csv, statistics, sys
tmp, rounds, n_prompt, n_gen, threads, path, load0, load1, secs = sys.argv[1:]
rounds = int(rounds)
pp, tg = "pp%s" % n_prompt, "tg%s" % n_gen

def rows(f):
    return list(csv.DictReader(open(f)))

def test_name(r):
    return r["test"] if "test" in r else ("pp%s" % r["n_prompt"] if int(r["n_prompt"]) else "tg%s" % r["n_gen"])

res = {"llama.cpp": [], "qinfer": []}
for k in range(1, rounds + 1):
    lr = {test_name(r): float(r["avg_ts"]) for r in rows("%s/llama.%d.csv" % (tmp, k))}
    lr["rss"] = int(open("%s/llama.%d.rss" % (tmp, k)).read()) * 1024
    qrows = rows("%s/qinfer.%d.csv" % (tmp, k))
    qr = {r["test"]: float(r["avg_ts"]) for r in qrows}
    qr["rss"] = int(qrows[0]["peak_rss_bytes"])
    qr["bw"] = float(qrows[0]["mem_bw_gbs"]) if qrows[0]["mem_bw_gbs"] else None
    res["llama.cpp"].append(lr)
    res["qinfer"].append(qr)
q0 = qrows[0]
l0 = rows("%s/llama.1.csv" % tmp)[0]

print("model: %s (%s, %.2f MiB); threads: %s; %d alternating rounds" % (path, q0["model_type"], int(q0["model_size"]) / 2**20, threads, rounds))
print("hardware: %s, %s physical cores (%s logical); load average %s at the start, %s at the end; %s s in all"
      % (q0["cpu"], q0["n_cores"], q0["n_logical"], load0, load1, secs))
print("llama.cpp: llama-bench build %s, backend %s, flash attention off (-fa 0), no repacked/AMX weights (--repack 0)"
      % (l0["build_commit"], l0["backends"]))
print("qinfer: %s, backend %s" % (q0["qinfer_version"], q0["backend"]))
print()
print("| round | program   | %10s | %10s | peak RSS MiB |" % (pp + " t/s", tg + " t/s"))
print("| ----: | --------- | ---------: | ---------: | -----------: |")
for k in range(rounds):
    for prog in ("llama.cpp", "qinfer"):
        r = res[prog][k]
        print("| %5d | %-9s | %10.2f | %10.2f | %12.1f |" % (k + 1, prog, r.get(pp, float("nan")), r.get(tg, float("nan")), r["rss"] / 2**20))
print()
med = {p: {t: statistics.median(r[t] for r in res[p]) for t in (pp, tg)} for p in res}
print("| test   | llama.cpp t/s (median) | qinfer t/s (median) | qinfer / llama.cpp |")
print("| ------ | ---------------------: | ------------------: | -----------------: |")
for t in (pp, tg):
    print("| %-6s | %22.2f | %19.2f | %18.2f |" % (t, med["llama.cpp"][t], med["qinfer"][t], med["qinfer"][t] / med["llama.cpp"][t]))
print()
bws = [r["bw"] for r in res["qinfer"] if r["bw"]]
btok = int(q0["weight_bytes_per_token"])
print("weights read per decoded token: %.1f MB" % (btok / 1e6))
if bws:
    bw = statistics.median(bws)
    print("memory read bandwidth (qinfer's probe, threads: %s, median of %d rounds): %.1f GB/s" % (threads, len(bws), bw))
    for p in ("llama.cpp", "qinfer"):
        print("decode roofline share, %-9s: %.2f t/s x %.1f MB = %.2f GB/s = %.1f%% of the measured bandwidth"
              % (p, med[p][tg], btok / 1e6, med[p][tg] * btok / 1e9, 100 * med[p][tg] * btok / 1e9 / bw))
print("peak RSS (largest over rounds): llama-bench %.1f MiB (/usr/bin/time -v), qinfer %.1f MiB (its getrusage; the bandwidth probe's child process excluded)"
      % (max(r["rss"] for r in res["llama.cpp"]) / 2**20, max(r["rss"] for r in res["qinfer"]) / 2**20))
EOF
