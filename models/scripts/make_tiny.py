#!/usr/bin/env python3
"""Make tiny random-weight Hugging Face model folders with mlx-lm's own model
classes, one per model type (and variant) that the dense-decoder family plugin
claims, in f32, bf16 and 4-bit (plus one 8-bit group-32) flavours.

    python models/scripts/make_tiny.py --out models/tiny \
        [--tokenizer-from models/smollm2-135m-instruct] [--types llama,qwen3] [--force]

Each folder gets config.json + model.safetensors (+ model.safetensors.index.json),
written with mlx_lm.utils.save_model / save_config exactly as `mlx_lm.convert`
writes them. Weights are seeded, so the folders are reproducible. With
--tokenizer-from the tokenizer files are copied in (also into folders that
already exist, whose weights are then left alone).
"""

import argparse
import contextlib
import copy
import io
import shutil
import sys
import time
import zlib
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import _get_classes, load, load_model, quantize_model, save_config, save_model

TOKENIZER_FILES = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
]

# Fields shared by every tiny config (HF names; ids match the SmolLM2 tokenizer:
# <|im_start|> = 1, <|im_end|> = 2).
COMMON = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
    "vocab_size": 49152,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "use_cache": True,
    "transformers_version": "4.51.0",
}

LLAMA = {
    "head_dim": 16,
    "rms_norm_eps": 1e-5,
    "attention_bias": False,
    "mlp_bias": False,
    "pretraining_tp": 1,
    "rope_theta": 10000.0,
    "rope_scaling": None,
}

