#!/usr/bin/env python3
"""Every chat template of llama.cpp's collection (models/templates/*.jinja), rendered by mqlm's
interpreter, equals what Python's jinja2 renders with transformers' settings, for every
conversation of the table below; a template that raises in jinja2 must raise in ours too.

A conversation a request can carry (messages of role, content, tool_calls, tool_call_id and
name; tools; chat_template_kwargs) goes through mqlm's model::ChatTemplate as the server renders
it: the tool calls' arguments go as JSON text, which the server gives templates parsed when it is
an object; jinja2 gets the same values as the server gives them (arguments as dicts, content None
where null). Other conversations (an assistant's reasoning_content) go to the interpreter as they
are.

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

ANSWER = {"role": "assistant", "content": "It is 21 C and clear in Paris."}

# name, messages, extra variables (add_generation_prompt, tools, chat_template_kwargs, ...)
CONVERSATIONS = [
    ("one_tool", [SYSTEM, USER], {"add_generation_prompt": True, "tools": TOOLS[:1]}),
    ("one_tool_call_result_then_answer",
     [USER, {"role": "assistant", "content": None, "tool_calls": [CALL]},
      {"role": "tool", "tool_call_id": "call00001", "name": "get_weather", "content": "21 C, clear"}, ANSWER,
      {"role": "user", "content": "And tomorrow?"}],
     {"add_generation_prompt": True, "tools": TOOLS[:1]}),
    ("tool_result_without_name_no_generation_prompt",
     [SYSTEM, USER, {"role": "assistant", "content": None, "tool_calls": [CALL]},
      {"role": "tool", "tool_call_id": "call00001", "content": "21 C, clear"}, ANSWER],
     {"add_generation_prompt": False, "tools": TOOLS}),
    ("nested_unicode_and_empty_arguments",
     [USER, {"role": "assistant", "content": None, "tool_calls": [
         {"id": "call00004", "type": "function", "function": {"name": "search", "arguments": {
             "query": {"cities": ["Paris", "Zürich"], "days": 3, "metric": True, "note": None}, "limit": 0.25}}},
         {"id": "call00005", "type": "function", "function": {"name": "now", "arguments": {}}}]},
      {"role": "tool", "tool_call_id": "call00004", "name": "search", "content": "[{\"city\": \"Zürich\", \"t\": 12}]"},
      {"role": "tool", "tool_call_id": "call00005", "name": "now", "content": ""}],
     {"add_generation_prompt": True, "tools": TOOLS + [
         {"type": "function", "function": {"name": "search", "description": "Searches «everything».", "parameters": {
             "type": "object", "properties": {"query": {"type": "object"}, "limit": {"type": "number"}}}}},
         {"type": "function", "function": {"name": "now", "description": "The time.",
                                           "parameters": {"type": "object", "properties": {}}}}]}),
    ("arguments_that_are_no_json_object",
     [USER, {"role": "assistant", "content": "Let me look.", "tool_calls": [
         {"id": "call00006", "type": "function", "function": {"name": "get_weather", "arguments": ""}},
         {"id": "call00007", "type": "function", "function": {"name": "add", "arguments": "[1.5, 2]"}}]},
      {"role": "tool", "tool_call_id": "call00006", "name": "get_weather", "content": "no city given"},
      {"role": "tool", "tool_call_id": "call00007", "name": "add", "content": "3.5"}],
     {"add_generation_prompt": True, "tools": TOOLS, "reasoning_effort": "low"}),
    ("tools_with_thinking_disabled", [SYSTEM, USER], {"add_generation_prompt": True, "tools": TOOLS,
                                                     "enable_thinking": False}),
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


# What a request's message may hold, in the order the server gives a template its keys.
MESSAGE_KEYS = ("role", "tool_call_id", "name", "content", "tool_calls")


def is_request(messages):
    """The conversation is one a request can carry, so the server's path renders it."""
    return all(set(m) <= set(MESSAGE_KEYS) and isinstance(m.get("content"), (str, type(None))) for m in messages)


def parsed_arguments(arguments):
    """The server gives a template arguments whose JSON text is an object as that object."""
    if isinstance(arguments, str):
        try:
            value = json.loads(arguments)
        except ValueError:
            return arguments
        return value if isinstance(value, dict) else arguments
    return arguments


def as_server_gives(message):
    """A message as model::ChatTemplate gives it to templates."""
    out = {"role": message["role"]}
    for key in ("tool_call_id", "name"):
        if message.get(key):
            out[key] = message[key]
    out["content"] = message.get("content")
    if message.get("tool_calls"):
        out["tool_calls"] = [{"id": c["id"], "type": "function", "function": {
            "name": c["function"]["name"], "arguments": parsed_arguments(c["function"]["arguments"])}}
            for c in message["tool_calls"]]
    return out


def as_sent(message):
    """A message as a client sends it: tool calls' arguments as JSON text."""
    out = dict(message)
    if message.get("tool_calls"):
        out["tool_calls"] = [{**c, "function": {**c["function"], "arguments": c["function"]["arguments"] if isinstance(
            c["function"]["arguments"], str) else json.dumps(c["function"]["arguments"], ensure_ascii=False)}}
            for c in message["tool_calls"]]
    return out


def case_of(path, messages, extra):
    """What render_cases takes for a conversation, and the context jinja2 renders it with."""
    if not is_request(messages):
        context = context_of(messages, extra)
        return {"template": str(path), "context": context}, context
    chat = {"messages": [as_sent(m) for m in messages], "add_generation_prompt": extra["add_generation_prompt"]}
    if "tools" in extra:
        chat["tools"] = extra["tools"]
    kwargs = {k: v for k, v in extra.items() if k not in ("add_generation_prompt", "tools")}
    if kwargs:
        chat["kwargs"] = kwargs
    return {"template": str(path), "chat": chat}, context_of([as_server_gives(m) for m in messages], extra)


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
            case, context = case_of(path, messages, extra)
            cases.append({**case, "label": f"{path.name} / {name}"})
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
    requests = sum(1 for _, messages, _ in CONVERSATIONS if is_request(messages))
    print(f"conformance: {len(templates)} templates x {len(CONVERSATIONS)} conversations ({requests} through "
          f"the server's ChatTemplate) = {total} renders: "
          f"{equal_text} equal, {both_raise} raise in both, {len(differences)} differ")
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())
