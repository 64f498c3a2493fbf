"""Replays recorded agent sessions (tests/fixtures/agent-traces/*.json)
through a running `host serve` and measures how much of each warm turn's
prompt the prefix cache served: on requests 2 and later, the sum of cached
prompt tokens over the sum of prompt tokens, read from each API's usage
fields (chat: prompt_tokens_details.cached_tokens / prompt_tokens;
Messages: cache_read_input_tokens / (input_tokens + cache_read_input_tokens);
Responses: input_tokens_details.cached_tokens / input_tokens).

Request k of a trace is what the harness sent: its per-request noise, then
the stable system prompt, the tools, and the conversation up to its k-th
cut (see make_traces.py). Every request asks for one greedy token: the
figure is about prompts, not answers. Run traces on a fresh server (or one
whose cache has room for them all): each trace's first request is cold.

Usage: agent_replay.py BASE_URL TRACE.json [TRACE.json ...] [--turns N]
Prints one line per request and one per trace, then a last line
`RESULT {json}`: {trace name: {"warm_hit_rate", "prompt_tokens",
"cached_tokens" (both over the warm requests), "requests": [[prompt, cached], ...]}}.
"""
import argparse
import json
import urllib.request


def post(base, path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=1800) as r:
        return json.load(r)


def request(trace, k):
    """(path, body, usage → (prompt tokens, cached tokens)) of request k."""
    noise, system = trace["noise"][k], trace["system"]
    conversation = trace["conversation"][: trace["cuts"][k]]
    if trace["api"] == "messages":
        blocks = ([{"type": "text", "text": noise}] if noise else []) + [{"type": "text", "text": system}]
        body = {"model": "m", "max_tokens": 1, "temperature": 0, "system": blocks, "tools": trace["tools"], "messages": conversation}
        return "/v1/messages", body, lambda u: (u["input_tokens"] + u["cache_read_input_tokens"], u["cache_read_input_tokens"])
    if trace["api"] == "responses":
        body = {"model": "m", "max_output_tokens": 1, "temperature": 0, "instructions": noise + system, "tools": trace["tools"], "input": conversation, "store": False, "include": ["reasoning.encrypted_content"]}
        return "/v1/responses", body, lambda u: (u["input_tokens"], u["input_tokens_details"]["cached_tokens"])
    messages = [{"role": "system", "content": noise + system}] + conversation
    body = {"model": "m", "max_tokens": 1, "temperature": 0, "tools": trace["tools"], "messages": messages}
    return "/v1/chat/completions", body, lambda u: (u["prompt_tokens"], u["prompt_tokens_details"]["cached_tokens"])


def replay(base, trace, turns):
    rows = []
    for k in range(min(turns, len(trace["cuts"]))):
        path, body, read = request(trace, k)
        prompt, cached = read(post(base, path, body)["usage"])
        rows.append((prompt, cached))
        print(f"{trace['name']} request {k + 1}: prompt {prompt}, cached {cached} ({cached / prompt:.1%})", flush=True)
    warm = rows[1:]
    prompt, cached = sum(p for p, _ in warm), sum(c for _, c in warm)
    return {"warm_hit_rate": cached / prompt if prompt else 0.0, "prompt_tokens": prompt, "cached_tokens": cached, "requests": rows}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base")
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--turns", type=int, default=1 << 30, help="replay at most this many requests of each trace")
    a = ap.parse_args()
    out = {}
    for path in a.traces:
        with open(path) as f:
            trace = json.load(f)
        r = replay(a.base.rstrip("/"), trace, a.turns)
        out[trace["name"]] = r
        print(f"{trace['name']}: warm turns {r['cached_tokens']}/{r['prompt_tokens']} prompt tokens from the cache ({r['warm_hit_rate']:.1%})", flush=True)
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
