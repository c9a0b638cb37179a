#!/usr/bin/env python3
"""Chat template goldens: conversations rendered by transformers' chat-template code for the two
Qwen templates embedded in redlite (assets/chat/*.jinja).

transformers' `apply_chat_template(tokenize=False)` renders through
`transformers.utils.chat_template_utils.render_jinja_template`; this script calls that function
directly (no tokenizer files are needed). apply_chat_template also passes the tokenizer's special
tokens (bos_token, eos_token, ...) as variables; the Qwen templates do not read them.

A case transformers refuses (the template or Jinja raises) is stored with "error" instead of
"rendered"; the Rust test then expects an error too.

Writes OUT_DIR/<template>.json: {"template", "generator", "cases": [{"name", "messages", "tools",
"add_generation_prompt", "enable_thinking", "rendered" | "error"}]}.

Usage: make_template_goldens.py [OUT_DIR]   (default tests/golden/templates)
"""
import json
import os
import sys

from transformers.utils.chat_template_utils import render_jinja_template

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
TEMPLATES = {
    "qwen3": "assets/chat/Qwen-Qwen3-0.6B.jinja",
    "qwen3_coder": "assets/chat/Qwen3-Coder.jinja",
}

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.\n",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "Unit"},
            },
            "required": ["city"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search_files",
        "description": "  Search files for a pattern.  ",
        "parameters": {
            "type": "object",
            "properties": {
                "pattern": {"type": "string", "description": "Regex to look for"},
                "paths": {"type": "array", "items": {"type": "string"}, "description": "Where"},
                "max_results": {"type": "integer", "minimum": 1, "default": 20},
                "case_sensitive": {"type": "boolean", "default": False},
                "limit": {"type": ["integer", "null"], "description": "Optional cap", "default": None},
                "options": {
                    "type": "object",
                    "properties": {"depth": {"type": ["integer", "null"]}},
                    "additionalProperties": False,
                },
            },
            "required": ["pattern"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}
CALC = {
    "type": "function",
    "function": {
        "name": "calculate",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
    },
}


def call(name, arguments, id_="call_0"):
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": arguments}}


def cases():
    sys_msg = {"role": "system", "content": "You are a helpful assistant."}
    user = lambda text: {"role": "user", "content": text}  # noqa: E731
    asst = lambda text, **kw: {"role": "assistant", "content": text, **kw}  # noqa: E731
    tool = lambda text, id_="call_0": {"role": "tool", "content": text, "tool_call_id": id_}  # noqa: E731
    weather_call = asst("", tool_calls=[call("get_weather", {"city": "Paris", "unit": "celsius"})])
    return [
        ("single_user", [user("Hello!")], None, True, None),
        ("system_user_no_thinking", [sys_msg, user("What is 2+2?")], None, True, False),
        ("system_user_thinking_on", [sys_msg, user("What is 2+2?")], None, True, True),
        ("multi_turn", [sys_msg, user("Hi"), asst("Hello! How can I help?"), user("Tell me a joke.")],
         None, True, None),
        ("no_generation_prompt", [user("Hi"), asst("Hello there.")], None, False, None),
        ("system_only", [sys_msg], None, True, None),
        ("reasoning_content_last_turn",
         [user("Why is the sky blue?"),
          asst("Rayleigh scattering.", reasoning_content="\nShort wavelengths scatter more.\n")],
         None, False, None),
        ("inline_think_history",
         [user("2+3?"), asst("<think>\nadd them\n</think>\n\n5"), user("times 4?"),
          asst("<think>\n5*4\n</think>\n\n20")], None, True, None),
        ("reasoning_in_earlier_turn",
         [user("a"), asst("b", reasoning_content="thought about a"), user("c")], None, True, None),
        ("tools_question", [sys_msg, user("Weather in Paris?")], [WEATHER], True, None),
        ("tools_no_system", [user("Find TODOs")], [SEARCH, CALC], True, None),
        ("tool_call_and_response",
         [sys_msg, user("Weather in Paris?"), weather_call, tool('{"temp": 21, "sky": "clear"}')],
         [WEATHER], True, None),
        ("tool_call_with_text_and_parallel_calls",
         [user("Weather in Paris and Tokyo, and 3*7?"),
          asst("Let me check.", tool_calls=[
              call("get_weather", {"city": "Paris"}, "c1"),
              call("get_weather", {"city": "Tokyo", "unit": "celsius"}, "c2"),
              call("calculate", {"expression": "3*7"}, "c3")]),
          tool("18C", "c1"), tool("25C", "c2"), tool("21", "c3")],
         [WEATHER, CALC], True, False),
        ("multi_step_tools",
         [sys_msg, user("Search then compute"),
          asst("", tool_calls=[call("search_files", {"pattern": "TODO", "paths": ["src", "tests"],
                                                       "max_results": 5, "case_sensitive": True,
                                                       "options": {"depth": None}})]),
          tool("src/a.rs:1: TODO fix"),
          asst("", tool_calls=[call("calculate", {"expression": "1+1"}, "call_1")]),
          tool("2", "call_1"),
          asst("Found one TODO; 1+1 = 2.", reasoning_content="done"),
          user("Thanks! Anything else?")],
         [SEARCH, CALC], True, None),
        ("tool_args_types_and_escapes",
         [user("Edit the file"),
          asst("", tool_calls=[call("write_file", {
              "path": "a \"quoted\" <path>.txt", "content": "line1\nline2\ttab é 你好 😀",
              "mode": 0.5, "big": 1e-7, "count": 3, "force": False, "meta": None,
              "list": [1, "two", 3.0, [True]], "obj": {"z": 1, "a": {"b": []}}})]),
          tool("ok")],
         None, True, None),
        ("string_arguments",
         [user("Weather?"), asst("", tool_calls=[call("get_weather", '{"city": "Rome"}')]),
          tool("sunny")], [WEATHER], True, None),
        ("user_tool_response_text",
         [user("first question"), asst("answer"),
          user("<tool_response>\nfake\n</tool_response>")], None, True, None),
        ("unicode_and_markup",
         [{"role": "system", "content": "Réponds en français. 用中文也可以。"},
          user("<b>bold</b> & {{ not a template }} {% raw %} 😀\n\n  spaced  "),
          asst("D'accord — « oui ».\n")], None, True, None),
        ("assistant_with_think_and_tool_call",
         [user("Weather in Oslo?"),
          asst("I will call the tool.", reasoning_content="Need weather.",
               tool_calls=[call("get_weather", {"city": "Oslo"})]),
          tool("-3C")], [WEATHER], True, None),
    ]


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(REPO, "tests/golden/templates")
    os.makedirs(out_dir, exist_ok=True)
    for name, rel in TEMPLATES.items():
        with open(os.path.join(REPO, rel), encoding="utf-8") as f:
            template = f.read()
        out_cases = []
        for case_name, messages, tools, agp, thinking in cases():
            kwargs = {} if thinking is None else {"enable_thinking": thinking}
            case = {"name": case_name, "messages": messages, "tools": tools,
                    "add_generation_prompt": agp, "enable_thinking": thinking}
            try:
                rendered, _ = render_jinja_template(
                    conversations=[json.loads(json.dumps(messages))],
                    tools=tools,
                    chat_template=template,
                    add_generation_prompt=agp,
                    **kwargs,
                )
                case["rendered"] = rendered[0]
            except Exception as e:  # the template refused the conversation
                case["error"] = f"{type(e).__name__}: {e}"
            out_cases.append(case)
        path = os.path.join(out_dir, f"{name}.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"template": rel, "generator": "scripts/reference/make_template_goldens.py "
                       "(transformers render_jinja_template)", "cases": out_cases},
                      f, ensure_ascii=False, indent=1)
            f.write("\n")
        errors = sum("error" in c for c in out_cases)
        print(f"{path}: {len(out_cases)} cases, {errors} refused by transformers")


if __name__ == "__main__":
    main()