# name -> config (model_type, architectures and the type-specific fields).
VARIANTS = {
    # Llama, untied lm_head, plain RoPE.
    "llama": {
        **LLAMA,
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": 2,
        "tie_word_embeddings": False,
    },
    # Llama 3.x: tied embeddings, llama3 rope_scaling (with head_dim 16 and
    # theta 5e5 the 8 frequencies fall in all three bands: kept, smoothed, /8).
    "llama3": {
        **LLAMA,
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": 2,
        "tie_word_embeddings": True,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
    },
    # Llama with sliding-window layers (mlx-lm gives them a RotatingKVCache
    # of max_size = sliding_window): a window of 8 is wrapped many times by a
    # 5-token prompt + 64 generated tokens, and a prompt longer than 8 goes
    # past the window within one prefill (the multi-token concat path).
    "llama-swa": {
        **LLAMA,
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": 3,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
        "sliding_window": 8,
        "tie_word_embeddings": False,
    },
    # Mistral (mlx-lm maps it onto models/llama.py), untied.
    "mistral": {
        "model_type": "mistral",
        "architectures": ["MistralForCausalLM"],
        "num_hidden_layers": 2,
        "head_dim": 16,
        "rms_norm_eps": 1e-5,
        "rope_theta": 1000000.0,
        "sliding_window": None,
        "tie_word_embeddings": False,
    },
    # Qwen2: q/k/v bias, head_dim implied (hidden / heads), untied.
    "qwen2": {
        "model_type": "qwen2",
        "architectures": ["Qwen2ForCausalLM"],
        "num_hidden_layers": 3,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "use_sliding_window": False,
        "sliding_window": 4096,
        "max_window_layers": 3,
        "tie_word_embeddings": False,
    },
    # Qwen3: q/k RMSNorm over head_dim, tied.
    "qwen3": {
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
        "num_hidden_layers": 3,
        "head_dim": 16,
        "rms_norm_eps": 1e-6,
        "attention_bias": False,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": 3,
        "tie_word_embeddings": True,
    },
    # SmolLM3: llama + NoPE layers. no_rope_layers[i] == 1 means layer i USES
    # rope. The explicit list [1, 0, 1] differs from what the interval (4)
    # would give for 3 layers ([1, 1, 1]), so a reader must honour the list.
    "smollm3": {
        **LLAMA,
        "model_type": "smollm3",
        "architectures": ["SmolLM3ForCausalLM"],
        "num_hidden_layers": 3,
        "rope_theta": 5000000.0,
        "no_rope_layer_interval": 4,
        "no_rope_layers": [1, 0, 1],
        "use_sliding_window": False,
        "sliding_window": None,
        "tie_word_embeddings": True,
    },
    # Gemma 3 text (mlx-lm models/gemma3_text.py): (1 + w) RMSNorms (4 per
    # block + q/k norms), embeddings scaled by sqrt(hidden), gelu_approx MLP,
    # query_pre_attn_scalar (32, not head_dim) as the attention scale, and
    # every 3rd layer global (rope_theta + linear rope_scaling) while the
    # others slide over a window of 8 with the local base. mlx-lm decides
    # tying from the checkpoint (no lm_head.weight = tied), see build().
    "gemma3": {
        "model_type": "gemma3_text",
        "architectures": ["Gemma3ForCausalLM"],
        "num_hidden_layers": 6,
        "head_dim": 16,
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_activation": "gelu_pytorch_tanh",
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "query_pre_attn_scalar": 32,
        "sliding_window": 8,
        "sliding_window_pattern": 3,
        "layer_types": [
            "sliding_attention",
            "sliding_attention",
            "full_attention",
            "sliding_attention",
            "sliding_attention",
            "full_attention",
        ],
        "final_logit_softcapping": None,
        "attn_logit_softcapping": None,
        "tie_word_embeddings": True,
    },
    # Gemma 4 text (mlx-lm models/gemma4_text.py), every dense feature at
    # once: layers S S F S S F (window 8); global layers with their own head
    # dim (32 vs 16), K = V (attention_k_eq_v) over 1 KV head (2 on sliding
    # layers) and proportional RoPE on a quarter of the dims; q/k norms and a
    # scale-free v norm; the last 2 layers share the K/V of layers 3 (S) and
    # 2 (F) and have double-wide MLPs; per-layer input embeddings (32 per
    # layer, so the 192-wide table is 4-bit quantized in q4); logits soft-
    # capped at 30; tied. build() gives layer_scalar a spread around 1.
    "gemma4": {
        "model_type": "gemma4_text",
        "architectures": ["Gemma4ForCausalLM"],
        "num_hidden_layers": 6,
        "head_dim": 16,
        "global_head_dim": 32,
        "num_global_key_value_heads": 1,
        "attention_k_eq_v": True,
        "hidden_activation": "gelu_pytorch_tanh",
        "rms_norm_eps": 1e-6,
        "sliding_window": 8,
        "sliding_window_pattern": 3,
        "layer_types": [
            "sliding_attention",
            "sliding_attention",
            "full_attention",
            "sliding_attention",
            "sliding_attention",
            "full_attention",
        ],
        "rope_parameters": {
            "full_attention": {
                "partial_rotary_factor": 0.25,
                "rope_theta": 1000000.0,
                "rope_type": "proportional",
            },
            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
        },
        "num_kv_shared_layers": 2,
        "use_double_wide_mlp": True,
        "hidden_size_per_layer_input": 32,
        "vocab_size_per_layer_input": 49152,
        "final_logit_softcapping": 30.0,
        "enable_moe_block": False,
        "tie_word_embeddings": True,
    },
    # Gemma 4 with the MoE block (as the 26B-A4B): beside each dense MLP a
    # router (top-2 of 4 experts, 8-bit in q4 by the quant_predicate) and
    # gelu_approx GLU experts of width 64 (all quantized in q4). No KV
    # sharing, no per-layer inputs; rope_parameters left to mlx-lm's
    # defaults (proportional RoPE on the global layer); untied lm_head.
    "gemma4-moe": {
        "model_type": "gemma4_text",
        "architectures": ["Gemma4ForCausalLM"],
        "num_hidden_layers": 3,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
        "head_dim": 16,
        "global_head_dim": 32,
        "num_global_key_value_heads": 1,
        "attention_k_eq_v": True,
        "hidden_activation": "gelu_pytorch_tanh",
        "rms_norm_eps": 1e-6,
        "sliding_window": 8,
        "sliding_window_pattern": 3,
        "num_kv_shared_layers": 0,
        "hidden_size_per_layer_input": 0,
        "final_logit_softcapping": 30.0,
        "enable_moe_block": True,
        "num_experts": 4,
        "top_k_experts": 2,
        "moe_intermediate_size": 64,
        "tie_word_embeddings": False,
    },
    # Qwen3-MoE (mlx-lm models/qwen3_moe.py): qwen3 attention; layers 0 and
    # 2 route each token to 2 of 8 SwiGLU experts (softmax router,
    # renormalised top-2), layer 1 is dense (mlp_only_layers). Expert width
    # 64 so that q4 quantizes every expert projection (group 64; the router
    # gets 8 bits through the model's quant_predicate). Untied.
    "qwen3_moe": {
        "model_type": "qwen3_moe",
        "architectures": ["Qwen3MoeForCausalLM"],
        "num_hidden_layers": 3,
        "head_dim": 16,
        "rms_norm_eps": 1e-6,
        "attention_bias": False,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 64,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [1],
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": 3,
        "tie_word_embeddings": False,
    },
    # Qwen3.5 (mlx-lm models/qwen3_5.py), the hybrid: layers 0 and 2 are
    # gated DeltaNet (2 key heads of 16 repeated to 4 value heads of 16, a
    # 4-tap conv; recurrent state), layers 1 and 3 gated full attention
    # (full_attention_interval 2; q/k norms, RoPE on a quarter of head_dim
    # 16). build() draws A_log / dt_bias as mlx-lm initialises them and keeps
    # A_log in float32 (the model's cast_predicate). Tied.
    "qwen3_5": {
        "model_type": "qwen3_5",
        "architectures": ["Qwen3_5ForCausalLM"],
        "num_hidden_layers": 4,
        "full_attention_interval": 2,
        "head_dim": 16,
        "rms_norm_eps": 1e-6,
        "attention_bias": False,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000000,
            "partial_rotary_factor": 0.25,
            "mrope_section": [11, 11, 10],
            "mrope_interleaved": True,
        },
        "tie_word_embeddings": True,
    },
    # Qwen3.5-MoE (mlx-lm models/qwen3_5_moe.py): the same hybrid, every MLP
    # sparse: 2 of 8 SwiGLU experts of width 64 (softmax router, renormalised
    # top-2) plus a shared expert behind a sigmoid gate; q4 gives the router
    # and the shared gate 8 bits (the model's quant_predicate). Untied.
    "qwen3_5_moe": {
        "model_type": "qwen3_5_moe",
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "num_hidden_layers": 4,
        "full_attention_interval": 2,
        "head_dim": 16,
        "rms_norm_eps": 1e-6,
        "attention_bias": False,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25},
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 64,
        "shared_expert_intermediate_size": 64,
        "norm_topk_prob": True,
        "tie_word_embeddings": False,
    },
}

