#!/usr/bin/env python3
"""Record mlx-lm's reference outputs for a model folder as JSON.

    python models/scripts/oracle.py --model DIR --prompt-ids 1,2,3 --max-tokens 64 --out ref.json
    python models/scripts/oracle.py --model DIR --chat "Hello" --out ref.json
    python models/scripts/oracle.py --model DIR --prompt "Once upon" --out ref.json

Greedy decoding goes through mlx_lm.generate.generate_step with mlx-lm's own
greedy sampler (argmax of the log-probabilities), the way `mlx_lm.generate
--temp 0` does it. It does not stop at EOS unless --stop-at-eos is given, so
`tokens` has exactly --max-tokens entries. The raw logits of each step are
captured with a pass-through logits processor (which changes nothing else);
`step_logprobs_top` holds the log-probabilities the sampler actually argmaxed.
With --prompt-logprobs, `prompt_logprobs` scores each prompt token under the
tokens before it, from the same full forward that gives `prompt_last_logits`.

With --kv-bits, generate_step quantizes the K/V as `mlx_lm.generate --kv-bits`
does (`maybe_quantize_kv_cache`: a KVCache becomes a QuantizedKVCache once a
model call leaves it holding --quantized-kv-start tokens). mlx-lm has no
quantized RotatingKVCache (its to_quantized raises), so for sliding-window
layers this script stands one in: the same RotatingKVCache, whose fetched K/V
are quantized with mx.quantize before mlx-lm's own quantized attention reads
them. Quantization groups along the head dimension, so this equals storing
each token's codes in the ring.
"""

import argparse
import json
import time
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten
from mlx_lm import __version__ as mlx_lm_version
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import RotatingKVCache, make_prompt_cache
from mlx_lm.sample_utils import greedy_sampler
from mlx_lm.utils import load, load_model

TOP_K = 5


def top(x, key="logits", k=TOP_K):
    v = np.array(x.astype(mx.float32))
    ids = np.argsort(-v, kind="stable")[:k]  # ties: lowest id first, like argmax
    return {"ids": ids.tolist(), key: v[ids].tolist()}


class QuantizedWindow(RotatingKVCache):
    """A RotatingKVCache that hands out its window as mx.quantize codes; the
    `bits` attribute sends attention through mlx-lm's
    quantized_scaled_dot_product_attention (models/base.py)."""

    def __init__(self, ring, group_size, bits):
        self.__dict__.update(ring.__dict__)
        self.group_size = group_size
        self.bits = bits

    def update_and_fetch(self, keys, values):
        k, v = super().update_and_fetch(keys, values)
        q = lambda x: mx.quantize(x, group_size=self.group_size, bits=self.bits)
        return q(k), q(v)

    def to_quantized(self, group_size=64, bits=4):
        return self


