"""OpenAI's Responses API against a live `host serve`, with the official openai SDK.

Usage: responses_check.py BASE_URL MODEL_DIR
MODEL_DIR's chat template speaks the Hermes `<tool_call>` syntax.
Checks `client.responses.create` whole and streamed (the documented event
order, numbered by sequence_number; the SDK's stream helper), usage
against transformers' rendering, text.format under a schema, function
calls validated against their parameters (Python `jsonschema`) and a
function_call_output round trip, previous_response_id follow-ups whose
prompt the prefix cache serves, GET and DELETE, and store:false. Prints
ALL OK when every check passes; any failure raises.
"""
import json
import sys

import jsonschema
import openai
from transformers import AutoTokenizer

base, model_dir = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0)
tok = AutoTokenizer.from_pretrained(model_dir)
MODEL = "tiny"

from tool_schemas import WEATHER
TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather in a city", "parameters": WEATHER, "strict": True}]
HF_TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": WEATHER}}]
SMALL = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["ok", "n"], "additionalProperties": False}
Q = "What is the weather in Paris?"


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print("ok:", what)


def reference_tokens(messages, tools=None):
    text = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    return len(tok.encode(text, add_special_tokens=False))


def create(**kw):
    return client.responses.create(model=MODEL, **kw)


# 1. A plain response.
r = create(input=Q, max_output_tokens=8, temperature=0)
check(r.object == "response" and r.id.startswith("resp_") and r.status in ("completed", "incomplete"), f"a response: {r.id} {r.status}")
check(r.output[0].type == "message" and r.output[0].role == "assistant", "its output is an assistant message")
check(r.output_text == r.output[0].content[0].text and r.output[0].content[0].type == "output_text", f"output_text: {r.output_text!r}")
u = r.usage
check(u.input_tokens == reference_tokens([{"role": "user", "content": Q}]), f"input_tokens are transformers' ({u.input_tokens})")
check(u.total_tokens == u.input_tokens + u.output_tokens and u.output_tokens <= 8, "total_tokens = input + output")
check(r.status != "incomplete" or (u.output_tokens == 8 and r.incomplete_details.reason == "max_output_tokens"), "a cut answer is incomplete for max_output_tokens")
greedy = r.output_text
r = create(input=[{"role": "developer", "content": "Be brief."}, {"role": "user", "content": [{"type": "input_text", "text": Q}]}], max_output_tokens=2, instructions="Answer in French.", temperature=0)
want = reference_tokens([{"role": "system", "content": "Answer in French."}, {"role": "system", "content": "Be brief."}, {"role": "user", "content": Q}])
check(r.usage.input_tokens == want and r.instructions == "Answer in French.", f"instructions and message items render as transformers does ({r.usage.input_tokens} vs {want})")

# 2. Streamed: the documented event order, numbered from 0.
events = list(create(input=Q, max_output_tokens=8, temperature=0, stream=True))
kinds = [e.type for e in events]
check([e.sequence_number for e in events] == list(range(len(events))), "sequence_number counts every event from 0")
deltas = [e for e in events if e.type == "response.output_text.delta"]
expected = (
    ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
    + ["response.output_text.delta"] * len(deltas)
    + ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
)
last = events[-1]
check(kinds[:-1] == expected, f"events in order: {kinds}")
check(last.type == ("response.completed" if last.response.status == "completed" else "response.incomplete"), f"the last event says how it ended: {last.type}")
text = "".join(d.delta for d in deltas)
done = next(e for e in events if e.type == "response.output_text.done")
check(text == done.text == greedy == last.response.output_text, f"deltas join to the whole answer's text: {text!r}")
check(events[0].response.status == "in_progress" and events[0].response.output == [], "response.created carries an in-progress response")
check(len({e.item_id for e in events if hasattr(e, "item_id")}) == 1, "every text event names one item")

# 3. text.format: JSON under a schema; it completes, whole and streamed.
fmt = {"format": {"type": "json_schema", "name": "small", "schema": SMALL, "strict": True}}
r = create(input=Q, max_output_tokens=60, temperature=0, text=fmt)
check(r.status == "completed", f"a schema-constrained answer completes: {r.output_text}")
jsonschema.validate(json.loads(r.output_text), SMALL)
events = list(create(input=Q, max_output_tokens=60, temperature=0, text=fmt, stream=True))
check(events[-1].type == "response.completed" and events[-1].response.output_text == r.output_text, "streamed, it ends with response.completed and the same text")
check(events[-1].response.text.format.type == "json_schema", "the response echoes text.format")
# The SDK's stream helper (its final response needs `response.completed`,
# which an answer cut by max_output_tokens does not send).
with client.responses.stream(model=MODEL, input=Q, max_output_tokens=60, temperature=0, text=fmt) as s:
    seen = [e.type for e in s]
    final = s.get_final_response()
check(final.output_text == r.output_text and "response.output_text.delta" in seen, "the SDK's stream helper gives the same final response")

