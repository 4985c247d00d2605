#!/usr/bin/env bash
# test_throughput.sh QINFER - bench, Lua and the server report throughput by
# one definition, engine/measure.c's, under the names and units of
# results/README.md. One workload for all three on the default model: 4
# sequences (bench's tg8 @ b4 row, qinfer.throughput at batch 4) or 4
# requests (qinfer.serve; 4 completions sent at once to qinfer serve) of
# 8 greedy output tokens after prompts of about 8 tokens (bench: its
# "tg8 @ b4 d8" row).
#   - each front end's rate is its own exported counts over its own exported
#     seconds: bench's samples_ts against samples_s (and the same in its
#     --db metrics), qinfer.throughput's against decode_s, qinfer.serve's
#     against its requests' arrival and token times (given back to
#     qinfer.measure_requests, the same figures to the bit), the server's
#     /metrics against its token counter, the clients' usage and the
#     timelines its answers carry (qinfer_timeline);
#   - the server's recorded timelines given to Lua's qinfer.measure_requests
#     give every figure of its /metrics: one function, whoever calls it;
#   - every figure each reports is a name of results/README.md, in its unit;
#   - under the fake clock (QINFER_FAKE_CLOCK) bench and Lua give the same
#     number, B / tick exactly: one function, one figure.
# Exits 77 without the model; the server part is skipped, with a line,
# without serve built in.
set -uo pipefail
Q=${1:?usage: test_throughput.sh PATH/TO/qinfer}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
readme=$here/../../results/README.md
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
if ! "$Q" inspect smollm2-135m >/dev/null 2>&1; then echo "skip: model smollm2-135m not fetched"; exit 77; fi
"$Q" bench --help | grep "built without SQLite" >/dev/null && db=() || db=(--db "$tmp/bench.db")

# bench: the tg8 @ b4 row, two repetitions
if expect_ok "$Q" bench -t 2 -p 0 -n 8 -b 4 -d 8 -r 2 --warmup 0 --probe-mib 0 -o json "${db[@]}"; then
  python3 - "$tmp/out" "$tmp/bench.db" "$tmp/names" <<'PY' && ok || bad "bench's rates against its own seconds"
import json, os, sys
row = [r for r in json.load(open(sys.argv[1])) if r["batch"] == 4][0]
assert row["batch"] == 4 and row["n_gen"] == 8 and len(row["samples_s"]) == 2, row
for ts, s in zip(row["samples_ts"], row["samples_s"]):
    assert s > 0 and abs(ts - 4 * 8 / s) <= 1e-6 + 1e-8 * ts, (ts, s)
if os.path.exists(sys.argv[2]):
    import sqlite3
    c = sqlite3.connect(sys.argv[2])
    got = c.execute("SELECT m.name, m.unit, m.value, m.repetition FROM metrics m JOIN runs r ON r.id = m.run_id "
                    "WHERE r.config_json LIKE '%\"batch\":4%' AND m.name LIKE 'decode.%tokens_per_s'").fetchall()
    assert len(got) == 4, got
    with open(sys.argv[3], "w") as f:
        for name, unit, v, k in got:
            s = row["samples_s"][k]
            want = 4 * 8 / s if name == "decode.tokens_per_s" else 8 / s
            assert abs(v - want) <= 1e-6 * want, (name, v, want)
            f.write(f"{name} {unit}\n")
PY
  if [[ -s $tmp/names ]]; then
    python3 "$here/check_throughput.py" --names "$readme" "$tmp/names" && ok || bad "bench's names and units"
  fi
fi

# Lua: qinfer.throughput and qinfer.serve, each against its own counts and times
expect_ok "$Q" lua -t 2 "$here/throughput_def.lua" decode
expect_ok "$Q" lua -t 2 "$here/throughput_def.lua" serve &&
  { grep '^metric ' "$tmp/out" | cut -d' ' -f2- >"$tmp/names"
    python3 "$here/check_throughput.py" --names "$readme" "$tmp/names" && ok || bad "qinfer.serve's names and units"; }

# one function, one number: bench's batched row and qinfer.throughput under
# the fake clock (one tick a read): both 4 sequences / 0.001 s exactly
bench=$(QINFER_FAKE_CLOCK=0.001 "$Q" bench -t 2 -p 0 -n 8 -b 4 -d 8 -r 1 --warmup 0 --probe-mib 0 -o json 2>"$tmp/err" |
  python3 -c 'import json, sys; print("%.6f" % [r for r in json.load(sys.stdin) if r["batch"] == 4][0]["samples_ts"][0])')
lua=$(QINFER_FAKE_CLOCK=0.001 "$Q" lua -t 2 "$here/throughput_def.lua" decode 2>>"$tmp/err" | awk '{printf "%.6f", $2}')
[[ $bench == "4000.000000" && $lua == "$bench" ]] && ok ||
  bad "under the fake clock bench gives '$bench' t/s and Lua '$lua', want 4000.000000 both: $(head -c 300 "$tmp/err")"

# the server: a fresh one, so its run figures span exactly these requests
if "$Q" serve --help >/dev/null 2>&1; then
  "$Q" serve -m smollm2-135m --port 0 -t 2 --max-batch 4 -c 256 2>"$tmp/serve.log" &
  pid=$!
  for _ in $(seq 200); do
    grep -q 'on http://' "$tmp/serve.log" && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  url=$(grep -o 'http://[0-9.:]*' "$tmp/serve.log" | head -n 1)
  if [[ -z $url ]]; then
    bad "the server did not start: $(tail -n 5 "$tmp/serve.log")"
  else
    python3 "$here/check_throughput.py" "$url" "$readme" "$tmp/timelines" && ok ||
      bad "the server's /metrics against its own counts"
    [[ -s $tmp/timelines ]] && expect_ok "$Q" lua -t 2 "$here/throughput_def.lua" timeline "$tmp/timelines"
  fi
  kill -TERM "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
else
  echo "skip (server part): $("$Q" serve 2>&1 | head -n 1)"
fi

echo "test_throughput: $passes passed, $fails failed"
((fails == 0))
