#!/usr/bin/env bash
# The whole test suite: a Release build with every test (unit, goldens
# against llama.cpp, CLI, GGUF fuzzing), then an AddressSanitizer + UBSan
# build running the unit tests and 10,000 fuzzed GGUF files, with the
# model-level golden tests cut to a few cases (QI_TEST_QUICK=1), and the
# CLI, Lua and serve scripts to their checks of bad input, errors after the
# model loads included (QI_TEST_ERRORS_ONLY=1, tests/cli/lib.sh): the runs
# whose output they check are the Release build's, to stay fast.
#
#   tests/run.sh            both builds
#   tests/run.sh --fast     Release build only
# Needs the Debian packages of scripts/setup.sh; model-level tests need
# models/fetch.sh smollm2-135m devil (they skip, loudly, without them).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
fast=0
[[ ${1:-} == --fast ]] && fast=1
[[ ${1:-} == -h || ${1:-} == --help ]] && { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0; }

# each stage's wall time, for the CI log (the whole run must stay short)
t0=$SECONDS
stage() { echo "== $1 ($((SECONDS - t0)) s)"; t0=$SECONDS; }

echo "== Release build and tests"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null

asan_pid=
if ((fast == 0)); then
  # The sanitizer build compiles beside the Release one, at the lowest
  # priority (nice 19): it takes the cycles that one leaves idle (its
  # serial steps: nvcc, the links) and the rest once it is done, before
  # any test starts. Beside the Release tests instead, it held a core
  # (below) while they ran, and an engine test of two threads took twice
  # its time beside it (test_engine: 16 s, alone 7.6 s): compiling takes
  # the cycles it is given, a test's spinning thread pool wastes them.
  # Its output goes to build-asan/build.log, shown if it fails.
  # setsid gives it a session of its own, and with it (where the kernel
  # groups tasks by session, sched_autogroup) a scheduling group that the
  # scheduler weighs as much as the tests' whole session, whatever its
  # tasks' nice: so the group itself is set to nice 19 too.
  # Without the CUDA sources: the sanitizers watch host code, and the CUDA
  # device's host logic (backend_cuda.c) is built and tested either way;
  # nor the benchmarks, which no test runs (the Release build builds them).
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DQI_SANITIZE=ON -DQI_CUDA=OFF -DQI_BUILD_BENCH=OFF >/dev/null
  setsid -w sh -c '{ echo 19 >/proc/self/autogroup; } 2>/dev/null; exec nice -n 19 cmake --build build-asan -j"$1"' \
    sh "$jobs" >build-asan/build.log 2>&1 &
  asan_pid=$!
  # a failed Release build stops it too (its own process group)
  trap '[[ -n $asan_pid ]] && kill -- -"$asan_pid" 2>/dev/null' EXIT
fi

cmake --build build -j"$jobs"
stage "Release build done"

if ((fast == 0)); then
  wait "$asan_pid" || { tail -n 50 build-asan/build.log; asan_pid=; echo "== sanitizer build failed"; exit 1; }
  asan_pid=
  stage "sanitizer build done (what was left of it after the Release build)"
fi

(cd build && ctest --output-on-failure -j"$jobs")
stage "Release tests done"

if ((fast == 0)); then
  echo "== AddressSanitizer + UBSan tests"
  (cd build-asan && QI_TEST_QUICK=1 QI_TEST_ERRORS_ONLY=1 ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
     UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ctest --output-on-failure -j"$jobs")
  stage "sanitizer tests done"
fi
echo "== all tests passed"
