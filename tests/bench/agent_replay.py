"""Replays recorded agent sessions (tests/fixtures/agent-traces/*.json)
through a running `host serve` and measures how much of each warm turn's
prompt the prefix cache served: on requests 2 and later, the sum of cached
prompt tokens over the sum of prompt tokens, read from each API's usage
fields (chat: prompt_tokens_details.cached_tokens / prompt_tokens;
Messages: cache_read_input_tokens / (input_tokens + cache_read_input_tokens);
Responses: input_tokens_details.cached_tokens / input_tokens).

Request k of a trace is what the harness sent: its per-request noise, then
the stable system prompt, the tools, and the conversation up to its k-th
cut (see make_traces.py). Every request asks for `--max-tokens` greedy
tokens (default 1): the figure is about prompts; each answer is kept (its
text, reasoning and calls) so a run can be compared with a server that
computed every prompt afresh. Run traces on a fresh server (or one
whose cache has room for them all): each trace's first request is cold.

Usage: agent_replay.py BASE_URL TRACE.json [TRACE.json ...] [--turns N] [--max-tokens N] [--only K,K]
Prints one line per request and one per trace, then a last line
`RESULT {json}`: {trace name: {"warm_hit_rate", "prompt_tokens",
"cached_tokens" (both over the warm requests), "requests": [[prompt, cached], ...],
"answers": [answer, ...]}}.
"""
import argparse
import json
import urllib.request


def post(base, path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=1800) as r:
        return json.load(r)


def request(trace, k, max_tokens):
    """(path, body, usage → (prompt tokens, cached tokens)) of request k."""
    noise, system = trace["noise"][k], trace["system"]
    conversation = trace["conversation"][: trace["cuts"][k]]
    if trace["api"] == "messages":
        blocks = ([{"type": "text", "text": noise}] if noise else []) + [{"type": "text", "text": system}]
        body = {"model": "m", "max_tokens": max_tokens, "temperature": 0, "system": blocks, "tools": trace["tools"], "messages": conversation}
        return "/v1/messages", body, lambda u: (u["input_tokens"] + u["cache_read_input_tokens"], u["cache_read_input_tokens"])
    if trace["api"] == "responses":
        body = {"model": "m", "max_output_tokens": max_tokens, "temperature": 0, "instructions": noise + system, "tools": trace["tools"], "input": conversation, "store": False, "include": ["reasoning.encrypted_content"]}
        return "/v1/responses", body, lambda u: (u["input_tokens"], u["input_tokens_details"]["cached_tokens"])
    messages = [{"role": "system", "content": noise + system}] + conversation
    body = {"model": "m", "max_tokens": max_tokens, "temperature": 0, "tools": trace["tools"], "messages": messages}
    return "/v1/chat/completions", body, lambda u: (u["prompt_tokens"], u["prompt_tokens_details"]["cached_tokens"])


def answer(api, reply):
    """What a reply generated, without its ids and seals: text, reasoning
    and calls in order."""
    if api == "messages":
        keys = {"text": ["text"], "thinking": ["thinking"], "tool_use": ["name", "input"]}
        return [[b["type"]] + [b.get(k) for k in keys.get(b["type"], [])] for b in reply["content"]]
    if api == "responses":
        parts = []
        for item in reply["output"]:
            if item["type"] == "function_call":
                parts.append(["function_call", item["name"], item["arguments"]])
            else:
                parts.append([item["type"], [c.get("text") for c in item.get("content") or []]])
        return parts
    m = reply["choices"][0]["message"]
    calls = [[c["function"]["name"], c["function"]["arguments"]] for c in m.get("tool_calls") or []]
    return [m.get("reasoning_content"), m.get("content"), calls]


def replay(base, trace, turns, max_tokens=1, only=None):
    rows, answers = [], []
    for k in range(min(turns, len(trace["cuts"]))):
        if only is not None and k not in only:
            continue
        path, body, read = request(trace, k, max_tokens)
        reply = post(base, path, body)
        prompt, cached = read(reply["usage"])
        rows.append((prompt, cached))
        answers.append(answer(trace["api"], reply))
        print(f"{trace['name']} request {k + 1}: prompt {prompt}, cached {cached} ({cached / prompt:.1%})", flush=True)
    warm = rows[1:]
    prompt, cached = sum(p for p, _ in warm), sum(c for _, c in warm)
    return {"warm_hit_rate": cached / prompt if prompt else 0.0, "prompt_tokens": prompt, "cached_tokens": cached, "requests": rows, "answers": answers}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base")
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--turns", type=int, default=1 << 30, help="replay at most this many requests of each trace")
    ap.add_argument("--max-tokens", type=int, default=1, help="greedy tokens each request generates")
    ap.add_argument("--only", help="send only these requests (0-based, comma-separated; for a server without a cache)")
    a = ap.parse_args()
    only = None if a.only is None else {int(k) for k in a.only.split(",")}
    out = {}
    for path in a.traces:
        with open(path) as f:
            trace = json.load(f)
        r = replay(a.base.rstrip("/"), trace, a.turns, a.max_tokens, only)
        out[trace["name"]] = r
        print(f"{trace['name']}: warm turns {r['cached_tokens']}/{r['prompt_tokens']} prompt tokens from the cache ({r['warm_hit_rate']:.1%})", flush=True)
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
