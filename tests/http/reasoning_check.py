"""Reasoning output against a live `host serve`, with the official openai and anthropic SDKs.

Usage: reasoning_check.py BASE_URL MODEL_DIR END_THINK_ID
MODEL_DIR is a random-weight model whose chat template opens `<think>` in
the generation prompt (closed empty when enable_thinking is false) and
whose tokenizer has `</think>` as token END_THINK_ID. Such a model does not
end its reasoning on its own, so every request here biases that token
(logit_bias) and penalises repeats (presence_penalty): greedy decoding then
closes the block after a few tokens, the same way every time.

The oracle is independent of the server's reasoning parser: the prompt is
rendered by transformers (Jinja2) from the same conversation and switches,
its tokens are completed raw through /v1/completions with the same
sampling, and the raw text is split at the first `</think>` by hand. Chat
completions (whole and streamed), Anthropic Messages and the Responses API
must give exactly those two parts as reasoning and answer, count the
prompt's tokens as transformers does, and count the reasoning's tokens.
Switching reasoning off must change the prompt as the template says.
Grammars (a forced tool call, a JSON schema) constrain only the answer
after the block. Prints ALL OK when every check passes; any failure raises.
"""
import json
import sys

import anthropic
import jsonschema
import openai
from transformers import AutoTokenizer

base, model_dir, end_id = sys.argv[1], sys.argv[2], int(sys.argv[3])
oa = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
an = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0)
tok = AutoTokenizer.from_pretrained(model_dir)
MODEL = "tiny"
END = "</think>"
# Greedy, `</think>` favoured, repeats penalised (see the module's note).
STEER = {"temperature": 0, "presence_penalty": 2.0, "logit_bias": {str(end_id): 1.4}}
Q = [{"role": "user", "content": "What is 2 + 2?"}]

from tool_schemas import WEATHER

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": WEATHER}}]
SMALL = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print("ok:", what)


def prompt_ids(messages, tools=None, **kwargs):
    text = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False, **kwargs)
    return tok.encode(text, add_special_tokens=False)


def raw(ids, max_tokens):
    """The raw completion of these prompt tokens: its text, and its tokens' texts."""
    r = oa.completions.create(model=MODEL, prompt=ids, max_tokens=max_tokens, logprobs=0, extra_body=STEER, **{})
    return r.choices[0].text, r.choices[0].logprobs.tokens, r.choices[0].finish_reason


def split(text, tokens):
    """(reasoning, answer, reasoning tokens) of a raw answer that starts inside the block."""
    if END not in text:
        return text.strip(), "", len(tokens)
    before, after = text.split(END, 1)
    return before.strip(), after.lstrip(), tokens.index(END) + 1


# 1. Chat completions: the raw completion split at `</think>`.
N = 16
ids = prompt_ids(Q)
text, tokens, raw_finish = raw(ids, N)
reasoning, answer, k = split(text, tokens)
check(END in text and 1 < k < N and reasoning and answer, f"the raw completion closes its block after {k} tokens: {text!r}")
c = oa.chat.completions.create(model=MODEL, messages=Q, max_tokens=N, extra_body=STEER)
m = c.choices[0].message
check(c.usage.prompt_tokens == len(ids), f"the prompt is transformers' ({c.usage.prompt_tokens} tokens)")
check(m.reasoning_content == reasoning, f"reasoning_content is the text inside the block: {m.reasoning_content!r}")
check(m.content == answer, f"content is the text after it: {m.content!r}")
check(c.usage.completion_tokens_details.reasoning_tokens == k, f"reasoning_tokens counts the block ({k})")
check(c.choices[0].finish_reason == raw_finish, f"finish_reason {raw_finish}")

s = oa.chat.completions.create(model=MODEL, messages=Q, max_tokens=N, stream=True, stream_options={"include_usage": True}, extra_body=STEER)
r_parts, c_parts, usage, order = [], [], None, []
for chunk in s:
    if chunk.usage:
        usage = chunk.usage
    for ch in chunk.choices:
        d = ch.delta
        rc = getattr(d, "reasoning_content", None)
        if rc:
            r_parts.append(rc)
            order.append("r")
        if d.content:
            c_parts.append(d.content)
            order.append("c")
