"""Hostile requests against `qinfer serve` (run by run.sh; the standard
library only): malformed JSON, wrong types, missing fields, unknown paths
and methods, bodies past the limit (announced and chunked), a slow client,
clients vanishing mid-upload and mid-stream (their requests cancelled, no
sequence left running), a queue overflow (429). The server must answer each
with the right status and an OpenAI-style error body, and keep serving."""
import http.client
import json
import socket
import sys
import threading
import time
import urllib.parse

url = urllib.parse.urlparse(sys.argv[1])
HOST, PORT = url.hostname, url.port
fails = []


def check(cond, what):
    if not cond:
        fails.append(what)
        print("FAIL:", what)


def request(method, path, body=None, headers=None, timeout=120, chunked=False):
    c = http.client.HTTPConnection(HOST, PORT, timeout=timeout)
    c.request(method, path, body=body, headers=headers or {}, encode_chunked=chunked)
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data


def expect_error(status, path, body, what):
    got, data = request("POST", path, body, {"Content-Type": "application/json"})
    check(got == status, f"{what}: status {got}, want {status}: {data[:200]!r}")
    try:
        e = json.loads(data)["error"]
        check(isinstance(e["message"], str) and isinstance(e["type"], str), f"{what}: error body {e}")
    except (ValueError, KeyError, TypeError) as x:
        check(False, f"{what}: not an error body ({x}): {data[:200]!r}")


def metric(name):
    _, data = request("GET", "/metrics")
    for ln in data.decode().splitlines():
        if ln.startswith(name + " "):
            return float(ln.split()[-1])
    return None


C, CH = "/v1/completions", "/v1/chat/completions"
for body, what in [(b"{bad", "malformed JSON"), (b"", "empty body"), (b"[1,2]", "not an object"),
                   (b'{"prompt": "a"', "truncated JSON"), (b"\xff\xfe{}", "garbage bytes"),
                   (b"{}", "no prompt"), (b'{"prompt": 5}', "prompt a number"),
                   (b'{"prompt": ["a", "b"]}', "two prompts"), (b'{"prompt": "a", "max_tokens": "5"}', "max_tokens a string"),
                   (b'{"prompt": "a", "max_tokens": -1}', "negative max_tokens"),
                   (b'{"prompt": "a", "max_tokens": 1.5}', "fractional max_tokens"),
                   (b'{"prompt": "a", "temperature": "hot"}', "temperature a string"),
                   (b'{"prompt": "a", "stream": "yes"}', "stream a string"),
                   (b'{"prompt": "a", "qinfer_timeline": 1}', "qinfer_timeline a number"), (b'{"prompt": "a", "stop": 5}', "stop a number"),
                   (b'{"prompt": "a", "stop": ["a","b","c","d","e"]}', "five stops"),
                   (b'{"prompt": "a", "logprobs": 9}', "logprobs 9"), (b'{"prompt": "a", "n": 2}', "n 2"),
                   (b'{"prompt": "a", "model": "gpt-4"}', "unknown model"), (b'{"prompt": "a", "model": 3}', "model a number"),
                   (b'{"prompt": ""}', "empty prompt"), (('{"prompt": "' + "word " * 600 + '"}').encode(), "prompt past the context")]:
    expect_error(400, C, body, what)
for body, what in [(b"{}", "chat without messages"), (b'{"messages": "hi"}', "messages a string"),
                   (b'{"messages": []}', "no messages"), (b'{"messages": [{"role": "user"}]}', "no content"),
                   (b'{"messages": [{"role": "user", "content": 1}]}', "content a number"),
                   (b'{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}',
                    "assistant last")]:
    expect_error(400, CH, body, what)
