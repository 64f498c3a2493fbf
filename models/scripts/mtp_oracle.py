"""Oracle for the `mtp` drafter: mlx-vlm 0.7.10's own Qwen3.5 classes and
its own MTP round loop (`speculative/mtp.py:_mtp_rounds`), run greedily.

    mtp_oracle.py OUT PROMPT_IDS MAX_TOKENS [BITS]

BITS (4 or 8): the head's linear layers affine-quantized (groups of 32) as
mlx-lm quantizes a checkpoint, saved so with `quantization` in its config,
and the reference runs the quantized head (the `inside/` layout is then not
written: its config would quantize the target too).

Writes, under OUT:
  target/          a tiny random Qwen3.5 hybrid (mlx-vlm's `LanguageModel`),
                   in the layout model-qwen3-5 loads (`language_model.*`,
                   float32), with a word-level tokenizer of its vocabulary;
  target/mtp/      its MTP head as a `qwen3_5_mtp` folder (unprefixed
                   tensors), loaded back through the reference's own
                   `sanitize` before the rounds run;
  inside/          the same target with the head as `mtp.*` tensors in its
                   checkpoint (Hugging Face layout: norms stored minus one);
  speculators-mtp/ the head in speculators' layout (speculators_layout.py;
                   not with BITS);
  reference.json   {"plain": greedy tokens of the target alone,
                    "emitted": tokens of the reference round loop,
                    "rounds": [{"drafts", "accepted", "logits"}]} where
                   `logits` holds the drafter's float32 logits at each draft
                   step (the step that chose drafts[i]).

Agreement is arranged on purpose: the target's embeddings are scaled so
its residual stream mostly carries the input token (with tied embeddings
it then often repeats its input), and the head's `fc` mostly passes the
embedding of its token through (it drafts repeats); the rest of both is
random, so some drafts are accepted and some rejected.

Only the reference's speculative and Qwen3.5 modules are imported (a stub
package module skips mlx_vlm/__init__.py and its heavy imports).
"""

import importlib.util
import json
import os
import sys
import types

import mlx.core as mx
import mlx.nn as nn

spec = importlib.util.find_spec("mlx_vlm")
if spec is None:
    sys.exit("mlx_vlm is not installed (mlx-vlm==0.7.10, installed with --no-deps)")
stub = types.ModuleType("mlx_vlm")
stub.__path__ = list(spec.submodule_search_locations)
sys.modules["mlx_vlm"] = stub

from mlx.utils import tree_flatten  # noqa: E402
import speculators_layout  # noqa: E402
from mlx_vlm.models.qwen3_5.config import TextConfig  # noqa: E402
from mlx_vlm.models.qwen3_5.language import LanguageModel  # noqa: E402
from mlx_vlm.speculative import mtp as rounds  # noqa: E402
from mlx_vlm.speculative.drafters.qwen3_5_mtp import (  # noqa: E402
    ModelConfig,
    Qwen3_5MTPDraftModel,
)

VOCAB = 96
HIDDEN = 64
TARGET = {
    "model_type": "qwen3_5",
    "architectures": ["Qwen3_5ForCausalLM"],
    "hidden_size": HIDDEN,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "full_attention_interval": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "linear_num_value_heads": 4,
    "linear_num_key_heads": 2,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "rms_norm_eps": 1e-6,
    "vocab_size": VOCAB,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "rope_parameters": {
        "type": "default",
        "rope_theta": 10000000,
        "partial_rotary_factor": 0.25,
        "mrope_section": [11, 11, 10],
        "mrope_interleaved": True,
    },
    "torch_dtype": "float32",
}
# How strongly each model leans on the token it reads (see the docstring).
# (0.7: over 40 tokens, rounds of 0, 1 and 2 accepted drafts; 1.5 and up:
# the target repeats one token and every draft is accepted.)
TARGET_EMBED_SCALE = 0.7
HEAD_EMBED_GAIN = 1.0
HEAD_HIDDEN_GAIN = 0.5


