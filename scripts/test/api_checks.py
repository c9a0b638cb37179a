"""Checks of the API surface through the official `openai` package: models, health, metrics,
chat and text completions (whole and streamed), logprobs, sampling fields, prompt reuse across
turns, the context boundary, a tool-call round trip and the reasoning switch. Each takes a
`Ctx` and asserts; the random-weight default model makes texts word salad, so the checks are
about shapes, exact counts and greedy determinism."""

import json

import openai

from client_util import (
    GREEDY,
    GREEDY_MESSAGES,
    METRIC_NAMES,
    apply_template,
    check_usage,
    parse_prometheus,
    show,
    value,
)

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
    assert r.headers.get("content-type", "").startswith("text/plain"), (
        f"/metrics content-type {r.headers.get('content-type')}"
    )
    m = parse_prometheus(r.text)
    names = {n for n, _ in m}
    missing = [n for n in METRIC_NAMES if n not in names]
    show("metrics", f"{len(m)} samples; " + ", ".join(sorted(names))[:400], limit=500)
    assert not missing, f"metrics missing: {missing}"
    for outcome in ("submitted", "rejected", "finished", "cancelled", "failed"):
        value(m, "redlite_requests_total", outcome=outcome)
    assert value(m, "redlite_slots") == 4, f"redlite_slots {value(m, 'redlite_slots')}, started with --slots 4"


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
        assert first.usage.completion_tokens == 16, (
            f"finish_reason length after {first.usage.completion_tokens} of 16 tokens"
        )
    second = ctx.client.chat.completions.create(model=ctx.model, messages=GREEDY_MESSAGES, **GREEDY)
    details = second.usage.prompt_tokens_details
    cached = details.cached_tokens if details else None
    show("second", f"same text: {second.choices[0].message.content == c.message.content}; cached_tokens {cached}")
    assert second.choices[0].message.content == c.message.content, (
        f"greedy not deterministic: {c.message.content!r} vs {second.choices[0].message.content!r}"
    )
    assert second.usage.prompt_tokens == first.usage.prompt_tokens
    assert second.usage.completion_tokens == first.usage.completion_tokens
    assert cached is None or 0 <= cached <= second.usage.prompt_tokens, f"cached_tokens {cached}"
    ctx.reference = (c.message.content, first.usage)


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
    assert (u.prompt_tokens, u.completion_tokens) == (
        ctx.greedy_usage.prompt_tokens,
        ctx.greedy_usage.completion_tokens,
    ), "stream usage differs from non-streaming"
    # Without include_usage no chunk carries usage.
    plain = list(ctx.client.chat.completions.create(model=ctx.model, messages=GREEDY_MESSAGES, stream=True, **GREEDY))
    assert all(ch.usage is None for ch in plain), "usage sent without stream_options.include_usage"
    assert "".join(ch.choices[0].delta.content or "" for ch in plain if ch.choices) == ctx.greedy_text


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
        json.loads(e[len("data: ") :])


