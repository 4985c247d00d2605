#!/usr/bin/env bash
# CI's fuzzing: every target for a short burst (tests/fuzz/README.md).
#
#   tests/fuzz/burst.sh [SECONDS]    each target SECONDS (default 5)
#
# Builds the libFuzzer targets in build-fuzz/ ($QI_FUZZ_BUILD; clang,
# ASan + UBSan) and runs each from its seeds, corpus and regression
# inputs (under libFuzzer's memory limits, which the replays of other
# builds do not have) for SECONDS, nice'd,
# one at a time; new inputs go to a scratch folder (the committed corpus
# is not changed: tests/fuzz/campaign.sh grows it). A finding fails the
# run: its input is kept under build-fuzz/findings/TARGET/ and printed in
# base64, to be saved as a regression input (tests/fuzz/regress/TARGET/).
# Exits 77 with the reason where clang or libFuzzer is absent.
set -euo pipefail
FZ_ROOT=$(cd "$(dirname "$0")/../.." && pwd)
FZ_BUILD=${QI_FUZZ_BUILD:-$FZ_ROOT/build-fuzz}
. "$FZ_ROOT/tests/fuzz/fuzzlib.sh"
[[ ${1:-} == -h || ${1:-} == --help ]] && { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0; }
secs=${1:-5}
fz_need_libfuzzer
fz_build
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=()
printf '%-10s %10s %8s %9s\n' target executions edges features
for t in "${FZ_TARGETS[@]}"; do
  [[ -x $FZ_BUILD/fz_$t ]] || { printf '%-10s skipped: not built (its library is absent)\n' "$t"; continue; }
  mkdir -p "$work/$t/new" "$work/$t/art"
  fz_opts "$t"
  rc=0
  nice "$FZ_BUILD/fz_$t" "${FZ_OPTS[@]}" -max_total_time="$secs" -artifact_prefix="$work/$t/art/" \
    "$work/$t/new" "$(fz_seeds "$t")" "$FZ_ROOT/tests/fuzz/corpus/$t" "$FZ_ROOT/tests/fuzz/regress/$t" \
    >"$work/$t/log" 2>&1 || rc=$?
  fz_summary "$work/$t/log"
  printf '%-10s %10s %8s %9s\n' "$t" "$FZ_EXECS" "$FZ_COV" "$FZ_FT"
  if ((rc != 0)); then
    failed+=("$t")
    mkdir -p "$FZ_BUILD/findings/$t"
    grep -E '(==[0-9]+==ERROR|SUMMARY:|property failed|runtime error)' "$work/$t/log" | head -n 5 || tail -n 20 "$work/$t/log"
    for f in "$work/$t/art"/*; do
      [[ -e $f ]] || continue
      cp "$f" "$FZ_BUILD/findings/$t/"
      echo "finding $(basename "$f") (base64; save as tests/fuzz/regress/$t/$(basename "$f")):"
      base64 -w 76 "$f" | head -n 200
    done
  fi
done
if ((${#failed[@]})); then
  echo "fuzz: findings in ${failed[*]} (build-fuzz/findings/)"
  exit 1
fi
echo "fuzz: no findings"
