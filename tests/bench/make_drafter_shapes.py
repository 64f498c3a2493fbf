"""Random-weight targets and drafters at the Qwen3-8B scale, to time
speculative rounds (tests/bench/gpu/device_drafters.sh).

    make_drafter_shapes.py --out DIR [--tokenizer-from DIR]

Writes under DIR:
  qwen3-8b/              Qwen3-8B's shape (mlx-lm's qwen3 classes, bf16);
  qwen3-8b/dflash-rand   a DFlash drafter for it (5 layers, block 16, taps
                         1, 9, 17, 25, 33 as DFlash's default formula);
  qwen3-8b/dflash-agree  the same shapes, built to draft repeats;
  qwen3-8b/dspark-agree  a DSpark drafter (Markov rank 256), drafting repeats;
  qwen3-8b/deepspec-agree a DeepSpec drafter (`Gemma4DSparkModel`: 5 Gemma 4
                         layers, k_eq_v at global head dim 512 over one KV
                         head, its own embedding and LM head, block_size 7:
                         verify width 8, no sliding window so the width is
                         not capped), drafting repeats;
  qwen3_5-8b/            a Qwen3.5 hybrid of the same width (32 layers, every
                         4th full attention), bf16;
  qwen3_5-8b/mtp-rand    an MTP head for it (a `qwen3_5_mtp` folder);
  qwen3_5-8b/mtp-agree   the same, built to draft repeats.

Both targets repeat their input token (the embeddings are scaled so the
residual stream carries them, and the output head is the embedding matrix),
so the `-agree` drafters are accepted in full: that measures the speedup
at full acceptance; the `-rand` drafters are rejected: that measures what a
round costs. Weights do not change the cost of a forward.
"""

import argparse
import json
import shutil
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_map

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "models" / "scripts"))
import make_tiny  # noqa: E402
from mlx_lm.models import qwen3  # noqa: E402
from mlx_lm.utils import save_config, save_model  # noqa: E402

H, VOCAB, MASK = 4096, 49152, 49151
BF16 = mx.bfloat16
QWEN3_8B = dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], vocab_size=VOCAB, rms_norm_eps=1e-6,
                rope_theta=1000000.0, max_position_embeddings=40960, tie_word_embeddings=False, hidden_size=H,
                num_hidden_layers=36, intermediate_size=12288, num_attention_heads=32, num_key_value_heads=8,
                head_dim=128, eos_token_id=2, bos_token_id=1)
QWEN3_5 = dict(hidden_size=H, intermediate_size=12288, num_hidden_layers=32, full_attention_interval=4,
               num_attention_heads=16, num_key_value_heads=4, head_dim=256, linear_num_key_heads=16,
               linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128, vocab_size=VOCAB,
               tie_word_embeddings=False)
TAPS = [1, 9, 17, 25, 33]
DRAFT = dict(heads=32, kv=8, hd=128, inter=12288, layers=5)


def shrink():
    """A small version of everything, to check this script on a CPU."""
    global H, TAPS
    H, TAPS = 256, [1, 3]
    QWEN3_8B.update(hidden_size=H, num_hidden_layers=4, intermediate_size=512, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=64)
    QWEN3_5.update(hidden_size=H, num_hidden_layers=4, intermediate_size=512, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4,
                   linear_key_head_dim=64, linear_value_head_dim=64)
    DRAFT.update(heads=4, kv=2, hd=64, inter=512, layers=2)


def repeating(model, embed, head_name):
    """Scales the embeddings so the residual stream carries the input token
    and makes the head the (unscaled) embedding matrix; the mask token's
    embedding is zero (block drafters' mask slots then carry nothing)."""
    w = embed.weight.astype(mx.float32)
    w = w / mx.sqrt(mx.mean(w * w))
    w = mx.concatenate([w[:MASK], mx.zeros((1, w.shape[1]))], axis=0)
    embed.weight = (1000.0 * w).astype(BF16)
    return {head_name: w.astype(BF16)}


def save(folder, model_or_tensors, config, tok):
    folder.mkdir(parents=True, exist_ok=True)
    if isinstance(model_or_tensors, nn.Module):
        save_model(folder, model_or_tensors)
        save_config(config, folder / "config.json")
    else:
        mx.save_safetensors(str(folder / "model.safetensors"), model_or_tensors)
        with open(folder / "config.json", "w") as f:
            json.dump(config, f, indent=2)
    if tok:
        for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
            if (tok / f).exists():
                shutil.copy(tok / f, folder / f)