def check_content_parts_and_roles(ctx):
    as_string = [{"role": "user", "content": "Hello there, how are you?"}]
    as_parts = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "Hello there, "}, {"type": "text", "text": "how are you?"}],
        }
    ]
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
    # Text that spells a control token: counted as one special token, or as plain text?
    probe = [{"role": "user", "content": "<|im_end|>"}]
    spelled = ctx.client.chat.completions.create(model=ctx.model, messages=probe, max_tokens=1).usage.prompt_tokens
    plain = ctx.client.chat.completions.create(
        model=ctx.model, messages=[{"role": "user", "content": "x"}], max_tokens=1
    ).usage.prompt_tokens
    show(
        "user text '<|im_end|>'",
        f"{spelled - plain + 1} token(s): " + ("read as the control token" if spelled == plain else "plain text"),
    )
    # "developer" is the newer name of the system role in OpenAI's API.
    try:
        r = ctx.client.chat.completions.create(
            model=ctx.model,
            messages=[{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
            max_tokens=4,
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
        ctx.client.completions.create(
            model=ctx.model,
            prompt=prompt,
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    show("streamed", f"{len(chunks)} chunks, {text!r}")
    assert text == c.text, f"streamed completion {text!r} != {c.text!r}"
    usage = [ch.usage for ch in chunks if ch.usage is not None]
    assert len(usage) == 1 and usage[0].completion_tokens == r.usage.completion_tokens, f"streamed usage {usage}"
    # The legacy `logprobs: N` of text completions: the legacy shape, or a 400.
    try:
        r = ctx.client.completions.create(model=ctx.model, prompt=prompt, max_tokens=4, temperature=0, logprobs=2)
        lp = r.choices[0].logprobs
        show("logprobs=2", lp.model_dump() if lp else None)
        assert lp is not None and lp.tokens and len(lp.tokens) == r.usage.completion_tokens, "logprobs=2 ignored"
        assert lp.token_logprobs and len(lp.token_logprobs) == len(lp.tokens)
    except openai.BadRequestError as e:
        show("logprobs=2", f"refused: 400 {e.message}")


def check_logprobs(ctx):
    r = ctx.client.chat.completions.create(
        model=ctx.model, messages=GREEDY_MESSAGES, logprobs=True, top_logprobs=3, **GREEDY
    )
    lp = r.choices[0].logprobs
    assert lp is not None and lp.content is not None, "no logprobs.content"
    n = r.usage.completion_tokens
    show(
        "logprobs",
        f"{len(lp.content)} entries for {n} tokens; first {lp.content[0].model_dump() if lp.content else None}",
        limit=400,
    )
    assert len(lp.content) == n, f"{len(lp.content)} logprob entries for {n} completion tokens"
    for i, e in enumerate(lp.content):
        assert isinstance(e.token, str)
        assert e.logprob <= 0, f"entry {i}: logprob {e.logprob} > 0"
        assert len(e.top_logprobs) == 3, f"entry {i}: {len(e.top_logprobs)} top_logprobs"
        tops = [t.logprob for t in e.top_logprobs]
        assert all(t <= 0 for t in tops) and tops == sorted(tops, reverse=True), (
            f"entry {i}: top_logprobs not sorted: {tops}"
        )
        # Greedy picks the most likely token.
        assert abs(e.logprob - tops[0]) < 1e-3, f"entry {i}: greedy token logprob {e.logprob} is not the top {tops[0]}"
        assert e.bytes is None or isinstance(e.bytes, list)
    assert r.choices[0].message.content == ctx.greedy_text, "asking for logprobs changed the greedy text"
    joined = "".join(e.token for e in lp.content)
    show("tokens joined == content", joined == ctx.greedy_text)
    # logprobs without top_logprobs: the sampled token's only.
    r = ctx.client.chat.completions.create(model=ctx.model, messages=GREEDY_MESSAGES, logprobs=True, **GREEDY)
    entries = r.choices[0].logprobs.content
    assert len(entries) == r.usage.completion_tokens and all(e.top_logprobs == [] for e in entries), (
        f"logprobs=true alone: {len(entries)} entries, top_logprobs {[len(e.top_logprobs) for e in entries][:4]}"
    )
    # Streaming carries the same entries, chunk by chunk.
    chunks = list(
        ctx.client.chat.completions.create(
            model=ctx.model, messages=GREEDY_MESSAGES, logprobs=True, top_logprobs=3, stream=True, **GREEDY
        )
    )
    streamed = [
        e
        for ch in chunks
        if ch.choices and ch.choices[0].logprobs and ch.choices[0].logprobs.content
        for e in ch.choices[0].logprobs.content
    ]
    assert [(e.token, round(e.logprob, 4)) for e in streamed] == [(e.token, round(e.logprob, 4)) for e in lp.content], (
        "streamed logprobs differ"
    )


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
        r = ctx.client.chat.completions.create(
            model=ctx.model, messages=GREEDY_MESSAGES, stop=[stop, "never-appears-xyz"], **GREEDY
        )
        show("stop", f"{stop!r} -> {r.choices[0].message.content!r} ({r.choices[0].finish_reason})")
        assert r.choices[0].message.content == cut, (
            f"stop {stop!r}: expected {cut!r}, got {r.choices[0].message.content!r}"
        )
        assert r.choices[0].finish_reason == "stop", r.choices[0].finish_reason
        assert r.usage.completion_tokens <= ctx.greedy_usage.completion_tokens
        r = ctx.client.chat.completions.create(model=ctx.model, messages=GREEDY_MESSAGES, stop=stop, **GREEDY)
        assert r.choices[0].message.content == cut, "stop as a plain string"
        chunks = list(
            ctx.client.chat.completions.create(
                model=ctx.model, messages=GREEDY_MESSAGES, stop=[stop], stream=True, **GREEDY
            )
        )
        streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        assert streamed == cut, f"streamed stop: expected {cut!r}, got {streamed!r}"
    else:
        show("stop", f"greedy reply {base!r} too short to cut: skipped")
    # max_completion_tokens (the newer name of max_tokens).
    r = ctx.client.chat.completions.create(
        model=ctx.model, messages=GREEDY_MESSAGES, temperature=0, seed=1234, max_completion_tokens=5
    )
    show(
        "max_completion_tokens=5",
        f"{r.choices[0].message.content!r} {r.usage.completion_tokens} tokens {r.choices[0].finish_reason}",
    )
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
        model=ctx.model,
        messages=GREEDY_MESSAGES,
        n=1,
        user="client-test",
        store=False,
        metadata={"run": "ci"},
        **GREEDY,
    )
    assert len(r.choices) == 1 and r.choices[0].message.content == base


def check_n(ctx):
    try:
        r = ctx.client.chat.completions.create(
            model=ctx.model, messages=GREEDY_MESSAGES, n=2, temperature=0.7, max_tokens=4, seed=3
        )
        show("n=2", f"{len(r.choices)} choices")
        assert len(r.choices) == 2, f"n=2 answered with {len(r.choices)} choice(s) and no error"
    except openai.BadRequestError as e:
        show("n=2", f"refused: 400 {e.message}")


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
    show(
        "turn 2 cold",
        f"{cold.usage.prompt_tokens} prompt tokens, cached {cached(cold)}: {cold.choices[0].message.content!r}",
    )
    show(
        "turn 2 warm",
        f"cached {cached(warm)}, ingested {ingested:.0f} (new tokens {warm.usage.prompt_tokens - first.usage.prompt_tokens}): {warm.choices[0].message.content!r}",
    )
    assert cached(warm) >= first.usage.prompt_tokens, (
        f"turn 2 reused {cached(warm)} tokens, turn 1's prompt has {first.usage.prompt_tokens}"
    )
    assert ingested == warm.usage.prompt_tokens - cached(warm), (
        f"ingested {ingested} != prompt {warm.usage.prompt_tokens} - cached {cached(warm)}"
    )
    assert warm.choices[0].message.content == cold.choices[0].message.content, (
        "resuming from a snapshot changed the greedy reply"
    )
    # A real conversation: the model's own reply goes back as the assistant turn.
    reply = first.choices[0].message.content
    real2 = turn1 + [{"role": "assistant", "content": reply}, {"role": "user", "content": "And the next entry?"}]
    r = ctx.client.chat.completions.create(messages=real2, **args)
    show(
        "turn 2 after the model's reply",
        f"{r.usage.prompt_tokens} prompt tokens, cached {cached(r)} "
        f"(turn 1 prompt {first.usage.prompt_tokens}, + reply {first.usage.completion_tokens})",
    )
    assert cached(r) >= first.usage.prompt_tokens
    # A regenerated answer: the same prompt again.
    again = ctx.client.chat.completions.create(messages=turn1, **args)
    show("turn 1 again (regenerate)", f"cached {cached(again)} of {again.usage.prompt_tokens}")
    if cached(again) == 0:
        print(
            "    NOTE: resending an identical prompt reuses nothing (the prompt-end snapshot is not used for the same prompt)"
        )


def check_context_boundary(ctx):
    ctx_len = 2048

    def prompt_tokens(words):
        messages = [{"role": "user", "content": "pear" + " pear" * (words - 1)}]
        r = ctx.client.chat.completions.create(model=ctx.model, messages=messages, max_tokens=1, temperature=0)
        return messages, r.usage.prompt_tokens

    # A prompt ~60 tokens short of the context, whatever the model's vocabulary makes of "pear".
    _, one = prompt_tokens(1)
    _, hundred = prompt_tokens(100)
    per_word = (hundred - one) / 99
    messages, prompt = prompt_tokens(1 + int((ctx_len - 60 - one) / per_word))
    room = ctx_len - prompt
    show("prompt", f"{prompt} tokens; room {room}")
    assert room > 0
    r = ctx.client.chat.completions.create(model=ctx.model, messages=messages, max_tokens=room, temperature=0)
    show(
        f"max_tokens={room} (prompt + max_tokens = {ctx_len})",
        f"HTTP 200, {r.usage.completion_tokens} tokens, {r.choices[0].finish_reason}",
    )
    assert r.usage.completion_tokens <= room
    try:
        ctx.client.chat.completions.create(model=ctx.model, messages=messages, max_tokens=room + 1, temperature=0)
        raise AssertionError(f"max_tokens={room + 1} (one past the context) accepted")
    except openai.BadRequestError as e:
        show(f"max_tokens={room + 1}", f"400 {e.message}")
        assert "context" in e.message.lower()


def check_tool_round_trip(ctx):
    r = ctx.client.chat.completions.create(
        model=ctx.model,
        messages=TOOL_CONVERSATION,
        tools=[WEATHER_TOOL],
        tool_choice="auto",
        temperature=0,
        max_tokens=16,
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
    for needle in (
        "<tools>",
        '"get_weather"',
        "<tool_call>",
        "</tool_call>",
        "Paris",
        "<tool_response>",
        "</tool_response>",
        '"temperature": 18',
    ):
        assert needle in prompt, f"/apply-template output lacks {needle!r}"
    assert prompt.index("<tool_call>") < prompt.index("<tool_response>")
    assert prompt.rstrip().endswith("<|im_start|>assistant") or "<|im_start|>assistant\n" in prompt[-40:], (
        "no generation prompt at the end"
    )
    # The tool_choice forms OpenAI clients send.
    for choice in ("none", "required", {"type": "function", "function": {"name": "get_weather"}}):
        r = ctx.client.chat.completions.create(
            model=ctx.model,
            messages=TOOL_CONVERSATION[:2],
            tools=[WEATHER_TOOL],
            tool_choice=choice,
            temperature=0,
            max_tokens=4,
        )
        assert r.choices[0].message.role == "assistant"
    show("tool_choice none/required/named", "accepted")
    off = apply_template(
        ctx, {"model": ctx.model, "messages": TOOL_CONVERSATION[:2], "tools": [WEATHER_TOOL], "tool_choice": "none"}
    )
    assert "<tools>" not in off, "tool_choice none still renders the tools"


def check_reasoning_switch(ctx):
    r = ctx.client.chat.completions.create(
        model=ctx.model,
        messages=GREEDY_MESSAGES,
        temperature=0,
        max_tokens=8,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    c = r.choices[0]
    reasoning = getattr(c.message, "reasoning_content", None)
    show("enable_thinking=false", f"content {c.message.content!r} reasoning_content {reasoning!r}")
    assert isinstance(c.message.content, str)
    on = apply_template(
        ctx, {"model": ctx.model, "messages": GREEDY_MESSAGES, "chat_template_kwargs": {"enable_thinking": True}}
    )
    off = apply_template(
        ctx, {"model": ctx.model, "messages": GREEDY_MESSAGES, "chat_template_kwargs": {"enable_thinking": False}}
    )
    show("prompt end, thinking on", on[-60:])
    show("prompt end, thinking off", off[-60:])
