"""check_load.py DB RUNS REQUESTS TTFT_MS TPOT_MS - the results of a `qinfer
load` test (test_load.sh) held to results/README.md's definitions, from the
per-request figures the same runs stored (the standard library only):

  - RUNS runs done, one per rate, the rate in every metric's params;
  - every request offered is accounted for: requests.done + requests.rejected
    = requests.offered = REQUESTS; a request.rejected row, with a reason, for
    each rejected one, per-request figures for each one done;
  - per request: TPOT = (e2e - TTFT) / (output tokens - 1), 0 <= TTFT <= e2e;
  - per run: the TTFT, TPOT and e2e statistics (mean, median, p90, p99 with
    numpy's linear percentile) of the requests done, output-token throughput
    = output tokens / run.duration_s, goodput (requests/s and fraction of
    those sent) under the bounds.
Exit 1 naming every figure that disagrees."""
import json
import math
import sqlite3
import sys

db, n_runs, n_req = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ttft_bound, tpot_bound = float(sys.argv[4]) / 1000, float(sys.argv[5]) / 1000
fails = []


def check(cond, what):
    if not cond:
        fails.append(what)
        print("FAIL:", what)


def close(a, b, what):
    check(a is not None and b is not None and abs(a - b) <= 1e-9 + 1e-9 * abs(b), f"{what}: {a} != {b}")


def pct(v, p):
    v = sorted(v)
    r = p / 100 * (len(v) - 1)
    lo = math.floor(r)
    return v[lo] if lo + 1 >= len(v) else v[lo] + (r - lo) * (v[lo + 1] - v[lo])


c = sqlite3.connect(db)
runs = c.execute("SELECT id, config_json FROM runs WHERE status = 'done' ORDER BY id").fetchall()
check(len(runs) == n_runs, f"{len(runs)} runs done, expected {n_runs}")
for run_id, cfg in runs:
    rate = json.loads(cfg)["rate"]
    rows = c.execute("SELECT name, params, value FROM metrics WHERE run_id = ?", (run_id,)).fetchall()
    run, req, rejected = {}, {}, {}
    for name, params, value in rows:
        p = json.loads(params)
        check(p.get("rate") == rate, f"run {run_id}: {name} has params {params}, not rate {rate}")
        if name == "request.rejected":
            check(p.get("reason"), f"run {run_id}: request {p.get('request')} rejected without a reason")
            rejected[p["request"]] = p.get("reason")
        elif "request" in p:
            req.setdefault(p["request"], {})[name] = value
        else:
            run[name] = value
    w = f"rate {rate}"
    check(run.get("requests.offered") == n_req, f"{w}: requests.offered {run.get('requests.offered')}")
    check(run.get("requests.done", 0) + run.get("requests.rejected", 0) == n_req,
          f"{w}: done {run.get('requests.done')} + rejected {run.get('requests.rejected')} != {n_req}")
    check(len(rejected) == run.get("requests.rejected"), f"{w}: {len(rejected)} rejected rows")
    check(len(req) == run.get("requests.done"), f"{w}: {len(req)} requests with figures")
    check(not (set(req) & set(rejected)), f"{w}: a request both done and rejected")
    check(set(req) | set(rejected) == set(range(n_req)), f"{w}: requests unaccounted for")
    for i, r in req.items():
        n = r["request.output_tokens"]
        if n == 0:
            check("request.ttft_s" not in r, f"{w} request {i}: a TTFT without tokens")
            continue
        check(0 <= r["request.ttft_s"] <= r["request.e2e_s"], f"{w} request {i}: TTFT/e2e {r}")
        if n >= 2:
            close(r["request.tpot_s"] * (n - 1), r["request.e2e_s"] - r["request.ttft_s"], f"{w} request {i}: TPOT")
        else:
            check("request.tpot_s" not in r, f"{w} request {i}: a TPOT with {n} tokens")
    for area in ("ttft", "tpot", "e2e"):
        v = [r[f"request.{area}_s"] for r in req.values() if f"request.{area}_s" in r]
        if not v:
            check(f"{area}.mean_s" not in run, f"{w}: {area} figures over no requests")
            continue
        close(run.get(f"{area}.mean_s"), sum(v) / len(v), f"{w}: {area}.mean_s")
        for stat, p in (("median", 50), ("p90", 90), ("p99", 99)):
            close(run.get(f"{area}.{stat}_s"), pct(v, p), f"{w}: {area}.{stat}_s")
    d = run.get("run.duration_s", 0)
    if req:
        out = sum(r["request.output_tokens"] for r in req.values())
        close(run.get("throughput.output_tokens_per_s"), out / d, f"{w}: output-token throughput")
        close(run.get("throughput.requests_per_s"), len(req) / d, f"{w}: request throughput")
        good = sum(1 for r in req.values() if r.get("request.ttft_s", math.inf) <= ttft_bound
                   and r.get("request.tpot_s", 0) <= tpot_bound)
        close(run.get("goodput.requests_per_s"), good / d, f"{w}: goodput")
        sent = n_req - sum(1 for r in rejected.values() if r.startswith("not sent"))
        close(run.get("requests.sent"), sent, f"{w}: requests sent")
        close(run.get("goodput.fraction"), good / sent, f"{w}: goodput fraction")
sys.exit(1 if fails else 0)