# Quantized K/V (`--kv-quant`, mlx-lm's kv_bits) groups a head's row in
# groups of 64 by default, so head_dim 16 cannot be quantized: these variants
# give every attention layer head_dim 64 (one group per head row), f32 and
# bf16 only.
KV_VARIANTS = {
    f"{base}-hd64": {**copy.deepcopy(VARIANTS[base]), "head_dim": 64, **extra}
    for base, extra in [
        ("llama", {}),
        ("qwen3", {}),
        ("gemma3", {"query_pre_attn_scalar": 64}),
        ("qwen3_5", {}),
    ]
}
VARIANTS.update(KV_VARIANTS)

# flavour -> (torch_dtype written in config.json, quantization or None).
# Quantized folders are made as `mlx_lm.convert -q` makes them from a bf16
# checkpoint: cast to torch_dtype first, then quantize (scales/biases in bf16).
FLAVOURS = {
    "f32": ("float32", None),
    "bf16": ("bfloat16", None),
    "q4": ("bfloat16", (64, 4)),
    "q8g32": ("bfloat16", (32, 8)),
}
EXTRA_FLAVOURS = {"llama": ["q8g32"]}
ONLY_FLAVOURS = {name: ["f32", "bf16"] for name in KV_VARIANTS}


def seed_of(name):
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


def random_params(model, seed):
    """Fresh f32 values for every parameter: linears/embeddings/biases normal,
    norm weights 1 + small noise. Deterministic given the seed. The linears are
    deliberately "hot" (std 0.2 on width 64): at std ~0.08 the tied models
    greedily repeat one token (the current token's own embedding wins)."""
    mx.random.seed(seed)
    out = []
    for name, p in tree_flatten(model.parameters()):
        if "norm" in name:  # input_layernorm, post_attention_layernorm, q_norm, k_norm, norm
            v = 1.0 + 0.05 * mx.random.normal(p.shape)
        elif name.endswith("bias"):
            v = 0.1 * mx.random.normal(p.shape)
        elif "embed_tokens" in name or "lm_head" in name:
            v = 0.1 * mx.random.normal(p.shape)
        else:
            v = 0.2 * mx.random.normal(p.shape)
        out.append((name, v.astype(mx.float32)))
    model.update(tree_unflatten(out))
    mx.eval(model.parameters())
    return model


