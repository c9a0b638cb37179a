"""Checks of what must be refused or survived: API keys, malformed and oversized requests,
unknown endpoints, and clients that go away mid-stream, mid-wait or while queued. After them
the server must still answer and hold no busy slot, and its counters must add up."""

import json
import time

import openai

from client_util import GREEDY, GREEDY_MESSAGES, error_body, expect_error, httpx, raw_http, show, sse_content, value


def check_auth_errors(ctx):
    body = {"model": ctx.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    expect_error(ctx, "no key", 401, json_body=body, auth=False)
    expect_error(ctx, "wrong key", 401, json_body=body, auth=False, headers={"Authorization": "Bearer wrong-key"})
    expect_error(ctx, "not a bearer", 401, json_body=body, auth=False, headers={"Authorization": "test-key"})
    r = ctx.http.get("/v1/models", headers={"Authorization": f"bearer {ctx.key}"})
    show("lower-case 'bearer' scheme", f"HTTP {r.status_code} (the scheme is case-insensitive in HTTP)")
    r = ctx.http.get("/v1/models")
    show("GET /v1/models (no key)", f"HTTP {r.status_code}")
    assert r.status_code == 401, f"/v1/models without a key: {r.status_code}"
    error_body(r.status_code, r.content, "/v1/models without a key")
    bad = openai.OpenAI(base_url=ctx.base + "/v1", api_key="wrong-key", max_retries=0)
    try:
        bad.chat.completions.create(model=ctx.model, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        raise AssertionError("wrong key accepted")
    except openai.AuthenticationError as e:
        show("SDK, wrong key", f"AuthenticationError {e.status_code}: {e.message}")
        assert e.status_code == 401 and isinstance(e.body, dict) and e.body.get("message")


def check_request_errors(ctx):
    m = ctx.model
    user = [{"role": "user", "content": "hi"}]
    misses = []  # every case runs; the check fails at the end, naming each miss

    def refuse(label, **request):
        try:
            return expect_error(ctx, label, 400, **request)
        except AssertionError as e:
            misses.append(str(e)[:100])
            return None

    refuse("invalid JSON", content=b'{"model": "m", "messages": [')
    refuse("JSON not an object", content=b"[1, 2, 3]")
    refuse("messages is a string", json_body={"model": m, "messages": "hi"})
    refuse("messages missing", json_body={"model": m})
    refuse("temperature is a string", json_body={"model": m, "messages": user, "temperature": "hot"})
    refuse("max_tokens is a string", json_body={"model": m, "messages": user, "max_tokens": "ten"})
    refuse("max_tokens negative", json_body={"model": m, "messages": user, "max_tokens": -5})
    refuse("content is a number", json_body={"model": m, "messages": [{"role": "user", "content": 42}]})
    refuse("stop is a number", json_body={"model": m, "messages": user, "stop": 7})
    refuse("unknown role", json_body={"model": m, "messages": [{"role": "wizard", "content": "hi"}]})
    refuse("role missing", json_body={"model": m, "messages": [{"content": "hi"}]})
    refuse("empty messages", json_body={"model": m, "messages": []})
    refuse("max_tokens 0", json_body={"model": m, "messages": user, "max_tokens": 0})
    refuse("temperature -1", json_body={"model": m, "messages": user, "max_tokens": 2, "temperature": -1})
    refuse("top_p 1.5", json_body={"model": m, "messages": user, "max_tokens": 2, "top_p": 1.5})
    refuse("tool_choice unknown", json_body={"model": m, "messages": user, "max_tokens": 2, "tool_choice": "sometimes"})
    refuse(
        "tool without a function",
        json_body={"model": m, "messages": user, "max_tokens": 2, "tools": [{"type": "function"}]},
    )
    refuse("top_logprobs > 20", json_body={"model": m, "messages": user, "logprobs": True, "top_logprobs": 50})
    refuse(
        "invalid UTF-8",
        content=b'{"model": "m", "messages": [{"role": "user", "content": "bad \xff\xfe bytes"}]}',
    )
    # ~3000 tokens: each " apple" is one token of the Qwen vocabulary.
    long_text = "apple" + " apple" * 2999
    refuse(
        "prompt past the context",
        json_body={"model": m, "messages": [{"role": "user", "content": long_text}]},
        contains="context",
    )
    refuse(
        "max_tokens past the context",
        json_body={"model": m, "messages": user, "max_tokens": 5000},
        contains="context",
    )
    refuse(
        "max_completion_tokens past the context",
        json_body={"model": m, "messages": user, "max_completion_tokens": 5000},
        contains="context",
    )
    r = ctx.http.post("/v1/completions", json={"model": m, "prompt": long_text, "max_tokens": 4}, headers=ctx.auth())
    err = error_body(r.status_code, r.content, "completion prompt past the context")
    show("completion prompt past the context", f"HTTP {r.status_code} {err}")
    assert r.status_code == 400 and "context" in err["message"].lower()
    for label, prompt in (
        ("completion prompt is a number", 12),
        ("completion prompt empty", ""),
        ("completion token id past the vocabulary", [1, 2, 999_999_999]),
    ):
        r = ctx.http.post("/v1/completions", json={"model": m, "prompt": prompt, "max_tokens": 2}, headers=ctx.auth())
        show(label, f"HTTP {r.status_code} {r.text[:160]}")
        if r.status_code != 400:
            misses.append(f"{label}: expected HTTP 400, got {r.status_code}")
        else:
            error_body(r.status_code, r.content, label)
    # A format the server cannot guarantee must be refused, not ignored.
    r = ctx.http.post(
        "/v1/chat/completions",
        json={"model": m, "messages": user, "max_tokens": 2, "response_format": {"type": "json_object"}},
        headers=ctx.auth(),
    )
    show("response_format json_object", f"HTTP {r.status_code} {r.text[:160]}")
    if r.status_code != 400:
        misses.append(f"response_format json_object: expected HTTP 400 (no JSON mode), got {r.status_code}")
    # Many small messages: the template's fuel or the context refuses them, quickly, with a 400.
    many = [{"role": "user" if i % 2 == 0 else "assistant", "content": "hi"} for i in range(20000)]
    t0 = time.monotonic()
    refuse("20000 messages", json_body={"model": m, "messages": many})
    assert time.monotonic() - t0 < 10, f"refusing 20000 messages took {time.monotonic() - t0:.1f} s"
    # The SDK surfaces these as BadRequestError with the error object as body.
    try:
        ctx.client.chat.completions.create(model=m, messages=[], max_tokens=2)
        raise AssertionError("empty messages accepted")
    except openai.BadRequestError as e:
        show("SDK, empty messages", f"BadRequestError {e.status_code}: {e.message}")
        assert isinstance(e.body, dict) and e.body.get("message")
    assert not misses, "; ".join(misses)


def check_body_limits(ctx):
    big = json.dumps({"model": ctx.model, "messages": [{"role": "user", "content": "x" * (20 << 20)}]}).encode()
    headers = {"Authorization": f"Bearer {ctx.key}", "Content-Type": "application/json"}
    for chunked in (False, True):
        label = f"20 MB body ({'chunked' if chunked else 'Content-Length'})"
        t0 = time.monotonic()
        status, _, body, sent = raw_http(ctx.base, "POST", "/v1/chat/completions", headers, big, chunked=chunked)
        err = error_body(status, body, label)
        show(label, f"HTTP {status} after {sent >> 10} KiB sent, {time.monotonic() - t0:.2f} s: {err}")
        assert status == 413, f"{label}: expected 413, got {status}"
    status, _, body, _ = raw_http(
        ctx.base,
        "POST",
        "/v1/chat/completions",
        headers,
        b'{"model": "m", "messages": [{"role": "user", "content": "\xc3\x28"}]}',
    )
    show("raw invalid UTF-8", f"HTTP {status}")
    assert status == 400, status
    error_body(status, body, "raw invalid UTF-8")


def check_other_endpoints(ctx):
    r = ctx.http.post("/v1/nope", json={}, headers=ctx.auth())
    show("POST /v1/nope", f"HTTP {r.status_code} {r.text[:120]!r}")
    assert r.status_code == 404, r.status_code
    r = ctx.http.get("/v1/chat/completions", headers=ctx.auth())
    show("GET /v1/chat/completions", f"HTTP {r.status_code}")
    assert r.status_code in (404, 405), r.status_code
    r = ctx.http.post(
        "/v1/chat/completions",
        content=b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}',
        headers={**ctx.auth(), "Content-Type": "text/plain"},
    )
    show("text/plain content type", f"HTTP {r.status_code}")
    assert r.status_code in (200, 400, 415), r.status_code
    if r.status_code != 200:
        error_body(r.status_code, r.content, "text/plain content type")


def check_still_serving(ctx):
    r = ctx.client.chat.completions.create(model=ctx.model, messages=GREEDY_MESSAGES, **GREEDY)
    assert r.choices[0].message.content == ctx.greedy_text, "after the error cases the greedy reply changed"
    m = ctx.wait_idle()
    show(
        "after errors",
        f"slots_busy {value(m, 'redlite_slots_busy')}, queue {value(m, 'redlite_queue_depth')}, failed {value(m, 'redlite_requests_total', outcome='failed')}",
    )
    assert value(m, "redlite_slots_busy") == 0, "a slot is still busy"
    assert value(m, "redlite_queue_depth") == 0
    assert value(m, "redlite_requests_total", outcome="failed") == 0, "requests failed inside the engine"
    # Any model name is accepted.
    r = ctx.client.chat.completions.create(model="gpt-4o-mini", messages=GREEDY_MESSAGES, **GREEDY)
    assert r.choices[0].message.content == ctx.greedy_text


def check_disconnect_mid_stream(ctx):
    before = ctx.wait_idle()
    body = {
        "model": ctx.model,
        "messages": [{"role": "user", "content": "Write a very long story."}],
        "max_tokens": 1000,
        "temperature": 0,
        "stream": True,
    }
    got = 0
    with ctx.http.stream("POST", "/v1/chat/completions", json=body, headers=ctx.auth()) as r:
        assert r.status_code == 200, r.status_code
        assert r.headers.get("content-type", "").startswith("text/event-stream"), r.headers.get("content-type")
        for line in r.iter_lines():
            if sse_content(line):
                got += 1
                if got == 2:
                    break
    closed = time.monotonic()
    while time.monotonic() - closed < 3.0:
        m = ctx.metrics()
        if value(m, "redlite_slots_busy") == 0:
            break
        time.sleep(0.05)
    freed = time.monotonic() - closed
    cancelled = value(m, "redlite_requests_total", outcome="cancelled") - value(
        before, "redlite_requests_total", outcome="cancelled"
    )
    generated = value(m, "redlite_completion_tokens_total") - value(before, "redlite_completion_tokens_total")
    show(
        "stream closed after 2 tokens",
        f"slot free after {freed:.2f} s; cancelled +{cancelled:.0f}; {generated:.0f} tokens generated in all",
    )
    assert value(m, "redlite_slots_busy") == 0, "the slot of a closed stream is still busy after 3 s"
    assert cancelled == 1, f"cancelled requests +{cancelled}, expected +1"
    assert generated < 1000, "the closed stream ran to max_tokens"


def check_disconnect_nonstreaming(ctx):
    before = ctx.wait_idle()
    body = {
        "model": ctx.model,
        "messages": [{"role": "user", "content": "Write an even longer story."}],
        "max_tokens": 1000,
        "temperature": 0,
    }
    try:
        ctx.http.post("/v1/chat/completions", json=body, headers=ctx.auth(), timeout=0.5)
        raise AssertionError("a 1000-token reply came back within 0.5 s: the client gave up too late to test this")
    except httpx.TimeoutException:
        pass
    gave_up = time.monotonic()
    while time.monotonic() - gave_up < 3.0:
        m = ctx.metrics()
        if value(m, "redlite_slots_busy") == 0:
            break
        time.sleep(0.05)
    cancelled = value(m, "redlite_requests_total", outcome="cancelled") - value(
        before, "redlite_requests_total", outcome="cancelled"
    )
    show(
        "non-streaming client gave up after 0.5 s",
        f"slot free after {time.monotonic() - gave_up:.2f} s; cancelled +{cancelled:.0f}",
    )
    assert value(m, "redlite_slots_busy") == 0, "the slot of a client that gave up is still busy after 3 s"
    assert cancelled == 1, f"cancelled requests +{cancelled}, expected +1"


def check_disconnect_while_queued(ctx):
    """Four long streams hold the four slots; a fifth waits in the queue and its client goes
    away: the queue empties while the four still run."""
    before = ctx.wait_idle()

    def body(i):
        return {
            "model": ctx.model,
            "messages": [{"role": "user", "content": f"Story number {i}, long."}],
            "max_tokens": 1000,
            "temperature": 0,
            "stream": True,
        }

    holders = []
    try:
        for i in range(4):
            cm = ctx.http.stream("POST", "/v1/chat/completions", json=body(i), headers=ctx.auth())
            r = cm.__enter__()
            assert r.status_code == 200
            holders.append((cm, r.iter_lines()))
        for _, lines in holders:  # every holder has its slot: its first token came
            next(line for line in lines if sse_content(line))
        m = ctx.metrics()
        show("4 streams running", f"slots busy {value(m, 'redlite_slots_busy'):.0f}")
        waiter = httpx.Client(base_url=ctx.base, timeout=0.5)
        try:
            waiter.post("/v1/chat/completions", json=body(99), headers=ctx.auth())
            raise AssertionError("a fifth request was answered while four 1000-token streams held every slot")
        except httpx.TimeoutException:
            pass
        finally:
            waiter.close()
        gave_up = time.monotonic()
        while time.monotonic() - gave_up < 3.0:
            m = ctx.metrics()
            if value(m, "redlite_queue_depth") == 0:
                break
            time.sleep(0.05)
        busy = value(m, "redlite_slots_busy")
        show(
            "fifth client gave up",
            f"queue {value(m, 'redlite_queue_depth'):.0f} after {time.monotonic() - gave_up:.2f} s, slots busy {busy:.0f}",
        )
        assert value(m, "redlite_queue_depth") == 0, "the queued request of a client that went away still waits"
    finally:
        for cm, _ in holders:
            cm.__exit__(None, None, None)
    m = ctx.wait_idle()
    cancelled = value(m, "redlite_requests_total", outcome="cancelled") - value(
        before, "redlite_requests_total", outcome="cancelled"
    )
    show("all closed", f"slots busy {value(m, 'redlite_slots_busy'):.0f}, cancelled +{cancelled:.0f}")
    assert value(m, "redlite_slots_busy") == 0
    assert cancelled == 5, f"cancelled +{cancelled}, expected +5"


def check_final_metrics(ctx):
    m = ctx.wait_idle()
    keys = ["submitted", "rejected", "finished", "cancelled", "failed"]
    show("requests", {k: value(m, "redlite_requests_total", outcome=k) for k in keys})
    show(
        "tokens",
        {
            "prompt": value(m, "redlite_prompt_tokens_total"),
            "cached": value(m, "redlite_prompt_tokens_cached_total"),
            "prefill": value(m, "redlite_prefill_tokens_total"),
            "completion": value(m, "redlite_completion_tokens_total"),
            "prefix hits/lookups": f"{value(m, 'redlite_prefix_cache_hits_total'):.0f}/{value(m, 'redlite_prefix_cache_lookups_total'):.0f}",
        },
    )
    assert value(m, "redlite_slots_busy") == 0
    sub = value(m, "redlite_requests_total", outcome="submitted")
    done = sum(value(m, "redlite_requests_total", outcome=k) for k in ("finished", "cancelled", "failed"))
    assert sub == done, f"{sub} submitted but {done} finished, cancelled or failed"
    assert value(m, "redlite_prompt_tokens_total") == value(m, "redlite_prompt_tokens_cached_total") + value(
        m, "redlite_prefill_tokens_total"
    ), "prompt != cached + prefill"
