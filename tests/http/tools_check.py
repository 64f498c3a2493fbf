"""Tool calling against a live `host serve`, with the official openai SDK.

Usage: tools_check.py BASE_URL MODEL_DIR (hermes|none)
`hermes`: the model's chat template speaks the Hermes `<tool_call>` syntax;
`none`: its template has no tool syntax.
Calls made under a grammar (`required`, a named function) must validate
against their function's JSON Schema (Python `jsonschema`); prompts with
tools, tool calls and tool results must have exactly the tokens that
transformers' `apply_chat_template` gives for the same conversation.
Prints ALL OK when every check passes; any failure raises.
"""
import json
import sys

import jsonschema
import openai
from transformers import AutoTokenizer

base, model_dir, syntax = sys.argv[1], sys.argv[2], sys.argv[3]
client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0)
model = client.models.list().data[0].id
tok = AutoTokenizer.from_pretrained(model_dir)

from tool_schemas import ADD, WEATHER
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "add", "description": "Adds two numbers", "parameters": ADD}},
]
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
MSG = [{"role": "user", "content": "What is the weather in Paris?"}]


def check(cond, what):
    if not cond:
        raise AssertionError(f"[{syntax}] {what}")
    print(f"ok [{syntax}]:", what)


def valid_call(call):
    schema = SCHEMAS[call.function.name]
    jsonschema.validate(json.loads(call.function.arguments), schema)
    return call.type == "function" and call.id.startswith("call_")


def chat(**kw):
    return client.chat.completions.create(model=model, messages=kw.pop("messages", MSG), tools=TOOLS, max_tokens=kw.pop("max_tokens", 120), **kw)


def reference_prompt_tokens(messages, tools=TOOLS):
    text = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    return len(tok.encode(text, add_special_tokens=False))


# 1. required: a call, valid under its function's schema.
for seed in range(3):
    r = chat(tool_choice="required", temperature=0.9, seed=seed)
    c = r.choices[0]
    check(c.finish_reason == "tool_calls" and c.message.tool_calls, f"required gives a tool call (seed {seed})")
    check(all(valid_call(t) for t in c.message.tool_calls), f"required calls validate against their schemas (seed {seed})")

# 2. A named function, and parallel_tool_calls false.
r = chat(tool_choice={"type": "function", "function": {"name": "add"}}, temperature=0)
calls = r.choices[0].message.tool_calls
check(len(calls) >= 1 and all(t.function.name == "add" and valid_call(t) for t in calls), "a named function is called")
r = chat(tool_choice="required", parallel_tool_calls=False, temperature=0.9, seed=5)
check(len(r.choices[0].message.tool_calls) == 1, "parallel_tool_calls false gives exactly one call")
first = chat(tool_choice="required", temperature=0)

# 3. Streamed calls reassemble (by index) to the whole answer's calls.
stream = chat(tool_choice="required", temperature=0, stream=True)
calls, finish = {}, None
for chunk in stream:
    for ch in chunk.choices:
        finish = ch.finish_reason or finish
        for d in ch.delta.tool_calls or []:
            slot = calls.setdefault(d.index, {"id": None, "name": None, "arguments": ""})
            if d.id:
                check(slot["id"] is None, "a call's id comes once, in its first delta")
                slot["id"], slot["name"] = d.id, d.function.name
            slot["arguments"] += d.function.arguments or ""
whole = first.choices[0].message.tool_calls
check(finish == "tool_calls", "the stream ends with finish_reason tool_calls")
check([(c["name"], c["arguments"]) for _, c in sorted(calls.items())] == [(t.function.name, t.function.arguments) for t in whole], "streamed calls equal the whole answer's")

