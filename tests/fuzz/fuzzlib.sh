# fuzzlib.sh - shared by campaign.sh and burst.sh (sourced): the libFuzzer
# build and the summary of a run's log.

# The list of targets in the order the scripts run them.
FZ_TARGETS=(gguf tok_bpe tok_spm plan json hwprofile simcal nprofile sparsity lua serve http merge)

# Exits 77 with the reason when clang cannot build a libFuzzer program.
fz_need_libfuzzer() {
  local t
  t=$(mktemp -d)
  if ! command -v clang >/dev/null; then
    echo "fuzz: skipped: no clang here (Debian: apt-get install clang libclang-rt-14-dev; scripts/setup.sh installs them)"
    rm -rf "$t"; exit 77
  fi
  printf '#include <stddef.h>\n#include <stdint.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n' >"$t/t.c"
  if ! clang -fsanitize=fuzzer,address,undefined "$t/t.c" -o "$t/t" 2>"$t/err" || ! "$t/t" -runs=1 >/dev/null 2>&1; then
    echo "fuzz: skipped: clang cannot build or run a libFuzzer program here ($(head -c 300 "$t/err"))"
    rm -rf "$t"; exit 77
  fi
  rm -rf "$t"
}

# Configures (once) and builds the fuzz targets in $FZ_BUILD with clang and
# -DQI_FUZZ=ON, then writes the binary seeds into $FZ_BUILD/fuzz-seeds
# (make_seeds.sh: the GGUF models, the results databases) with the qinfer
# named by $QI_FUZZ_QINFER (tests/run.sh: its Release build's), else one
# built here too; the output of both goes to $FZ_BUILD/build.log.
fz_build() {
  if [[ ! -f $FZ_BUILD/CMakeCache.txt ]]; then
    CC=clang cmake -S "$FZ_ROOT" -B "$FZ_BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DQI_FUZZ=ON -DQI_CUDA=OFF \
      -DQI_BUILD_TESTS=OFF -DQI_BUILD_BENCH=OFF >"$FZ_BUILD.cfg.log" 2>&1 ||
      { cat "$FZ_BUILD.cfg.log"; echo "fuzz: configuring $FZ_BUILD failed"; return 1; }
  fi
  local qinfer=${QI_FUZZ_QINFER:-} targets=(fuzz_targets)
  [[ -n $qinfer ]] || { qinfer=$FZ_BUILD/qinfer; targets+=(qinfer); }
  nice cmake --build "$FZ_BUILD" -j"$(nproc)" --target "${targets[@]}" >"$FZ_BUILD/build.log" 2>&1 ||
    { tail -n 40 "$FZ_BUILD/build.log"; echo "fuzz: building the fuzz targets failed"; return 1; }
  local merge=-
  [[ -x $FZ_BUILD/fz_merge ]] && merge=$FZ_BUILD/fz_merge
  bash "$FZ_ROOT/tests/fuzz/make_seeds.sh" "$qinfer" "$merge" "$FZ_BUILD/fuzz-seeds" >>"$FZ_BUILD/build.log" 2>&1 ||
    { tail -n 20 "$FZ_BUILD/build.log"; echo "fuzz: writing the seeds failed"; return 1; }
}

# The folder of target $1's seeds: written at build time for gguf and merge
# (fz_build), committed under tests/fuzz/seeds/ for the others.
fz_seeds() {
  if [[ -d $FZ_BUILD/fuzz-seeds/$1 ]]; then echo "$FZ_BUILD/fuzz-seeds/$1"; else echo "$FZ_ROOT/tests/fuzz/seeds/$1"; fi
}

# The libFuzzer options every run gets: a hang is a finding past
# QI_FUZZ_TIMEOUT seconds of wall time (default 10; on a machine other jobs
# keep busy, a nice'd target that starts threads waits for the CPU far longer
# than it runs, so raise it there), as is a process past 2 GiB; the target's
# dictionary when it has one.
fz_opts() {
  local t=$1
  local to=${QI_FUZZ_TIMEOUT:-10}
  [[ $to =~ ^[0-9]+$ && $to -ge 1 ]] || { echo "QI_FUZZ_TIMEOUT must be a positive whole number of seconds" >&2; exit 2; }
  FZ_OPTS=(-timeout="$to" -rss_limit_mb=2048 -malloc_limit_mb=1024 -print_final_stats=1)
  [[ -f $FZ_ROOT/tests/fuzz/dict/$t.dict ]] && FZ_OPTS+=("-dict=$FZ_ROOT/tests/fuzz/dict/$t.dict")
  true
}

# From a libFuzzer log: executions, edges (cov), features (ft).
fz_summary() {
  local log=$1
  FZ_EXECS=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  FZ_COV=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1 | cut -d' ' -f2 || true)
  FZ_FT=$(grep -o 'ft: [0-9]*' "$log" | tail -n 1 | cut -d' ' -f2 || true)
  FZ_EXECS=${FZ_EXECS:-0} FZ_COV=${FZ_COV:-0} FZ_FT=${FZ_FT:-0}
}
