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
import sys
import time
import traceback

import openai

import api_checks as api
import error_checks as errors
from client_util import Ctx

# Run in this order: the greedy reply of the early checks is the reference of later ones, and
# the leak checks come after the error cases.
CHECKS = [
    ("models, /health, /metrics", api.check_models_health_metrics),
    ("chat, non-streaming, greedy twice", api.check_chat_nonstreaming),
    ("chat, streaming with include_usage", api.check_chat_streaming),
    ("raw event stream ends with data: [DONE]", api.check_raw_event_stream),
    ("content parts and roles", api.check_content_parts_and_roles),
    ("completions, plain and streaming", api.check_completions),
    ("logprobs with top_logprobs=3", api.check_logprobs),
    ("stop, max_completion_tokens, sampling fields", api.check_sampling_fields),
    ("n=2: two choices or a 400", api.check_n),
    ("prompt reuse across turns", api.check_prompt_reuse),
    ("prompt + max_tokens = context", api.check_context_boundary),
    ("tool-call round trip and /apply-template", api.check_tool_round_trip),
    ("chat_template_kwargs.enable_thinking", api.check_reasoning_switch),
    ("errors: API key", errors.check_auth_errors),
    ("errors: bad requests", errors.check_request_errors),
    ("errors: body size limit", errors.check_body_limits),
    ("errors: other endpoints", errors.check_other_endpoints),
    ("still serving, nothing leaked", errors.check_still_serving),
    ("client closes a stream mid-way", errors.check_disconnect_mid_stream),
    ("non-streaming client gives up", errors.check_disconnect_nonstreaming),
    ("queued client gives up", errors.check_disconnect_while_queued),
    ("final metrics add up", errors.check_final_metrics),
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