# 4. A round trip: the call, its result, and the answer; the prompt is
# token for token what transformers renders (a template that knows tools).
if syntax == "hermes":
    call = whole[0]
    history = MSG + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": call.id, "type": "function", "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "18 degrees, clear"},
    ]
    r = chat(messages=history, temperature=0, max_tokens=16, tool_choice="none")
    check(r.choices[0].message.tool_calls is None and r.choices[0].finish_reason in ("stop", "length"), "tool_choice none answers in text")
    as_hf = MSG + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": call.id, "type": "function", "function": {"name": call.function.name, "arguments": json.loads(call.function.arguments)}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "18 degrees, clear"},
    ]
    want = reference_prompt_tokens(as_hf)
    check(r.usage.prompt_tokens == want, f"the round trip's prompt has transformers' tokens ({r.usage.prompt_tokens} vs {want})")
    r = chat(temperature=0, max_tokens=4, tool_choice="none")
    check(r.usage.prompt_tokens == reference_prompt_tokens(MSG), "a prompt with tools has transformers' tokens")
else:
    # A template without tool syntax renders no `tool_calls` (many fail on
    # the null content): the past call is the assistant's text, written as
    # the model writes calls, and the prompt is transformers' rendering of
    # that text conversation.
    call = whole[0]
    history = MSG + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": call.id, "type": "function", "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "18 degrees, clear"},
    ]
    r = chat(messages=history, temperature=0, max_tokens=4, tool_choice="none")
    written = json.dumps({"name": call.function.name, "arguments": json.loads(call.function.arguments)}, ensure_ascii=False, separators=(",", ":"))
    as_text = MSG + [{"role": "assistant", "content": written}, {"role": "tool", "content": "18 degrees, clear"}]
    want = reference_prompt_tokens(as_text)
    check(r.usage.prompt_tokens == want, f"the round trip's past call is the assistant's text ({r.usage.prompt_tokens} vs {want})")

# 5. auto: the model's own syntax is parsed out of its text (the text is
# steered into a call with a regex, so a random-weight model makes one).
if syntax == "hermes":
    forced = r'<tool_call>\n\{"name": "add", "arguments": \{"a": 2, "b": 3\}\}\n</tool_call>'
    r = chat(tool_choice="auto", temperature=0, extra_body={"guided_regex": forced})
    c = r.choices[0]
    check(c.finish_reason == "tool_calls", f"auto parses a call from the text: {c.message!r}")
    check(c.message.content is None and [(t.function.name, json.loads(t.function.arguments)) for t in c.message.tool_calls] == [("add", {"a": 2, "b": 3})], "auto gives the parsed call and no text")
    text_then_call = r'Sure\.\n<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "Oslo", "unit": "C"\}\}\n</tool_call>'
    chunks = list(chat(tool_choice="auto", temperature=0, stream=True, extra_body={"guided_regex": text_then_call}))
    content = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    names = [d.function.name for ch in chunks if ch.choices for d in (ch.choices[0].delta.tool_calls or []) if d.function and d.function.name]
    check(content.strip() == "Sure." and names == ["get_weather"], f"a streamed auto answer splits text and call: {content!r} {names}")
    r = chat(tool_choice="auto", temperature=0, max_tokens=8)
    check(r.choices[0].finish_reason in ("stop", "length") and not r.choices[0].message.tool_calls, "auto without a call is plain text")
else:
    try:
        chat(tool_choice="auto")
        raise AssertionError("auto accepted without a tool syntax")
    except openai.BadRequestError as e:
        check(e.body.get("param") == "tool_choice", f"auto without a tool syntax is a 400: {e.body.get('message')}")

# 6. Bad tool requests are 400s naming the parameter.
bad = [
    (dict(tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice"),
    (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]), "tools[0].function.parameters"),
    (dict(tools=[{"type": "function", "function": {"name": "bad name!"}}]), "tools[0].function.name"),
    (dict(messages=MSG + [{"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{not json"}}]}]), "messages[1].tool_calls[0].function.arguments"),
]
for kw, param in bad:
    args = dict(model=model, messages=kw.pop("messages", MSG), max_tokens=4, tools=kw.pop("tools", TOOLS), **kw)
    try:
        client.chat.completions.create(**args)
        raise AssertionError(f"accepted {kw}")
    except openai.BadRequestError as e:
        check(e.body.get("param") == param, f"400 naming {param}: {e.body.get('message')}")
print("ALL OK")
