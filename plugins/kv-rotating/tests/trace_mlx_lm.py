#!/usr/bin/env python3
"""Record what mlx-lm's RotatingKVCache does for scripted update sequences,
as the fixture `mlx_lm_trace.txt` that kv-rotating's unit tests replay.

    LD_LIBRARY_PATH=.mlx/lib .venv/bin/python plugins/kv-rotating/tests/trace_mlx_lm.py \
        > plugins/kv-rotating/tests/mlx_lm_trace.txt

Token t (1-based, in arrival order) has key t and value -t (shape [1, 1, L, 1]),
so a fetched or stored array reads as the token order it holds (0 = unused
slot). Per update: the mask asked BEFORE it (make_mask(L, window_size=window),
as models/llama.py asks for sliding layers), the keys update_and_fetch returns,
the raw storage, offset, _idx and is_trimmable after it.
"""

import mlx.core as mx
import numpy as np
from mlx_lm import __version__
from mlx_lm.models.cache import RotatingKVCache

# name -> (max_size, window, ops); an int op is an update of that many
# tokens, ("trim", n) a trim (only while trimmable, as callers check first).
SEQUENCES = {
    # 5-token prompt as generate_step runs it (4, then 1) and 64 decode steps.
    "short-prompt-decode": (8, 8, [4] + [1] * 65),
    # A prompt longer than the window: one concat step of 39, then decode.
    "long-prefill": (8, 8, [39] + [1] * 12),
    # Multi-token steps after the ring wrapped (temporal order + cut to 7).
    "concat-after-wrap": (8, 8, [3] + [1] * 9 + [3] + [1] * 2 + [20] + [1] * 3 + [5, 2, 1]),
    # Exactly full ring, then a 2-token step; boundaries at 7 and 8.
    "boundaries": (8, 8, [1] * 8 + [2] + [7] + [1] * 2),
    "boundary-7": (8, 8, [7, 1, 1, 2]),
    # Trims before the wrap, then growth again.
    "trims": (8, 8, [3, ("trim", 2), 1, 1, 1, 2, ("trim", 1), 1, ("trim", 3)] + [1] * 10),
    # A ring wider than the window: single-token masks become arrays.
    "wide-ring": (12, 8, [5] + [1] * 20 + [3] + [1] * 4),
}


def ids(a):
    return ",".join(str(int(x)) for x in np.array(a).reshape(-1))


def main():
    print(f"# mlx-lm {__version__} RotatingKVCache(keep=0), from trace_mlx_lm.py")
    for name, (max_size, window, ops) in SEQUENCES.items():
        print(f"seq {name} max_size={max_size} window={window}")
        c = RotatingKVCache(max_size=max_size)
        t = 0
        for op in ops:
            if isinstance(op, tuple):
                assert c.is_trimmable()
                n = c.trim(op[1])
                print(f"trim {op[1]} removed={n} offset={c.offset} idx={c._idx} trimmable={int(c.is_trimmable())}")
                continue
            L = op
            m = c.make_mask(L, window_size=window)
            if m is None:
                mask = "none"
            elif isinstance(m, str):
                mask = m
            else:
                m = np.array(m)
                if m.ndim == 1:
                    m = m[None]
                mask = f"{m.shape[0]}x{m.shape[1]}:" + "".join("1" if b else "0" for b in m.reshape(-1))
            k = mx.arange(t + 1, t + L + 1, dtype=mx.float32).reshape(1, 1, L, 1)
            t += L
            keys, values = c.update_and_fetch(k, -k)
            assert np.array_equal(np.array(values), -np.array(keys))
            print(
                f"update {L} mask={mask} fetched={ids(keys)} storage={ids(c.keys)} "
                f"offset={c.offset} idx={c._idx} trimmable={int(c.is_trimmable())}"
            )


if __name__ == "__main__":
    main()