def qwen3_target(out, tok):
    """Saves the target; returns its embedding and head (for DeepSpec's own)."""
    mx.random.seed(0)
    model = qwen3.Model(qwen3.ModelArgs.from_dict(QWEN3_8B))
    model.update(tree_map(lambda p: p.astype(BF16), model.parameters()))
    head = repeating(model, model.model.embed_tokens, "w")["w"]
    model.lm_head.weight = head
    mx.eval(model.parameters())
    save(out, model, dict(QWEN3_8B, torch_dtype="bfloat16"), tok)
    return model.model.embed_tokens.weight, head


def qwen3_5_target(out, tok):
    make_tiny.VARIANTS["qwen3_5-8b"] = {**make_tiny.VARIANTS["qwen3_5"], **QWEN3_5}
    model, config = make_tiny.build("qwen3_5-8b", "bf16")
    lm = model.language_model
    head = repeating(model, lm.model.embed_tokens, "w")["w"]
    lm.lm_head.weight = head
    mx.eval(model.parameters())
    save(out, model, config, tok)
    return config


def normal(shape, scale=0.02):
    return (scale * mx.random.normal(shape)).astype(BF16)


def ones(n):
    return mx.ones((n,), dtype=BF16)


def eye_rows(rows, cols):
    return mx.eye(cols, dtype=BF16)[:rows]


def gqa_back(heads, kv_heads, hd):
    """o_proj that puts each query head's value back where its KV head's
    v_proj (the first kv_heads·hd dims) took it from."""
    o = mx.zeros((H, heads * hd))
    for qh in range(heads):
        kv = qh // (heads // kv_heads)
        o[kv * hd + mx.arange(hd), qh * hd + mx.arange(hd)] = 1.0
    return o.astype(BF16)


def layer(t, p, d, agree, v=None, o=None):
    """One decoder layer's tensors into `t`: random, except `v` / `o` when
    given, and a zero MLP output when `agree` (the layer then adds only what
    its attention carries)."""
    heads, kv, hd, inter = d["heads"], d["kv"], d["hd"], d["inter"]
    t[f"{p}.self_attn.q_proj.weight"] = normal((d["q_rows"], H))
    t[f"{p}.self_attn.k_proj.weight"] = normal((kv * hd, H))
    t[f"{p}.self_attn.v_proj.weight"] = normal((kv * hd, H)) if v is None else v
    t[f"{p}.self_attn.o_proj.weight"] = normal((H, heads * hd)) if o is None else o
    t[f"{p}.self_attn.q_norm.weight"] = ones(hd)
    t[f"{p}.self_attn.k_norm.weight"] = ones(hd)
    t[f"{p}.mlp.gate_proj.weight"] = normal((inter, H))
    t[f"{p}.mlp.up_proj.weight"] = normal((inter, H))
    t[f"{p}.mlp.down_proj.weight"] = mx.zeros((H, inter), dtype=BF16) if agree else normal((H, inter))
    t[f"{p}.input_layernorm.weight"] = ones(H)
    t[f"{p}.post_attention_layernorm.weight"] = ones(H)


def block_drafter(out, agree, markov, tok):
    mx.random.seed(1 + 2 * agree + markov)
    heads, kv, hd, inter, layers = (DRAFT[k] for k in ("heads", "kv", "hd", "inter", "layers"))
    t = {"fc.weight": mx.zeros((H, len(TAPS) * H), dtype=BF16) if agree else normal((H, len(TAPS) * H)),
         "hidden_norm.weight": ones(H), "norm.weight": ones(H)}
    for i in range(layers):
        layer(t, f"layers.{i}", dict(heads=heads, kv=kv, hd=hd, inter=inter, q_rows=heads * hd), agree,
              v=eye_rows(kv * hd, H) if agree else None, o=gqa_back(heads, kv, hd) if agree else None)
    dflash = {"mask_token_id": MASK, "target_layer_ids": TAPS, "num_target_layers": QWEN3_8B["num_hidden_layers"]}
    cfg = dict(model_type="qwen3", hidden_size=H, intermediate_size=inter, num_hidden_layers=layers,
               num_attention_heads=heads, num_key_value_heads=kv, head_dim=hd, rms_norm_eps=1e-6,
               vocab_size=VOCAB, rope_theta=1000000.0, max_position_embeddings=40960, block_size=16)
    if markov:
        rank = 256
        t["markov_head.markov_w1.weight"] = normal((VOCAB, rank))
        t["markov_head.markov_w2.weight"] = mx.zeros((VOCAB, rank), dtype=BF16) if agree else normal((VOCAB, rank))
        dflash.update(projector_type="dspark", block_size=15, markov_rank=rank, block_size_policy="fixed",
                      runtime_block_size=16)
        cfg.pop("block_size")
    cfg["dflash_config"] = dflash
    save(out, t, cfg, tok)