def make_target():
    mx.random.seed(7)
    # Text only: the multimodal config is read for its token ids alone
    # (ids past the vocabulary, so no prompt position is an image).
    mm = types.SimpleNamespace(
        vision_config=types.SimpleNamespace(spatial_merge_size=2),
        image_token_id=VOCAB + 1,
        video_token_id=VOCAB + 2,
        vision_start_token_id=VOCAB + 3,
    )
    lm = LanguageModel(TextConfig.from_dict(TARGET), mm)
    lm.set_dtype(mx.float32)
    lm.model.embed_tokens.weight = lm.model.embed_tokens.weight * TARGET_EMBED_SCALE
    # Random norms (the defaults are all ones) so scale errors show.
    for path, p in tree_flatten(lm.parameters()):
        if path.endswith("norm.weight"):
            set_param(lm, path, 1.0 + 0.2 * mx.random.normal(p.shape))
    mx.eval(lm.parameters())
    return lm


def set_param(module, path, value):
    parts = path.split(".")
    for p in parts[:-1]:
        module = module[int(p)] if p.isdigit() else getattr(module, p)
    setattr(module, parts[-1], value)


def make_head(lm):
    cfg = ModelConfig.from_dict(
        {"model_type": "qwen3_5_mtp", "text_config": dict(TARGET, mtp_num_hidden_layers=1)}
    )
    head = Qwen3_5MTPDraftModel(cfg)
    head.set_dtype(mx.float32)
    mx.random.seed(11)
    # The head's decoder layer shares the target's last (attention) layer.
    last = dict(tree_flatten(lm.model.layers[-1].parameters()))
    for name, value in last.items():
        set_param(head.layers[0], name, value)
    eye = mx.eye(HIDDEN)
    noise = 0.05 * mx.random.normal((HIDDEN, 2 * HIDDEN))
    head.fc.weight = mx.concatenate([HEAD_EMBED_GAIN * eye, HEAD_HIDDEN_GAIN * eye], axis=1) + noise
    for name in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        getattr(head, name).weight = 1.0 + 0.2 * mx.random.normal((HIDDEN,))
    mx.eval(head.parameters())
    return head, cfg


QUANT_GROUP = 32


def quantize(head, bits):
    nn.quantize(head, group_size=QUANT_GROUP, bits=bits, class_predicate=lambda _, m: isinstance(m, nn.Linear))


def quantize_whole_groups(model, bits):
    """The linear layers whose input width is a whole number of groups (the
    others stay dense, as a checkpoint quantized by nn.quantize leaves them)."""
    nn.quantize(
        model,
        group_size=QUANT_GROUP,
        bits=bits,
        class_predicate=lambda _, m: isinstance(m, nn.Linear) and m.weight.shape[-1] % QUANT_GROUP == 0,
    )


def save(folder, tensors, config):
    os.makedirs(folder, exist_ok=True)
    mx.save_safetensors(os.path.join(folder, "model.safetensors"), tensors)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=2)


def save_tokenizer(folder):
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders

    vocab = {f"t{i}": i for i in range(VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "t1", "eos_token": "t2", "unk_token": "t0"}, f)


def reload_head(folder):
    """The head as the reference loads a checkpoint: its config class, its
    `sanitize` (the `mtp.` prefix and +1 norms), strict weights."""
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    if config.get("model_type") != "qwen3_5_mtp":
        config = {"model_type": "qwen3_5_mtp", "text_config": config}
    head = Qwen3_5MTPDraftModel(ModelConfig.from_dict(config))
    if "quantization" in config:
        quantize(head, config["quantization"]["bits"])
    weights = mx.load(os.path.join(folder, "model.safetensors"))
    if any(k.startswith("mtp.") for k in weights):
        weights = {k: v for k, v in weights.items() if k.startswith("mtp.")}
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


def record_accepted(rounds, trace):
    """Wraps a reference round loop's bookkeeping (`rounds`, its module) so
    the last traced round gets its accepted count; returns the original."""
    record = rounds._record_speculative_round

    def recorded_round(model, accepted, drafted):
        trace[-1]["accepted"] = int(accepted)
        assert drafted == len(trace[-1]["drafts"]), (drafted, trace[-1])
        record(model, accepted, drafted)

    rounds._record_speculative_round = recorded_round
    return record


