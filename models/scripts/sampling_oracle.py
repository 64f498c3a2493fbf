#!/usr/bin/env python3
"""mlx-lm's logits processors and sampler filters on given logits, as JSON.

    python models/scripts/sampling_oracle.py CASES.json OUT.json

Each case: {"logits": [V floats], "history": [ids], "params": {temperature,
top_p, min_p, top_k, repetition_penalty, presence_penalty,
frequency_penalty, logit_bias: {id: bias}}}. For each, writes the logits
after mlx-lm's processors (make_logits_processors, in its order, context 20)
and the distribution its sampler draws from: the processors, then
logits - logsumexp, then make_sampler's filters (top-p, min-p, top-k), at
1/temperature, through a softmax (the same chain generate_step runs).
"""
import json
import sys

import mlx.core as mx
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p, make_logits_processors


def main():
    cases = json.load(open(sys.argv[1]))
    out = []
    for case in cases:
        p = case["params"]
        logits = mx.array([case["logits"]], dtype=mx.float32)
        history = mx.array(case["history"], dtype=mx.int32)
        bias = {int(k): v for k, v in p.get("logit_bias", {}).items()}
        procs = make_logits_processors(
            logit_bias=bias or None,
            repetition_penalty=p.get("repetition_penalty") if p.get("repetition_penalty", 1.0) != 1.0 else None,
            presence_penalty=p.get("presence_penalty") or None,
            frequency_penalty=p.get("frequency_penalty") or None,
        )
        for proc in procs:
            logits = proc(history, logits)
        lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        if 0 < p.get("top_p", 1.0) < 1.0:
            lp = apply_top_p(lp, p["top_p"])
        if p.get("min_p", 0.0) != 0.0:
            lp = apply_min_p(lp, p["min_p"])
        if p.get("top_k", 0) > 0:
            lp = apply_top_k(lp, p["top_k"])
        probs = mx.softmax(lp * (1 / p["temperature"]), axis=-1)
        out.append({"processed": logits[0].tolist(), "probabilities": probs[0].tolist()})
    json.dump(out, open(sys.argv[2], "w"))


if __name__ == "__main__":
    main()
