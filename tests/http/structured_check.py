"""Structured output against a live `host serve`, checked by independent
validators: every answer that ends with `stop` must validate against its
JSON Schema (Python `jsonschema`), match its regex (Python `re`) or be one
of its choices; every corpus answer cut by `length` must be a prefix the
schema allows (llguidance's own Python matcher over the answer's bytes:
the same grammar library, driven apart from the server's masks, batches
and drafts); the official openai SDK's `parse` must return the model.

Usage: structured_check.py BASE_URL MODEL_DIR LABEL [--concurrency N] [--greedy-corpus]

--greedy-corpus runs the corpus greedily only (the real model's run: its
sampled rows take the same paths as the tiny models', which run both).
Prints ALL OK when every check passes; any failure raises (non-zero exit).
"""
import argparse
import json
import pathlib
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import List, Literal

import jsonschema
import llguidance
import llguidance.hf
import openai
import pydantic
from transformers import AutoTokenizer

ap = argparse.ArgumentParser()
ap.add_argument("base")
ap.add_argument("model_dir")
ap.add_argument("label")
ap.add_argument("--concurrency", type=int, default=1)
ap.add_argument("--expect-drafts", action="store_true")
ap.add_argument("--greedy-corpus", action="store_true")
args = ap.parse_args()

client = openai.OpenAI(base_url=args.base, api_key="unused", max_retries=0)
model = client.models.list().data[0].id
tok = AutoTokenizer.from_pretrained(args.model_dir)
SCHEMAS = json.loads((pathlib.Path(__file__).parent / "schemas.json").read_text())
MSG = [{"role": "user", "content": "Describe something as JSON."}]
LLTOK = llguidance.hf.from_tokenizer(tok)


def check(cond, what):
    if not cond:
        raise AssertionError(f"[{args.label}] {what}")
    print(f"ok [{args.label}]:", what)


def allowed_prefix(schema, text):
    """How many of `text`'s tokens (as the tokenizer splits it) the schema's
    grammar accepts in turn, and how many there are. The schema gets the
    layout the server writes JSON in (docs/http-api.md: `", "` and `": "`,
    no other whitespace) unless it names its own."""
    if isinstance(schema, dict) and "x-guidance" not in schema:
        schema = {**schema, "x-guidance": {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}}
    grammar = llguidance.LLMatcher.grammar_from_json_schema(schema)
    matcher = llguidance.LLMatcher(LLTOK, grammar)
    ids = tok.encode(text, add_special_tokens=False)
    return matcher.validate_tokens(ids), len(ids), matcher.get_error()


def ask(extra, messages=MSG, max_tokens=160, **kw):
    return client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, extra_body=extra, **kw)


