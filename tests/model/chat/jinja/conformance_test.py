#!/usr/bin/env python3
"""Every chat template of llama.cpp's collection (models/templates/*.jinja), rendered by mqlm's
interpreter, equals what Python's jinja2 renders with transformers' settings, for every
conversation of the table below; a template that raises in jinja2 must raise in ours too.

jinja2 is set up as transformers' apply_chat_template sets it: the immutable sandbox,
trim_blocks and lstrip_blocks, the loopcontrols extension and {% generation %}, its tojson
(ensure_ascii=False), raise_exception, and strftime_now (here at a fixed time, given to both).

Usage: conformance_test.py --render RENDER_CASES_BINARY --templates DIR
"""
import argparse
import difflib
import json
import pathlib
import subprocess
import sys
from datetime import datetime, timezone

from jinja2 import nodes
from jinja2.exceptions import TemplateError
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

NOW = 1764403200  # 2025-11-29 08:00 UTC

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city, now.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "The city's name"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "add", "description": "Adds two numbers.",
        "parameters": {"type": "object", "properties": {
            "a": {"type": "number"}, "b": {"type": "integer", "description": "A whole number"}},
            "required": ["a", "b"]}}},
]

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
USER = {"role": "user", "content": "What is the weather in Paris?"}
CALL = {"id": "call00001", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
CALL_2 = {"id": "call00002", "type": "function", "function": {"name": "add", "arguments": {"a": 1.5, "b": 2}}}

# name, messages, extra variables (add_generation_prompt, tools, ...)
CONVERSATIONS = [
    ("system_user", [SYSTEM, USER], {"add_generation_prompt": True}),
    ("user_only", [{"role": "user", "content": "Hello!"}], {"add_generation_prompt": True}),
    ("user_no_generation_prompt", [{"role": "user", "content": "Hello!"}], {"add_generation_prompt": False}),
    ("multi_turn", [SYSTEM, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
                    {"role": "user", "content": "Tell me a joke."}], {"add_generation_prompt": True}),
    ("multi_turn_no_generation_prompt", [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
                                         {"role": "user", "content": "Bye"}, {"role": "assistant", "content": "Bye!"}],
     {"add_generation_prompt": False}),
    ("tools", [SYSTEM, USER], {"add_generation_prompt": True, "tools": TOOLS}),
    ("tool_call_and_result", [USER, {"role": "assistant", "content": "", "tool_calls": [CALL]},
                              {"role": "tool", "tool_call_id": "call00001", "name": "get_weather",
                               "content": "{\"temperature\": 21, \"sky\": \"clear\"}"}],
     {"add_generation_prompt": True, "tools": TOOLS}),
    ("parallel_tool_calls_then_answer",
     [SYSTEM, {"role": "user", "content": "Weather in Paris, and 1.5 + 2?"},
      {"role": "assistant", "content": None, "tool_calls": [CALL, CALL_2]},
      {"role": "tool", "tool_call_id": "call00001", "name": "get_weather", "content": "21 C, clear"},
      {"role": "tool", "tool_call_id": "call00002", "name": "add", "content": "3.5"},
      {"role": "assistant", "content": "It is 21 C and clear in Paris; 1.5 + 2 = 3.5."},
      {"role": "user", "content": "Thanks!"}],
     {"add_generation_prompt": True, "tools": TOOLS}),
    ("tool_call_with_json_string_arguments",
     [USER, {"role": "assistant", "content": "", "tool_calls": [
         {"id": "call00003", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "call00003", "name": "get_weather", "content": "21 C"}],
     {"add_generation_prompt": True, "tools": TOOLS}),
    ("reasoning", [{"role": "user", "content": "What is 2+2?"},
                   {"role": "assistant", "content": "4", "reasoning_content": "2 plus 2 makes 4."},
                   {"role": "user", "content": "And 3+3?"}],
     {"add_generation_prompt": True, "enable_thinking": True}),
    ("thinking_disabled", [{"role": "user", "content": "Quick: capital of France?"}],
     {"add_generation_prompt": True, "enable_thinking": False}),
    ("unicode_and_quotes", [{"role": "user", "content": "  Grüße, \"world\" — it's <b>ünïcödé</b> 🙂\n\ttabbed  "}],
     {"add_generation_prompt": True}),
]


class GenerationTag(Extension):
    """transformers' {% generation %} ... {% endgeneration %}: renders its body."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def raise_exception(message):
    raise TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(format):
    return datetime.fromtimestamp(NOW, tz=timezone.utc).strftime(format)


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def context_of(messages, extra):
    context = {"messages": messages, "tools": None, "documents": None, "bos_token": "<s>", "eos_token": "</s>"}
    context.update(extra)
    return context


def jinja2_render(template, context):
    """template: the compiled template, or the exception compiling it raised."""
    try:
        if isinstance(template, Exception):
            raise template
        return {"ok": True, "text": template.render(**context)}
    except Exception as e:  # what a template raises, or jinja2 refusing it
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}


def compile_template(env, source):
    try:
        return env.from_string(source)
    except Exception as e:
        return e


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--render", required=True)
    parser.add_argument("--templates", required=True)
    parser.add_argument("--show", type=int, default=5, help="differences shown in full")
    args = parser.parse_args()
    templates = sorted(pathlib.Path(args.templates).glob("*.jinja"))
    if len(templates) < 50:
        sys.exit(f"conformance: only {len(templates)} templates in {args.templates}: is llama.cpp's source installed?")
    env = environment()
    cases, expected = [], []
    for path in templates:
        template = compile_template(env, path.read_text())
        for name, messages, extra in CONVERSATIONS:
            context = context_of(messages, extra)
            cases.append({"template": str(path), "context": context, "label": f"{path.name} / {name}"})
            expected.append(jinja2_render(template, context))
    ours = json.loads(subprocess.run([args.render], input=json.dumps({"now": NOW, "cases": cases}),
                                     capture_output=True, text=True, check=True).stdout)
    equal_text = both_raise = 0
    differences = []
    for case, want, got in zip(cases, expected, ours):
        if want["ok"] and got["ok"] and want["text"] == got["text"]:
            equal_text += 1
        elif not want["ok"] and not got["ok"]:
            both_raise += 1
        else:
            differences.append((case["label"], want, got))
    for label, want, got in differences[:args.show]:
        print(f"--- {label}")
        if want["ok"] and got["ok"]:
            sys.stdout.writelines(difflib.unified_diff(want["text"].splitlines(True), got["text"].splitlines(True),
                                                       "jinja2", "mqlm", n=2))
        else:
            print(f"jinja2: {want.get('error', 'renders')}\nmqlm:   {got.get('error', 'renders')}")
    for label, want, got in differences[args.show:]:
        print(f"--- {label}: jinja2 {'renders' if want['ok'] else 'raises'}, mqlm "
              f"{'renders' if got['ok'] else 'raises: ' + got['error']}")
    total = len(cases)
    print(f"conformance: {len(templates)} templates x {len(CONVERSATIONS)} conversations = {total} renders: "
          f"{equal_text} equal, {both_raise} raise in both, {len(differences)} differ")
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())
