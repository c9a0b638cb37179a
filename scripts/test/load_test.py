#!/usr/bin/env python3
"""Load test of `redlite serve` on loopback: CLIENTS concurrent streaming clients (the official
`openai` package's AsyncOpenAI), each sending REQUESTS distinct greedy chat requests one after
another. Every request is first run alone (sequentially, non-streaming) for its reference
reply; under load each streamed reply must equal its reference exactly, so nothing is lost or
mixed between slots and batching does not change results. A 503 (queue full) is retried after
its Retry-After and counted. Bounded: the concurrent phase fails past --time-limit seconds.

Reports p50/p99 time to first token, aggregate completion tok/s, and the slot and queue
behaviour read from /metrics. The last line is "N passed, N failed" over the requests.

    python scripts/test/load_test.py --base-url http://127.0.0.1:PORT --api-key KEY
"""

import argparse
import asyncio
import random
import statistics
import sys
import time

import openai

from openai_clients import httpx, parse_prometheus, value

SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]


def pseudo_words(rng, count):
    """Distinct made-up words, so no prompt is another's prefix and no snapshot is shared."""
    words, seen = [], set()
    while len(words) < count:
        w = "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 4)))
        if w not in seen:
            seen.add(w)
            words.append(w)
    return words


def make_requests(clients, per_client, max_tokens, model):
    """requests[client][i]: keyword arguments of chat.completions.create."""
    rng = random.Random(20261202)
    openers = pseudo_words(rng, clients * per_client)
    vocabulary = pseudo_words(rng, 400)
    out = []
    for c in range(clients):
        row = []
        for r in range(per_client):
            i = c * per_client + r
            # Prompt lengths from ~20 to ~500 tokens: some prefills take several chunks and
            # interleave with the decode steps of running streams.
            body = " ".join(rng.choice(vocabulary) for _ in range(4 + (i * 37) % 160))
            messages = [{"role": "user", "content": f"{openers[i].capitalize()} {body}. Continue the list."}]
            if i % 3 == 0:
                messages.insert(0, {"role": "system", "content": f"{openers[i].capitalize()} mode: reply with words."})
            row.append(dict(model=model, messages=messages, temperature=0, max_tokens=max_tokens, seed=7))
        out.append(row)
    return out


