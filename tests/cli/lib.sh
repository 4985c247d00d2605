# shellcheck shell=bash
# lib.sh - shared by the CLI test scripts (sourced, not run): a scratch
# folder, pass/fail counting, and the two expectations every check uses.
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

# expect_ok CMD...: exits 0; its output is left in $tmp/out and $tmp/err
expect_ok() {
  "$@" >"$tmp/out" 2>"$tmp/err" || { bad "$* -> exit $? ($(head -c 300 "$tmp/err"))"; return 1; }
  ok
}
