#!/usr/bin/env python3
"""Load test of `redlite serve` on loopback: CLIENTS concurrent streaming clients (the official
`openai` package's AsyncOpenAI), each sending REQUESTS distinct chat requests one after
another (greedy; every 4th samples with its own seed). Every request is first run alone
(sequentially, non-streaming) for its reference reply; under load each streamed reply must
equal its reference exactly, so nothing is lost or mixed between slots and batching does not
change results. A 503 (queue full) is retried after its Retry-After and counted. Bounded: the
concurrent phase fails past --time-limit seconds.

With --conversations a client's requests are the turns of one conversation (each reply run
alone becomes the assistant turn of the next request): alone, a turn resumes from the state
stored after the previous one; under load it may find that state evicted and start from
scratch, so this also asks that prompt reuse not change results.

Reports p50/p99 time to first token, aggregate completion tok/s, and the slot and queue
behaviour read from /metrics. The last line is "N passed, N failed" over the requests.

    python scripts/test/load_test.py --base-url http://127.0.0.1:PORT --api-key KEY
"""

import argparse
import asyncio
import json
import random
import statistics
import sys
import time

import openai

from client_util import httpx, parse_prometheus, value

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


def make_requests(clients, per_client, max_tokens, model, sampled_every, conversations):
    """requests[client][i]: keyword arguments of chat.completions.create. No two conversations
    share a prefix (each opens with its own made-up word). With `conversations`, a client's
    requests are the turns of one conversation and `messages` holds only what a turn adds (the
    history is prepended when the reference run has produced it)."""
    rng = random.Random(20261202)
    openers = pseudo_words(rng, clients * per_client)
    vocabulary = pseudo_words(rng, 400)
    out = []
    for c in range(clients):
        row = []
        for r in range(per_client):
            i = c * per_client + r
            opener = openers[c * per_client if conversations else i].capitalize()
            # Prompts of ~20 to ~500 tokens (later turns add less): some prefills take several
            # chunks and interleave with the decode steps of running streams.
            follow_up = conversations and r > 0
            words = 4 + (i * 37) % (50 if follow_up else 160)
            body = " ".join(rng.choice(vocabulary) for _ in range(words))
            if follow_up:
                messages = [{"role": "user", "content": f"Now these: {body}."}]
            else:
                messages = [{"role": "user", "content": f"{opener} {body}. Continue the list."}]
                if i % 3 == 0:
                    messages.insert(0, {"role": "system", "content": f"{opener} mode: reply with words."})
            req = dict(model=model, messages=messages, temperature=0, max_tokens=max_tokens, seed=7)
            if sampled_every and i % sampled_every == sampled_every - 1:
                # Seeded sampling: each request's random stream is its own, so it too must not
                # depend on what else runs.
                req.update(temperature=0.8, top_p=0.95, seed=1000 + i)
            row.append(req)
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
        self.busy, self.queue, self.latency = [], [], []
        self.stop = False

    async def run(self):
        async with httpx.AsyncClient(base_url=self.base, timeout=10) as http:
            while not self.stop:
                try:
                    t0 = time.perf_counter()
                    r = await http.get("/metrics", headers={"Authorization": f"Bearer {self.key}"})
                    self.latency.append(time.perf_counter() - t0)
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