# 4. A function call, forced, validated; streamed it comes as argument events.
r = create(input=Q, tools=TOOLS, tool_choice="required", max_output_tokens=120, temperature=0)
calls = [o for o in r.output if o.type == "function_call"]
check(r.status == "completed" and calls, f"tool_choice required gives function_call items: {[o.type for o in r.output]}")
for c in calls:
    jsonschema.validate(json.loads(c.arguments), WEATHER)
    check(c.call_id.startswith("call_") and c.id.startswith("fc_") and c.name == "get_weather", f"the call validates: {c.arguments}")
r2 = create(input=Q, tools=TOOLS, tool_choice={"type": "function", "name": "get_weather"}, parallel_tool_calls=False, max_output_tokens=120, temperature=0)
check(len([o for o in r2.output if o.type == "function_call"]) == 1, "a named function is called once")
events = list(create(input=Q, tools=TOOLS, tool_choice="required", max_output_tokens=120, temperature=0, stream=True))
kinds = [e.type for e in events]
check("response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds, "streamed calls send argument events")
args_done = [e.arguments for e in events if e.type == "response.function_call_arguments.done"]
check(args_done == [c.arguments for c in calls], "streamed arguments equal the whole answer's")
added = [e.item.type for e in events if e.type == "response.output_item.added"]
check(added == ["function_call"] * len(calls), f"each call is an output item: {added}")

# The calls' results, continuing the stored response (each call answered,
# as OpenAI requires); the prefix cache serves it.
results = [{"type": "function_call_output", "call_id": c.call_id, "output": "18 degrees, clear"} for c in calls]
follow = create(previous_response_id=r.id, input=results, tools=TOOLS, tool_choice="none", max_output_tokens=8, temperature=0)
check(all(o.type == "message" for o in follow.output) and follow.previous_response_id == r.id, "tool_choice none answers the result in text")
as_hf = [
    {"role": "user", "content": Q},
    {"role": "assistant", "content": None, "tool_calls": [{"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": json.loads(c.arguments)}} for c in calls]},
] + [{"role": "tool", "tool_call_id": c.call_id, "name": c.name, "content": "18 degrees, clear"} for c in calls]
want = reference_tokens(as_hf, HF_TOOLS)
check(follow.usage.input_tokens == want, f"the round trip renders as transformers does ({follow.usage.input_tokens} vs {want})")
check(follow.usage.input_tokens_details.cached_tokens > 0, f"the follow-up's prefix is cached ({follow.usage.input_tokens_details.cached_tokens})")

# 5. previous_response_id with text: stored conversation + new input.
first = create(input="Tell me a story.", max_output_tokens=8, temperature=0)
second = create(previous_response_id=first.id, input="Go on.", max_output_tokens=4, temperature=0)
history = [{"role": "user", "content": "Tell me a story."}, {"role": "assistant", "content": first.output_text}, {"role": "user", "content": "Go on."}]
check(second.usage.input_tokens == reference_tokens(history), f"the follow-up's prompt is the conversation so far ({second.usage.input_tokens})")
cached = second.usage.input_tokens_details.cached_tokens
check(cached >= first.usage.input_tokens - 1, f"the prefix cache serves the stored conversation ({cached} of {second.usage.input_tokens})")
third = create(previous_response_id=second.id, input="And then?", max_output_tokens=2, temperature=0)
check(third.usage.input_tokens == reference_tokens(history + [{"role": "assistant", "content": second.output_text}, {"role": "user", "content": "And then?"}]), "a chain of follow-ups keeps the whole conversation")

# 6. GET and DELETE.
got = client.responses.retrieve(first.id)
check(got.id == first.id and got.output_text == first.output_text and got.usage.input_tokens == first.usage.input_tokens, "GET returns the stored response")
client.responses.delete(first.id)
try:
    client.responses.retrieve(first.id)
    raise AssertionError("a deleted response was found")
except openai.NotFoundError:
    check(True, "a deleted response is a 404")
try:
    client.responses.delete(first.id)
    raise AssertionError("a deleted response was deleted again")
except openai.NotFoundError:
    check(True, "deleting it again is a 404")
try:
    create(previous_response_id=first.id, input="Go on.", max_output_tokens=2)
    raise AssertionError("a deleted response was continued")
except openai.BadRequestError as e:
    check(e.code == "previous_response_not_found" and e.param == "previous_response_id", f"continuing it is a 400: {e.message}")
check(client.responses.retrieve(second.id).id == second.id, "the follow-up is still stored")

# 7. store: false: answered, never kept.
r = create(input=Q, max_output_tokens=2, store=False, temperature=0)
check(r.store is False and r.output_text is not None, "store false still answers")
try:
    client.responses.retrieve(r.id)
    raise AssertionError("an unstored response was found")
except openai.NotFoundError:
    check(True, "an unstored response cannot be read")
try:
    create(previous_response_id=r.id, input="Go on.", max_output_tokens=2)
    raise AssertionError("an unstored response was continued")
except openai.BadRequestError as e:
    check(e.code == "previous_response_not_found", "an unstored response cannot be continued")
print("ALL OK")
