"""Oracle for the `assistant` drafter: mlx-vlm 0.7.10's own Gemma 4 text
model (`models/gemma4/language.py:LanguageModel`), its own assistant head
(`speculative/drafters/gemma4_assistant`) and its own round loop
(`speculative/mtp.py:_mtp_rounds`), run greedily.

    assistant_oracle.py OUT PROMPT_IDS MAX_TOKENS [BITS]

BITS (4 or 8): only the tied head is written, as `assistant/`, its linear
layers affine-quantized (groups of 32) where their input width allows it,
as MLX's `nn.quantize` skips the others by default (the head is 48 wide:
its q, gate, up and post projections stay dense), `quantization` in its
config; the reference runs the quantized head.

Writes, under OUT:
  target/          a tiny random Gemma 4 text model (layers S F S F, sliding
                   window 64, full layers with their own head size 32 and
                   proportional RoPE, soft-capped tied logits), float32, in
                   the `gemma4_text` layout model-gemma4 loads, with a
                   word-level tokenizer of its vocabulary;
  target-w8/       the same target with a sliding window of 8 (the same
                   weights; its rings wrap, for the batched tests);
  target-full/     a Gemma 4 target with full-attention layers only (for
                   the refusal of a head whose sliding layers have no
                   target layer to attend);
  assistant/       a tied-embedding assistant (`gemma4_assistant`: width 48
                   over the target's 64, layers S S S F, sliding window 8);
  centroids/       the same head with the centroid LM head
                   (`use_ordered_embeddings`: 8 clusters of 12 tokens, the
                   top 2 scored);
  reference.json   {"plain": greedy tokens of the target alone,
                    "assistant"|"centroids": {"emitted": tokens of the
                    reference loop, "rounds": [{"drafts", "accepted",
                    "logits"}]}} where `logits` holds the drafter's float32
                   logits at each draft step (for the centroid head the
                   full-vocabulary logits of its `MaskedEmbedder`).

The reference runs `_mtp_rounds` as mlx-vlm's generate runs it for one
greedy request (prefill with hidden states and shared K/V, then the rounds;
called directly, as mtp_oracle.py does). The target's sliding window (64)
holds the whole run, so its rings never evict (the engine's serial ring
refuses speculative rounds once it has wrapped) and the shared K/V the
reference's drafter reads are the whole history; the assistant's own
`sliding_window` is 8, so its sliding layers' bidirectional mask keeps
only the last 8 positions of them, which the plugin must reproduce.

Agreement is arranged on purpose: the target mostly repeats its input
(its embeddings scaled up, tied head), and the head carries the pending
token's embedding through (`pre_projection` passes its first 48 dims, its
embedding matrix is the target's cut to 48 dims; the layers' outputs are
small); the rest is random, so rounds accept none, some and all of their
drafts. The centroid head's clusters are a random partition of the
vocabulary scored by their tokens' mean embedding.

Only the reference's speculative and Gemma 4 modules are imported (the
stub package module of mtp_oracle.py).
"""

import json
import os
import sys

import mlx.core as mx
import mlx.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mtp_oracle as base  # noqa: E402  (also installs the mlx_vlm stub)

from mlx.utils import tree_flatten  # noqa: E402
from mlx_vlm.models.gemma4.config import TextConfig  # noqa: E402
from mlx_vlm.models.gemma4.language import LanguageModel  # noqa: E402
from mlx_vlm.speculative import mtp as rounds  # noqa: E402
from mlx_vlm.speculative.drafters.gemma4_assistant import (  # noqa: E402
    Gemma4AssistantDraftModel,
    ModelConfig,
)

