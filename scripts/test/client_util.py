"""What the client checks share: the connection (`Ctx`), /metrics parsing, the transcript
printer, OpenAI error-object checks, and a raw HTTP/1.1 sender for bodies an ordinary client
will not send."""

import json
import re
import select
import socket
import time
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

GREEDY = dict(temperature=0, max_tokens=16, seed=1234)

GREEDY_MESSAGES = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "Name three rivers in Europe."},
]


class Ctx:
    def __init__(self, base_url, api_key):
        self.base = base_url.rstrip("/")
        self.key = api_key
        self.client = openai.OpenAI(base_url=self.base + "/v1", api_key=api_key, max_retries=0, timeout=120)
        self.http = httpx.Client(base_url=self.base, timeout=120)
        self.model = None
        # (text, usage) of the greedy reply to GREEDY_MESSAGES: many checks compare with it.
        self.reference = None

    def _reference(self):
        if self.reference is None:
            r = self.client.chat.completions.create(model=self.model, messages=GREEDY_MESSAGES, **GREEDY)
            self.reference = (r.choices[0].message.content, r.usage)
        return self.reference

    @property
    def greedy_text(self):
        return self._reference()[0]

    @property
    def greedy_usage(self):
        return self._reference()[1]

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
    choices = json.loads(line[len("data: ") :]).get("choices") or [{}]
    return (choices[0].get("delta") or {}).get("content") or ""


def check_usage(usage, max_completion, label):
    assert usage is not None, f"{label}: no usage"
    assert usage.prompt_tokens > 0, f"{label}: prompt_tokens {usage.prompt_tokens}"
    assert 0 <= usage.completion_tokens <= max_completion, (
        f"{label}: completion_tokens {usage.completion_tokens} > {max_completion}"
    )
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens, (
        f"{label}: total {usage.total_tokens} != {usage.prompt_tokens} + {usage.completion_tokens}"
    )


def apply_template(ctx, body):
    r = ctx.http.post("/apply-template", json=body, headers=ctx.auth())
    assert r.status_code == 200, f"/apply-template: HTTP {r.status_code} {r.text[:300]}"
    prompt = r.json().get("prompt")
    assert isinstance(prompt, str) and prompt, f"/apply-template: no prompt in {r.text[:200]}"
    return prompt


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
