"""The oracles' drafters written again in speculators' on-disk layout
(vLLM's drafter library, 0.9.0), as its own `save_pretrained` would write
them: config.json with `speculators_model_type`, the draft layers' Hugging
Face config as `transformer_layer_config`, the algorithm's fields at the
top level and `speculators_config`; the tensors under speculators' names,
without the verifier's embedding and LM head (it never saves them for a
drafter with the verifier's full vocabulary).

Called by dspark_oracle.py and mtp_oracle.py, which write the folders
`speculators-<kind>/` beside the mlx-vlm ones: the same weights, so the
same reference rounds apply.

Facts from speculators 0.9.0's source this follows:
- DFlash/DSpark (`models/dflash/config.py`, `models/dspark/config.py`):
  `block_size` counts the block's slots with the anchor, the drafts are the
  slots after it, or all of them with `sample_from_anchor` (DSpark's
  default); `aux_hidden_state_layer_ids` count the embedding output as 0
  (its DFlash converter writes mlx-vlm's `target_layer_ids` plus one); the
  tensor names are mlx-vlm's (`layers.*`, `fc`, `hidden_norm`, `norm`,
  `markov_head.*`, `confidence_head.proj`).
- MTP (`convert/mtp/converter.py`): a checkpoint's `mtp.fc` becomes
  `mtp_layers.0.input_proj`, `mtp.norm` `mtp_layers.0.final_layernorm`,
  `mtp.pre_fc_norm_hidden` / `_embedding` `mtp_layers.0.hidden_layernorm` /
  `token_layernorm`, `mtp.layers.0.*` `mtp_layers.0.*`, values unchanged
  (Qwen3.5's norms stay stored minus one); `num_nextn_predict_layers` 1.
"""

import json
import os

import mlx.core as mx

VERSION = "0.9.0"


def _speculators_config(algorithm, drafts, verifier_architectures):
    return {
        "algorithm": algorithm,
        "default_proposal_method": "greedy",
        "proposal_methods": [
            {"proposal_type": "greedy", "speculative_tokens": drafts, "verifier_accept_k": 1, "accept_tolerance": 0.0}
        ],
        "verifier": {"name_or_path": "../target", "architectures": verifier_architectures},
    }


def _save(folder, tensors, config):
    os.makedirs(folder, exist_ok=True)
    mx.save_safetensors(os.path.join(folder, "model.safetensors"), tensors)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)


def write_block(src, dst, config, verifier_architectures, tensors=None, draft_vocab=None):
    """The mlx-vlm DFlash/DSpark drafter in folder `src` (its `config`, in
    mlx-vlm's `dflash_config` layout) as speculators' dflash/dspark folder;
    `tensors` instead of `src`'s, and `draft_vocab` (D) for a reduced draft
    vocabulary (its `t2d` / `d2t` maps, and an `lm_head` `[D, H]` if it has
    one of its own, among the tensors)."""
    d = config["dflash_config"]
    dspark = "markov_rank" in d or d.get("projector_type") == "dspark"
    layer = {k: v for k, v in config.items() if k not in ("dflash_config", "block_size", "tie_word_embeddings")}
    # transformers 5 writes the RoPE settings as `rope_parameters`.
    layer["rope_parameters"] = {"rope_type": "default", "rope_theta": layer.pop("rope_theta")}
    layer.update(
        attention_bias=False,
        hidden_act="silu",
        layer_types=["full_attention"] * layer["num_hidden_layers"],
        use_sliding_window=False,
        sliding_window=None,
    )
    if dspark:
        # mlx-vlm's DSpark `block_size` counts proposals; with
        # `sample_from_anchor` speculators' block has as many slots.
        block, anchor = d["block_size"], True
    else:
        block, anchor = config["block_size"], False
    out = {
        "architectures": ["DSparkSpeculator" if dspark else "DFlashSpeculator"],
        "speculators_model_type": "dspark" if dspark else "dflash",
        "speculators_version": VERSION,
        "transformer_layer_config": layer,
        "draft_vocab_size": draft_vocab or config["vocab_size"],
        "block_size": block,
        "target_hidden_size": None,
        "aux_hidden_state_layer_ids": [i + 1 for i in d["target_layer_ids"]],
        "mask_token_id": d["mask_token_id"],
        "sliding_window_non_causal": False,
        "sample_from_anchor": anchor,
        "speculators_config": _speculators_config(
            "dspark" if dspark else "dflash", block if anchor else block - 1, verifier_architectures
        ),
        "dtype": "float32",
    }
    if dspark:
        out.update(
            markov_rank=d["markov_rank"],
            markov_head_type=d.get("markov_head_type", "vanilla"),
            enable_confidence_head=d.get("enable_confidence_head", False),
            confidence_head_with_markov=True,
        )
    _save(dst, tensors if tensors is not None else mx.load(os.path.join(src, "model.safetensors")), out)


MTP_NAMES = {
    "fc.": "input_proj.",
    "norm.": "final_layernorm.",
    "pre_fc_norm_hidden.": "hidden_layernorm.",
    "pre_fc_norm_embedding.": "token_layernorm.",
    "layers.0.": "",
}


def write_mtp(head_tensors, text_config, dst, drafts):
    """A Qwen3.5 MTP head, given as its `qwen3_5_mtp` tensors (unprefixed,
    norms as mlx-vlm uses them), as speculators' mtp folder."""
    tensors = {}
    for name, value in head_tensors.items():
        # Hugging Face's (and so speculators') Qwen3.5 norms: minus one.
        stored = value - 1.0 if "norm" in name and value.ndim == 1 else value
        prefix = next(p for p in MTP_NAMES if name.startswith(p))
        tensors["mtp_layers.0." + MTP_NAMES[prefix] + name[len(prefix) :]] = stored
    layer = {k: v for k, v in text_config.items() if k not in ("architectures", "torch_dtype")}
    layer["model_type"] = "qwen3_5_text"
    rope = dict(layer["rope_parameters"])
    rope["rope_type"] = rope.pop("type")
    layer["rope_parameters"] = rope
    out = {
        "architectures": ["MTPDraftModel"],
        "speculators_model_type": "mtp",
        "speculators_version": VERSION,
        "transformer_layer_config": layer,
        "num_nextn_predict_layers": 1,
        "speculators_config": _speculators_config("mtp", drafts, text_config["architectures"]),
        "dtype": "float32",
    }
    _save(dst, tensors, out)