check("".join(r_parts) == reasoning and "".join(c_parts) == answer, "streamed deltas join to the same reasoning and content")
check(order == sorted(order, key=lambda x: x != "r") and len(r_parts) >= 1, f"reasoning deltas come before content ({''.join(order)})")
check(usage.completion_tokens_details.reasoning_tokens == k, "streamed usage counts the reasoning tokens")

# Cut inside the block: all of it is reasoning.
c = oa.chat.completions.create(model=MODEL, messages=Q, max_tokens=2, extra_body=STEER)
want, _, _ = split(raw(ids, 2)[0], tokens[:2])
check(c.choices[0].message.reasoning_content == want and c.choices[0].message.content == "" and c.choices[0].finish_reason == "length", f"a block cut by max_tokens is all reasoning: {want!r}")

# 2. Switched off: the template closes the block in the prompt, the answer is all content.
for how, extra in [
    ("chat_template_kwargs.enable_thinking=false", {"chat_template_kwargs": {"enable_thinking": False}}),
    ("reasoning_effort=none", {"reasoning_effort": "none"}),
]:
    off = prompt_ids(Q, enable_thinking=False)
    check(off != ids and tok.decode(off).endswith("<think>\n\n</think>\n\n"), "transformers' prompt with enable_thinking=false closes the block")
    want, _, _ = raw(off, N)
    c = oa.chat.completions.create(model=MODEL, messages=Q, max_tokens=N, extra_body={**STEER, **extra})
    m = c.choices[0].message
    check(c.usage.prompt_tokens == len(off), f"{how}: the prompt is the template's with thinking off")
    check(m.content == want and getattr(m, "reasoning_content", None) is None, f"{how}: the whole answer is content: {m.content!r}")
    check(c.usage.completion_tokens_details.reasoning_tokens == 0, f"{how}: no reasoning tokens")
c = oa.chat.completions.create(model=MODEL, messages=Q, max_tokens=N, extra_body={**STEER, "reasoning_effort": "high"})
check(c.usage.prompt_tokens == len(prompt_ids(Q, reasoning_effort="high")) == len(ids), "reasoning_effort=high keeps the block open")

# 3. Past reasoning in the history: the template drops it before the last
# user turn, unless preserve_thinking asks it to stay.
# (No digit after a newline: transformers' GPT2Tokenizer class splits
# digits off whitespace differently from this folder's tokenizer.json.)
history = Q + [{"role": "assistant", "content": "Four.", "reasoning_content": "Two and two."}, {"role": "user", "content": "And 3 + 3?"}]
for kwargs in [{}, {"preserve_thinking": True}]:
    want = prompt_ids(history, **kwargs)
    c = oa.chat.completions.create(model=MODEL, messages=history, max_tokens=1, extra_body={**STEER, "chat_template_kwargs": kwargs})
    check(c.usage.prompt_tokens == len(want), f"history with reasoning_content renders as transformers does {kwargs} ({len(want)})")
check(len(prompt_ids(history, preserve_thinking=True)) > len(prompt_ids(history)), "preserve_thinking keeps the past reasoning in the prompt")