def settled_metrics(http, key, limit_s=5.0):
    """The metrics once the server is idle: the scheduler counts a step's tokens after it has
    sent them, so a read right after the last response can miss the final step."""
    deadline = time.perf_counter() + limit_s
    last = read_metrics(http, key)
    while time.perf_counter() < deadline:
        time.sleep(0.1)
        now = read_metrics(http, key)
        idle = value(now, "redlite_slots_busy") == 0 and value(now, "redlite_queue_depth") == 0
        if idle and value(now, "redlite_completion_tokens_total") == value(last, "redlite_completion_tokens_total"):
            return now
        last = now
    return last


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", required=True, help="http://127.0.0.1:PORT (no /v1)")
    ap.add_argument("--api-key", required=True)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--requests", type=int, default=3, help="requests of each client, one after another")
    ap.add_argument(
        "--conversations",
        action="store_true",
        help="a client's requests are the turns of one conversation (under load a turn may resume from a stored state or not)",
    )
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument(
        "--sampled-every",
        type=int,
        default=4,
        help="every Nth request samples (temperature 0.8, its own seed) instead of greedy; 0: none",
    )
    ap.add_argument("--time-limit", type=float, default=240, help="seconds the concurrent phase may take")
    ap.add_argument("--alone-limit", type=float, default=300, help="seconds the run of every request alone may take")
    ap.add_argument("--dump", help="write every request, its reply alone and its reply under load to this JSON file")
    ap.add_argument("--slots", type=int, help="the server's --slots, to check the metrics against")
    ap.add_argument("--queue", type=int, help="the server's --queue, to check the metrics against")
    args = ap.parse_args()
    base = args.base_url.rstrip("/")
    http = httpx.Client(base_url=base, timeout=60)
    sync_client = openai.OpenAI(base_url=base + "/v1", api_key=args.api_key, max_retries=0, timeout=120)
    model = sync_client.models.list().data[0].id
    reqs = make_requests(args.clients, args.requests, args.max_tokens, model, args.sampled_every, args.conversations)
    total = args.clients * args.requests
    print(f"openai {openai.__version__}, server {base}, model {model}")
    sampled = sum(req["temperature"] > 0 for row in reqs for req in row)
    shape = "turns of one conversation" if args.conversations else "independent requests"
    print(
        f"{args.clients} clients x {args.requests} {shape}, max_tokens {args.max_tokens}: {total - sampled} greedy, {sampled} seeded sampling"
    )

    # Phase 1: every request alone.
    start_metrics = read_metrics(http, args.api_key)
    t0 = time.perf_counter()
    refs = []
    for row in reqs:
        ref_row, history = [], []
        for req in row:
            if time.perf_counter() - t0 > args.alone_limit:
                print(f"FAIL running every request alone took more than {args.alone_limit:.0f} s")
                print("0 passed, 1 failed")
                return 1
            if args.conversations:  # the conversation so far, replies run alone included
                req["messages"] = history + req["messages"]
            r = sync_client.chat.completions.create(**req)
            ref_row.append((r.choices[0].message.content, r.choices[0].finish_reason, r.usage))
            history = req["messages"] + [{"role": "assistant", "content": r.choices[0].message.content}]
        refs.append(ref_row)
    alone_s = time.perf_counter() - t0
    alone_tokens = sum(u.completion_tokens for row in refs for _, _, u in row)
    prompt_tokens = [u.prompt_tokens for row in refs for _, _, u in row]
    before = settled_metrics(http, args.api_key)
    alone = lambda name: value(before, name) - value(start_metrics, name)  # noqa: E731
    print(
        f"-- alone: {total} requests in {alone_s:.1f} s, {alone_tokens} completion tokens ({alone_tokens / alone_s:.1f} tok/s), "
        f"prompts {min(prompt_tokens)}..{max(prompt_tokens)} tokens, {alone('redlite_prompt_tokens_total'):.0f} in all, "
        f"{alone('redlite_prompt_tokens_cached_total'):.0f} reused from snapshots"
    )

    # Phase 2: all clients at once.
    results = [[Result() for _ in row] for row in reqs]
    bad_503s = []

    async def concurrent():
        aclient = openai.AsyncOpenAI(
            base_url=base + "/v1", api_key=args.api_key, max_retries=0, timeout=args.time_limit
        )
        sampler = Sampler(base, args.api_key)
        sampling = asyncio.create_task(sampler.run())
        deadline = time.perf_counter() + args.time_limit
        start = time.perf_counter()
        timed_out = False
        try:
            await asyncio.wait_for(
                asyncio.gather(
                    *(client_loop(aclient, reqs[c], results[c], deadline, bad_503s) for c in range(args.clients))
                ),
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
    after = settled_metrics(http, args.api_key)

    # Compare.
    flat = [(c, i, results[c][i], refs[c][i]) for c in range(args.clients) for i in range(args.requests)]
    passed, failures = 0, []
    for c, i, res, (ref_text, ref_finish, ref_usage) in flat:
        tag = f"client {c} request {i} ({'greedy' if reqs[c][i]['temperature'] == 0 else 'seeded sampling'})"
        if res.error:
            failures.append(f"{tag}: {res.error}")
        elif res.text is None:
            failures.append(f"{tag}: did not finish")
        elif res.text != ref_text:
            k = next(
                (j for j, (a, b) in enumerate(zip(res.text, ref_text)) if a != b), min(len(res.text), len(ref_text))
            )
            failures.append(
                f"{tag}: text differs from the request run alone at char {k}: "
                f"alone {ref_text[max(0, k - 20) : k + 30]!r}, under load {res.text[max(0, k - 20) : k + 30]!r}"
            )
        elif res.finish != ref_finish:
            failures.append(f"{tag}: finish_reason {res.finish} under load, {ref_finish} alone")
        elif res.usage is None:
            failures.append(f"{tag}: no usage chunk")
        elif (res.usage.prompt_tokens, res.usage.completion_tokens) != (
            ref_usage.prompt_tokens,
            ref_usage.completion_tokens,
        ):
            failures.append(
                f"{tag}: usage {res.usage.prompt_tokens}+{res.usage.completion_tokens} under load, "
                f"{ref_usage.prompt_tokens}+{ref_usage.completion_tokens} alone"
            )
        else:
            passed += 1

    if args.dump:
        with open(args.dump, "w") as f:
            json.dump(
                [
                    {
                        "client": c,
                        "turn": i,
                        "request": reqs[c][i],
                        "alone": ref[0],
                        "under_load": res.text,
                        "error": res.error,
                    }
                    for c, i, res, ref in flat
                ],
                f,
                ensure_ascii=False,
                indent=1,
            )

    d = lambda name, **labels: value(after, name, **labels) - value(before, name, **labels)  # noqa: E731
    done = [r for _, _, r, _ in flat if r.text is not None]
    ttft = [r.ttft for r in done]
    ttft_total = [r.ttft_total for r in done]
    latency = [r.latency for r in done]
    completion = sum(r.usage.completion_tokens for r in done if r.usage)
    rejections = sum(r.rejections for _, _, r, _ in flat)
    max_refused = max((r.rejections for _, _, r, _ in flat), default=0)
    steps = d("redlite_steps_total")
    rows = [
        ("requests", f"{len(done)}/{total} finished, {passed} equal to the request run alone"),
        ("wall time", f"{wall:.1f} s (limit {args.time_limit:.0f} s){' TIMED OUT' if timed_out else ''}"),
        (
            "TTFT p50 / p99",
            f"{percentile(ttft, 50) * 1000:.0f} / {percentile(ttft, 99) * 1000:.0f} ms (from the accepted attempt)",
        ),
        (
            "TTFT incl. 503 waits",
            f"{percentile(ttft_total, 50) * 1000:.0f} / {percentile(ttft_total, 99) * 1000:.0f} ms",
        ),
        ("latency p50 / p99", f"{percentile(latency, 50):.2f} / {percentile(latency, 99):.2f} s"),
        ("completion tokens", f"{completion} (server counted {d('redlite_completion_tokens_total'):.0f})"),
        (
            "aggregate tok/s",
            f"{completion / wall:.1f} under load vs {alone_tokens / alone_s:.1f} alone (completion tokens / wall time)",
        ),
        (
            "prompt tok/s",
            f"{d('redlite_prefill_tokens_total') / wall:.0f} ingested under load vs {alone('redlite_prefill_tokens_total') / alone_s:.0f} alone",
        ),
        (
            "503 + Retry-After",
            f"{rejections} seen, server rejected {d('redlite_requests_total', outcome='rejected'):.0f}; "
            f"{sum(r.rejections > 0 for _, _, r, _ in flat)} requests refused at least once, one {max_refused} times",
        ),
        (
            "steps",
            f"{steps:.0f}: {d('redlite_step_sequences_total') / max(steps, 1):.2f} sequences and "
            f"{d('redlite_step_rows_total') / max(steps, 1):.1f} rows per step on average",
        ),
        (
            "slots busy",
            f"max {max(sampler.busy, default=float('nan')):.0f}, mean {statistics.fmean(sampler.busy) if sampler.busy else float('nan'):.2f} "
            f"of {value(after, 'redlite_slots'):.0f} ({len(sampler.busy)} samples)",
        ),
        (
            "/metrics under load",
            f"answered in {percentile(sampler.latency, 50) * 1000:.1f} ms p50, {max(sampler.latency, default=0) * 1000:.1f} ms max",
        ),
        (
            "queue depth",
            f"max {value(after, 'redlite_queue_depth_max'):.0f} (server), max sampled {max(sampler.queue, default=float('nan')):.0f}"
            f", limit {args.queue if args.queue is not None else '?'}",
        ),
        (
            "prompt tokens",
            f"{d('redlite_prompt_tokens_total'):.0f}, {d('redlite_prompt_tokens_cached_total'):.0f} reused from snapshots "
            f"({d('redlite_prefix_cache_hits_total'):.0f} hits of {d('redlite_prefix_cache_lookups_total'):.0f} lookups)",
        ),
        (
            "after the load",
            f"slots busy {value(after, 'redlite_slots_busy'):.0f}, queue {value(after, 'redlite_queue_depth'):.0f}, "
            f"failed +{d('redlite_requests_total', outcome='failed'):.0f}, cancelled +{d('redlite_requests_total', outcome='cancelled'):.0f}",
        ),
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
        (
            "no slot busy and nothing queued after the load",
            value(after, "redlite_slots_busy") == 0 and value(after, "redlite_queue_depth") == 0,
        ),
        (
            f"completion tokens received ({completion}) = counted by the server",
            completion == d("redlite_completion_tokens_total"),
        ),
        ("decode steps are batched (more than one sequence per step on average)", avg_batch > 1.0 or args.clients == 1),
    ]
    if args.slots is not None:
        checks.append((f"busy slots never above {args.slots}", max(sampler.busy, default=0) <= args.slots))
        if args.clients > args.slots:
            checks.append(
                (
                    f"{args.clients} clients on {args.slots} slots: requests queued",
                    value(after, "redlite_queue_depth_max") >= 1,
                )
            )
    if args.queue is not None:
        checks.append(
            (f"queue depth never above --queue {args.queue}", value(after, "redlite_queue_depth_max") <= args.queue)
        )
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
