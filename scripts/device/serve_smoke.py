#!/usr/bin/env python3
"""`redlite serve` on a GPU, with the standard library only (the GPU machine has no network to
install the openai package): health, models, one chat, then N concurrent greedy streams
compared with the same requests run one at a time, and /metrics. Prints a short report.

    redlite serve --device cuda --snapshots 0 ...   # no prompt reuse: both passes compute
    python3 scripts/device/serve_smoke.py http://127.0.0.1:PORT [CLIENTS] [MAX_TOKENS]
"""
import json
import sys
import threading
import time
import urllib.request

BASE = sys.argv[1]
CLIENTS = int(sys.argv[2]) if len(sys.argv) > 2 else 8
MAX_TOKENS = int(sys.argv[3]) if len(sys.argv) > 3 else 32


def post(path, body, stream=False):
    req = urllib.request.Request(BASE + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=600)


def chat(i, stream):
    body = {"messages": [{"role": "user", "content": f"Request {i}: tell me about the number {i * 7919}."}],
            "max_tokens": MAX_TOKENS, "temperature": 0, "stream": stream}
    start = time.time()
    if not stream:
        r = json.load(post("/v1/chat/completions", body))
        return r["choices"][0]["message"]["content"], None, r["usage"]
    text, ttft = "", None
    with post("/v1/chat/completions", body) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            delta = json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
            if delta and ttft is None:
                ttft = time.time() - start
            text += delta
    return text, ttft, None


def metrics():
    text = urllib.request.urlopen(BASE + "/metrics").read().decode()
    return {l.split()[0]: float(l.split()[1]) for l in text.splitlines() if l and not l.startswith("#")}


print("health:", urllib.request.urlopen(BASE + "/health").read().decode())
print("models:", json.load(urllib.request.urlopen(BASE + "/v1/models"))["data"][0]["id"])
t0 = time.time()
alone = [chat(i, False) for i in range(CLIENTS)]
alone_s = time.time() - t0
print(f"alone: {CLIENTS} requests in {alone_s:.2f} s; usage of the first: {alone[0][2]}")
results = [None] * CLIENTS


def run(i):
    results[i] = chat(i, True)


m0 = metrics()
t0 = time.time()
threads = [threading.Thread(target=run, args=(i,)) for i in range(CLIENTS)]
for t in threads:
    t.start()
for t in threads:
    t.join()
wall = time.time() - t0
m1 = metrics()
equal = sum(results[i][0] == alone[i][0] for i in range(CLIENTS))
ttfts = sorted(r[1] for r in results if r[1] is not None)
steps = m1["redlite_steps_total"] - m0["redlite_steps_total"]
seqs = m1["redlite_step_sequences_total"] - m0["redlite_step_sequences_total"]
tokens = m1["redlite_completion_tokens_total"] - m0["redlite_completion_tokens_total"]
print(f"together: {CLIENTS} streams in {wall:.2f} s, {tokens:.0f} tokens, {tokens / wall:.1f} tok/s "
      f"(alone {CLIENTS * MAX_TOKENS / alone_s:.1f}); {seqs / max(steps, 1):.2f} sequences per step; "
      f"TTFT p50 {ttfts[len(ttfts) // 2] * 1e3:.0f} ms")
print(f"equal to the request alone: {equal}/{CLIENTS} (the GPU's multi-row kernels may round differently)")
for i in range(CLIENTS):
    if results[i][0] != alone[i][0]:
        a, b = alone[i][0], results[i][0]
        k = next((j for j in range(min(len(a), len(b))) if a[j] != b[j]), min(len(a), len(b)))
        print(f"  request {i}: first difference at char {k}")
print("busy slots after:", m1["redlite_slots_busy"], "failed:", m1['redlite_requests_total{outcome="failed"}'])
