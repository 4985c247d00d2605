#!/usr/bin/env bash
# run.sh QINFER TEST - one test of `qinfer serve` against the real server on
# the default model: starts it on a free loopback port (--port 0, the port
# read from its first line), runs tests/serve/TEST.py with the base URL, then
# stops it with SIGTERM and requires a clean exit (under ASan: no leak).
#   openai   the official openai client from PyPI (a venv in the model cache,
#            made on first use; skipped, 77, when it cannot be installed)
#   hostile  malformed, huge, mistyped, slow and vanishing requests (stdlib only)
# Exit 77 (skip) without the model or without serve built in.
set -u
qinfer=$1 test=$2
here=$(cd "$(dirname "$0")" && pwd)
cache=${QINFER_CACHE:-$HOME/.cache/qinfer}
tmp=$(mktemp -d)
pid=
cleanup() { [[ -n $pid ]] && kill "$pid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT

if ! "$qinfer" inspect smollm2-135m >/dev/null 2>&1; then echo "skip: model smollm2-135m not fetched"; exit 77; fi
if "$qinfer" serve --help >/dev/null 2>&1; [[ $? -ne 0 ]]; then echo "skip: $("$qinfer" serve 2>&1)"; exit 77; fi

if [[ $test == hostile ]]; then # bad flags: one line, exit 2
  for args in "--host nowhere" "--port 70000" "--max-queue 0" "--bogus"; do
    # shellcheck disable=SC2086
    "$qinfer" serve $args >/dev/null 2>"$tmp/flag"; frc=$?
    if [[ $frc -ne 2 || $(wc -l <"$tmp/flag") -ne 1 ]]; then
      echo "FAIL: serve $args -> exit $frc, stderr: $(cat "$tmp/flag")"; exit 1
    fi
  done
  "$qinfer" serve --help | grep -- "--max-queue" >/dev/null || { echo "FAIL: serve --help lacks --max-queue"; exit 1; }
fi

py=python3
if [[ $test == openai ]]; then
  venv=$cache/serve-venv
  if ! "$venv/bin/python" -c 'import openai' 2>/dev/null; then
    { python3 -m venv "$venv" && "$venv/bin/python" -m pip install -q openai; } >"$tmp/pip.log" 2>&1 ||
      { echo "skip: cannot install the openai package from PyPI into $venv: $(tail -n 1 "$tmp/pip.log")"; exit 77; }
  fi
  py=$venv/bin/python
fi

"$qinfer" serve -m smollm2-135m --port 0 -t 1 --max-batch 4 --max-queue 4 -c 512 2>"$tmp/err" &
pid=$!
for _ in $(seq 200); do
  grep -q 'on http://' "$tmp/err" && break
  kill -0 "$pid" 2>/dev/null || { echo "FAIL: the server exited at start: $(cat "$tmp/err")"; exit 1; }
  sleep 0.1
done
url=$(grep -o 'http://[0-9.:]*' "$tmp/err" | head -n 1)
[[ -n $url ]] || { echo "FAIL: the server printed no address: $(cat "$tmp/err")"; exit 1; }

"$py" "$here/test_$test.py" "$url" "$pid"
rc=$?
if ! kill -0 "$pid" 2>/dev/null; then echo "FAIL: the server died: $(tail -n 20 "$tmp/err")"; exit 1; fi
kill -TERM "$pid"
wait "$pid"
src=$?
pid=
if [[ $src -ne 0 ]]; then echo "FAIL: the server exited $src on SIGTERM: $(tail -n 30 "$tmp/err")"; exit 1; fi
if grep -q 'ERROR: \(AddressSanitizer\|LeakSanitizer\)\|runtime error:' "$tmp/err"; then
  echo "FAIL: sanitizer report:"; grep -A 30 'ERROR\|runtime error' "$tmp/err" | head -n 60; exit 1
fi
exit $rc
