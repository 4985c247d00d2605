"""check_preempt.py URL [swap] - qinfer serve admitting through the scheduler
under a KV memory budget too small for its batch (test_load.sh starts it with
--kv-memory): four greedy requests at once, each crossing into a second KV
block while decoding, so some are preempted, recomputed (or, with swap, a
server started with --preempt swap: swapped to the offload tier and back);
each must answer what it answers alone, and /metrics must count the
preemptions (with swap: every one a swap; without, none) and leave nothing
running (the standard library only)."""
import json
import sys
import threading
import urllib.request

url = sys.argv[1]
swap = len(sys.argv) > 2 and sys.argv[2] == "swap"
fails = []


def check(cond, what):
    if not cond:
        fails.append(what)
        print("FAIL:", what)


def complete(prompt):
    body = json.dumps({"prompt": prompt, "max_tokens": 16, "temperature": 0}).encode()
    req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())["choices"][0]["text"]


def metric(name):
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return None


prompts = [f"Item {k}: " + " ".join(f"w{k}{i}" for i in range(15)) for k in range(4)]  # 54 tokens: a second block while decoding
p0, s0 = metric("qinfer_preemptions_total"), metric("qinfer_preemptions_swap_total")
together = [None] * 4


def one(k):
    together[k] = complete(prompts[k])


ts = [threading.Thread(target=one, args=(k,)) for k in range(4)]
[t.start() for t in ts]
[t.join() for t in ts]
p1, s1 = metric("qinfer_preemptions_total"), metric("qinfer_preemptions_swap_total")
check(p1 > p0, "the budget preempted nothing")
if swap:
    check(s1 - s0 == p1 - p0, f"{p1 - p0:g} preemptions, {s1 - s0:g} of them swaps")
else:
    check(s1 == s0, f"{s1 - s0:g} swaps without --preempt swap")
for k in range(4):
    alone = complete(prompts[k])
    check(together[k] == alone, f"request {k}: {together[k]!r} together, {alone!r} alone")
check(metric("qinfer_requests_running") == 0 and metric("qinfer_requests_waiting") == 0, "requests left behind")
sys.exit(1 if fails else 0)