def percentile(values, q):
    if not values:
        return float("nan")
    s = sorted(values)
    k = (len(s) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


class Sampler:
    """Reads /metrics every `period` seconds while the load runs: busy slots and queue depth."""

    def __init__(self, base, key, period=0.1):
        self.base, self.key, self.period = base, key, period
        self.busy, self.queue = [], []
        self.stop = False

    async def run(self):
        async with httpx.AsyncClient(base_url=self.base, timeout=10) as http:
            while not self.stop:
                try:
                    r = await http.get("/metrics", headers={"Authorization": f"Bearer {self.key}"})
                    m = parse_prometheus(r.text)
                    self.busy.append(value(m, "redlite_slots_busy"))
                    self.queue.append(value(m, "redlite_queue_depth"))
                except Exception as e:  # a missed sample is no failure; the counters still are
                    print(f"   metrics sample failed: {e}")
                await asyncio.sleep(self.period)


class Result:
    def __init__(self):
        self.text = None
        self.finish = None
        self.usage = None
        self.ttft = None  # from the accepted attempt
        self.ttft_total = None  # from the first attempt, 503 waits included
        self.latency = None
        self.rejections = 0
        self.error = None


async def run_one(aclient, req, res, deadline, bad_503s):
    first_try = time.perf_counter()
    while True:
        start = time.perf_counter()
        try:
            stream = await aclient.chat.completions.create(**req, stream=True, stream_options={"include_usage": True})
        except openai.APIStatusError as e:
            if e.status_code != 503:
                raise
            res.rejections += 1
            retry_after = e.response.headers.get("retry-after")
            if not (isinstance(e.body, dict) and isinstance(e.body.get("message"), str)):
                bad_503s.append(f"503 without an OpenAI error object: {e.body!r}")
            if retry_after is None:
                bad_503s.append("503 without Retry-After")
                wait = 1.0
            else:
                wait = float(retry_after)
            if time.perf_counter() + wait > deadline:
                raise TimeoutError(f"still refused (503) after {res.rejections} tries")
            await asyncio.sleep(wait + random.uniform(0, 0.05))
            continue
        parts, first = [], None
        async for chunk in stream:
            if chunk.choices:
                choice = chunk.choices[0]
                if choice.delta.content:
                    if first is None:
                        first = time.perf_counter()
                    parts.append(choice.delta.content)
                if choice.finish_reason:
                    res.finish = choice.finish_reason
            if chunk.usage is not None:
                res.usage = chunk.usage
        end = time.perf_counter()
        first = first or end
        res.text = "".join(parts)
        res.ttft = first - start
        res.ttft_total = first - first_try
        res.latency = end - first_try
        return


async def client_loop(aclient, reqs, results, deadline, bad_503s):
    for req, res in zip(reqs, results):
        try:
            await run_one(aclient, req, res, deadline, bad_503s)
        except Exception as e:
            res.error = f"{type(e).__name__}: {e}"


def read_metrics(http, key):
    r = http.get("/metrics", headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200, f"/metrics: HTTP {r.status_code}"
    return parse_prometheus(r.text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", required=True, help="http://127.0.0.1:PORT (no /v1)")
    ap.add_argument("--api-key", required=True)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--requests", type=int, default=3, help="requests per client, one after another")
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--time-limit", type=float, default=240, help="seconds the concurrent phase may take")
    ap.add_argument("--slots", type=int, help="the server's --slots, to check the metrics against")
    ap.add_argument("--queue", type=int, help="the server's --queue, to check the metrics against")
    args = ap.parse_args()
    base = args.base_url.rstrip("/")
    http = httpx.Client(base_url=base, timeout=60)
    sync_client = openai.OpenAI(base_url=base + "/v1", api_key=args.api_key, max_retries=0, timeout=120)
    model = sync_client.models.list().data[0].id
    reqs = make_requests(args.clients, args.requests, args.max_tokens, model)
    total = args.clients * args.requests
    print(f"openai {openai.__version__}, server {base}, model {model}")
    print(f"{args.clients} clients x {args.requests} requests, greedy, max_tokens {args.max_tokens}")

    # Phase 1: every request alone.
    t0 = time.perf_counter()
    refs = []
    for row in reqs:
        ref_row = []
        for req in row:
            r = sync_client.chat.completions.create(**req)
            ref_row.append((r.choices[0].message.content, r.choices[0].finish_reason, r.usage))
        refs.append(ref_row)
    alone_s = time.perf_counter() - t0
    alone_tokens = sum(u.completion_tokens for row in refs for _, _, u in row)
    prompt_tokens = [u.prompt_tokens for row in refs for _, _, u in row]
    print(f"-- alone: {total} requests in {alone_s:.1f} s, {alone_tokens} completion tokens ({alone_tokens / alone_s:.1f} tok/s), "
          f"prompts {min(prompt_tokens)}..{max(prompt_tokens)} tokens")

    # Phase 2: all clients at once.
    before = read_metrics(http, args.api_key)
    results = [[Result() for _ in row] for row in reqs]
    bad_503s = []

    async def concurrent():
        aclient = openai.AsyncOpenAI(base_url=base + "/v1", api_key=args.api_key, max_retries=0, timeout=args.time_limit)
        sampler = Sampler(base, args.api_key)
        sampling = asyncio.create_task(sampler.run())
        deadline = time.perf_counter() + args.time_limit
        start = time.perf_counter()
        timed_out = False
        try:
            await asyncio.wait_for(
                asyncio.gather(*(client_loop(aclient, reqs[c], results[c], deadline, bad_503s) for c in range(args.clients))),
                timeout=args.time_limit,
            )
        except asyncio.TimeoutError:
            timed_out = True
        wall = time.perf_counter() - start
        sampler.stop = True
        await sampling
        await aclient.close()
        return wall, timed_out, sampler

    wall, timed_out, sampler = asyncio.run(concurrent())
    time.sleep(0.3)  # the scheduler publishes busy slots at its next step
    after = read_metrics(http, args.api_key)

    # Compare.
    flat = [(c, i, results[c][i], refs[c][i]) for c in range(args.clients) for i in range(args.requests)]
    passed, failures = 0, []
    for c, i, res, (ref_text, ref_finish, ref_usage) in flat:
        tag = f"client {c} request {i}"
        if res.error:
            failures.append(f"{tag}: {res.error}")
        elif res.text is None:
            failures.append(f"{tag}: did not finish")
        elif res.text != ref_text:
            k = next((j for j, (a, b) in enumerate(zip(res.text, ref_text)) if a != b), min(len(res.text), len(ref_text)))
            failures.append(f"{tag}: text differs from the request run alone at char {k}: "
                            f"alone {ref_text[max(0, k - 20):k + 30]!r}, under load {res.text[max(0, k - 20):k + 30]!r}")
        elif res.finish != ref_finish:
            failures.append(f"{tag}: finish_reason {res.finish} under load, {ref_finish} alone")
        elif res.usage is None:
            failures.append(f"{tag}: no usage chunk")
        elif (res.usage.prompt_tokens, res.usage.completion_tokens) != (ref_usage.prompt_tokens, ref_usage.completion_tokens):
            failures.append(f"{tag}: usage {res.usage.prompt_tokens}+{res.usage.completion_tokens} under load, "
                            f"{ref_usage.prompt_tokens}+{ref_usage.completion_tokens} alone")
        else:
            passed += 1

    d = lambda name, **labels: value(after, name, **labels) - value(before, name, **labels)  # noqa: E731
    done = [r for _, _, r, _ in flat if r.text is not None]
    ttft = [r.ttft for r in done]
    ttft_total = [r.ttft_total for r in done]
    latency = [r.latency for r in done]
    completion = sum(r.usage.completion_tokens for r in done if r.usage)
    rejections = sum(r.rejections for _, _, r, _ in flat)
    steps = d("redlite_steps_total")
    rows = [
        ("requests", f"{len(done)}/{total} finished, {passed} equal to the request run alone"),
        ("wall time", f"{wall:.1f} s (limit {args.time_limit:.0f} s){' TIMED OUT' if timed_out else ''}"),
        ("TTFT p50 / p99", f"{percentile(ttft, 50) * 1000:.0f} / {percentile(ttft, 99) * 1000:.0f} ms (from the accepted attempt)"),
        ("TTFT incl. 503 waits", f"{percentile(ttft_total, 50) * 1000:.0f} / {percentile(ttft_total, 99) * 1000:.0f} ms"),
        ("latency p50 / p99", f"{percentile(latency, 50):.2f} / {percentile(latency, 99):.2f} s"),
        ("completion tokens", f"{completion} (server counted {d('redlite_completion_tokens_total'):.0f})"),
        ("aggregate tok/s", f"{completion / wall:.1f} under load vs {alone_tokens / alone_s:.1f} alone"),
        ("503 + Retry-After", f"{rejections} seen, server rejected {d('redlite_requests_total', outcome='rejected'):.0f}"),
        ("steps", f"{steps:.0f}: {d('redlite_step_sequences_total') / max(steps, 1):.2f} sequences and "
                  f"{d('redlite_step_rows_total') / max(steps, 1):.1f} rows per step on average"),
        ("slots busy", f"max {max(sampler.busy, default=float('nan')):.0f}, mean {statistics.fmean(sampler.busy) if sampler.busy else float('nan'):.2f} "
                       f"of {value(after, 'redlite_slots'):.0f} ({len(sampler.busy)} samples)"),
        ("queue depth", f"max {value(after, 'redlite_queue_depth_max'):.0f} (server), max sampled {max(sampler.queue, default=float('nan')):.0f}"
                        f", limit {args.queue if args.queue is not None else '?'}"),
        ("prompt tokens", f"{d('redlite_prompt_tokens_total'):.0f}, {d('redlite_prompt_tokens_cached_total'):.0f} reused from snapshots "
                          f"({d('redlite_prefix_cache_hits_total'):.0f} hits of {d('redlite_prefix_cache_lookups_total'):.0f} lookups)"),
        ("after the load", f"slots busy {value(after, 'redlite_slots_busy'):.0f}, queue {value(after, 'redlite_queue_depth'):.0f}, "
                           f"failed +{d('redlite_requests_total', outcome='failed'):.0f}, cancelled +{d('redlite_requests_total', outcome='cancelled'):.0f}"),
    ]
    width = max(len(k) for k, _ in rows)
    print()
    print(f"| {'load test'.ljust(width)} | result |")
    print(f"| {'-' * width} | ------ |")
    for k, v in rows:
        print(f"| {k.ljust(width)} | {v} |")
    print()

    # Server-side checks, each (what must hold, holds).
    rejected = d("redlite_requests_total", outcome="rejected")
    avg_batch = d("redlite_step_sequences_total") / steps if steps else 0.0
    checks = [
        (f"the concurrent phase ends within {args.time_limit:.0f} s", not timed_out),
        ("every 503 carries Retry-After and an OpenAI error object", not bad_503s),
        (f"503s seen ({rejections}) = rejections counted by the server ({rejected:.0f})", rejections == rejected),
        ("no request failed inside the engine", d("redlite_requests_total", outcome="failed") == 0),
        ("no slot busy and nothing queued after the load", value(after, "redlite_slots_busy") == 0 and value(after, "redlite_queue_depth") == 0),
        (f"completion tokens received ({completion}) = counted by the server", completion == d("redlite_completion_tokens_total")),
        ("decode steps are batched (more than one sequence per step on average)", avg_batch > 1.0 or args.clients == 1),
    ]
    if args.slots is not None:
        checks.append((f"busy slots never above {args.slots}", max(sampler.busy, default=0) <= args.slots))
        if args.clients > args.slots:
            checks.append((f"{args.clients} clients on {args.slots} slots: requests queued", value(after, "redlite_queue_depth_max") >= 1))
    if args.queue is not None:
        checks.append((f"queue depth never above --queue {args.queue}", value(after, "redlite_queue_depth_max") <= args.queue))
    for what, ok in checks:
        if not ok:
            failures.append(what)
    for what in sorted(set(bad_503s))[:5]:
        print(f"   {what}")

    for f in failures[:40]:
        print(f"FAIL {f}")
    if len(failures) > 40:
        print(f"... and {len(failures) - 40} more")
    checks_passed = sum(ok for _, ok in checks)
    print(f"{passed + checks_passed} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