def reference_rounds(lm, head, prompt, max_tokens):
    """`_mtp_rounds` as mlx-vlm's generate runs it for one greedy request,
    with the drafter's greedy step wrapped to record its logits."""
    seeds, steps, trace = [], [], []

    def greedy_token(hidden):
        logits = head._lm_head_fn(hidden).astype(mx.float32)
        steps.append(logits.reshape(-1).tolist())
        return mx.argmax(logits, axis=-1)

    head._greedy_token = greedy_token
    draft_block = head.draft_block

    def recorded_draft_block(*args, **kwargs):
        seeded = head._seed_token is not None
        seed = steps[-1] if seeded else None
        start = len(steps)
        tokens = draft_block(*args, **kwargs)
        trace.append({"drafts": tokens.reshape(-1).tolist(), "logits": ([seed] if seeded else []) + steps[start:]})
        return tokens

    head.draft_block = recorded_draft_block
    record_accepted(rounds, trace)

    cache = lm.make_cache()
    ids = mx.array([prompt], dtype=mx.int32)
    out = lm(ids, cache=cache, return_hidden=True)
    first = int(mx.argmax(out.logits[0, -1]).item())
    emitted = [first]
    argmax = lambda logits: mx.argmax(logits, axis=-1)  # noqa: E731
    for tok, _ in rounds._mtp_rounds(
        lm,
        head,
        cache,
        out.hidden_states[-1],
        {},
        prompt_tokens=ids,
        first_bonus=first,
        max_tokens=max_tokens,
        sampler=argmax,
        token_dtype=mx.int32,
        greedy_sampling=True,
    ):
        emitted.append(int(tok))
    return emitted, trace


def main():
    out, prompt, max_tokens = sys.argv[1], [int(t) for t in sys.argv[2].split(",")], int(sys.argv[3])
    bits = int(sys.argv[4]) if len(sys.argv) > 4 else None
    assert all(0 <= t < VOCAB for t in prompt), f"prompt ids must be below {VOCAB}"
    lm = make_target()
    head, cfg = make_head(lm)
    if bits:
        quantize(head, bits)
    # Hidden states after the final norm are what the head reads (the
    # reference's verify returns `self.norm(h)`); the checkpoints:
    target_tensors = {f"language_model.{k}": v for k, v in tree_flatten(lm.parameters())}
    head_tensors = dict(tree_flatten(head.parameters()))
    target_dir = os.path.join(out, "target")
    save(target_dir, target_tensors, TARGET)
    save_tokenizer(target_dir)
    head_config = {"model_type": "qwen3_5_mtp", "block_size": cfg.block_size, "text_config": dict(TARGET, mtp_num_hidden_layers=1)}
    if bits:
        head_config["quantization"] = {"group_size": QUANT_GROUP, "bits": bits}
    save(os.path.join(target_dir, "mtp"), head_tensors, head_config)
    # The Hugging Face layout: `mtp.*` beside the target's tensors, 1-D
    # norm weights stored minus one.
    inside = dict(target_tensors)
    for k, v in head_tensors.items():
        inside[f"mtp.{k}"] = v - 1.0 if "norm" in k and v.ndim == 1 else v
    # The rounds run on the heads as the reference loads them from disk.
    mtp_head = reload_head(os.path.join(target_dir, "mtp"))
    if not bits:
        inside_dir = os.path.join(out, "inside")
        save(inside_dir, inside, dict(TARGET, mtp_num_hidden_layers=1))
        speculators_layout.write_mtp(head_tensors, TARGET, os.path.join(out, "speculators-mtp"), cfg.block_size - 1)
        save_tokenizer(inside_dir)
        inside_head = reload_head(inside_dir)
        for a, b in zip(tree_flatten(mtp_head.parameters()), tree_flatten(inside_head.parameters())):
            assert a[0] == b[0] and mx.allclose(a[1], b[1], atol=1e-6).item(), f"{a[0]} differs between the layouts"
    plain = greedy(lm, prompt, max_tokens)
    emitted, trace = reference_rounds(lm, mtp_head, prompt, max_tokens)
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump({"plain": plain, "emitted": emitted, "rounds": trace}, f)
    accepted = [r["accepted"] for r in trace]
    # The closest call between a draft and the runner-up, in logits: the
    # margin a port must stay within to draft the same tokens.
    margin = min(sorted(step, reverse=True)[0] - sorted(step, reverse=True)[1] for r in trace for step in r["logits"])
    print(json.dumps({"rounds": len(trace), "accepted": accepted, "lossless": emitted == plain, "margin": margin}))


if __name__ == "__main__":
    main()
