#!/usr/bin/env bash
# The whole test suite: a Release build with every test (unit, goldens
# against llama.cpp, CLI, GGUF fuzzing, the fuzz targets' corpora and
# regression inputs), then an AddressSanitizer + UBSan build running the
# unit tests, the same replays and 10,000 fuzzed GGUF files, with the
# model-level golden tests cut to a few cases (QI_TEST_QUICK=1), and the
# CLI, Lua and serve scripts to their checks of bad input, errors after the
# model loads included (QI_TEST_ERRORS_ONLY=1, tests/cli/lib.sh): the runs
# whose output they check are the Release build's, to stay fast; last,
# every libFuzzer target for a few seconds (tests/fuzz/burst.sh, its own
# clang build in build-fuzz/; skipped without clang).
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
[[ ${1:-} == -h || ${1:-} == --help ]] && { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0; }

# each stage's wall time, for the CI log (the whole run must stay short)
t0=$SECONDS
stage() { echo "== $1 ($((SECONDS - t0)) s)"; t0=$SECONDS; }

echo "== Release build and tests"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null

asan_pid=
if ((fast == 0)); then
  # The sanitizer build starts first and compiles beside the Release build,
  # then beside the Release tests. It runs in a session of its own
  # (setsid), and where the kernel groups tasks by session
  # (sched_autogroup) the scheduler weighs that session as much as the
  # tests' whole one, whatever its tasks' nice: so it takes about a core
  # while it runs, and an engine test of two threads beside it takes up to
  # twice its time (test_engine: 16 s, alone 7.6 s). It needs some 300 s
  # of CPU (most of it the AVX kernels under the sanitizers, compiled with
  # lighter flags there: CMakeLists.txt; 700 s before), and the tests leave
  # few idle cycles (their thread pools spin), so lower still (its group
  # at nice 19) it got almost none and its 6 minutes came after the tests;
  # started before the Release build, more of it is done beside that
  # build, which loses nothing by sharing. Its output goes to
  # build-asan/build.log, shown if it fails.
  # Without the CUDA sources: the sanitizers watch host code, and the CUDA
  # device's host logic (backend_cuda.c) is built and tested either way;
  # nor the benchmarks, which no test runs (the Release build builds them).
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DQI_SANITIZE=ON -DQI_CUDA=OFF -DQI_BUILD_BENCH=OFF >/dev/null
  setsid -w nice -n 19 cmake --build build-asan -j"$jobs" >build-asan/build.log 2>&1 &
  asan_pid=$!
  # a failed Release stage stops the build too (its own process group)
  trap '[[ -n $asan_pid ]] && kill -- -"$asan_pid" 2>/dev/null' EXIT
fi

cmake --build build -j"$jobs"
stage "Release build done"

(cd build && ctest --output-on-failure -j"$jobs")
stage "Release tests done"

if ((fast == 0)); then
  echo "== AddressSanitizer + UBSan build and tests"
  wait "$asan_pid" || { tail -n 50 build-asan/build.log; asan_pid=; echo "== sanitizer build failed"; exit 1; }
  asan_pid=
  stage "sanitizer build done (what was left of it after the Release tests)"
  (cd build-asan && QI_TEST_QUICK=1 QI_TEST_ERRORS_ONLY=1 ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
     UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ctest --output-on-failure -j"$jobs")
  stage "sanitizer tests done"
fi

# Every libFuzzer target for a short burst from its committed corpus (the
# corpus and every regression input were replayed above, fuzz_replay_*, in
# both builds): tests/fuzz/README.md; 2 s each keeps the whole run near 20
# minutes on 2 cores (QI_FUZZ_BURST_S sets it). Skipped, with the reason, where clang
# or libFuzzer is absent.
if ((fast == 0)); then
  echo "== fuzz bursts (${QI_FUZZ_BURST_S:-2} s a target)"
  rc=0
  # the seeds' GGUF models written by the Release build's qinfer (not
  # one more qinfer built, instrumented, in build-fuzz/)
  QI_FUZZ_QINFER=$PWD/build/qinfer bash tests/fuzz/burst.sh "${QI_FUZZ_BURST_S:-2}" || rc=$?
  ((rc == 77)) && echo "== fuzz bursts skipped"
  ((rc == 0 || rc == 77)) || { echo "== fuzz bursts found something"; exit 1; }
  stage "fuzz bursts done"
fi
echo "== all tests passed"
