"""How far mlx-lm's own last-prompt logits move between two valid ways of
computing them: the whole prompt in one forward (multi-token attention: cuDNN
on a CUDA device) and one token at a time over its cache (the single-query
kernel a decode step uses). Calibrates what a bf16 logit difference between
engines means on a given model.
Usage: oracle_self_spread.py DIR... (prompt ids 1..5, as device_bf16_parity.sh)"""
import sys

import mlx.core as mx
from mlx_lm import load
from mlx_lm.models.cache import make_prompt_cache

for d in sys.argv[1:]:
    model, _ = load(d)
    ids = [1, 2, 3, 4, 5]
    whole = model(mx.array([ids]))[0, -1].astype(mx.float32)
    cache = make_prompt_cache(model)
    for t in ids:
        step = model(mx.array([[t]]), cache=cache)
    step = step[0, -1].astype(mx.float32)
    diff = mx.abs(whole - step)
    worst = mx.max(diff - (0.05 + 0.02 * mx.abs(whole))).item()
    print(f"| {d.rstrip('/').split('/')[-1]} | mlx-lm whole prompt vs token by token | {mx.max(diff).item():.4f} | {'within' if worst <= 0 else 'OUTSIDE'} 0.05 + 0.02|b| |", flush=True)