def build(name, flavour):
    config = {**COMMON, **copy.deepcopy(VARIANTS[name])}
    dtype_name, quant = FLAVOURS[flavour]
    config["torch_dtype"] = dtype_name
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    if config["model_type"] == "gemma3_text" and config.get("tie_word_embeddings"):
        # gemma3_text always builds an lm_head and ties only in sanitize()
        # when the checkpoint has none: drop it as loading a tied one does.
        model.sanitize({})
    random_params(model, seed_of(name))
    if config["model_type"] == "gemma4_text":
        # layer_scalar multiplies the whole residual stream (a std-0.2 draw
        # around 0 would shrink it layer after layer), and the router's
        # scales are multipliers too: keep them near 1.
        scalars = [
            (k, 1.0 + 0.25 * mx.random.normal(v.shape))
            for k, v in tree_flatten(model.parameters())
            if k.endswith(("layer_scalar", "router.scale", "per_expert_scale"))
        ]
        model.update(tree_unflatten(scalars))
    if config["model_type"] in ("qwen3_5", "qwen3_5_moe"):
        # Gated DeltaNet as mlx-lm initialises it (dt_bias = 1, A = exp(A_log)
        # > 0), but A log-uniform over [0.01, 16] rather than uniform over
        # [0, 16], so some heads decay slowly and the state carries far.
        mx.random.seed(seed_of(name) + 1)
        gdn = []
        for k, v in tree_flatten(model.parameters()):
            if k.endswith("A_log"):
                gdn.append((k, mx.random.uniform(-4.6, 2.77, v.shape)))
            elif k.endswith("dt_bias"):
                gdn.append((k, 1.0 + 0.1 * mx.random.normal(v.shape)))
        model.update(tree_unflatten(gdn))
    # As mlx_lm.convert: cast floating parameters to torch_dtype, except
    # those the model's cast_predicate keeps (qwen3_5's A_log).
    dtype = getattr(mx, dtype_name)
    cast = getattr(model, "cast_predicate", lambda _: True)
    model.update(
        tree_unflatten(
            [(k, v.astype(dtype) if cast(k) else v) for k, v in tree_flatten(model.parameters())]
        )
    )
    if quant is not None:
        group_size, bits = quant
        with contextlib.redirect_stdout(io.StringIO()):  # quiet the bpw line
            model, config = quantize_model(model, config, group_size, bits)
    mx.eval(model.parameters())
    return model, config


def greedy(model, ids, n):
    return [t for t, _ in generate_step(mx.array(ids), model, max_tokens=n)]


def folder_size(path):
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--tokenizer-from", type=Path)
    ap.add_argument("--types", help="comma list of " + ",".join(VARIANTS))
    ap.add_argument("--force", action="store_true", help="rewrite existing folders")
    ap.add_argument("--no-check", action="store_true", help="skip the load + generate check")
    args = ap.parse_args()

    names = args.types.split(",") if args.types else list(VARIANTS)
    for n in names:
        if n not in VARIANTS:
            sys.exit(f"unknown type {n!r}; known: {','.join(VARIANTS)}")
    args.out.mkdir(parents=True, exist_ok=True)

    for name in names:
        flavours = ONLY_FLAVOURS.get(name, ["f32", "bf16", "q4"] + EXTRA_FLAVOURS.get(name, []))
        for flavour in flavours:
            path = args.out / f"tiny-{name}-{flavour}"
            t0 = time.perf_counter()
            exists = (path / "config.json").exists() and (path / "model.safetensors").exists()
            if exists and not args.force:
                status = "kept"
            else:
                if path.exists():
                    shutil.rmtree(path)
                model, config = build(name, flavour)
                save_model(path, model)
                save_config(config, path / "config.json")
                status = "made"
            if args.tokenizer_from:
                for f in TOKENIZER_FILES:
                    if (args.tokenizer_from / f).exists():
                        shutil.copy(args.tokenizer_from / f, path / f)
            check = ""
            if status == "made" and not args.no_check:
                if (path / "tokenizer.json").exists():
                    model, _ = load(str(path))
                else:  # what mlx_lm.load does, minus the tokenizer
                    model, _ = load_model(path)
                try:
                    toks = greedy(model, [1, 2, 3, 4, 5], 64)
                except RuntimeError as e:
                    # MLX's CPU gather_mm (dense MoE experts) is float32-only:
                    # mlx-lm cannot run a bf16 MoE natively on the CPU, so
                    # check that folder's weights in float32.
                    if "GatherMM" not in str(e):
                        raise
                    model.set_dtype(mx.float32)
                    toks = greedy(model, [1, 2, 3, 4, 5], 64)
                    check += " (run in f32: CPU gather_mm is f32-only)"
                if len(toks) != 64:
                    sys.exit(f"{path}: generated {len(toks)} tokens")
                if len(set(toks)) < 4:
                    sys.exit(f"{path}: degenerate greedy output {toks}")
                check = f" distinct={len(set(toks))}/64" + check
                if "layer_types" in VARIANTS[name]:
                    # Sliding layers must get mlx-lm's RotatingKVCache.
                    kinds = [type(c).__name__ for c in make_prompt_cache(model)]
                    check += f" caches={','.join(kinds)}"
            print(
                f"{status} {path} {folder_size(path) / 2**20:.1f}MiB"
                f"{check} {time.perf_counter() - t0:.1f}s",
                flush=True,
            )


if __name__ == "__main__":
    main()
