#!/usr/bin/env python3
"""`redlite serve` through the official `openai` Python package (and raw HTTP where the SDK
gets in the way): models, health, metrics, chat and completions (streaming and not), logprobs,
sampling fields, a tool-call round trip, reasoning switches, every error case of the API, and
clients that go away. Prints a transcript; the last line is "N passed, N failed".

The default model has random weights, so texts are word salad: the checks are about shapes,
exact counts and greedy determinism, never about what the text says.

    python scripts/test/openai_clients.py --base-url http://127.0.0.1:PORT --api-key KEY
"""

import argparse
import json
import re
import select
import socket
import sys
import time
import traceback
from urllib.parse import urlparse

import openai

try:  # the openai package brings httpx2 (same API as httpx); older releases bring httpx
    import httpx2 as httpx
except ImportError:
    import httpx

METRIC_NAMES = [
    "redlite_requests_total",
    "redlite_prompt_tokens_total",
    "redlite_prompt_tokens_cached_total",
    "redlite_prefill_tokens_total",
    "redlite_completion_tokens_total",
    "redlite_prefix_cache_lookups_total",
    "redlite_prefix_cache_hits_total",
    "redlite_steps_total",
    "redlite_step_rows_total",
    "redlite_step_sequences_total",
    "redlite_slots",
    "redlite_slots_busy",
    "redlite_queue_depth",
    "redlite_queue_depth_max",
    "redlite_tokens_per_second",
]

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}

TOOL_CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_0",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_0", "content": '{"temperature": 18, "sky": "cloudy"}'},
]


class Ctx:
    def __init__(self, base_url, api_key):
        self.base = base_url.rstrip("/")
        self.key = api_key
        self.client = openai.OpenAI(base_url=self.base + "/v1", api_key=api_key, max_retries=0, timeout=120)
        self.http = httpx.Client(base_url=self.base, timeout=120)
        self.model = None
        self.greedy_text = None  # the reference greedy chat reply, reused by later checks

    def auth(self):
        return {"Authorization": f"Bearer {self.key}"}

    def metrics(self):
        r = self.http.get("/metrics", headers=self.auth())
        assert r.status_code == 200, f"GET /metrics: {r.status_code} {r.text[:200]}"
        return parse_prometheus(r.text)

    def wait_idle(self, seconds=3.0):
        """Polls /metrics until no slot is busy and nothing waits; returns the last read."""
        deadline = time.monotonic() + seconds
        while True:
            m = self.metrics()
            if value(m, "redlite_slots_busy") == 0 and value(m, "redlite_queue_depth") == 0:
                return m
            if time.monotonic() > deadline:
                return m
            time.sleep(0.05)