def deepspec_drafter(out, target_embed, head, tok):
    """Drafts repeats: each layer's values are the first 512 dims of its
    input (k_eq_v: the key projection), put back by o_proj, so the mask
    slots carry the anchor's embedding; the MLP's output norm is zero."""
    mx.random.seed(9)
    heads, hd, inter, layers = 16, 512, DRAFT["inter"], DRAFT["layers"]
    if H < hd:
        hd = H // 2
    t = {"fc.weight": mx.zeros((H, len(TAPS) * H), dtype=BF16), "hidden_norm.weight": ones(H),
         "norm.weight": ones(H), "embed_tokens.weight": target_embed, "lm_head.weight": head,
         "markov_head.markov_w1.weight": normal((VOCAB, 256)),
         "markov_head.markov_w2.weight": mx.zeros((VOCAB, 256), dtype=BF16)}
    for i in range(layers):
        p = f"layers.{i}"
        t[f"{p}.self_attn.q_proj.weight"] = normal((heads * hd, H))
        t[f"{p}.self_attn.k_proj.weight"] = eye_rows(hd, H)
        t[f"{p}.self_attn.o_proj.weight"] = gqa_back(heads, 1, hd)
        t[f"{p}.self_attn.q_norm.weight"] = ones(hd)
        t[f"{p}.self_attn.k_norm.weight"] = ones(hd)
        t[f"{p}.mlp.gate_proj.weight"] = normal((inter, H))
        t[f"{p}.mlp.up_proj.weight"] = normal((inter, H))
        t[f"{p}.mlp.down_proj.weight"] = normal((H, inter))
        for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm"):
            t[f"{p}.{n}.weight"] = ones(H)
        t[f"{p}.post_feedforward_layernorm.weight"] = mx.zeros((H,), dtype=BF16)
        t[f"{p}.layer_scalar"] = ones(1)
    cfg = dict(architectures=["Gemma4DSparkModel"], model_type="gemma4_text", hidden_size=H,
               intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=8,
               head_dim=256, global_head_dim=hd, num_global_key_value_heads=1, attention_k_eq_v=True,
               rms_norm_eps=1e-6, vocab_size=VOCAB, final_logit_softcapping=30.0, tie_word_embeddings=False,
               sliding_window=None, layer_types=["full_attention"] * layers,
               rope_parameters={"full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                   "rope_theta": 1000000.0}},
               block_size=7, mask_token_id=MASK, target_layer_ids=TAPS,
               num_target_layers=QWEN3_8B["num_hidden_layers"], markov_rank=256)
    save(out, t, cfg, tok)


def mtp_head(out, target_config, agree, tok):
    mx.random.seed(5 + agree)
    c = {**target_config.get("text_config", target_config)}
    heads, kv, hd, inter = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], c["intermediate_size"]
    fc = mx.concatenate([mx.eye(H), mx.zeros((H, H))], axis=1).astype(BF16) if agree else normal((H, 2 * H))
    t = {"fc.weight": fc, "pre_fc_norm_embedding.weight": ones(H), "pre_fc_norm_hidden.weight": ones(H),
         "norm.weight": ones(H)}
    # The queries and their gate side by side (Qwen3.5's gated attention).
    layer(t, "layers.0", dict(heads=heads, kv=kv, hd=hd, inter=inter, q_rows=2 * heads * hd), agree,
          o=mx.zeros((H, heads * hd), dtype=BF16) if agree else None)
    cfg = {"model_type": "qwen3_5_mtp", "text_config": dict(c, mtp_num_hidden_layers=1)}
    save(out, t, cfg, tok)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--tokenizer-from", type=Path)
    ap.add_argument("--only", default="qwen3,qwen3_5")
    ap.add_argument("--small", action="store_true", help="tiny shapes (to check the script)")
    a = ap.parse_args()
    if a.small:
        shrink()
    tok = a.tokenizer_from
    if "qwen3" in a.only.split(","):
        t = a.out / "qwen3-8b"
        embed, head = qwen3_target(t, tok)
        block_drafter(t / "dflash-rand", agree=False, markov=False, tok=tok)
        block_drafter(t / "dflash-agree", agree=True, markov=False, tok=tok)
        block_drafter(t / "dspark-agree", agree=True, markov=True, tok=tok)
        # Its embedding is scaled by sqrt(H) on the way in: the target's / sqrt(H).
        deepspec_drafter(t / "deepspec-agree", (embed.astype(mx.float32) / H**0.5).astype(BF16), head, tok)
    if "qwen3_5" in a.only.split(","):
        t = a.out / "qwen3_5-8b"
        config = qwen3_5_target(t, tok)
        mtp_head(t / "mtp-rand", config, agree=False, tok=tok)
        mtp_head(t / "mtp-agree", config, agree=True, tok=tok)
    print("made", a.out)


if __name__ == "__main__":
    main()
