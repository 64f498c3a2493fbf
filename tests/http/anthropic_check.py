"""Anthropic's Messages API against a live `host serve`, with the official anthropic SDK.

Usage: anthropic_check.py BASE_URL MODEL_DIR
MODEL_DIR's chat template speaks the Hermes `<tool_call>` syntax.
Checks plain and streamed messages (the SDK's stream helpers), stop
reasons and stop sequences, usage (input read from the prefix cache is
reported apart, as Anthropic does), count_tokens against transformers'
rendering of the same conversation, forced tool use validated against
`input_schema` (Python `jsonschema`), a tool_result round trip, and errors
in Anthropic's shape. Prints ALL OK when every check passes; any failure raises.
"""
import json
import sys

import anthropic
import jsonschema
from transformers import AutoTokenizer

base, model_dir = sys.argv[1], sys.argv[2]
client = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0)
tok = AutoTokenizer.from_pretrained(model_dir)
MODEL = "tiny"

from tool_schemas import ADD, WEATHER
TOOLS = [
    {"name": "get_weather", "description": "Weather in a city", "input_schema": WEATHER},
    {"name": "add", "description": "Adds two numbers", "input_schema": ADD},
]
# The same tools as the chat template takes them (OpenAI's function tools).
HF_TOOLS = [{"type": "function", "function": {"name": t["name"], "description": t["description"], "parameters": t["input_schema"]}} for t in TOOLS]
SCHEMAS = {t["name"]: t["input_schema"] for t in TOOLS}
MSG = [{"role": "user", "content": "What is the weather in Paris?"}]
# This SDK has no sampling parameters of its own; the server takes
# Anthropic's `temperature`, `top_p` and `top_k` all the same.
GREEDY = {"temperature": 0}


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print("ok:", what)


def reference_tokens(messages, tools=None):
    text = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    return len(tok.encode(text, add_special_tokens=False))


def total_input(usage):
    return usage.input_tokens + (usage.cache_read_input_tokens or 0)


def text_of(message):
    return "".join(b.text for b in message.content if b.type == "text")


# 1. A plain message.
r = client.messages.create(model=MODEL, max_tokens=8, messages=MSG, extra_body=GREEDY)
check(r.type == "message" and r.role == "assistant" and r.id.startswith("msg_"), f"a message comes back: {r.id}")
check(r.content and r.content[0].type == "text", "its first block is text")
check(r.stop_reason in ("end_turn", "max_tokens") and r.stop_sequence is None, f"stop_reason {r.stop_reason}")
check(r.usage.output_tokens <= 8 and (r.stop_reason != "max_tokens" or r.usage.output_tokens == 8), "output_tokens within max_tokens")
check(total_input(r.usage) == reference_tokens(MSG), f"input + cache reads = transformers' prompt ({total_input(r.usage)})")
greedy = text_of(r)

# The same prompt again: its prefix is cached, reported apart from input_tokens.
again = client.messages.create(model=MODEL, max_tokens=8, messages=MSG, extra_body=GREEDY)
check(text_of(again) == greedy, "greedy answers repeat")
check((again.usage.cache_read_input_tokens or 0) > 0 and total_input(again.usage) == total_input(r.usage), f"a repeated prompt reads the cache ({again.usage.cache_read_input_tokens})")

r = client.messages.create(model=MODEL, max_tokens=3, messages=MSG, extra_body=GREEDY)
check(r.stop_reason == "max_tokens" and r.usage.output_tokens == 3, "max_tokens ends with stop_reason max_tokens")

# 2. A stop sequence taken from the greedy answer: the text stops before it.
words = [w for w in greedy.split() if w.strip()]
check(len(words) >= 2, f"the greedy answer has words to stop at: {greedy!r}")
stop = words[1]
r = client.messages.create(model=MODEL, max_tokens=8, messages=MSG, extra_body=GREEDY, stop_sequences=["\u2603never", stop])
check(r.stop_reason == "stop_sequence" and r.stop_sequence == stop, f"stop_sequence {r.stop_sequence!r}")
check(text_of(r) == greedy[: greedy.index(stop)], f"the text ends before the stop sequence: {text_of(r)!r}")

# 3. Streaming with the SDK's helpers: text_stream and get_final_message.
with client.messages.stream(model=MODEL, max_tokens=8, messages=MSG, extra_body=GREEDY) as s:
    streamed = "".join(s.text_stream)
    final = s.get_final_message()
check(streamed == greedy and text_of(final) == greedy, f"the streamed text is the whole answer's: {streamed!r}")
check(final.stop_reason in ("end_turn", "max_tokens") and total_input(final.usage) == reference_tokens(MSG), "the final message has stop_reason and usage")
check(final.usage.output_tokens <= 8 and final.usage.output_tokens > 0, "the final message counts output tokens")