def parse_prometheus(text):
    """{(name, 'k="v",...'): value} from Prometheus text format."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)(\s+\d+)?$", line)
        assert m, f"not a Prometheus sample line: {line!r}"
        labels = (m.group(2) or "{}")[1:-1]
        out[(m.group(1), labels)] = float(m.group(3))
    return out


def value(metrics, name, **labels):
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for (n, lab), v in metrics.items():
        if n != name:
            continue
        if not labels or all(f'{k}="{v2}"' in lab for k, v2 in labels.items()):
            return v
    raise AssertionError(f"metric {name}{{{want}}} missing")


def show(label, obj, limit=160):
    text = obj.replace("\n", "\\n") if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)
    if len(text) > limit:
        text = text[:limit] + f"... ({len(text)} chars)"
    print(f"    {label}: {text}")


def sse_content(line):
    """The delta text of one `data: {...}` line of a chat stream ("" for anything else)."""
    if not line.startswith("data: {"):
        return ""
    choices = json.loads(line[len("data: "):]).get("choices") or [{}]
    return (choices[0].get("delta") or {}).get("content") or ""


def error_body(status, body_bytes, label):
    """Asserts an OpenAI-style error object and returns it."""
    try:
        body = json.loads(body_bytes)
    except Exception:
        raise AssertionError(f"{label}: HTTP {status} body is not JSON: {body_bytes[:200]!r}")
    assert isinstance(body, dict) and isinstance(body.get("error"), dict), f"{label}: no error object: {body}"
    err = body["error"]
    assert isinstance(err.get("message"), str) and err["message"], f"{label}: error.message missing: {err}"
    assert isinstance(err.get("type"), str) and err["type"], f"{label}: error.type missing: {err}"
    return err


def expect_error(ctx, label, status, *, json_body=None, content=None, headers=None, auth=True, contains=None):
    h = dict(ctx.auth() if auth else {})
    if content is not None:
        h["Content-Type"] = "application/json"
    h.update(headers or {})
    r = ctx.http.post("/v1/chat/completions", json=json_body, content=content, headers=h)
    show(label, f"HTTP {r.status_code} {r.text[:200]}")
    assert r.status_code == status, f"{label}: expected HTTP {status}, got {r.status_code}: {r.text[:300]}"
    err = error_body(r.status_code, r.content, label)
    if contains:
        assert contains in err["message"].lower(), f"{label}: message should mention {contains!r}: {err['message']}"
    return err


def raw_http(base, method, path, headers, body, chunked=False, timeout=60):
    """One HTTP/1.1 request over a plain socket that stops sending as soon as the server answers
    (an HTTP client that insists on writing the whole body first sees a reset instead of the
    413). Returns (status, headers, body bytes, bytes of the body sent)."""
    u = urlparse(base)
    sock = socket.create_connection((u.hostname, u.port), timeout=timeout)
    try:
        head = [f"{method} {path} HTTP/1.1", f"Host: {u.hostname}:{u.port}", "Connection: close"]
        head += [f"{k}: {v}" for k, v in headers.items()]
        head.append("Transfer-Encoding: chunked" if chunked else f"Content-Length: {len(body)}")
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        sent, piece, answered = 0, 1 << 16, False
        deadline = time.monotonic() + timeout
        while sent < len(body) and time.monotonic() < deadline:
            readable, _, _ = select.select([sock], [], [], 0)
            if readable:
                answered = True
                break
            part = body[sent : sent + piece]
            try:
                sock.sendall(b"%x\r\n%s\r\n" % (len(part), part) if chunked else part)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(part)
        if chunked and not answered and sent >= len(body):
            try:
                sock.sendall(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                pass
        data = b""
        while True:
            try:
                got = sock.recv(65536)
            except ConnectionResetError:
                break
            if not got:
                break
            data += got
            if b"\r\n\r\n" in data:
                head_part, _, rest = data.partition(b"\r\n\r\n")
                m = re.search(rb"(?i)content-length:\s*(\d+)", head_part)
                if m and len(rest) >= int(m.group(1)):
                    break
    finally:
        sock.close()
    assert data, f"{method} {path}: no response (sent {sent} of {len(body)} body bytes)"
    head_part, _, rest = data.partition(b"\r\n\r\n")
    lines = head_part.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    hdrs = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    if hdrs.get("transfer-encoding", "").lower() == "chunked":
        body_out, buf = b"", rest
        while buf:
            size_line, _, buf = buf.partition(b"\r\n")
            size = int(size_line.split(b";")[0] or b"0", 16)
            if size == 0:
                break
            body_out, buf = body_out + buf[:size], buf[size + 2 :]
        rest = body_out
    return status, hdrs, rest, sent


# ---------------------------------------------------------------------------------------------
# checks, run in order


def check_models_health_metrics(ctx):
    models = ctx.client.models.list()
    ids = [m.id for m in models.data]
    show("models", ids)
    assert len(ids) == 1, f"expected one model, got {ids}"
    ctx.model = ids[0]
    r = ctx.http.get("/health")
    show("GET /health (no key)", f"HTTP {r.status_code} {r.text[:80]}")
    assert r.status_code == 200, f"/health without a key: {r.status_code}"
    r = ctx.http.get("/metrics")
    show("GET /metrics (no key)", f"HTTP {r.status_code}")
    assert r.status_code in (200, 401), f"/metrics without a key: {r.status_code}"
    r = ctx.http.get("/metrics", headers=ctx.auth())
    assert r.status_code == 200, f"/metrics: {r.status_code}"
    assert r.headers.get("content-type", "").startswith("text/plain"), f"/metrics content-type {r.headers.get('content-type')}"
    m = parse_prometheus(r.text)
    names = {n for n, _ in m}
    missing = [n for n in METRIC_NAMES if n not in names]
    show("metrics", f"{len(m)} samples; " + ", ".join(sorted(names))[:400], limit=500)
    assert not missing, f"metrics missing: {missing}"
    for outcome in ("submitted", "rejected", "finished", "cancelled", "failed"):
        value(m, "redlite_requests_total", outcome=outcome)
    assert value(m, "redlite_slots") == 4, f"redlite_slots {value(m, 'redlite_slots')}, started with --slots 4"


GREEDY = dict(temperature=0, max_tokens=16, seed=1234)
GREEDY_MESSAGES = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "Name three rivers in Europe."},
]


def check_usage(usage, max_completion, label):
    assert usage is not None, f"{label}: no usage"
    assert usage.prompt_tokens > 0, f"{label}: prompt_tokens {usage.prompt_tokens}"
    assert 0 <= usage.completion_tokens <= max_completion, f"{label}: completion_tokens {usage.completion_tokens} > {max_completion}"
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens, f"{label}: total {usage.total_tokens} != {usage.prompt_tokens} + {usage.completion_tokens}"


def check_chat_nonstreaming(ctx):
    first = ctx.client.chat.completions.create(model=ctx.model, messages=GREEDY_MESSAGES, **GREEDY)
    c = first.choices[0]
    show("reply", c.message.content)
    show("finish/usage", f"{c.finish_reason} {first.usage.model_dump(exclude_none=True)}")
    assert first.object == "chat.completion", first.object
    assert len(first.choices) == 1
    assert c.message.role == "assistant"
    assert isinstance(c.message.content, str), f"content {c.message.content!r}"
    assert c.finish_reason in ("stop", "length"), c.finish_reason
    check_usage(first.usage, 16, "first")
    if c.finish_reason == "length":
        assert first.usage.completion_tokens == 16, f"finish_reason length after {first.usage.completion_tokens} of 16 tokens"
    second = ctx.client.chat.completions.create(model=ctx.model, messages=GREEDY_MESSAGES, **GREEDY)
    details = second.usage.prompt_tokens_details
    cached = details.cached_tokens if details else None
    show("second", f"same text: {second.choices[0].message.content == c.message.content}; cached_tokens {cached}")
    assert second.choices[0].message.content == c.message.content, f"greedy not deterministic: {c.message.content!r} vs {second.choices[0].message.content!r}"
    assert second.usage.prompt_tokens == first.usage.prompt_tokens
    assert second.usage.completion_tokens == first.usage.completion_tokens
    assert cached is None or 0 <= cached <= second.usage.prompt_tokens, f"cached_tokens {cached}"
    ctx.greedy_text = c.message.content
    ctx.greedy_usage = first.usage


def check_chat_streaming(ctx):
    stream = ctx.client.chat.completions.create(
        model=ctx.model, messages=GREEDY_MESSAGES, stream=True, stream_options={"include_usage": True}, **GREEDY
    )
    chunks = list(stream)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    usage_chunks = [ch for ch in chunks if ch.usage is not None]
    show("chunks", f"{len(chunks)}; text {text!r}"[:200])
    show("finish/usage", f"{finishes} {usage_chunks[-1].usage.model_dump(exclude_none=True) if usage_chunks else None}")
    assert chunks, "no chunks"
    assert all(ch.object == "chat.completion.chunk" for ch in chunks), {ch.object for ch in chunks}
    assert len({ch.id for ch in chunks}) == 1, "chunks carry different ids"
    assert chunks[0].choices and chunks[0].choices[0].delta.role == "assistant", "first delta has no role"
    assert text == ctx.greedy_text, f"stream text {text!r} != non-streaming {ctx.greedy_text!r}"
    assert finishes == [finishes[-1]] and finishes[-1] in ("stop", "length"), f"finish_reason chunks {finishes}"
    assert len(usage_chunks) == 1 and usage_chunks[0] is chunks[-1], "usage must come once, in the last chunk"
    assert chunks[-1].choices == [], "the usage chunk should have empty choices"
    u = chunks[-1].usage
    check_usage(u, 16, "stream")
    assert (u.prompt_tokens, u.completion_tokens) == (ctx.greedy_usage.prompt_tokens, ctx.greedy_usage.completion_tokens), "stream usage differs from non-streaming"
    # Without include_usage no chunk carries usage.
    plain = list(ctx.client.chat.completions.create(model=ctx.model, messages=GREEDY_MESSAGES, stream=True, **GREEDY))
    assert all(ch.usage is None for ch in plain), "usage sent without stream_options.include_usage"
    assert "".join(ch.choices[0].delta.content or "" for ch in plain if ch.choices) == ctx.greedy_text


def apply_template(ctx, body):
    r = ctx.http.post("/apply-template", json=body, headers=ctx.auth())
    assert r.status_code == 200, f"/apply-template: HTTP {r.status_code} {r.text[:300]}"
    prompt = r.json().get("prompt")
    assert isinstance(prompt, str) and prompt, f"/apply-template: no prompt in {r.text[:200]}"
    return prompt


def check_content_parts_and_roles(ctx):
    as_string = [{"role": "user", "content": "Hello there, how are you?"}]
    as_parts = [{"role": "user", "content": [{"type": "text", "text": "Hello there, "}, {"type": "text", "text": "how are you?"}]}]
    p1 = apply_template(ctx, {"model": ctx.model, "messages": as_string})
    p2 = apply_template(ctx, {"model": ctx.model, "messages": as_parts})
    show("template", p2)
    assert p1 == p2, f"content parts render differently from the joined string:\n{p1!r}\n{p2!r}"
    r1 = ctx.client.chat.completions.create(model=ctx.model, messages=as_parts, temperature=0, max_tokens=8)
    r2 = ctx.client.chat.completions.create(model=ctx.model, messages=as_string, temperature=0, max_tokens=8)
    assert r1.choices[0].message.content == r2.choices[0].message.content
    convo = [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": "Say a number."},
        {"role": "assistant", "content": "Seven."},
        {"role": "user", "content": [{"type": "text", "text": "Another one."}]},
    ]
    r = ctx.client.chat.completions.create(model=ctx.model, messages=convo, temperature=0, max_tokens=8)
    show("multi-turn reply", r.choices[0].message.content)
    assert isinstance(r.choices[0].message.content, str)
    # "developer" is the newer name of the system role in OpenAI's API.
    try:
        r = ctx.client.chat.completions.create(
            model=ctx.model, messages=[{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hi"}], max_tokens=4
        )
        show("developer role", "accepted")
    except openai.BadRequestError as e:
        show("developer role", f"refused (400: {e.message})")


def check_completions(ctx):
    prompt = "The quick brown fox jumps over the"
    r = ctx.client.completions.create(model=ctx.model, prompt=prompt, max_tokens=8, temperature=0)
    c = r.choices[0]
    show("completion", f"{c.text!r} finish {c.finish_reason} usage {r.usage.model_dump(exclude_none=True)}")
    assert r.object == "text_completion", r.object
    assert isinstance(c.text, str) and c.finish_reason in ("stop", "length")
    check_usage(r.usage, 8, "completion")
    chunks = list(
        ctx.client.completions.create(model=ctx.model, prompt=prompt, max_tokens=8, temperature=0, stream=True, stream_options={"include_usage": True})
    )
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    show("streamed", f"{len(chunks)} chunks, {text!r}")
    assert text == c.text, f"streamed completion {text!r} != {c.text!r}"
    usage = [ch.usage for ch in chunks if ch.usage is not None]
    assert len(usage) == 1 and usage[0].completion_tokens == r.usage.completion_tokens, f"streamed usage {usage}"


def check_logprobs(ctx):
    r = ctx.client.chat.completions.create(model=ctx.model, messages=GREEDY_MESSAGES, logprobs=True, top_logprobs=3, **GREEDY)
    lp = r.choices[0].logprobs
    assert lp is not None and lp.content is not None, "no logprobs.content"
    n = r.usage.completion_tokens
    show("logprobs", f"{len(lp.content)} entries for {n} tokens; first {lp.content[0].model_dump() if lp.content else None}", limit=400)
    assert len(lp.content) == n, f"{len(lp.content)} logprob entries for {n} completion tokens"
    for i, e in enumerate(lp.content):
        assert isinstance(e.token, str)
        assert e.logprob <= 0, f"entry {i}: logprob {e.logprob} > 0"
        assert len(e.top_logprobs) == 3, f"entry {i}: {len(e.top_logprobs)} top_logprobs"
        tops = [t.logprob for t in e.top_logprobs]
        assert all(t <= 0 for t in tops) and tops == sorted(tops, reverse=True), f"entry {i}: top_logprobs not sorted: {tops}"
        # Greedy picks the most likely token.
        assert abs(e.logprob - tops[0]) < 1e-3, f"entry {i}: greedy token logprob {e.logprob} is not the top {tops[0]}"
        assert e.bytes is None or isinstance(e.bytes, list)
    assert r.choices[0].message.content == ctx.greedy_text, "asking for logprobs changed the greedy text"
    joined = "".join(e.token for e in lp.content)
    show("tokens joined == content", joined == ctx.greedy_text)
    # Streaming carries the same entries, chunk by chunk.
    chunks = list(
        ctx.client.chat.completions.create(model=ctx.model, messages=GREEDY_MESSAGES, logprobs=True, top_logprobs=3, stream=True, **GREEDY)
    )
    streamed = [e for ch in chunks if ch.choices and ch.choices[0].logprobs and ch.choices[0].logprobs.content for e in ch.choices[0].logprobs.content]
    assert [(e.token, round(e.logprob, 4)) for e in streamed] == [(e.token, round(e.logprob, 4)) for e in lp.content], "streamed logprobs differ"


def check_sampling_fields(ctx):
    base = ctx.greedy_text
    # stop: a piece from the middle of the greedy reply cuts it there.
    if len(base) >= 6:
        k = len(base) // 2
        stop = base[k : k + 2]
        while base.index(stop) < k and k + 3 < len(base):
            k += 1
            stop = base[k : k + 2]
        cut = base[: base.index(stop)]
        r = ctx.client.chat.completions.create(model=ctx.model, messages=GREEDY_MESSAGES, stop=[stop, "never-appears-xyz"], **GREEDY)
        show("stop", f"{stop!r} -> {r.choices[0].message.content!r} ({r.choices[0].finish_reason})")
        assert r.choices[0].message.content == cut, f"stop {stop!r}: expected {cut!r}, got {r.choices[0].message.content!r}"
        assert r.choices[0].finish_reason == "stop", r.choices[0].finish_reason
        assert r.usage.completion_tokens <= ctx.greedy_usage.completion_tokens
        r = ctx.client.chat.completions.create(model=ctx.model, messages=GREEDY_MESSAGES, stop=stop, **GREEDY)
        assert r.choices[0].message.content == cut, "stop as a plain string"
        chunks = list(ctx.client.chat.completions.create(model=ctx.model, messages=GREEDY_MESSAGES, stop=[stop], stream=True, **GREEDY))
        streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        assert streamed == cut, f"streamed stop: expected {cut!r}, got {streamed!r}"
    else:
        show("stop", f"greedy reply {base!r} too short to cut: skipped")
    # max_completion_tokens (the newer name of max_tokens).
    r = ctx.client.chat.completions.create(
        model=ctx.model, messages=GREEDY_MESSAGES, temperature=0, seed=1234, max_completion_tokens=5
    )
    show("max_completion_tokens=5", f"{r.choices[0].message.content!r} {r.usage.completion_tokens} tokens {r.choices[0].finish_reason}")
    assert r.usage.completion_tokens <= 5
    if r.choices[0].finish_reason == "length":
        assert r.usage.completion_tokens == 5
    assert base.startswith(r.choices[0].message.content), "a shorter greedy reply must be a prefix of the longer one"
    # Every sampling field at once.
    sampled = dict(
        model=ctx.model,
        messages=GREEDY_MESSAGES,
        temperature=0.8,
        top_p=0.9,
        presence_penalty=0.5,
        frequency_penalty=0.3,
        max_tokens=12,
        seed=42,
        extra_body={"top_k": 20, "min_p": 0.05},
    )
    a = ctx.client.chat.completions.create(**sampled)
    b = ctx.client.chat.completions.create(**sampled)
    show("sampled (seed 42) twice", [a.choices[0].message.content, b.choices[0].message.content])
    assert isinstance(a.choices[0].message.content, str)
    assert a.choices[0].message.content == b.choices[0].message.content, "the same seed gave different samples"
    # n=1 explicitly, and fields clients send that change nothing here, are fine.
    r = ctx.client.chat.completions.create(
        model=ctx.model, messages=GREEDY_MESSAGES, n=1, user="client-test", store=False, metadata={"run": "ci"}, **GREEDY
    )
    assert len(r.choices) == 1 and r.choices[0].message.content == base


def check_tool_round_trip(ctx):
    r = ctx.client.chat.completions.create(
        model=ctx.model, messages=TOOL_CONVERSATION, tools=[WEATHER_TOOL], tool_choice="auto", temperature=0, max_tokens=16
    )
    c = r.choices[0]
    show("reply", f"content {c.message.content!r} tool_calls {c.message.tool_calls} finish {c.finish_reason}")
    assert c.message.role == "assistant"
    assert c.finish_reason in ("stop", "length", "tool_calls"), c.finish_reason
    assert isinstance(c.message.content, str) or c.message.tool_calls, "neither content nor tool_calls"
    check_usage(r.usage, 16, "tool")
    # Streaming with tools as well.
    chunks = list(
        ctx.client.chat.completions.create(
            model=ctx.model, messages=TOOL_CONVERSATION, tools=[WEATHER_TOOL], temperature=0, max_tokens=16, stream=True
        )
    )
    assert chunks and chunks[-1].choices[0].finish_reason in ("stop", "length", "tool_calls")
    streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert streamed == (c.message.content or ""), f"streamed {streamed!r} != {c.message.content!r}"
    prompt = apply_template(ctx, {"model": ctx.model, "messages": TOOL_CONVERSATION, "tools": [WEATHER_TOOL]})
    print("    rendered conversation:")
    for line in prompt.splitlines():
        print("      | " + line[:150])
    for needle in ("<tools>", '"get_weather"', "<tool_call>", "</tool_call>", "Paris", "<tool_response>", "</tool_response>", '"temperature": 18'):
        assert needle in prompt, f"/apply-template output lacks {needle!r}"
    assert prompt.index("<tool_call>") < prompt.index("<tool_response>")
    assert prompt.rstrip().endswith("<|im_start|>assistant") or "<|im_start|>assistant\n" in prompt[-40:], "no generation prompt at the end"
    # The tool_choice forms OpenAI clients send.
    for choice in ("none", "required", {"type": "function", "function": {"name": "get_weather"}}):
        r = ctx.client.chat.completions.create(
            model=ctx.model, messages=TOOL_CONVERSATION[:2], tools=[WEATHER_TOOL], tool_choice=choice, temperature=0, max_tokens=4
        )
        assert r.choices[0].message.role == "assistant"
    show("tool_choice none/required/named", "accepted")


def check_reasoning_switch(ctx):
    r = ctx.client.chat.completions.create(
        model=ctx.model, messages=GREEDY_MESSAGES, temperature=0, max_tokens=8, extra_body={"chat_template_kwargs": {"enable_thinking": False}}
    )
    c = r.choices[0]
    reasoning = getattr(c.message, "reasoning_content", None)
    show("enable_thinking=false", f"content {c.message.content!r} reasoning_content {reasoning!r}")
    assert isinstance(c.message.content, str)
    on = apply_template(ctx, {"model": ctx.model, "messages": GREEDY_MESSAGES, "chat_template_kwargs": {"enable_thinking": True}})
    off = apply_template(ctx, {"model": ctx.model, "messages": GREEDY_MESSAGES, "chat_template_kwargs": {"enable_thinking": False}})
    show("prompt end, thinking on", on[-60:])
    show("prompt end, thinking off", off[-60:])


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
    expect_error(ctx, "invalid JSON", 400, content=b'{"model": "m", "messages": [')
    expect_error(ctx, "JSON not an object", 400, content=b'[1, 2, 3]')
    expect_error(ctx, "messages is a string", 400, json_body={"model": m, "messages": "hi"})
    expect_error(ctx, "messages missing", 400, json_body={"model": m})
    expect_error(ctx, "temperature is a string", 400, json_body={"model": m, "messages": user, "temperature": "hot"})
    expect_error(ctx, "max_tokens is a string", 400, json_body={"model": m, "messages": user, "max_tokens": "ten"})
    expect_error(ctx, "max_tokens negative", 400, json_body={"model": m, "messages": user, "max_tokens": -5})
    expect_error(ctx, "content is a number", 400, json_body={"model": m, "messages": [{"role": "user", "content": 42}]})
    expect_error(ctx, "stop is a number", 400, json_body={"model": m, "messages": user, "stop": 7})
    expect_error(ctx, "unknown role", 400, json_body={"model": m, "messages": [{"role": "wizard", "content": "hi"}]})
    expect_error(ctx, "role missing", 400, json_body={"model": m, "messages": [{"content": "hi"}]})
    expect_error(ctx, "empty messages", 400, json_body={"model": m, "messages": []})
    expect_error(ctx, "top_logprobs > 20", 400, json_body={"model": m, "messages": user, "logprobs": True, "top_logprobs": 50})
    expect_error(ctx, "invalid UTF-8", 400, content=b'{"model": "m", "messages": [{"role": "user", "content": "bad \xff\xfe bytes"}]}')
    # ~3000 tokens: each " apple" is one token of the Qwen vocabulary.
    long_text = "apple" + " apple" * 2999
    expect_error(ctx, "prompt past the context", 400, json_body={"model": m, "messages": [{"role": "user", "content": long_text}]}, contains="context")
    expect_error(ctx, "max_tokens past the context", 400, json_body={"model": m, "messages": user, "max_tokens": 5000}, contains="context")
    expect_error(ctx, "max_completion_tokens past the context", 400, json_body={"model": m, "messages": user, "max_completion_tokens": 5000}, contains="context")
    r = ctx.http.post("/v1/completions", json={"model": m, "prompt": long_text, "max_tokens": 4}, headers=ctx.auth())
    err = error_body(r.status_code, r.content, "completion prompt past the context")
    show("completion prompt past the context", f"HTTP {r.status_code} {err}")
    assert r.status_code == 400 and "context" in err["message"].lower()
    r = ctx.http.post("/v1/completions", json={"model": m, "prompt": 12}, headers=ctx.auth())
    show("completion prompt is a number", f"HTTP {r.status_code}")
    assert r.status_code == 400, r.status_code
    error_body(r.status_code, r.content, "completion prompt is a number")
    # The SDK surfaces these as BadRequestError with the error object as body.
    try:
        ctx.client.chat.completions.create(model=m, messages=[], max_tokens=2)
        raise AssertionError("empty messages accepted")
    except openai.BadRequestError as e:
        show("SDK, empty messages", f"BadRequestError {e.status_code}: {e.message}")
        assert isinstance(e.body, dict) and e.body.get("message")


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
    status, _, body, _ = raw_http(ctx.base, "POST", "/v1/chat/completions", headers, b'{"model": "m", "messages": [{"role": "user", "content": "\xc3\x28"}]}')
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
    r = ctx.http.post("/v1/chat/completions", content=b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}',
                      headers={**ctx.auth(), "Content-Type": "text/plain"})
    show("text/plain content type", f"HTTP {r.status_code}")
    assert r.status_code in (200, 400, 415), r.status_code
    if r.status_code != 200:
        error_body(r.status_code, r.content, "text/plain content type")


def check_still_serving(ctx):
    r = ctx.client.chat.completions.create(model=ctx.model, messages=GREEDY_MESSAGES, **GREEDY)
    assert r.choices[0].message.content == ctx.greedy_text, "after the error cases the greedy reply changed"
    m = ctx.wait_idle()
    show("after errors", f"slots_busy {value(m, 'redlite_slots_busy')}, queue {value(m, 'redlite_queue_depth')}, failed {value(m, 'redlite_requests_total', outcome='failed')}")
    assert value(m, "redlite_slots_busy") == 0, "a slot is still busy"
    assert value(m, "redlite_queue_depth") == 0
    assert value(m, "redlite_requests_total", outcome="failed") == 0, "requests failed inside the engine"
    # Any model name is accepted.
    r = ctx.client.chat.completions.create(model="gpt-4o-mini", messages=GREEDY_MESSAGES, **GREEDY)
    assert r.choices[0].message.content == ctx.greedy_text


def check_disconnect_mid_stream(ctx):
    before = ctx.wait_idle()
    body = {"model": ctx.model, "messages": [{"role": "user", "content": "Write a very long story."}], "max_tokens": 1000, "temperature": 0, "stream": True}
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
    cancelled = value(m, "redlite_requests_total", outcome="cancelled") - value(before, "redlite_requests_total", outcome="cancelled")
    generated = value(m, "redlite_completion_tokens_total") - value(before, "redlite_completion_tokens_total")
    show("stream closed after 2 tokens", f"slot free after {freed:.2f} s; cancelled +{cancelled:.0f}; {generated:.0f} tokens generated in all")
    assert value(m, "redlite_slots_busy") == 0, "the slot of a closed stream is still busy after 3 s"
    assert cancelled == 1, f"cancelled requests +{cancelled}, expected +1"
    assert generated < 1000, "the closed stream ran to max_tokens"


def check_disconnect_nonstreaming(ctx):
    before = ctx.wait_idle()
    body = {"model": ctx.model, "messages": [{"role": "user", "content": "Write an even longer story."}], "max_tokens": 1000, "temperature": 0}
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
    cancelled = value(m, "redlite_requests_total", outcome="cancelled") - value(before, "redlite_requests_total", outcome="cancelled")
    show("non-streaming client gave up after 0.5 s", f"slot free after {time.monotonic() - gave_up:.2f} s; cancelled +{cancelled:.0f}")
    assert value(m, "redlite_slots_busy") == 0, "the slot of a client that gave up is still busy after 3 s"
    assert cancelled == 1, f"cancelled requests +{cancelled}, expected +1"


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
    assert value(m, "redlite_prompt_tokens_total") == value(m, "redlite_prompt_tokens_cached_total") + value(m, "redlite_prefill_tokens_total"), "prompt != cached + prefill"


def check_prompt_reuse(ctx):
    """The second turn of a conversation resumes from the first turn's state: it ingests only
    its new tokens, and the reply is the one computed from scratch."""
    turn1 = [
        {"role": "system", "content": "You keep a ship's log, tersely."},
        {"role": "user", "content": "Log entry one: we left the harbour at dawn."},
    ]
    turn2 = turn1 + [
        {"role": "assistant", "content": "Noted: departed harbour, dawn, calm sea."},
        {"role": "user", "content": "Log entry two: the wind turned north by noon."},
    ]
    args = dict(model=ctx.model, temperature=0, max_tokens=12)
    cached = lambda r: (r.usage.prompt_tokens_details.cached_tokens or 0) if r.usage.prompt_tokens_details else 0  # noqa: E731
    # Turn 2 first, cold: nothing stored holds its first turn yet.
    cold = ctx.client.chat.completions.create(messages=turn2, **args)
    first = ctx.client.chat.completions.create(messages=turn1, **args)
    before = ctx.metrics()
    warm = ctx.client.chat.completions.create(messages=turn2, **args)
    after = ctx.metrics()
    ingested = value(after, "redlite_prefill_tokens_total") - value(before, "redlite_prefill_tokens_total")
    show("turn 1", f"{first.usage.prompt_tokens} prompt tokens, cached {cached(first)}")
    show("turn 2 cold", f"{cold.usage.prompt_tokens} prompt tokens, cached {cached(cold)}: {cold.choices[0].message.content!r}")
    show("turn 2 warm", f"cached {cached(warm)}, ingested {ingested:.0f} (new tokens {warm.usage.prompt_tokens - first.usage.prompt_tokens}): {warm.choices[0].message.content!r}")
    assert cached(warm) >= first.usage.prompt_tokens, f"turn 2 reused {cached(warm)} tokens, turn 1's prompt has {first.usage.prompt_tokens}"
    assert ingested == warm.usage.prompt_tokens - cached(warm), f"ingested {ingested} != prompt {warm.usage.prompt_tokens} - cached {cached(warm)}"
    assert warm.choices[0].message.content == cold.choices[0].message.content, "resuming from a snapshot changed the greedy reply"
    # A real conversation: the model's own reply goes back as the assistant turn.
    reply = first.choices[0].message.content
    real2 = turn1 + [{"role": "assistant", "content": reply}, {"role": "user", "content": "And the next entry?"}]
    r = ctx.client.chat.completions.create(messages=real2, **args)
    show("turn 2 after the model's reply", f"{r.usage.prompt_tokens} prompt tokens, cached {cached(r)} "
         f"(turn 1 prompt {first.usage.prompt_tokens}, + reply {first.usage.completion_tokens})")
    assert cached(r) >= first.usage.prompt_tokens
    # A regenerated answer: the same prompt again.
    again = ctx.client.chat.completions.create(messages=turn1, **args)
    show("turn 1 again (regenerate)", f"cached {cached(again)} of {again.usage.prompt_tokens}")
    if cached(again) == 0:
        print("    NOTE: resending an identical prompt reuses nothing (the prompt-end snapshot is not used for the same prompt)")


def check_n(ctx):
    try:
        r = ctx.client.chat.completions.create(model=ctx.model, messages=GREEDY_MESSAGES, n=2, temperature=0.7, max_tokens=4, seed=3)
        show("n=2", f"{len(r.choices)} choices")
        assert len(r.choices) == 2, f"n=2 answered with {len(r.choices)} choice(s) and no error"
    except openai.BadRequestError as e:
        show("n=2", f"refused: 400 {e.message}")


def check_raw_event_stream(ctx):
    body = {"model": ctx.model, "messages": GREEDY_MESSAGES, "stream": True, **GREEDY}
    with ctx.http.stream("POST", "/v1/chat/completions", json=body, headers=ctx.auth()) as r:
        assert r.status_code == 200
        ctype = r.headers.get("content-type", "")
        raw = r.read().decode()
    events = [e for e in raw.split("\n\n") if e.strip()]
    show("content-type", ctype)
    show("last events", events[-2:])
    assert ctype.startswith("text/event-stream"), ctype
    assert raw.endswith("\n\n"), "the stream does not end with a blank line"
    assert all(e.startswith("data: ") for e in events), [e for e in events if not e.startswith("data: ")][:3]
    assert events[-1] == "data: [DONE]", f"last event {events[-1]!r}"
    assert sum(e == "data: [DONE]" for e in events) == 1
    for e in events[:-1]:
        json.loads(e[len("data: "):])


def check_context_boundary(ctx):
    text = "pear" + " pear" * 1989
    messages = [{"role": "user", "content": text}]
    r = ctx.client.chat.completions.create(model=ctx.model, messages=messages, max_tokens=1, temperature=0)
    prompt = r.usage.prompt_tokens
    ctx_len = 2048
    room = ctx_len - prompt
    show("prompt", f"{prompt} tokens; room {room}")
    assert room > 0
    r = ctx.client.chat.completions.create(model=ctx.model, messages=messages, max_tokens=room, temperature=0)
    show(f"max_tokens={room} (prompt + max_tokens = {ctx_len})", f"HTTP 200, {r.usage.completion_tokens} tokens, {r.choices[0].finish_reason}")
    assert r.usage.completion_tokens <= room
    try:
        ctx.client.chat.completions.create(model=ctx.model, messages=messages, max_tokens=room + 1, temperature=0)
        raise AssertionError(f"max_tokens={room + 1} (one past the context) accepted")
    except openai.BadRequestError as e:
        show(f"max_tokens={room + 1}", f"400 {e.message}")
        assert "context" in e.message.lower()


def check_disconnect_while_queued(ctx):
    """Four long streams hold the four slots; a fifth waits in the queue and its client goes
    away: the queue empties while the four still run."""
    before = ctx.wait_idle()
    body = lambda i: {"model": ctx.model, "messages": [{"role": "user", "content": f"Story number {i}, long."}],  # noqa: E731
                      "max_tokens": 1000, "temperature": 0, "stream": True}
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
        show("fifth client gave up", f"queue {value(m, 'redlite_queue_depth'):.0f} after {time.monotonic() - gave_up:.2f} s, slots busy {busy:.0f}")
        assert value(m, "redlite_queue_depth") == 0, "the queued request of a client that went away still waits"
    finally:
        for cm, _ in holders:
            cm.__exit__(None, None, None)
    m = ctx.wait_idle()
    cancelled = value(m, "redlite_requests_total", outcome="cancelled") - value(before, "redlite_requests_total", outcome="cancelled")
    show("all closed", f"slots busy {value(m, 'redlite_slots_busy'):.0f}, cancelled +{cancelled:.0f}")
    assert value(m, "redlite_slots_busy") == 0
    assert cancelled == 5, f"cancelled +{cancelled}, expected +5"


CHECKS = [
    ("models, /health, /metrics", check_models_health_metrics),
    ("chat, non-streaming, greedy twice", check_chat_nonstreaming),
    ("chat, streaming with include_usage", check_chat_streaming),
    ("raw event stream ends with data: [DONE]", check_raw_event_stream),
    ("content parts and roles", check_content_parts_and_roles),
    ("completions, plain and streaming", check_completions),
    ("logprobs with top_logprobs=3", check_logprobs),
    ("stop, max_completion_tokens, sampling fields", check_sampling_fields),
    ("n=2: two choices or a 400", check_n),
    ("prompt reuse across turns", check_prompt_reuse),
    ("prompt + max_tokens = context", check_context_boundary),
    ("tool-call round trip and /apply-template", check_tool_round_trip),
    ("chat_template_kwargs.enable_thinking", check_reasoning_switch),
    ("errors: API key", check_auth_errors),
    ("errors: bad requests", check_request_errors),
    ("errors: body size limit", check_body_limits),
    ("errors: other endpoints", check_other_endpoints),
    ("still serving, nothing leaked", check_still_serving),
    ("client closes a stream mid-way", check_disconnect_mid_stream),
    ("non-streaming client gives up", check_disconnect_nonstreaming),
    ("queued client gives up", check_disconnect_while_queued),
    ("final metrics add up", check_final_metrics),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", required=True, help="http://127.0.0.1:PORT (no /v1)")
    ap.add_argument("--api-key", required=True)
    ap.add_argument("--only", help="run the checks whose name contains this")
    args = ap.parse_args()
    ctx = Ctx(args.base_url, args.api_key)
    print(f"openai {openai.__version__}, server {ctx.base}")
    passed, failed = [], []
    for name, fn in CHECKS:
        if args.only and args.only not in name and name != CHECKS[0][0]:
            continue
        print(f"-- {name}")
        t0 = time.monotonic()
        try:
            fn(ctx)
            print(f"   PASS ({time.monotonic() - t0:.2f} s)")
            passed.append(name)
        except Exception as e:  # one failing check must not hide the others
            detail = f"{type(e).__name__}: {e}"
            if not isinstance(e, AssertionError):
                detail += "\n" + "".join(traceback.format_exception(e)[-3:])
            print(f"   FAIL: {detail}")
            failed.append((name, detail.splitlines()[0]))
    print()
    for name, detail in failed:
        print(f"FAILED {name}: {detail}")
    print(f"{len(passed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
