#!/usr/bin/env bash
# A fuzzing campaign on one target (tests/fuzz/README.md).
#
#   tests/fuzz/campaign.sh TARGET SECONDS [RUNS]    run fz_TARGET for SECONDS
#                                           (or RUNS executions, if sooner)
#   tests/fuzz/campaign.sh --list            the targets
#
# Builds the libFuzzer targets (clang, ASan + UBSan, coverage) in
# build-fuzz/ ($QI_FUZZ_BUILD), runs the target nice'd from its seeds
# (tests/fuzz/seeds/TARGET, or for gguf and merge build-fuzz/fuzz-seeds/TARGET,
# written by make_seeds.sh; kept as they are) and its corpus
# (tests/fuzz/corpus/TARGET) with its dictionary, then replaces the corpus
# with the minimised union of it and what the run added (libFuzzer's
# -merge=1: the smallest inputs that add features to the seeds), at most
# $QI_FUZZ_CORPUS_KB KiB of it (default 128; smallest inputs first). A
# crash, leak, hang (over 10 s of wall time, $QI_FUZZ_TIMEOUT) or out-of-memory (over 2 GiB) stops the run and its input is saved under
# tests/fuzz/regress/TARGET/, which the CTest entry fuzz_replay_TARGET
# replays in every build. Prints executions, coverage (edges), features,
# corpus size and findings; exits 1 when there was a finding, 77 (with
# the reason) without clang/libFuzzer.
set -euo pipefail
FZ_ROOT=$(cd "$(dirname "$0")/../.." && pwd)
FZ_BUILD=${QI_FUZZ_BUILD:-$FZ_ROOT/build-fuzz}
. "$FZ_ROOT/tests/fuzz/fuzzlib.sh"
case ${1:-} in
  -h|--help|"") sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  --list) printf '%s\n' "${FZ_TARGETS[@]}"; exit 0 ;;
esac
t=$1 secs=${2:?usage: campaign.sh TARGET SECONDS}
[[ " ${FZ_TARGETS[*]} " == *" $t "* ]] || { echo "campaign.sh: unknown target '$t' (--list)" >&2; exit 2; }
[[ $secs =~ ^[0-9]+$ && $secs -ge 1 ]] || { echo "campaign.sh: SECONDS must be a positive whole number" >&2; exit 2; }
runs=${3:--1}
[[ $runs == -1 || ($runs =~ ^[0-9]+$ && $runs -ge 1) ]] || { echo "campaign.sh: RUNS must be a positive whole number" >&2; exit 2; }
fz_need_libfuzzer
fz_build
seeds=$(fz_seeds "$t") corpus=$FZ_ROOT/tests/fuzz/corpus/$t regress=$FZ_ROOT/tests/fuzz/regress/$t
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/new" "$work/art" "$corpus"
fz_opts "$t"
before=$(find "$corpus" -type f | wc -l)
t0=$SECONDS
set +e
nice "$FZ_BUILD/fz_$t" "${FZ_OPTS[@]}" -max_total_time="$secs" -runs="$runs" -artifact_prefix="$work/art/" \
  "$work/new" "$seeds" "$corpus" >"$work/log" 2>&1
rc=$?
set -e
elapsed=$((SECONDS - t0))
fz_summary "$work/log"
findings=0
for f in "$work"/art/*; do
  [[ -e $f ]] || continue
  mkdir -p "$regress"
  cp "$f" "$regress/"
  echo "finding: $(basename "$f") -> tests/fuzz/regress/$t/$(basename "$f")"
  findings=$((findings + 1))
done
if ((findings)); then
  grep -E '^(==[0-9]+==ERROR|SUMMARY:|.*property failed|.*runtime error)' "$work/log" | head -n 5 || true
  cp "$work/log" "$FZ_BUILD/campaign-$t.log"
  echo "the run's log: $FZ_BUILD/campaign-$t.log"
elif ((rc != 0)); then
  tail -n 30 "$work/log"
  echo "campaign.sh: fz_$t exited $rc without a finding saved"
  exit 1
fi
# the corpus and what the run added, minimised against the seeds (libFuzzer's
# merge keeps the smallest inputs that add features to what it holds), as
# the new corpus, within its byte budget (smallest inputs first)
mkdir -p "$work/min"
cp "$seeds"/* "$work/min/" 2>/dev/null || true
(cd "$seeds" && ls -A) >"$work/seed-names" 2>/dev/null || : >"$work/seed-names"
"$FZ_BUILD/fz_$t" "${FZ_OPTS[@]}" -merge=1 "$work/min" "$corpus" "$work/new" >"$work/merge.log" 2>&1 ||
  { tail -n 20 "$work/merge.log"; echo "campaign.sh: merging into the corpus failed"; exit 1; }
while read -r n; do rm -f "$work/min/$n"; done <"$work/seed-names"
find "$corpus" -maxdepth 1 -type f -delete
budget=$((${QI_FUZZ_CORPUS_KB:-128} * 1024)) total=0
while read -r size f; do
  ((total + size > budget)) && break
  cp "$f" "$corpus/"
  total=$((total + size))
done < <(find "$work/min" -maxdepth 1 -type f -printf '%s %p\n' | sort -n)
after=$(find "$corpus" -type f | wc -l)
printf '%s: %s s, %s executions, coverage %s edges, %s features, corpus %s files (%+d), findings %d\n' \
  "$t" "$elapsed" "$FZ_EXECS" "$FZ_COV" "$FZ_FT" "$after" $((after - before)) "$findings"
((findings == 0))
