#!/usr/bin/env bash
# test_load.sh QINFER - `qinfer load` against the real server on the default
# model, from a second process over loopback:
#   - bad flags and an unreachable server fail cleanly (one line; exit 2, 1);
#   - a load test that starts its own server (-m) at two rates, bounded in
#     requests and seconds, with a queue small enough that some requests are
#     refused: every request is accounted for (done, or rejected with a
#     reason), each rate is one run in the database, and the figures obey
#     engine/measure.c's definitions (check_load.py); the server it started
#     is stopped by SIGTERM;
#   - against a server already running (--url), an SLO that cannot be met
#     stops the rates at the first;
#   - that server's KV memory budget (--kv-memory) preempts requests, which
#     answer as they do alone (check_preempt.py); so does a server that
#     preempts by swap (--preempt swap), every preemption a swap; a bad
#     --preempt is refused.
# QI_TEST_ERRORS_ONLY=1 (the sanitizer build) runs the errors only: the bad
# flags, the missing server, the server that cannot start, the bad --preempt.
# Exit 77 (skip) without the model or without load/serve built in.
set -u
qinfer=$1
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
pid=
cleanup() { [[ -n $pid ]] && kill "$pid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }

if ! "$qinfer" inspect smollm2-135m >/dev/null 2>&1; then echo "skip: model smollm2-135m not fetched"; exit 77; fi
for c in serve load; do
  if "$qinfer" $c --help >/dev/null 2>&1; [[ $? -ne 0 ]]; then echo "skip: $("$qinfer" $c 2>&1)"; exit 77; fi
done
"$qinfer" load --help | grep -- "--slo-tpot-ms" >/dev/null || fail "load --help lacks --slo-tpot-ms"

# bad flags: one line on stderr, exit 2, nothing started
for args in "--bogus" "--rates 2,1" "--rates 0" "--rates 1," "--requests 0" "--max-seconds -1" "--url ftp://x" \
            "-m smollm2-135m --url http://127.0.0.1:1" "--prompt-len uniform:5-1" "--slo-goodput 2" \
            "--url http://127.0.0.1:1 -- -t 1" "--rates 1 --rate-start 1" "--db x.db --no-db" "--requests"; do
  # shellcheck disable=SC2086
  "$qinfer" load $args >/dev/null 2>"$tmp/flag"; rc=$?
  [[ $rc -eq 2 && $(wc -l <"$tmp/flag") -eq 1 ]] || fail "load $args -> exit $rc, stderr: $(cat "$tmp/flag")"
done
# no server there: exit 1, one line
"$qinfer" load --url http://127.0.0.1:1 --no-db >/dev/null 2>"$tmp/flag"; rc=$?
[[ $rc -eq 1 && $(wc -l <"$tmp/flag") -eq 1 ]] || fail "load with no server -> exit $rc, stderr: $(cat "$tmp/flag")"
# a server that cannot start: exit 1, no results
"$qinfer" load -m smollm2-135m --rates 1 --requests 1 --db "$tmp/bad.db" -- --max-batch 0 >/dev/null 2>"$tmp/flag"; rc=$?
[[ $rc -eq 1 ]] || fail "load with a server that cannot start -> exit $rc, stderr: $(cat "$tmp/flag")"
grep -q "exited at start" "$tmp/flag" || fail "no reason given for the server that did not start: $(cat "$tmp/flag")"
# a bad --preempt
"$qinfer" serve --preempt recomputed >/dev/null 2>"$tmp/flag"; rc=$?
[[ $rc -eq 2 && $(wc -l <"$tmp/flag") -eq 1 ]] || fail "serve --preempt recomputed -> exit $rc: $(cat "$tmp/flag")"
# QI_TEST_ERRORS_ONLY=1 (the sanitizer build; tests/cli/lib.sh): the errors only
if [[ ${QI_TEST_ERRORS_ONLY:-0} != 0 ]]; then echo "ok (the load runs left out: QI_TEST_ERRORS_ONLY=1)"; exit 0; fi

# two rates, its own server; rate 8 against a queue of 2 refuses some (429)
"$qinfer" load -m smollm2-135m --rates 1,8 --requests 6 --max-seconds 20 --prompt-len 16 \
  --output-len uniform:4-12 --slo-goodput 0 --db "$tmp/load.db" --serve-log "$tmp/serve.log" \
  -- -t 1 --max-batch 2 --max-queue 2 -c 256 >"$tmp/out" 2>"$tmp/err"; rc=$?
[[ $rc -eq 0 ]] || fail "load -m -> exit $rc: $(cat "$tmp/err")"
[[ $(grep -c '^ *[0-9]' "$tmp/out") -eq 2 ]] || fail "expected a line per rate: $(cat "$tmp/out")"
grep -q "signal 15, stopping" "$tmp/serve.log" || fail "the started server was not stopped: $(tail -n 5 "$tmp/serve.log")"
if grep -q 'ERROR: \(AddressSanitizer\|LeakSanitizer\)\|runtime error:' "$tmp/serve.log" "$tmp/err"; then
  fail "sanitizer report: $(grep -A 20 'ERROR\|runtime error' "$tmp/serve.log" "$tmp/err" | head -n 40)"
fi
python3 "$here/check_load.py" "$tmp/load.db" 2 6 1000 200 || fail "the figures in the database"

# a running server (--url), an SLO no request can meet: one rate, then the stop
"$qinfer" serve -m smollm2-135m --port 0 -t 1 --max-batch 4 --kv-memory 6 -c 256 2>"$tmp/serve2.log" &
pid=$!
for _ in $(seq 200); do
  grep -q 'on http://' "$tmp/serve2.log" && break
  kill -0 "$pid" 2>/dev/null || fail "the server exited at start: $(cat "$tmp/serve2.log")"
  sleep 0.1
done
url=$(grep -o 'http://[0-9.:]*' "$tmp/serve2.log" | head -n 1)
"$qinfer" load --url "$url" --rates 1,2,4 --requests 3 --max-seconds 20 --prompt-len 8 --output-len 4 \
  --slo-ttft-ms 0.001 --db "$tmp/url.db" >"$tmp/out2" 2>"$tmp/err2"; rc=$?
[[ $rc -eq 0 ]] || fail "load --url -> exit $rc: $(cat "$tmp/err2")"
grep -q "the SLO broke at 1 requests/s" "$tmp/out2" || fail "the SLO did not break at the first rate: $(cat "$tmp/out2")"
python3 "$here/check_load.py" "$tmp/url.db" 1 3 0.001 200 || fail "the figures in the --url database"
# the same server admits through the scheduler: its KV budget (6 MiB, about two
# block sets of this model) preempts, and preempted requests answer as alone
python3 "$here/check_preempt.py" "$url" || fail "preemption under the KV budget"
kill -0 "$pid" 2>/dev/null || fail "the server died: $(tail -n 20 "$tmp/serve2.log")"
kill -TERM "$pid"; wait "$pid"; src=$?; pid=
[[ $src -eq 0 ]] || fail "the server exited $src on SIGTERM"

# preemption by swap: the same budget, the KV of the preempted moved to the offload tier and back
"$qinfer" serve -m smollm2-135m --port 0 -t 1 --max-batch 4 --kv-memory 6 --preempt swap -c 256 2>"$tmp/serve3.log" &
pid=$!
for _ in $(seq 200); do
  grep -q 'on http://' "$tmp/serve3.log" && break
  kill -0 "$pid" 2>/dev/null || fail "the server exited at start: $(cat "$tmp/serve3.log")"
  sleep 0.1
done
grep -q 'preempt by swap' "$tmp/serve3.log" || fail "the server does not say it preempts by swap: $(head -n 2 "$tmp/serve3.log")"
url=$(grep -o 'http://[0-9.:]*' "$tmp/serve3.log" | head -n 1)
python3 "$here/check_preempt.py" "$url" swap || fail "preemption by swap under the KV budget"
kill -TERM "$pid"; wait "$pid"; src=$?; pid=
[[ $src -eq 0 ]] || fail "the swapping server exited $src on SIGTERM"
echo "ok"
