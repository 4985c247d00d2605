"""The official openai client against `qinfer serve` (run by run.sh): the
models list, completions and chat, streamed and not, greedy and seeded,
stop strings, echo with prompt logprobs scoring a multiple choice, requests
batched concurrently, errors as the client raises them, /metrics."""
import math
import sys
import threading
import urllib.request

import openai

url = sys.argv[1]
client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
M = "smollm2-135m"
fails = []


def check(cond, what):
    if not cond:
        fails.append(what)
        print("FAIL:", what)


ids = [m.id for m in client.models.list().data]
check(ids == [M], f"models: {ids}")

# completions: greedy, not streamed and streamed, agree
P = "The capital of France is"
a = client.completions.create(model=M, prompt=P, max_tokens=8, temperature=0)
check(a.choices[0].text.strip() != "", f"empty greedy completion: {a}")
check(a.choices[0].finish_reason == "length" and a.usage.completion_tokens == 8, f"usage/finish: {a}")
b = client.completions.create(model=M, prompt=P, max_tokens=8, temperature=0)
check(a.choices[0].text == b.choices[0].text, "greedy completions differ")
parts = [c.choices[0].text for c in client.completions.create(model=M, prompt=P, max_tokens=8, temperature=0,
                                                              stream=True)]
check("".join(parts) == a.choices[0].text, f"streamed {parts!r} != {a.choices[0].text!r}")
echoed = "".join(c.choices[0].text for c in client.completions.create(model=M, prompt=P, max_tokens=8, temperature=0,
                                                                   stream=True, echo=True))
check(echoed == P + a.choices[0].text, f"streamed with echo: {echoed!r}")

# seeded sampling reproduces
s1 = client.completions.create(model=M, prompt="Once upon a time", max_tokens=12, temperature=0.8, top_p=0.95,
                               seed=7).choices[0].text
s2 = client.completions.create(model=M, prompt="Once upon a time", max_tokens=12, temperature=0.8, top_p=0.95,
                               seed=7).choices[0].text
check(s1 == s2, f"same seed, different text: {s1!r} {s2!r}")

# stop string
st = client.completions.create(model=M, prompt="1, 2, 3,", max_tokens=16, temperature=0, stop=[" 6"])
check(" 6" not in st.choices[0].text and st.choices[0].finish_reason == "stop", f"stop: {st.choices[0]}")

# chat, not streamed and streamed
msgs = [{"role": "system", "content": "You are brief."}, {"role": "user", "content": "Name a colour."}]
c = client.chat.completions.create(model=M, messages=msgs, max_tokens=10, temperature=0)
check(c.choices[0].message.role == "assistant" and c.choices[0].message.content, f"chat: {c}")
chunks = list(client.chat.completions.create(model=M, messages=msgs, max_tokens=10, temperature=0, stream=True))
text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
check(text == c.choices[0].message.content, f"streamed chat {text!r} != {c.choices[0].message.content!r}")
check(chunks[0].choices[0].delta.role == "assistant", "the first chunk carries no role")
check(chunks[-1].choices[0].finish_reason in ("stop", "length"), "the last chunk carries no finish reason")

conv = msgs + [{"role": "assistant", "content": "Blue."}, {"role": "user", "content": "Another one?"}]
c2 = client.chat.completions.create(model=M, messages=conv, max_tokens=8, temperature=0)
check(c2.choices[0].message.content and c2.usage.prompt_tokens > c.usage.prompt_tokens, f"multi-turn chat: {c2}")

# echo + logprobs, max_tokens 0: the prompt's logprobs, scoring a multiple choice
def score(context, option):
    r = client.completions.create(model=M, prompt=context + option, max_tokens=0, echo=True, logprobs=1,
                                  temperature=0)
    lp = r.choices[0].logprobs
    check(r.choices[0].text == context + option, f"echo text: {r.choices[0].text!r}")
    check("".join(lp.tokens) == context + option, f"echo tokens: {lp.tokens}")
    check(lp.token_logprobs[0] is None and all(x <= 0 and math.isfinite(x) for x in lp.token_logprobs[1:]),
          f"logprobs: {lp.token_logprobs}")
    check(len(lp.top_logprobs) == len(lp.tokens) and lp.top_logprobs[0] is None, "top_logprobs")
    check(r.usage.completion_tokens == 0, "max_tokens 0 generated")
    n_ctx = len(client.completions.create(model=M, prompt=context, max_tokens=0, echo=True,
                                          logprobs=0).choices[0].logprobs.tokens)
    return sum(lp.token_logprobs[n_ctx:])


right, wrong = score(P, " Paris"), score(P, " London")
check(right > wrong, f"multiple choice: Paris {right:.3f} <= London {wrong:.3f}")
# logprobs with generation: the greedy token is the top alternative
g = client.completions.create(model=M, prompt=P, max_tokens=3, temperature=0, logprobs=2)
glp = g.choices[0].logprobs
check(len(glp.tokens) == 3 and all(max(t.values()) == lp_tok for t, lp_tok in
                                   zip(glp.top_logprobs, glp.token_logprobs)), f"greedy logprobs: {glp}")

# four requests at once are batched and give what they give alone
alone = {p: client.completions.create(model=M, prompt=p, max_tokens=10, temperature=0).choices[0].text
         for p in ["Once upon a time", "The sky is", "def main():", "Water boils at"]}
got = {}


def one(p):
    got[p] = client.completions.create(model=M, prompt=p, max_tokens=10, temperature=0).choices[0].text


ts = [threading.Thread(target=one, args=(p,)) for p in alone]
[t.start() for t in ts]
[t.join() for t in ts]
check(got == alone, f"batched != alone: {got} {alone}")

# errors as the client sees them
try:
    client.completions.create(model="no-such-model", prompt="x", max_tokens=1)
    check(False, "unknown model accepted")
except openai.BadRequestError as e:
    check(e.status_code == 400 and "unknown model" in str(e), f"unknown model: {e}")
try:
    client.completions.create(model=M, prompt="x", max_tokens=1, temperature=7)
    check(False, "temperature 7 accepted")
except openai.BadRequestError:
    pass

metrics = urllib.request.urlopen(url + "/metrics").read().decode()
done = [ln for ln in metrics.splitlines() if ln.startswith('qinfer_requests_total{status="done"}')]
check(done and int(done[0].split()[-1]) >= 20, f"metrics: {done}")
check("qinfer_throughput_output_tokens_per_s " in metrics and "qinfer_ttft_p99_s " in metrics, "run figures")
# the run figures are measure.h's: rates are the done requests' counts over
# the run's duration (first arrival to last token), as bench and Lua define them
fig = {ln.split()[0]: float(ln.split()[1]) for ln in metrics.splitlines() if ln and not ln.startswith("#")}
dur = fig["qinfer_run_duration_s"]
for rate, count in [("qinfer_throughput_output_tokens_per_s", "qinfer_output_tokens_total"),
                    ("qinfer_throughput_requests_per_s", 'qinfer_requests_total{status="done"}'),
                    ("qinfer_throughput_total_tokens_per_s", None)]:
    n = fig[count] if count else fig["qinfer_output_tokens_total"] + fig["qinfer_prompt_tokens_total"]
    check(abs(fig[rate] * dur - n) <= 1e-6 * n, f"{rate} {fig[rate]} x {dur} s != {n}")
check(fig["qinfer_requests_done"] == fig['qinfer_requests_total{status="done"}'], "the window spans every request")

print(f"serve openai: {len(fails)} failures")
sys.exit(1 if fails else 0)