# 1. The corpus, greedy and sampled, `concurrency` requests at a time.
def corpus_case(case):
    i, schema, sampled = case
    sampling = {"temperature": 0.8, "seed": 1000 + i} if sampled else {"temperature": 0}
    rf = {"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}}
    r = ask({}, response_format=rf, **sampling)
    c = r.choices[0]
    if c.finish_reason == "stop":
        value = json.loads(c.message.content)
        jsonschema.validate(value, schema)
    else:
        took, of, error = allowed_prefix(schema, c.message.content)
        check(0 < took == of, f"corpus {i} cut by length is a prefix its schema allows ({took}/{of} tokens; {error})")
    spec = (r.usage.model_extra or {}).get("speculation") or {}
    return c.finish_reason, spec.get("drafted", 0)


modes = (False,) if args.greedy_corpus else (False, True)
cases = [(i, s, sampled) for sampled in modes for i, s in enumerate(SCHEMAS)]
with ThreadPoolExecutor(args.concurrency) as pool:
    results = list(pool.map(corpus_case, cases))
finishes = [f for f, _ in results]
drafted = sum(d for _, d in results)
print(f"[{args.label}] corpus: {finishes.count('stop')} stop, {finishes.count('length')} length, {drafted} tokens drafted")
if args.expect_drafts:
    check(drafted > 0, f"the drafter drafted under grammars ({drafted} tokens)")
stops = finishes.count("stop")
import urllib.request
metrics = urllib.request.urlopen(args.base.removesuffix("/v1") + "/metrics").read().decode()
masks = int(re.search(r"^mlx_engine_grammar_masks_total (\d+)", metrics, re.M).group(1))
check(masks > 0, f"/metrics counts grammar masks ({masks})")
check(set(finishes) <= {"stop", "length"}, f"every corpus answer ends with stop or length: {set(finishes)}")
check(stops >= 0.8 * len(cases), f"{stops}/{len(cases)} corpus answers complete, each valid under its schema, the rest valid prefixes")

# 1b. The corpus cut short: each answer is a prefix its schema allows (the
# prefix check itself refuses one that is not).
integer_a = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
took, of, _ = allowed_prefix(integer_a, '{"a": "x')
check(took < of, f"the prefix check refuses a string where an integer goes ({took}/{of} tokens)")
check(allowed_prefix(integer_a, '{"a": 1')[:2] == (len(tok.encode('{"a": 1', add_special_tokens=False)),) * 2, "the prefix check takes a good prefix")
took, of, _ = allowed_prefix(integer_a, '{"a":1')
check(took < of, f"the prefix check holds the server's layout (`\": \"`, {took}/{of} tokens)")


def cut_case(case):
    i, schema = case
    rf = {"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}}
    c = ask({}, response_format=rf, max_tokens=6, temperature=0).choices[0]
    if c.finish_reason == "stop":
        jsonschema.validate(json.loads(c.message.content), schema)
    took, of, error = allowed_prefix(schema, c.message.content)
    return c.finish_reason, 0 < took == of, f"{i}: {took}/{of} tokens of {c.message.content!r} ({error})"


with ThreadPoolExecutor(args.concurrency) as pool:
    cut = list(pool.map(cut_case, list(enumerate(SCHEMAS))))
bad = [why for _, good, why in cut if not good]
check(not bad, f"every corpus answer cut at 6 tokens is a prefix its schema allows: {bad}")
cut_short = sum(f == "length" for f, _, _ in cut)
check(cut_short >= len(SCHEMAS) // 2, f"{cut_short}/{len(SCHEMAS)} of them were cut by length")

# 2. A grammar that cannot end within max_tokens ends with `length`, never a
# "complete" invalid answer.
long = {"type": "array", "items": {"type": "integer"}, "minItems": 40}
r = ask({"guided_json": long}, max_tokens=12, temperature=0)
check(r.choices[0].finish_reason == "length", "an unfinishable grammar ends with length")

# 3. json_object, regex, choice, Lark grammar, structured_outputs.
r = ask({}, response_format={"type": "json_object"}, temperature=0)
if r.choices[0].finish_reason == "stop":
    check(isinstance(json.loads(r.choices[0].message.content), dict), "json_object gives a JSON object")
rx = r"[a-z]{2,6}-[0-9]{3}"
r = ask({"guided_regex": rx}, temperature=0)
check(re.fullmatch(rx, r.choices[0].message.content), f"guided_regex output matches: {r.choices[0].message.content!r}")
options = ["alpha", "beta", "gamma delta"]
for seed in range(4):
    r = ask({"guided_choice": options}, temperature=1.0, seed=seed)
    check(r.choices[0].message.content in options, f"guided_choice picks one option (seed {seed})")
r = ask({"guided_grammar": 'start: "x=" NUM ";"\nNUM: /[1-9][0-9]?/'}, temperature=0.7, seed=3)
check(re.fullmatch(r"x=[1-9][0-9]?;", r.choices[0].message.content), "guided_grammar (Lark) output parses")
r = ask({"structured_outputs": {"regex": "(yes|no)!"}}, temperature=0)
check(r.choices[0].message.content in ("yes!", "no!"), "structured_outputs.regex")
r = client.completions.create(model=model, prompt="The answer:", max_tokens=20, temperature=0, extra_body={"guided_regex": "[0-9]{4}"})
check(re.fullmatch("[0-9]{4}", r.choices[0].text), "completions take a grammar too")

# 4. The SDK's parse with a pydantic model.
class Item(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=10)
    count: int = pydantic.Field(ge=0, le=99)
    kind: Literal["tool", "food", "toy"]


class Basket(pydantic.BaseModel):
    items: List[Item] = pydantic.Field(min_length=1, max_length=2)


p = client.chat.completions.parse(model=model, messages=MSG, response_format=Basket, max_tokens=200, temperature=0)
check(isinstance(p.choices[0].message.parsed, Basket), f"parse returns the pydantic model: {p.choices[0].message.parsed!r}")

# 5. Streaming under a grammar gives the same text as the whole answer.
schema = SCHEMAS[5]
rf = {"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}
whole = ask({}, response_format=rf, temperature=0).choices[0].message.content
chunks = ask({}, response_format=rf, temperature=0, stream=True)
streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
check(streamed == whole, "a constrained stream equals the constrained answer")

# 6. logit_bias: +100 makes one token certain; -100 bans it.
a, b = tok.encode(" apple", add_special_tokens=False)[0], tok.encode(" river", add_special_tokens=False)[0]
r = client.completions.create(model=model, prompt="Words:", max_tokens=4, temperature=0, logit_bias={str(a): 100, str(b): 90})
check(r.choices[0].text == tok.decode([a] * 4), f"logit_bias +100 forces its token: {r.choices[0].text!r}")
r = client.completions.create(model=model, prompt="Words:", max_tokens=4, temperature=0.9, seed=1, logit_bias={str(a): -100, str(b): 90})
check(r.choices[0].text == tok.decode([b] * 4), f"logit_bias -100 bans its token: {r.choices[0].text!r}")

# 7. n > 1: one choice per index; greedy choices agree; streamed choices
# reassemble to the same texts.
r = client.chat.completions.create(model=model, messages=MSG, max_tokens=12, n=3, temperature=0)
check([c.index for c in r.choices] == [0, 1, 2], "n=3 gives three choices")
check(len({c.message.content for c in r.choices}) == 1, "greedy choices are equal")
one = client.chat.completions.create(model=model, messages=MSG, max_tokens=12, temperature=0)
check(r.usage.completion_tokens == 3 * one.usage.completion_tokens, "usage counts every choice's tokens")
check(r.choices[0].message.content == one.choices[0].message.content, "a greedy choice of n=3 equals n=1")
r = client.chat.completions.create(model=model, messages=MSG, max_tokens=12, n=2, temperature=1.0, seed=7)
chunks = client.chat.completions.create(model=model, messages=MSG, max_tokens=12, n=2, temperature=1.0, seed=7, stream=True)
texts = {0: "", 1: ""}
for c in chunks:
    for ch in c.choices:
        texts[ch.index] += ch.delta.content or ""
check([texts[0], texts[1]] == [c.message.content for c in r.choices], "streamed n=2 choices equal the whole ones")

# 8. Bad grammars are 400s naming their parameter, and the server keeps serving.
bad = [
    ({"guided_regex": "(unclosed"}, "guided_regex"),
    ({"guided_grammar": "start: undefined_rule"}, "guided_grammar"),
    ({"guided_json": {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}}, "guided_json"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": [1, 2]}}}, "response_format.json_schema.schema"),
    ({"guided_choice": []}, "guided_choice"),
    ({"logit_bias": {"notanid": 3}}, "logit_bias"),
    ({"logit_bias": {"5": 101}}, "logit_bias"),
    ({"n": 0}, "n"),
]
for extra, param in bad:
    try:
        client.chat.completions.create(model=model, messages=MSG, max_tokens=4, extra_body=extra)
        raise AssertionError(f"accepted {extra}")
    except openai.BadRequestError as e:
        check(e.status_code == 400 and e.body.get("param") == param, f"400 naming {param}: {e.body.get('message')}")
r = ask({}, temperature=0, max_tokens=4)
check(r.choices[0].finish_reason in ("stop", "length"), "the server keeps serving")
print("ALL OK")
