#!/usr/bin/env bash
# The GPU machine check: build qinfer with CUDA (no Check, no pkg-config
# needed) for the GPU it finds, and verify the CUDA device on it. Run from a
# copy of the tree that carries .gpu-deps/ (made by tests/gpu/prepare.sh)
# when the machine lacks PCRE2's development files.
#
#   OUT=/some/dir tests/gpu/check.sh      (or: tests/gpu/check.sh /some/dir)
#
# Steps, each printed, timed and bounded by `timeout`: tool versions; unpack
# .gpu-deps/*.deb into the build folder (never into /); configure (Ninja
# when found, else make; -DQI_CUDA=ON -DQI_BUILD_TESTS=OFF, Release, CUDA
# architecture native); build qinfer and qi_gpucheck; nvidia-smi; qinfer
# sysinfo; qinfer sysinfo --probe; tests/gpu/test_probe.sh (sane numbers);
# every CUDA op against its reference (qi_gpucheck ops); synthetic models
# (qinfer synth: the SmolLM2, Gemma 3 and LLaMA-7B shapes); greedy ids on
# the GPU against the CPU (all layers, ngl=half, split attention), and on a
# capped GPU (--devices cpu,cuda:2G) that holds less than half of the
# LLaMA-7B shape; the speed table (prefill and decode tokens/s of all-CPU,
# all-GPU, ngl=half and split attention at batch 1, 16, 64, and decode's
# share of the measured HBM bandwidth); CUPTI's records of the kernels and
# copies of a bench run beside the engine's event timing (qinfer bench
# --cupti); the FFN's hot neurons on the GPU at 25%, 50% and 100% of the
# FFN against ngl=half (qinfer bench --neuron-policy, the speed ratio
# calibrated on the devices); a PyTorch cross-check of the probe's copies
# when torch is importable (information only).
# A failed step does not stop the independent ones. Everything goes to
# stdout and $OUT/check.log (default build-gpu-out); the last line is
# "check.sh: PASS ..." or "check.sh: FAIL ..."; the exit status is 0 only
# on PASS. Environment: QI_GPU_BUILD (build folder, default build-gpu),
# QI_GPU_DEPS (folder of .debs, default .gpu-deps; "system" to use the
# installed PCRE2 through pkg-config instead).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
[[ ${1:-} == -h || ${1:-} == --help ]] && { sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//'; exit 0; }
root=$PWD
B=${QI_GPU_BUILD:-build-gpu}
export DEPS=${QI_GPU_DEPS:-.gpu-deps}
# The build folder is wiped first, so it must be a git-ignored build*/ here.
[[ $B =~ ^build[A-Za-z0-9._-]*$ ]] || { echo "check.sh: QI_GPU_BUILD must be build*, not '$B'" >&2; exit 1; }
export OUT=${1:-${OUT:-$root/$B-out}}
mkdir -p "$OUT" || exit 1

failed=()
t_start=$(date +%s.%N)

elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

# step NAME LIMIT_S CMD...: run CMD with stdin closed and a time limit;
# record NAME as failed unless it exits 0. Returns CMD's status.
step() {
  local name=$1 limit=$2; shift 2
  echo
  echo "== [$name] $* (limit ${limit}s)"
  local t0 rc
  t0=$(date +%s.%N)
  if [[ $(type -t "$1") == function ]]; then # timeout runs programs, not functions
    timeout -k 5 "$limit" bash -c "$(declare -f "$1"); \"\$@\"" _ "$@" </dev/null
  else
    timeout -k 5 "$limit" "$@" </dev/null
  fi
  rc=$?
  if [[ $rc -eq 0 ]]; then
    echo "-- [$name] ok ($(elapsed "$t0")s)"
  elif [[ $rc -eq 77 ]]; then
    echo "-- [$name] FAILED: it skipped (exit 77, no usable GPU), and this check needs one"
    failed+=("$name")
  else
    [[ $rc -eq 124 || $rc -eq 137 ]] && echo "-- [$name] timed out after ${limit}s"
    echo "-- [$name] FAILED, exit $rc ($(elapsed "$t0")s)"
    failed+=("$name")
  fi
  return $rc
}

# skip NAME WHY: a step that cannot run because an earlier one failed.
skip() { echo; echo "-- [$1] not run: $2"; failed+=("$1"); }

# find_tool NAME PYMODULE ATTR: NAME on PATH, else the binary a pip package
# installs (python3 -c 'import cmake; cmake.CMAKE_BIN_DIR'), else its
# script in Python's scripts folders, else nothing.
find_tool() {
  local p
  p=$(command -v "$1") && { echo "$p"; return; }
  p=$(timeout 30 python3 -c "import $2, os; print(os.path.join($2.$3, '$1'))" 2>/dev/null) &&
    [[ -x $p ]] && { echo "$p"; return; }
  for p in "$(timeout 30 python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))' 2>/dev/null)/$1" \
           "$HOME/.local/bin/$1"; do
    [[ -x $p ]] && { echo "$p"; return; }
  done
  return 0
}

find_nvcc() {
  local p
  p=$(command -v nvcc) && { echo "$p"; return; }
  for p in "${CUDA_HOME:-}/bin/nvcc" "${CUDA_PATH:-}/bin/nvcc" /usr/local/cuda/bin/nvcc \
           $(printf '%s\n' /usr/local/cuda-*/bin/nvcc | sort -V -r); do
    [[ -x $p ]] && { echo "$p"; return; }
  done
}

# tools CMAKE NVCC [NINJA]: the versions that built this run.
# shellcheck disable=SC2317 # called by name through step
tools() {
  "$1" --version | head -1 && "$2" --version | tail -2 && cc --version | head -1 &&
    { [[ -z ${3:-} ]] || echo "ninja $("$3" --version)"; }
}

# Unpack every .deb of $DEPS into $1 with dpkg-deb, or ar + tar without it.
# shellcheck disable=SC2317 # called by name through step
unpack_debs() {
  local prefix=$1 deb
  rm -rf "$prefix" && mkdir -p "$prefix" || return 1
  (cd "$DEPS" && sha256sum -c SHA256SUMS) || return 1
  for deb in "$DEPS"/*.deb; do
    echo "unpack $(basename "$deb")"
    if command -v dpkg-deb >/dev/null; then
      dpkg-deb -x "$deb" "$prefix" || return 1
    else
      local data z=()
      data=$(ar t "$deb" | grep '^data\.tar') || return 1
      case $data in # tar cannot guess the compression of a pipe
        *.xz) z=(-J) ;; *.gz) z=(-z) ;; *.zst) z=(--zstd) ;; *.bz2) z=(-j) ;;
      esac
      ar p "$deb" "$data" | tar -x "${z[@]}" -C "$prefix" -f - || return 1
    fi
  done
  ls -l "$prefix"/usr/include/pcre2.h "$prefix"/usr/lib/*/libpcre2-8.so*
}

# synth_models QINFER DIR: the shapes the GPU checks run, random weights.
# shellcheck disable=SC2317 # called by name through step
synth_models() {
  mkdir -p "$2" &&
    "$1" synth -o "$2/smollm2.gguf" --preset smollm2-135m --type q8_0 &&
    "$1" synth -o "$2/gemma3.gguf" --preset gemma3-270m --type q8_0 &&
    "$1" synth -o "$2/llama7b.gguf" --preset llama-7b --type q4_0
}

# neuron_bench QINFER MODEL FILE: the FFN's hot neurons on the GPU (a
# uniform profile, the qinfer policy with its ratio timed on the devices)
# at 25%, 50% and 100% of the FFN against whole layers (ngl=half), batch 1
# and 16, and at 50% with the policy's swaps (between steps, and by the
# background worker uploading on the GPU's copy stream, then on its main
# one: what the copy stream saves): every run must finish, and FILE holds
# the rows and the ratio.
# shellcheck disable=SC2317 # called by name through step
neuron_bench() {
  local q=$1 m=$2 f=$3 b n
  : >"$f"
  n=$("$q" inspect "$m" 2>/dev/null | awk '/\.block_count / { print $NF; exit }')
  for b in 25% 50% 100%; do
    echo "== hot neurons $b" >>"$f"
    "$q" bench -m "$m" --devices cpu,cuda -p 0 -n 32 -b 1,16 -r 2 --neuron-policy qinfer:ratio=auto \
      --neuron-profile uniform --neuron-budget "$b" >>"$f" 2>&1 || return 1
  done
  # the qinfer policy's swaps at 50%: between steps, then by the background
  # worker, its uploads on the GPU's copy stream (beside the steps' ops) and
  # on its main one (among them)
  echo "== hot neurons 50%, swaps every 4 steps" >>"$f"
  "$q" bench -m "$m" --devices cpu,cuda -p 0 -n 32 -b 1,16 -r 2 --neuron-policy qinfer:ratio=auto \
    --neuron-profile uniform --neuron-budget 50% --neuron-swap-every 4 >>"$f" 2>&1 || return 1
  for s in copy main; do
    echo "== hot neurons 50%, swaps every 4 steps by the background worker, uploads on the $s stream" >>"$f"
    "$q" bench -m "$m" --devices cpu,cuda -p 0 -n 32 -b 1,16 -r 2 --neuron-policy qinfer:ratio=auto \
      --neuron-profile uniform --neuron-budget 50% --neuron-swap-every 4 --neuron-swap-worker \
      --neuron-swap-stream "$s" >>"$f" 2>&1 || return 1
  done
  echo "== ngl=$((${n:-32} / 2))" >>"$f"
  "$q" bench -m "$m" --devices cpu,cuda -p 0 -n 32 -b 1,16 -r 2 --placement "ngl=$((${n:-32} / 2))" >>"$f" 2>&1 || return 1
  grep -E "ratio calibrated|neuron split|neuron swaps|tg32 @ b" "$f"
}

# cupti_bench QINFER MODEL FILE: bench's pp64 and tg32 rows with every
# layer and the output head on the GPU, CUPTI recording; the output (in
# FILE) must hold both rows' comparison, kernels recorded and no dropped
# record.
# shellcheck disable=SC2317 # called by name through step
cupti_bench() {
  "$1" bench -m "$2" -p 64 -n 32 -r 1 --devices cpu,cuda --placement ngl=31 --cupti --probe-mib 0 2>&1 | tee "$3"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || return 1
  local row
  for row in pp64 tg32; do
    if ! grep -Eq "CUPTI of $row: [1-9][0-9]* kernels" "$3" || ! grep -q "events / CUPTI of $row: " "$3"; then
      echo "cupti: no kernels or no comparison for $row"
      return 1
    fi
  done
  if grep -q DROPPED "$3"; then echo "cupti: CUPTI dropped records"; return 1; fi
}

main() {
  echo "check.sh: qinfer GPU check in $root, build folder $B, log $OUT/check.log"
  # shellcheck disable=SC1091
  echo "host: $(uname -srm), $(nproc) CPUs, $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME")"

  local cmake ninja nvcc gen=() jobs
  jobs=$(nproc)
  cmake=$(find_tool cmake cmake CMAKE_BIN_DIR)
  ninja=$(find_tool ninja ninja BIN_DIR)
  nvcc=$(find_nvcc)
  echo "cmake: ${cmake:-none}; ninja: ${ninja:-none (make)}; nvcc: ${nvcc:-none}; cc: $(command -v cc || echo none)"
  if [[ -n $ninja ]]; then
    gen=(-G Ninja -DCMAKE_MAKE_PROGRAM="$ninja")
    PATH="$(dirname "$ninja"):$PATH"
    export PATH
  fi
  step tools 60 tools "${cmake:-cmake}" "${nvcc:-nvcc}" "$ninja"

  # PCRE2: the unpacked packages, found by CMake without pkg-config.
  local dep_flags=() prefix=$root/$B/deps libdir
  rm -rf "$B"
  mkdir -p "$B"
  if [[ $DEPS == system ]]; then
    echo; echo "-- [deps] using the installed PCRE2 through pkg-config"
  elif compgen -G "$DEPS/*.deb" >/dev/null; then
    if [[ $(uname -m) != x86_64 ]]; then
      echo; echo "-- [deps] $DEPS holds amd64 packages but this machine is $(uname -m)"
      failed+=(deps)
    elif step deps 60 unpack_debs "$prefix"; then
      libdir=$(dirname "$(compgen -G "$prefix/usr/lib/*/libpcre2-8.so" | head -1)")
      dep_flags=(-DCMAKE_DISABLE_FIND_PACKAGE_PkgConfig=ON -DCMAKE_PREFIX_PATH="$prefix/usr"
                 -DQI_PCRE2_INCLUDE_DIR="$prefix/usr/include" -DQI_PCRE2_LIBRARY="$libdir/libpcre2-8.so")
      export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    fi
  else
    echo; echo "-- [deps] no $DEPS/*.deb (run tests/gpu/prepare.sh where packages can be fetched);"
    echo "   trying the installed PCRE2 through pkg-config"
  fi
  if [[ -n $nvcc ]]; then
    LD_LIBRARY_PATH="$(dirname "$(dirname "$nvcc")")/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export LD_LIBRARY_PATH
  fi

  # the GPU's own architecture; where none answers (trying the script out
  # on a machine without one), Hopper's, so the build still runs
  local arch=native
  nvidia-smi -L >/dev/null 2>&1 || arch=90-real
  echo "CUDA architecture: $arch"
  local Q=$root/$B/qinfer
  if [[ -z $cmake || -z $nvcc ]]; then
    skip configure "cmake or nvcc not found"
    skip build "not configured"
  elif step configure 150 "$cmake" -S . -B "$B" "${gen[@]}" -DQI_CUDA=ON -DQI_BUILD_TESTS=OFF \
         -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="$nvcc" -DCMAKE_CUDA_ARCHITECTURES="$arch" \
         "${dep_flags[@]}"; then
    step build 300 "$cmake" --build "$B" -j"$jobs" --target qinfer qi_gpucheck &&
      { ldd "$Q" | grep -E 'pcre2|cudart|not found'; true; }
  else
    skip build "configure failed"
  fi

  step nvidia-smi 30 nvidia-smi
  step nvidia-smi-query 30 nvidia-smi --format=csv --query-gpu=name,driver_version,memory.total,pcie.link.gen.max,pcie.link.gen.current,pcie.link.width.max,pcie.link.width.current,clocks.max.memory ||
    { unset 'failed[-1]'; echo "   (information only)"; }

  if [[ -x $Q ]]; then
    step sysinfo 60 bash -o pipefail -c "'$Q' sysinfo 2>&1 | tee '$OUT/sysinfo.txt'"
    step probe 120 bash -o pipefail -c "'$Q' sysinfo --probe 2>&1 | tee '$OUT/probe.txt'"
    step test_probe 120 bash tests/gpu/test_probe.sh "$Q"
  else
    skip sysinfo "no qinfer binary"
    skip probe "no qinfer binary"
    skip test_probe "no qinfer binary"
  fi
  local G=$root/$B/qi_gpucheck M=$root/$B/models
  if [[ -x $G && -x $Q ]]; then
    step ops 300 bash -o pipefail -c "'$G' ops | tee '$OUT/ops.txt'"
    if step synth 180 synth_models "$Q" "$M"; then
      step greedy 420 bash -o pipefail -c "'$G' greedy '$M/smollm2.gguf' '$M/gemma3.gguf' '$M/llama7b.gguf' | tee '$OUT/greedy.txt'"
      step greedy-capped 300 bash -o pipefail -c "'$G' greedy --gpu-mem 2G '$M/llama7b.gguf' | tee '$OUT/greedy_capped.txt'"
      local hbm
      hbm=$(awk '/^d2d:/ { print $2 }' "$OUT/probe.txt" 2>/dev/null)
      step speed-smollm2 300 bash -o pipefail -c "'$G' speed '$M/smollm2.gguf' ${hbm:-0} | tee '$OUT/speed_smollm2.txt'"
      step speed-llama7b 420 bash -o pipefail -c "'$G' speed '$M/llama7b.gguf' ${hbm:-0} | tee '$OUT/speed_llama7b.txt'"
      step cupti 180 cupti_bench "$Q" "$M/smollm2.gguf" "$OUT/cupti.txt"
      step neuron-split 300 neuron_bench "$Q" "$M/llama7b.gguf" "$OUT/neuron_split.txt"
    else
      for s in greedy greedy-capped speed-smollm2 speed-llama7b cupti neuron-split; do skip "$s" "no synthetic models"; done
    fi
  else
    for s in ops synth greedy greedy-capped speed-smollm2 speed-llama7b cupti neuron-split; do skip "$s" "not built"; done
  fi
  if timeout 60 python3 -c 'import torch' 2>/dev/null; then
    step torch-bw 120 python3 tests/gpu/torch_bw.py || { unset 'failed[-1]'; echo "   (information only)"; }
  else
    echo; echo "-- [torch-bw] not run: torch is not importable (information only)"
  fi

  echo
  if [[ ${#failed[@]} -eq 0 ]]; then
    echo "check.sh: PASS (all steps, $(elapsed "$t_start")s)"
  else
    echo "check.sh: FAIL: ${failed[*]} ($(elapsed "$t_start")s)"
    return 1
  fi
}

main 2>&1 | tee "$OUT/check.log"
exit "${PIPESTATUS[0]}"
