# shellcheck shell=bash
# lib.sh - shared by the CLI test scripts (sourced, not run): a scratch
# folder, pass/fail counting, the two expectations every check uses, and
# the switch of the sanitizer build's runs.
#
# QI_TEST_ERRORS_ONLY=1 (tests/run.sh sets it for the AddressSanitizer +
# UBSan build): the scripts run every check of bad input (flags, files,
# plans, policies, Lua), those that load the model before they fail
# included, and leave out the runs on the model whose output they check
# (`if full_runs; then ... fi`); the Release build runs those, with the
# rest. The closing line says what was left out.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0 passes=0

ok()  { passes=$((passes + 1)); }
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }

# expect_fail CODE PATTERN CMD...: exits with CODE, stderr one line matching PATTERN
expect_fail() {
  local code=$1 pat=$2; shift 2
  "$@" >"$tmp/out" 2>"$tmp/err"; local rc=$?
  if [[ $rc -ne $code ]]; then bad "$* -> exit $rc, want $code ($(head -c 300 "$tmp/err"))"; return; fi
  if [[ $(wc -l <"$tmp/err") -ne 1 ]]; then bad "$* -> stderr is not one line: $(cat "$tmp/err")"; return; fi
  grep -q -- "$pat" "$tmp/err" || { bad "$* -> stderr lacks '$pat': $(cat "$tmp/err")"; return; }
  ok
}

# full_runs: 0 (run them) unless QI_TEST_ERRORS_ONLY=1
full_runs() { [[ ${QI_TEST_ERRORS_ONLY:-0} == 0 ]]; }
# summary: the closing line
summary() {
  echo "$passes passed, $fails failed$(full_runs || echo " (model runs left out: QI_TEST_ERRORS_ONLY=1)")"
}

# expect_ok CMD...: exits 0; its output is left in $tmp/out and $tmp/err
expect_ok() {
  "$@" >"$tmp/out" 2>"$tmp/err" || { bad "$* -> exit $? ($(head -c 300 "$tmp/err"))"; return 1; }
  ok
}