# The events, in Anthropic's order (the SDK drops pings; tests/it checks them).
events = list(client.messages.create(model=MODEL, max_tokens=8, messages=MSG, extra_body=GREEDY, stream=True))
kinds = [e.type for e in events]
check(kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"], f"message_start first, message_delta and message_stop last: {kinds}")
blocks = [k for k in kinds if k.startswith("content_block")]
check(blocks[0] == "content_block_start" and blocks[-1] == "content_block_stop" and blocks.count("content_block_start") == blocks.count("content_block_stop"), "blocks open and close in pairs")
check(events[0].message.content == [] and events[0].message.stop_reason is None, "message_start carries an empty message")

# 4. Forced tool use: `any` and a named tool, validated against input_schema.
# Sampled answers make one call each (without a seed, several parallel
# calls could run past max_tokens, which no grammar prevents).
for run in range(2):
    r = client.messages.create(model=MODEL, max_tokens=120, messages=MSG, tools=TOOLS, tool_choice={"type": "any", "disable_parallel_tool_use": True}, extra_body={"temperature": 0.9, "top_p": 0.95, "top_k": 50})
    uses = [b for b in r.content if b.type == "tool_use"]
    check(r.stop_reason == "tool_use" and len(uses) == 1, f"tool_choice any gives tool_use (sampled, run {run})")
    for u in uses:
        jsonschema.validate(u.input, SCHEMAS[u.name])
        check(u.id.startswith("toolu_"), f"{u.name} input validates against its input_schema: {u.input}")
r = client.messages.create(model=MODEL, max_tokens=120, messages=MSG, tools=TOOLS, tool_choice={"type": "tool", "name": "add"}, extra_body=GREEDY)
uses = [b for b in r.content if b.type == "tool_use"]
check(len(uses) == 1 and uses[0].name == "add", "a named tool is called once")
jsonschema.validate(uses[0].input, ADD)
r = client.messages.create(model=MODEL, max_tokens=120, messages=MSG, tools=TOOLS, tool_choice={"type": "any", "disable_parallel_tool_use": True}, extra_body={"temperature": 0.9, "top_k": 40})
check(len([b for b in r.content if b.type == "tool_use"]) == 1, "disable_parallel_tool_use gives exactly one tool_use")

whole = client.messages.create(model=MODEL, max_tokens=120, messages=MSG, tools=TOOLS, tool_choice={"type": "any"}, extra_body=GREEDY)
whole_uses = [(b.name, b.input) for b in whole.content if b.type == "tool_use"]
with client.messages.stream(model=MODEL, max_tokens=120, messages=MSG, tools=TOOLS, tool_choice={"type": "any"}, extra_body=GREEDY) as s:
    final = s.get_final_message()
check(final.stop_reason == "tool_use" and [(b.name, b.input) for b in final.content if b.type == "tool_use"] == whole_uses, "streamed tool_use (input_json_delta) equals the whole answer's")

# 5. A round trip: the tool_use, its tool_result, then an answer in text.
use = next(b for b in whole.content if b.type == "tool_use")
history = MSG + [
    {"role": "assistant", "content": [{"type": "tool_use", "id": use.id, "name": use.name, "input": use.input}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "18 degrees, clear"}]},
]
r = client.messages.create(model=MODEL, max_tokens=8, messages=history, tools=TOOLS, tool_choice={"type": "none"}, extra_body=GREEDY)
check(r.stop_reason in ("end_turn", "max_tokens") and all(b.type == "text" for b in r.content), "tool_choice none answers the tool result in text")
as_hf = MSG + [
    {"role": "assistant", "content": None, "tool_calls": [{"id": use.id, "type": "function", "function": {"name": use.name, "arguments": use.input}}]},
    {"role": "tool", "tool_call_id": use.id, "name": use.name, "content": "18 degrees, clear"},
]
want = reference_tokens(as_hf, HF_TOOLS)
counted = client.messages.count_tokens(model=MODEL, messages=history, tools=TOOLS).input_tokens
check(counted == want, f"the round trip renders as transformers does ({counted} vs {want})")
check(total_input(r.usage) == counted, f"count_tokens equals the round trip's input ({total_input(r.usage)})")

# 6. count_tokens: the same body's input, with system and tools.
system = [{"type": "text", "text": "Be brief. "}, {"type": "text", "text": "Answer in French."}]
counted = client.messages.count_tokens(model=MODEL, system=system, messages=MSG, tools=TOOLS).input_tokens
want = reference_tokens([{"role": "system", "content": "Be brief. Answer in French."}] + MSG, HF_TOOLS)
check(counted == want, f"count_tokens with system blocks and tools is transformers' count ({counted} vs {want})")
r = client.messages.create(model=MODEL, max_tokens=2, system=system, messages=MSG, tools=TOOLS, tool_choice={"type": "none"}, extra_body=GREEDY)
check(total_input(r.usage) == counted, "count_tokens equals the usage of the same request")
counted = client.messages.count_tokens(model=MODEL, system="Be brief.", messages=MSG).input_tokens
check(counted == reference_tokens([{"role": "system", "content": "Be brief."}] + MSG), "a string system prompt counts as a system message")

# 7. Structured output (output_config.format): the text is JSON under the schema.
SMALL = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["ok", "n"], "additionalProperties": False}
r = client.messages.create(model=MODEL, max_tokens=60, messages=MSG, output_config={"format": {"type": "json_schema", "schema": SMALL}}, extra_body=GREEDY)
check(r.stop_reason == "end_turn", f"a structured answer ends its turn when the schema is complete ({r.stop_reason})")
jsonschema.validate(json.loads(text_of(r)), SMALL)
check(True, f"the structured answer validates: {text_of(r)}")

# 8. Errors in Anthropic's shape, as the SDK raises them.
try:
    client.messages.create(model=MODEL, max_tokens=8, messages=MSG, tools=TOOLS, tool_choice={"type": "tool", "name": "nope"})
    raise AssertionError("an unknown tool was accepted")
except anthropic.BadRequestError as e:
    check(e.body["type"] == "error" and e.body["error"]["type"] == "invalid_request_error", f"400 invalid_request_error: {e.body['error']['message']}")
try:
    client.messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}])
    raise AssertionError("an image was accepted")
except anthropic.BadRequestError as e:
    check("not supported" in e.body["error"]["message"], f"an image block is a 400: {e.body['error']['message']}")
try:
    client.post("/v1/messages/nothing", body={}, cast_to=object)
    raise AssertionError("an unknown path answered")
except anthropic.NotFoundError as e:
    check(e.body["error"]["type"] == "not_found_error", "an unknown path under /v1/messages is a 404 not_found_error")
print("ALL OK")