# 4. Grammars constrain only the answer after the block.
tool_ids = prompt_ids(Q, tools=TOOLS)
t_text, t_tokens, _ = raw(tool_ids, N)
t_reasoning, _, _ = split(t_text, t_tokens)
c = oa.chat.completions.create(model=MODEL, messages=Q, tools=TOOLS, tool_choice="required", max_tokens=80, extra_body=STEER)
m = c.choices[0].message
check(c.usage.prompt_tokens == len(tool_ids), "the tools are in the prompt as transformers renders them")
check(m.reasoning_content == t_reasoning, f"a forced call's reasoning is the free text before `</think>`: {m.reasoning_content!r}")
check(c.choices[0].finish_reason == "tool_calls" and len(m.tool_calls) >= 1, "then the grammar writes the call")
for call in m.tool_calls:
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)
check(True, "the call's arguments follow its schema")
c = oa.chat.completions.create(model=MODEL, messages=Q, max_tokens=60, response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": SMALL}}, extra_body=STEER)
m = c.choices[0].message
check(m.reasoning_content == reasoning, "structured output: the reasoning is free")
jsonschema.validate(json.loads(m.content), SMALL)
check(c.choices[0].finish_reason == "stop", f"and the answer after it follows the schema: {m.content!r}")

# 5. Anthropic Messages: thinking blocks.
THINKING = {"type": "enabled", "budget_tokens": 1024}
AN_N = 1025
a_text, a_tokens, a_finish = raw(ids, AN_N)
a_reasoning, a_answer, a_k = split(a_text, a_tokens)
msg = an.messages.create(model=MODEL, max_tokens=AN_N, messages=Q, thinking=THINKING, extra_body=STEER)
kinds = [b.type for b in msg.content]
check(kinds == ["thinking", "text"], f"a thinking block, then the text: {kinds}")
check(msg.content[0].thinking == a_reasoning and isinstance(msg.content[0].signature, str) and msg.content[0].signature, "the thinking block holds the reasoning, signed")
check(msg.content[1].text == a_answer, "the text block holds the answer")
check(msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0) == len(ids), "input tokens are transformers' prompt")
events = []
with an.messages.stream(model=MODEL, max_tokens=AN_N, messages=Q, thinking=THINKING, extra_body=STEER) as st:
    for ev in st:
        if ev.type == "content_block_delta":
            events.append(ev.delta.type)
        elif ev.type in ("content_block_start", "content_block_stop"):
            events.append(ev.type)
    final = st.get_final_message()
