"""Drives a live `host serve` with the official openai Python SDK.

Usage: openai_sdk_check.py BASE_URL (paris|any)
Prints ALL OK when every check passes; any failure raises (non-zero exit).
"""
import sys

import openai

base, mode = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base, api_key="unused")
MSG = [{"role": "user", "content": "What is the capital of France?"}]


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print("ok:", what)


models = client.models.list()
model = models.data[0].id
check(len(models.data) == 1 and model, "models.list returns the served model")

# Chat, non-streaming, greedy.
r = client.chat.completions.create(model=model, messages=MSG, temperature=0, max_tokens=24)
text = r.choices[0].message.content
check(r.object == "chat.completion" and isinstance(text, str) and text, "chat completion has content")
check(r.choices[0].finish_reason in ("stop", "length"), "finish_reason is stop or length")
u = r.usage
check(u.total_tokens == u.prompt_tokens + u.completion_tokens and u.prompt_tokens > 0, "usage adds up")
check(u.prompt_tokens_details.cached_tokens == 0, "usage has prompt_tokens_details.cached_tokens")
if mode == "paris":
    check("Paris" in text, f"the default model answers Paris: {text!r}")

# Chat, streaming, with usage in the last chunk.
chunks = list(client.chat.completions.create(model=model, messages=MSG, temperature=0, max_tokens=24, stream=True, stream_options={"include_usage": True}))
check(chunks[0].choices[0].delta.role == "assistant", "first delta carries the role")
streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
check(streamed == text, f"streamed text equals the non-streamed text: {streamed!r} vs {text!r}")
finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
check(finals == [r.choices[0].finish_reason], "exactly one chunk has the finish_reason")
check(chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == u.completion_tokens and not chunks[-1].choices, "last chunk carries usage")

# max_tokens and max_completion_tokens.
r3 = client.chat.completions.create(model=model, messages=MSG, temperature=0, max_tokens=3)
check(r3.usage.completion_tokens <= 3, "max_tokens bounds the completion")
r4 = client.chat.completions.create(model=model, messages=MSG, temperature=0, max_tokens=50, max_completion_tokens=2)
check(r4.usage.completion_tokens <= 2, "max_completion_tokens wins over max_tokens")
if r.usage.completion_tokens > 3:
    check(r3.choices[0].finish_reason == "length", "finish_reason is length when cut")

# Stop strings: cut exactly before the first occurrence, also when streaming.
long = client.completions.create(model=model, prompt="The history of", temperature=0, max_tokens=40)
full = long.choices[0].text
check(long.object == "text_completion" and full, "completion has text")
stop = full[len(full) // 2 : len(full) // 2 + 3]
want = full[: full.find(stop)]
cut = client.completions.create(model=model, prompt="The history of", temperature=0, max_tokens=40, stop=[stop])
check(cut.choices[0].text == want and cut.choices[0].finish_reason == "stop", f"stop string {stop!r} cuts the text")
scut = "".join(c.choices[0].text for c in client.completions.create(model=model, prompt="The history of", temperature=0, max_tokens=40, stop=stop, stream=True))
check(scut == want, f"streamed text never leaks the stop string: {scut!r} vs {want!r}")

# Seed reproducibility at temperature 1.
def sample(seed):
    return client.completions.create(model=model, prompt="Once", temperature=1.0, max_tokens=24, seed=seed).choices[0].text

a, b = sample(42), sample(42)
check(a == b, "the same seed gives the same text")
check(any(sample(s) != a for s in (1, 2, 3)), "other seeds give other text")

# Logprobs.
lp = client.chat.completions.create(model=model, messages=MSG, temperature=0, max_tokens=5, logprobs=True, top_logprobs=3)
content = lp.choices[0].logprobs.content
check(len(content) == lp.usage.completion_tokens or lp.choices[0].finish_reason == "stop", "one logprob entry per token")
for e in content:
    tops = [t.logprob for t in e.top_logprobs]
    check(len(tops) == 3 and tops == sorted(tops, reverse=True) and all(x <= 0 for x in tops), "top_logprobs: 3, sorted, <= 0")
    check(abs(e.logprob - tops[0]) < 1e-5, "greedy token is the most likely one")
clp = client.completions.create(model=model, prompt="The", temperature=0, max_tokens=3, logprobs=2)
check(len(clp.choices[0].logprobs.token_logprobs) == clp.usage.completion_tokens, "completions logprobs per token")

# Several prompts and echo, as evaluation harnesses send them: a
# loglikelihood is the prompt's slice of token_logprobs.
two = client.completions.create(model=model, prompt=["The", "Once upon"], temperature=0, max_tokens=3)
alone = [client.completions.create(model=model, prompt=p, temperature=0, max_tokens=3).choices[0].text for p in ("The", "Once upon")]
check([c.text for c in two.choices] == alone and [c.index for c in two.choices] == [0, 1], "several prompts answer as one each")
ev = client.completions.create(model=model, prompt="Once upon a time", temperature=0, max_tokens=1, logprobs=1, echo=True)
elp = ev.choices[0].logprobs
check(ev.choices[0].text.startswith("Once upon a time"), "echo leads with the prompt")
check(elp.token_logprobs[0] is None and all(x <= 0 for x in elp.token_logprobs[1:]), "echo scores the prompt's tokens")
check(len(elp.tokens) == ev.usage.prompt_tokens + ev.usage.completion_tokens, "one entry per prompt and generated token")

# Errors surface as the SDK's typed exceptions.
try:
    client.chat.completions.create(model=model, messages=MSG, n=0)
    raise AssertionError("n=0 accepted")
except openai.BadRequestError as e:
    check(e.status_code == 400 and e.body.get("param") == "n", "n=0 is a 400 BadRequestError naming n")

print("ALL OK")