st, _ = request("GET", "/nope")
check(st == 404, f"unknown path: {st}")
st, _ = request("GET", C)
check(st == 405, f"GET on completions: {st}")
# a body past 1 MiB, announced: refused before it is sent
s = socket.create_connection((HOST, PORT), timeout=30)
s.sendall(f"POST {C} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {8 << 20}\r\n\r\n".encode())
head = s.recv(4096)
check(b" 413 " in head.split(b"\r\n")[0], f"announced huge body: {head[:80]!r}")
s.close()
# ... and sent chunked, without a length: read, dropped, refused
st, data = request("POST", C, body=iter([b'{"prompt": "' + b"a" * 65536] * 20 + [b'"}']),
                   headers={"Transfer-Encoding": "chunked"}, chunked=True)
check(st == 413, f"chunked huge body: {st} {data[:100]!r}")
# non-UTF-8 escapes in a prompt do not break the server
st, _ = request("POST", C, b'{"prompt": "\\ud800 \\u0000 x", "max_tokens": 2}')
check(st in (200, 400), f"odd escapes: {st}")

# a slow client holds a connection while others are served
slow = socket.create_connection((HOST, PORT), timeout=30)
slow.sendall(f"POST {C} HTTP/1.1\r\nHost: x\r\nContent-Len".encode())
t0 = time.time()
st, data = request("POST", C, b'{"prompt": "Hello", "max_tokens": 4, "temperature": 0}')
check(st == 200 and json.loads(data)["choices"][0]["text"], f"served beside a slow client: {st}")
slow.sendall(b"gth: 100\r\n\r\n{\"prom")
time.sleep(1)
slow.close()  # vanishes mid-upload

# a client that vanishes mid-stream: its request is cancelled, its sequence freed
cancelled0 = metric('qinfer_requests_total{status="cancelled"}')
s = socket.create_connection((HOST, PORT), timeout=60)
body = json.dumps({"prompt": "Once upon a time", "max_tokens": 400, "temperature": 0, "stream": True}).encode()
s.sendall(f"POST {C} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
          + body)
got = b""
while b"data: {" not in got:
    got += s.recv(4096)
s.close()
deadline = time.time() + 20
while time.time() < deadline and (metric('qinfer_requests_total{status="cancelled"}') <= cancelled0 or
                                  metric("qinfer_requests_running") != 0):
    time.sleep(0.2)
check(metric('qinfer_requests_total{status="cancelled"}') == cancelled0 + 1, "the vanished stream was not cancelled")
check(metric("qinfer_requests_running") == 0, "a sequence is left running")

# ... and one that vanishes while a non-streamed request runs
cancelled0 = metric('qinfer_requests_total{status="cancelled"}')
s = socket.create_connection((HOST, PORT), timeout=60)
body = json.dumps({"prompt": "Once upon a time", "max_tokens": 400, "temperature": 0}).encode()
s.sendall(f"POST {C} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
          + body)
time.sleep(0.5)
s.close()
deadline = time.time() + 20
while time.time() < deadline and (metric('qinfer_requests_total{status="cancelled"}') <= cancelled0 or
                                  metric("qinfer_requests_running") != 0):
    time.sleep(0.2)
check(metric('qinfer_requests_total{status="cancelled"}') == cancelled0 + 1, "the vanished request was not cancelled")
check(metric("qinfer_requests_running") == 0, "a sequence is left running after a vanished request")

# past the queue limit: 429 (the server runs --max-batch 4 --max-queue 4; a
# burst arrives faster than the engine admits, so at least 5 are served)
results = []
lock = threading.Lock()


def one():
    st, _ = request("POST", C, b'{"prompt": "Count: 1, 2,", "max_tokens": 40, "temperature": 0}')
    with lock:
        results.append(st)


ts = [threading.Thread(target=one) for _ in range(16)]
[t.start() for t in ts]
[t.join() for t in ts]
check(results.count(429) >= 1 and results.count(200) >= 5 and set(results) <= {200, 429},
      f"overload: {sorted(results)}")

# still serving
st, data = request("GET", "/health")
check(st == 200 and json.loads(data)["status"] == "ok", "health after all that")
st, data = request("POST", C, b'{"prompt": "Hello", "max_tokens": 2}')
check(st == 200, f"a completion after all that: {st}")
print(f"serve hostile: {len(fails)} failures, overload statuses {sorted(results)}")
sys.exit(1 if fails else 0)