check([b.type for b in final.content] == ["thinking", "text"] and final.content[0].thinking == a_reasoning and final.content[1].text == a_answer, "the SDK's stream helper rebuilds the same blocks")
check(final.content[0].signature == msg.content[0].signature, "with the same signature")
first_text = events.index("text_delta")
check(events[0] == "content_block_start" and events[1] == "thinking_delta" and "signature_delta" in events[:first_text], f"thinking_delta events, then signature_delta before the text ({events[:6]}…)")
off = prompt_ids(Q, enable_thinking=False)
msg = an.messages.create(model=MODEL, max_tokens=N, messages=Q, thinking={"type": "disabled"}, extra_body=STEER)
check([b.type for b in msg.content] == ["text"] and msg.content[0].text == raw(off, N)[0], "thinking disabled: the template's closed block, one text block")
check(an.messages.count_tokens(model=MODEL, messages=Q, thinking={"type": "disabled"}).input_tokens == len(off), "count_tokens follows the switch")
# Thinking blocks in the history are the assistant's reasoning_content.
loop = Q + [
    {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "I should look it up.", "signature": "x"},
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris", "unit": "C"}},
    ]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "18C"}]},
]
hf = Q + [
    {"role": "assistant", "content": "", "reasoning_content": "I should look it up.", "tool_calls": [{"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}}]},
    {"role": "tool", "tool_call_id": "toolu_1", "name": "get_weather", "content": "18C"},
]
an_tools = [{"name": "get_weather", "description": "Weather in a city", "input_schema": WEATHER}]
got = an.messages.count_tokens(model=MODEL, messages=loop, tools=an_tools).input_tokens
want = prompt_ids(hf, tools=TOOLS)
check(got == len(want) and "I should look it up." in tok.decode(want), f"a thinking block in the history renders as reasoning_content ({got})")

# 6. Responses: reasoning items.
r = oa.responses.create(model=MODEL, input="What is 2 + 2?", max_output_tokens=N, extra_body=STEER)
check([o.type for o in r.output] == ["reasoning", "message"], f"a reasoning item, then the message: {[o.type for o in r.output]}")
item = r.output[0]
check(item.summary == [] and item.content[0].type == "reasoning_text" and item.content[0].text == reasoning, "the reasoning item holds the reasoning as reasoning_text")
check(r.output_text == answer, "the message holds the answer")
check(r.usage.input_tokens == len(ids) and r.usage.output_tokens_details.reasoning_tokens == k, "usage: the prompt, and the reasoning tokens")
names, texts = [], {"reasoning": "", "text": ""}
for ev in oa.responses.create(model=MODEL, input="What is 2 + 2?", max_output_tokens=N, stream=True, extra_body=STEER):
    names.append(ev.type)
    if ev.type == "response.reasoning_text.delta":
        texts["reasoning"] += ev.delta
    elif ev.type == "response.output_text.delta":
        texts["text"] += ev.delta
    elif ev.type in ("response.completed", "response.incomplete"):
        done = ev.response
want_order = ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta"]
check(names[:5] == want_order, f"the stream opens the reasoning item first: {names[:5]}")
i = names.index("response.reasoning_text.done")
check(names[i:i + 4] == ["response.reasoning_text.done", "response.content_part.done", "response.output_item.done", "response.output_item.added"], "the reasoning item closes before the message opens")
check(texts == {"reasoning": reasoning, "text": answer} and done.output[0].content[0].text == reasoning, "streamed deltas join to the same reasoning and text")
# (The SDK's stream helper wants a completed response: a schema ends the answer.)
fmt = {"format": {"type": "json_schema", "name": "s", "schema": SMALL}}
with oa.responses.stream(model=MODEL, input="What is 2 + 2?", max_output_tokens=60, text=fmt, extra_body=STEER) as st:
    for _ in st:
        pass
    final = st.get_final_response()
check(final.status == "completed" and final.output[0].type == "reasoning" and final.output[0].content[0].text == reasoning, "the SDK's stream helper takes the reasoning item")
jsonschema.validate(json.loads(final.output_text), SMALL)
check(True, f"text.format constrains the answer after the reasoning: {final.output_text!r}")
r = oa.responses.create(model=MODEL, input="What is 2 + 2?", max_output_tokens=N, reasoning={"effort": "none"}, extra_body=STEER)
check([o.type for o in r.output] == ["message"] and r.usage.input_tokens == len(off) and r.reasoning.effort == "none", "reasoning.effort=none: the closed block, no reasoning item")
# Reasoning items come back as input; a stored response's reasoning too.
first = oa.responses.create(model=MODEL, input="What is 2 + 2?", max_output_tokens=N, extra_body=STEER)
follow = oa.responses.create(model=MODEL, previous_response_id=first.id, input="And 3 + 3?", max_output_tokens=1, extra_body=STEER)
conv = Q + [{"role": "assistant", "content": answer, "reasoning_content": reasoning}, {"role": "user", "content": "And 3 + 3?"}]
check(follow.usage.input_tokens == len(prompt_ids(conv)), "a follow-up renders the stored reasoning as the template does")
resp_tools = [{"type": "function", "name": "get_weather", "description": "Weather in a city", "parameters": WEATHER}]
items = [
    {"role": "user", "content": "What is 2 + 2?"},
    {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "I should look it up."}]},
    {"type": "function_call", "call_id": "toolu_1", "name": "get_weather", "arguments": json.dumps({"city": "Paris", "unit": "C"})},
    {"type": "function_call_output", "call_id": "toolu_1", "output": "18C"},
]
r = oa.responses.create(model=MODEL, input=items, tools=resp_tools, max_output_tokens=1, extra_body=STEER)
want = prompt_ids(hf, tools=TOOLS)
check(r.usage.input_tokens == len(want), f"a reasoning input item is its assistant turn's reasoning_content ({r.usage.input_tokens})")
# Stateless clients (Codex) ask for encrypted_content and send only that back.
r = oa.responses.create(model=MODEL, input="What is 2 + 2?", max_output_tokens=N, include=["reasoning.encrypted_content"], store=False, extra_body=STEER)
blob = r.output[0].encrypted_content
check(isinstance(blob, str) and blob and r.output[0].content[0].text == reasoning, "include=reasoning.encrypted_content gives the reasoning item a blob")
sealed_items = [items[0], {"type": "reasoning", "summary": [], "encrypted_content": blob}] + items[2:]
r2 = oa.responses.create(model=MODEL, input=sealed_items, tools=resp_tools, max_output_tokens=1, extra_body=STEER)
hf_sealed = [hf[0], dict(hf[1], reasoning_content=reasoning), hf[2]]
check(r2.usage.input_tokens == len(prompt_ids(hf_sealed, tools=TOOLS)), "a reasoning item sent back as that blob alone gives the template its reasoning again")

print("ALL OK")
