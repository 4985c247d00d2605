"""check_throughput.py URL README TIMELINES - the server's side of
test_throughput.sh: four greedy completions of 8 tokens sent at once to a
fresh `qinfer serve`, each asking for its timeline (qinfer_timeline), then
its /metrics held to the one definition (engine/measure.c): output-token
throughput = the output tokens of the requests done (its own counter, the
clients' usage.completion_tokens, the timelines' tokens) / run.duration_s,
that duration the timelines' first arrival to last token, and within what
the clients saw from the first request sent to the last answer; every run
figure a name of results/README.md ('.' as '_'). Writes the timelines to
TIMELINES, one request a line, "ARRIVAL START N_PROMPT TOKEN_TIME...", and
/metrics' run figures after them as "figure NAME VALUE" lines, for Lua's
qinfer.measure_requests to recompute. Then a streamed request: its last
event alone carries the timeline. Prints "serve RATE DURATION TOKENS".

check_throughput.py --names README FILE - every line "NAME UNIT" of FILE (a
front end's figures) a name of results/README.md's tables, with its unit."""
import json
import re
import sys
import threading
import time
import urllib.request

url = sys.argv[1]
fails = []


def check(cond, what):
    if not cond:
        fails.append(what)
        print("FAIL:", what)


def names_in(path):
    """The metric names of the tables of results/README.md's "Metric names",
    braces expanded: name -> unit."""
    out, inside = {}, False
    for line in open(path, encoding="utf-8"):
        if line.startswith("## "):
            inside = line.startswith("## Metric names")
        cells = line.split("|")
        if not inside:
            continue
        if len(cells) < 4:
            continue
        for n in re.findall(r"`([a-z0-9_.{},]+)`", cells[1]):
            m = re.match(r"^(.*)\{([^}]*)\}(.*)$", n)
            for alt in (m.group(2).split(",") if m else [None]):
                out[m.group(1) + alt + m.group(3) if m else n] = cells[2].strip()
    return out


if url == "--names":
    known = names_in(sys.argv[2])
    n = 0
    for ln in open(sys.argv[3]):
        name, unit = ln.split()
        n += 1
        check(name in known, f"{name} is not a name of results/README.md")
        check(known.get(name, unit) == unit, f"{name} in {unit}, results/README.md says {known.get(name)}")
    check(n > 0, "no figures to check")
    sys.exit(1 if fails else 0)

usage = [None] * 4
timelines = [None] * 4


def one(k):
    body = json.dumps({"prompt": f"Count with me, number {k}: one, two,", "max_tokens": 8,
                       "temperature": 0, "qinfer_timeline": True}).encode()
    req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        a = json.loads(r.read())
    usage[k] = a["usage"]
    timelines[k] = a.get("qinfer_timeline")


t0 = time.monotonic()
ts = [threading.Thread(target=one, args=(k,)) for k in range(4)]
[t.start() for t in ts]
[t.join() for t in ts]
span = time.monotonic() - t0
with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
    text = r.read().decode()
fig = {ln.split()[0]: float(ln.split()[1]) for ln in text.splitlines() if ln and not ln.startswith("#")}
check(None not in usage and None not in timelines, f"completions: {usage}, timelines {timelines}")
if None in usage or None in timelines:
    sys.exit(1)
tokens = sum(u["completion_tokens"] for u in usage)
check(tokens > 0, f"completions: {usage}")
for u, t in zip(usage, timelines):
    check(len(t["token_s"]) == u["completion_tokens"] and t["arrival_s"] <= t["start_s"] <= t["token_s"][0],
          f"a timeline that is not one: {t}, usage {u}")
first = min(t["arrival_s"] for t in timelines)
last = max(t["token_s"][-1] for t in timelines)
check(fig.get('qinfer_requests_total{status="done"}') == 4, "requests done: %s" % fig.get('qinfer_requests_total{status="done"}'))
check(fig.get("qinfer_output_tokens_total") == tokens, f"output tokens {fig.get('qinfer_output_tokens_total')}, the clients got {tokens}")
dur, rate = fig.get("qinfer_run_duration_s", 0), fig.get("qinfer_throughput_output_tokens_per_s")
check(0 < dur <= span, f"run duration {dur} s, the clients saw {span:.6f} s")
check(abs(dur - (last - first)) <= 1e-8 * dur, f"run duration {dur} s, the timelines span {last - first!r} s")
check(rate is not None and dur > 0 and abs(rate - tokens / dur) <= 1e-6 * rate,
      f"throughput {rate} tok/s, its own counts give {tokens} / {dur}")
check(fig.get("qinfer_throughput_requests_per_s") is not None and dur > 0 and
      abs(fig["qinfer_throughput_requests_per_s"] - 4 / dur) <= 1e-6 * fig["qinfer_throughput_requests_per_s"],
      "request throughput off its definition")
known = {"qinfer_" + n.replace(".", "_") for n in names_in(sys.argv[2])}
run_part = text.split("# The run figures below", 1)
check(len(run_part) == 2, "no run figures in /metrics")
with open(sys.argv[3], "w") as f:
    for u, t in zip(usage, timelines):
        f.write(" ".join(repr(x) for x in [t["arrival_s"], t["start_s"], u["prompt_tokens"]] + t["token_s"]) + "\n")
    if len(run_part) == 2:
        for ln in run_part[1].splitlines()[1:]:
            if ln and not ln.startswith("#"):
                check(ln.split()[0] in known, f"/metrics figure {ln.split()[0]} is not a name of results/README.md")
                f.write(f"figure {ln.split()[0]} {ln.split()[1]}\n")
# streamed, the timeline comes with the last event
body = json.dumps({"prompt": "One, two,", "max_tokens": 4, "temperature": 0, "stream": True,
                   "qinfer_timeline": True}).encode()
req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
with urllib.request.urlopen(req, timeout=120) as r:
    events = [json.loads(ln[6:]) for ln in r.read().decode().splitlines() if ln.startswith("data: {")]
check(events and "qinfer_timeline" in events[-1] and all("qinfer_timeline" not in e for e in events[:-1]) and
      len(events[-1]["qinfer_timeline"]["token_s"]) == events[-1]["usage"]["completion_tokens"],
      f"a stream's timeline: {events[-1] if events else None}")
print(f"serve {rate!r} {dur!r} {tokens}")
sys.exit(1 if fails else 0)
