# compare_common.sh - what bench/compare_llama_bench.sh and
# bench/compare_llama_batched.sh share; sourced by them from the repository
# root, never run. The sourcing script sets `prog` (its name, for messages)
# first.

die() { echo "$prog: $*" >&2; exit 2; }
need_val() { [[ $# -ge 2 ]] || die "option $1 needs a value (see --help)"; }
posint() { [[ $2 =~ ^[0-9]+$ ]] && (($2 >= $3)) || die "option $1: '$2' is not an integer >= $3"; }

cache=${QINFER_CACHE:-$HOME/.cache/qinfer}

# llama_tool NAME: the path of llama.cpp's tool NAME, built from the
# llama-cpp-python sdist by tests/golden/build_llama.sh when it is missing.
llama_tool() {
  local tool=$cache/llama.cpp/build/bin/$1
  if [[ ! -x $tool ]]; then
    echo "$prog: $1 missing; building it with tests/golden/build_llama.sh" >&2
    bash tests/golden/build_llama.sh >&2
    [[ -x $tool ]] || die "tests/golden/build_llama.sh did not produce $tool"
  fi
  echo "$tool"
}

# model_path MODEL: MODEL itself when it is a file, else the cached file of
# that short name in models/manifest.tsv.
model_path() {
  if [[ -f $1 ]]; then
    echo "$1"
    return
  fi
  local file
  file=$(awk -F'\t' -v n="$1" '$1 == n && $2 == "model" { print $5 }' models/manifest.tsv)
  [[ -n $file ]] || die "'$1' is neither a file nor a model name in models/manifest.tsv"
  [[ -f $cache/models/$file ]] || die "$1 is not fetched: run models/fetch.sh $1"
  echo "$cache/models/$file"
}

# The machine's physical cores (both programs' default thread count).
physical_cores() {
  awk -F: '/^physical id/ { p = $2 } /^core id/ { c[p "," $2] = 1 } END { print (length(c) > 0 ? length(c) : 1) }' /proc/cpuinfo
}

# run_rounds N: rounds 1..N, each running the sourcing script's run_llama R
# and run_qinfer R, the first program alternating so that drift in the
# machine's load (other jobs, thermals) does not always favour the same one.
# Sets load0 and load1 (the load averages before and after) and secs.
run_rounds() {
  local t0 r
  load0=$(cut -d' ' -f1-3 /proc/loadavg)
  t0=$(date +%s)
  for ((r = 1; r <= $1; r++)); do
    if ((r % 2)); then run_llama $r; run_qinfer $r; else run_qinfer $r; run_llama $r; fi
  done
  load1=$(cut -d' ' -f1-3 /proc/loadavg)
  secs=$(($(date +%s) - t0))
}