VOCAB = base.VOCAB
HIDDEN = 64
DRAFT_HIDDEN = 48
WINDOW = 64
DRAFT_WINDOW = 8
ROPE = {
    "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"},
    "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
}
TARGET = {
    "model_type": "gemma4_text",
    "architectures": ["Gemma4ForCausalLM"],
    "hidden_size": HIDDEN,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "global_head_dim": 32,
    "rms_norm_eps": 1e-6,
    "vocab_size": VOCAB,
    "vocab_size_per_layer_input": VOCAB,
    "hidden_size_per_layer_input": 0,
    "num_kv_shared_layers": 0,
    "attention_k_eq_v": False,
    "use_double_wide_mlp": False,
    "enable_moe_block": False,
    "hidden_activation": "gelu_pytorch_tanh",
    "sliding_window": WINDOW,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
    "rope_parameters": ROPE,
    "final_logit_softcapping": 30.0,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "float32",
}
DRAFT_TEXT = dict(
    TARGET,
    hidden_size=DRAFT_HIDDEN,
    intermediate_size=96,
    layer_types=["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
    sliding_window=DRAFT_WINDOW,
)
DRAFT = {
    "model_type": "gemma4_assistant",
    "backbone_hidden_size": HIDDEN,
    "use_ordered_embeddings": False,
    "num_centroids": 8,
    "centroid_intermediate_top_k": 2,
    "tie_word_embeddings": True,
    "block_size": 4,
    "text_config": DRAFT_TEXT,
}
# How strongly each model leans on the token it reads (see the docstring).
TARGET_EMBED_SCALE = 0.35
PASS_GAIN = 3.0
LAYER_OUT_GAIN = 0.15


def make_target():
    mx.random.seed(7)
    lm = LanguageModel(TextConfig.from_dict(TARGET))
    lm.set_dtype(mx.float32)
    lm.model.embed_tokens.weight = lm.model.embed_tokens.weight * TARGET_EMBED_SCALE
    for path, p in tree_flatten(lm.parameters()):
        if path.endswith("norm.weight"):
            base.set_param(lm, path, 1.0 + 0.2 * mx.random.normal(p.shape))
        elif path.endswith("layer_scalar"):
            base.set_param(lm, path, 1.0 + 0.1 * mx.random.normal(p.shape))
    mx.eval(lm.parameters())
    return lm


def make_head(lm, centroids):
    cfg = dict(DRAFT, use_ordered_embeddings=centroids)
    head = Gemma4AssistantDraftModel(ModelConfig.from_dict(cfg))
    head.set_dtype(mx.float32)
    mx.random.seed(11)
    embed = lm.model.embed_tokens.weight[:, :DRAFT_HIDDEN]
    head.model.embed_tokens.weight = embed
    eye = mx.eye(DRAFT_HIDDEN, 2 * HIDDEN)
    head.pre_projection.weight = PASS_GAIN * eye + 0.05 * mx.random.normal((DRAFT_HIDDEN, 2 * HIDDEN))
    for path, p in tree_flatten(head.parameters()):
        if path.endswith(("post_attention_layernorm.weight", "post_feedforward_layernorm.weight")):
            # The layers' outputs are normed: their gain is these weights'.
            base.set_param(head, path, LAYER_OUT_GAIN * (1.0 + 0.2 * mx.random.normal(p.shape)))
        elif path.endswith("norm.weight"):
            base.set_param(head, path, 1.0 + 0.2 * mx.random.normal(p.shape))
        elif path.endswith("layer_scalar"):
            base.set_param(head, path, 1.0 + 0.1 * mx.random.normal(p.shape))
    if centroids:
        order = mx.random.permutation(VOCAB).astype(mx.int32)
        head.masked_embedding.token_ordering = order
        per = VOCAB // DRAFT["num_centroids"]
        rows = embed[order].reshape(DRAFT["num_centroids"], per, DRAFT_HIDDEN)
        head.masked_embedding.centroids.weight = rows.mean(axis=1)
    mx.eval(head.parameters())
    return head, cfg


def reload_head(folder):
    """The head as the reference loads a checkpoint: its config class, its
    `sanitize`, strict weights (quantized first when its config says so)."""
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    head = Gemma4AssistantDraftModel(ModelConfig.from_dict(config))
    if "quantization" in config:
        base.quantize_whole_groups(head, config["quantization"]["bits"])
    weights = mx.load(os.path.join(folder, "model.safetensors"))
    head.load_weights(list(head.sanitize(weights).items()), strict=True)
    mx.eval(head.parameters())
    return head


def greedy(lm, prompt, n):
    cache = lm.make_cache()
    out = lm(mx.array([prompt]), cache=cache)
    tokens = []
    for _ in range(n):
        t = int(mx.argmax(out.logits[0, -1]).item())
        tokens.append(t)
        out = lm(mx.array([[t]]), cache=cache)
    return tokens


def reference_rounds(lm, head, prompt, max_tokens):
    """`_mtp_rounds` as mlx-vlm's generate runs it for one greedy request,
    with the drafter's forward wrapped to record its logits per step."""
    trace, steps = [], []
    forward = Gemma4AssistantDraftModel._forward_hidden

    def recorded_forward(self, *args, **kwargs):
        last_hidden, h = forward(self, *args, **kwargs)
        steps.append(self._lm_head_fn(h).astype(mx.float32).reshape(-1).tolist())
        return last_hidden, h

    Gemma4AssistantDraftModel._forward_hidden = recorded_forward
    draft_block = head.draft_block

    def recorded_draft_block(*args, **kwargs):
        start = len(steps)
        tokens = draft_block(*args, **kwargs)
        trace.append({"drafts": tokens.reshape(-1).tolist(), "logits": steps[start:]})
        return tokens

    head.draft_block = recorded_draft_block
    record = base.record_accepted(rounds, trace)
    try:
        cache = lm.make_cache()
        ids = mx.array([prompt], dtype=mx.int32)
        out = lm(ids, cache=cache, return_hidden=True, return_shared_kv=True)
        first = int(mx.argmax(out.logits[0, -1]).item())
        emitted = [first]
        argmax = lambda logits: mx.argmax(logits, axis=-1)  # noqa: E731
        for tok, _ in rounds._mtp_rounds(
            lm,
            head,
            cache,
            out.hidden_states[-1],
            out.shared_kv_states,
            prompt_tokens=ids,
            first_bonus=first,
            max_tokens=max_tokens,
            sampler=argmax,
            token_dtype=mx.int32,
            greedy_sampling=True,
        ):
            emitted.append(int(tok))
    finally:
        Gemma4AssistantDraftModel._forward_hidden = forward
        rounds._record_speculative_round = record
    return emitted, trace


def main():
    out, prompt, max_tokens = sys.argv[1], [int(t) for t in sys.argv[2].split(",")], int(sys.argv[3])
    bits = int(sys.argv[4]) if len(sys.argv) > 4 else None
    assert all(0 <= t < VOCAB for t in prompt), f"prompt ids must be below {VOCAB}"
    lm = make_target()
    target_dir = os.path.join(out, "target")
    base.save(target_dir, dict(tree_flatten(lm.parameters())), TARGET)
    base.save_tokenizer(target_dir)
    w8 = os.path.join(out, "target-w8")
    base.save(w8, dict(tree_flatten(lm.parameters())), dict(TARGET, sliding_window=DRAFT_WINDOW))
    base.save_tokenizer(w8)
    full_cfg = dict(TARGET, layer_types=["full_attention"] * len(TARGET["layer_types"]))
    full = LanguageModel(TextConfig.from_dict(full_cfg))
    mx.eval(full.parameters())
    base.save(os.path.join(out, "target-full"), dict(tree_flatten(full.parameters())), full_cfg)
    base.save_tokenizer(os.path.join(out, "target-full"))
    plain = greedy(lm, prompt, max_tokens)
    result = {"plain": plain}
    summary = {}
    variants = (("assistant", False),) if bits else (("assistant", False), ("centroids", True))
    for name, centroids in variants:
        head, cfg = make_head(lm, centroids)
        if bits:
            base.quantize_whole_groups(head, bits)
            mx.eval(head.parameters())
            cfg = dict(cfg, quantization={"group_size": base.QUANT_GROUP, "bits": bits})
        folder = os.path.join(out, name)
        tensors = dict(tree_flatten(head.parameters()))
        if centroids:
            # Checkpoints store the ordering as int64; the reference casts it.
            tensors["masked_embedding.token_ordering"] = tensors["masked_embedding.token_ordering"].astype(mx.int64)
        base.save(folder, tensors, cfg)
        emitted, trace = reference_rounds(lm, reload_head(folder), prompt, max_tokens)
        result[name] = {"emitted": emitted, "rounds": trace}
        summary[name] = {
            "rounds": len(trace),
            "accepted": [r["accepted"] for r in trace],
            "lossless": emitted == plain,
        }
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump(result, f)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