RotatingKVCache.to_quantized = lambda self, group_size=64, bits=4: QuantizedWindow(
    self, group_size, bits
)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, type=Path)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt-ids", help="comma-separated token ids")
    src.add_argument("--prompt", help="raw text, tokenized as mlx_lm.stream_generate does")
    src.add_argument("--chat", help="user message, through the chat template")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--stop-at-eos", action="store_true")
    ap.add_argument("--logits-only", action="store_true", help="skip generation")
    ap.add_argument("--prompt-logprobs", action="store_true", help="score every prompt token (prompt_logprobs)")
    ap.add_argument("--kv-bits", type=int, help="quantize the K/V (mlx-lm kv_bits)")
    ap.add_argument("--kv-group-size", type=int, default=64)
    ap.add_argument("--quantized-kv-start", type=int, default=0)
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()

    has_tokenizer = any(
        (args.model / f).exists()
        for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
    )
    if has_tokenizer:
        model, tokenizer, config = load(str(args.model), return_config=True)
    else:
        model, config = load_model(args.model)
        tokenizer = None

    if args.prompt_ids is not None:
        ids = [int(t) for t in args.prompt_ids.split(",") if t.strip()]
    elif tokenizer is None:
        ap.error("--prompt/--chat need a tokenizer in the model folder")
    elif args.chat is not None:
        # As the mlx_lm.generate CLI: render the template, then encode without
        # special tokens (the template already has them).
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": args.chat}],
            tokenize=False,
            add_generation_prompt=True,
        )
        ids = tokenizer.encode(text, add_special_tokens=False)
    else:
        # As mlx_lm.stream_generate does for a str prompt.
        bos = tokenizer.bos_token
        add_special = bos is None or not args.prompt.startswith(bos)
        ids = tokenizer.encode(args.prompt, add_special_tokens=add_special)

    dtypes = sorted(
        {
            str(v.dtype).split(".")[-1]
            for _, v in tree_flatten(model.parameters())
            if mx.issubdtype(v.dtype, mx.floating)
        }
    )
    result = {
        "model": str(args.model),
        "model_type": config["model_type"],
        "dtype": dtypes[0] if len(dtypes) == 1 else dtypes,
        "quantization": config.get("quantization"),
        "mlx_version": mx.__version__,
        "mlx_lm_version": mlx_lm_version,
        # Which libmlx.so this process mapped: the tests run the oracle on
        # the engine's own runtime (LD_LIBRARY_PATH=.mlx/lib).
        "libmlx": sorted({l.split()[-1] for l in open("/proc/self/maps") if l.rstrip().endswith("/libmlx.so")}),
        "prompt_ids": ids,
    }

    # One full forward over the prompt with a fresh cache.
    all_logits = model(mx.array([ids]), cache=make_prompt_cache(model))[0]
    logits = all_logits[-1]
    result["prompt_last_logits"] = np.array(logits.astype(mx.float32)).tolist()
    # --prompt-logprobs: each prompt token's log-probability under the tokens before it (row i
    # scores token i + 1; the first token has none), logits - logsumexp in
    # the model dtype as mlx-lm's sampler computes them, with the top 5.
    if args.prompt_logprobs:
        lp = all_logits - mx.logsumexp(all_logits, axis=-1, keepdims=True)
        rows = np.array(lp.astype(mx.float32))
        result["prompt_logprobs"] = [None] + [
            {"id": t, "logprob": float(rows[i, t]), **top(lp[i], "logprobs")}
            for i, t in enumerate(ids[1:])
        ]

    if not args.logits_only:
        if args.stop_at_eos:
            if tokenizer is not None:
                eos = set(tokenizer.eos_token_ids)
            else:
                e = config.get("eos_token_id")
                eos = set(e if isinstance(e, list) else [] if e is None else [e])
        else:
            eos = set()

        captured = []

        def capture(_tokens, step_logits):
            captured.append(step_logits[0])
            return step_logits

        tokens, logprobs = [], []
        finish = "length"
        tic = time.perf_counter()
        for n, (tok, lp) in enumerate(
            generate_step(
                mx.array(ids),
                model,
                max_tokens=args.max_tokens,
                sampler=greedy_sampler,
                logits_processors=[capture],
                kv_bits=args.kv_bits,
                kv_group_size=args.kv_group_size,
                quantized_kv_start=args.quantized_kv_start,
            )
        ):
            if n == 0:  # timing as mlx_lm.stream_generate measures it
                prompt_time = time.perf_counter() - tic
                tic = time.perf_counter()
            tokens.append(tok)
            logprobs.append(lp)
            if tok in eos:
                finish = "stop"
                break
        decode_time = time.perf_counter() - tic

        result["tokens"] = tokens
        result["finish_reason"] = finish
        result["step_logits_top"] = [top(l) for l in captured[: len(tokens)]]
        # What the sampler actually argmaxes: logits - logsumexp, in the model
        # dtype (in bf16 this rounding can tie, and argmax takes the lowest id).
        result["step_logprobs_top"] = [top(l, "logprobs") for l in logprobs]
        if tokenizer is not None:
            detok = tokenizer.detokenizer
            detok.reset()
            for t in tokens[:-1] if finish == "stop" else tokens:
                detok.add_token(t)
            detok.finalize()
            result["text"] = detok.text
        result["prefill_tokens_per_s"] = len(ids) / prompt_time
        result["decode_tokens_per_s"] = len(tokens) / decode_time

    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f)
    print(
        f"{args.model}: {len(ids)} prompt ids, "
        f"{len(result.get('tokens', []))} tokens -> {args.out}"
    )


if __name__ == "__main__":
    main()
