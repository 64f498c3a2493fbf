"""Oracle for the `dspark` drafter: mlx-vlm 0.7.10's own block drafter
classes (`DFlashDraftModel`, `DSparkDraftModel`, `Gemma4DSparkDraftModel`)
and its own round loop (`speculative/dflash.py:_dflash_rounds`), run
greedily over the tiny Qwen3.5 target of mtp_oracle.py.

    dspark_oracle.py OUT PROMPT_IDS MAX_TOKENS [BITS]

BITS (4 or 8): the drafters' linear layers whose inputs split into groups
of 32 affine-quantized as mlx-lm quantizes a checkpoint (`quantization` in
their configs); the reference runs the quantized drafters.

Writes, under OUT:
  target/            the tiny random Qwen3.5 hybrid (as mtp_oracle.py);
  dflash/            a DFlash drafter (no Markov head, drafts from the
                     block's slots 1..), config.json + model.safetensors;
  dspark/            a DSpark drafter (vanilla Markov head, drafts from
                     every slot, a confidence head);
  dspark-gated/,
  dspark-rnn/        DSpark drafters with speculators' gated and rnn Markov
                     heads (`markov_head_type`), which mlx-vlm does not
                     build: the heads here follow speculators 0.9's
                     `GatedMarkovHead` and `RNNHead` (its
                     `dspark/markov_head.py`) in MLX, and mlx-vlm's
                     `draft_block` is extended to hand them the block's
                     output at each draft's slot;
  deepspec/          a DeepSpec drafter (`Gemma4DSparkModel`: Gemma 4
                     layers with keys and values from one projection, its
                     own embedding and LM head, a flat config whose
                     `block_size` 7 makes a verify width of 8, capped at 4
                     by its sliding window of 6 under the 8-token prompt;
                     mlx-vlm's `_project_context_kv` reads a `v_proj` these
                     layers do not have, so the reference runs with it
                     returning None, its per-layer path);
  speculators-dflash/, speculators-dspark/, speculators-dspark-gated/,
  speculators-dspark-rnn/
                     the same drafters in speculators' layout
                     (speculators_layout.py; not with BITS);
  speculators-dflash-reduced/, speculators-dspark-reduced/
                     DFlash and DSpark drafters with speculators' reduced
                     draft vocabulary (48 of the 96 tokens: the target's
                     greedy output topped up at random; `t2d`, `d2t`; the
                     DSpark one with an LM head of its own, the target's
                     rows plus noise), which mlx-vlm does not read: their
                     reference runs mlx-vlm's classes and loop with
                     speculators' maps added (`ReducedDFlash`,
                     `ReducedDSpark`, `ReducedMarkov`; not with BITS);
  reference.json     {"plain": greedy tokens of the target alone,
                      "dflash"|"dspark": {"emitted": tokens of the reference
                      loop, "rounds": [{"drafts", "accepted", "logits",
                      "confidence"}]}} where `logits` holds the float32
                     logits each draft was chosen from (after the Markov
                     correction for DSpark) and `confidence` the confidence
                     head's values (DSpark; the reference loads the head and
                     never uses it: they are computed here with its method).

Agreement is arranged on purpose: the target mostly repeats its input
(mtp_oracle.py), and the drafters mostly carry the anchor's embedding to
every slot (small queries, so attention spreads over the anchor, the mask
slots, whose embedding is zeroed in the target, and a weak context; the
DeepSpec drafter's own embedding and LM head are copies of the target's),
so blocks often propose repeats; the rest is random, so rounds accept none,
some and all of their drafts.
"""

import json
import os
import sys

import mlx.core as mx
import mlx.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mtp_oracle as base  # noqa: E402  (also installs the mlx_vlm stub)
import speculators_layout  # noqa: E402

from mlx.utils import tree_flatten  # noqa: E402
from mlx_vlm.speculative import dflash as rounds  # noqa: E402
from mlx_vlm.speculative.drafters.dspark import DSparkDraftModel  # noqa: E402
from mlx_vlm.speculative.drafters.dspark.config import DSparkConfig  # noqa: E402
from mlx_vlm.speculative.drafters.gemma4_dspark import Gemma4DSparkDraftModel  # noqa: E402
from mlx_vlm.speculative.drafters.gemma4_dspark.config import Gemma4DsparkConfig  # noqa: E402
from mlx_vlm.speculative.drafters.qwen3_dflash import DFlashDraftModel  # noqa: E402
from mlx_vlm.speculative.drafters.qwen3_dflash.config import DFlashConfig  # noqa: E402

MASK = base.VOCAB - 1
TAPS = [1, 3]
BACKBONE = {
    "model_type": "qwen3",
    "hidden_size": base.HIDDEN,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rms_norm_eps": 1e-6,
    "vocab_size": base.VOCAB,
    "max_position_embeddings": 4096,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
}
CONFIGS = {
    # Verify width 4: three drafts a round.
    "dflash": dict(BACKBONE, block_size=4, dflash_config={"mask_token_id": MASK, "target_layer_ids": TAPS}),
    "dspark": dict(
        BACKBONE,
        dflash_config={
            "projector_type": "dspark",
            "block_size": 3,
            "block_size_policy": "fixed",
            "markov_rank": 8,
            "enable_confidence_head": True,
            "mask_token_id": MASK,
            "target_layer_ids": TAPS,
            "num_target_layers": base.TARGET["num_hidden_layers"],
        },
    ),
    # The backbone's sizes; Gemma 4 layers read `rope_parameters`, not `rope_theta`.
    "deepspec": dict(
        BACKBONE,
        architectures=["Gemma4DSparkModel"],
        model_type="gemma4_text",
        global_head_dim=32,
        num_global_key_value_heads=1,
        attention_k_eq_v=True,
        final_logit_softcapping=30.0,
        tie_word_embeddings=False,
        layer_types=["full_attention", "full_attention"],
        sliding_window=6,
        rope_parameters={
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0}
        },
        block_size=7,
        mask_token_id=MASK,
        target_layer_ids=TAPS,
        num_target_layers=base.TARGET["num_hidden_layers"],
        markov_rank=8,
        enable_confidence_head=True,
    ),
}
CONFIGS["dspark-gated"] = dict(CONFIGS["dspark"], dflash_config=dict(CONFIGS["dspark"]["dflash_config"], markov_head_type="gated"))
CONFIGS["dspark-rnn"] = dict(CONFIGS["dspark"], dflash_config=dict(CONFIGS["dspark"]["dflash_config"], markov_head_type="rnn"))
# speculators' reduced draft vocabulary over a kind above: the kind each reduces.
REDUCED = {"dflash-reduced": "dflash", "dspark-reduced": "dspark"}
CONFIGS.update({k: CONFIGS[v] for k, v in REDUCED.items()})
DRAFT_VOCAB = 48
KINDS = ("dflash", "dspark", "deepspec", "dspark-gated", "dspark-rnn", "dflash-reduced", "dspark-reduced")


class SpeculatorsMarkov(nn.Module):
    """speculators' `GatedMarkovHead` (`gated`) or `RNNHead` (`rnn`):
    the bias of a draft step from the previous token's embedding `e` and
    the block's output `h` at the draft's slot; the rnn head carries a
    state across the block's steps, zero at its start."""

    def __init__(self, kind, vocab, rank, hidden):
        super().__init__()
        self.kind = kind
        self.markov_w1 = nn.Embedding(vocab, rank)
        self.markov_w2 = nn.Linear(rank, vocab, bias=False)
        if kind == "gated":
            self.gate_proj = nn.Linear(hidden + rank, rank)
        else:
            self.joint_proj = nn.Linear(2 * rank + hidden, 3 * rank)

    def get_prev_embeddings(self, token_ids):
        return self.markov_w1(token_ids)

    def apply_step_logits(self, logits, token_ids):
        e = self.get_prev_embeddings(token_ids)
        h = self._h
        if self.kind == "gated":
            latent = mx.sigmoid(self.gate_proj(mx.concatenate([h, e], axis=-1))) * e
        else:
            state = mx.zeros_like(e) if self._state is None else self._state
            g, c, o = mx.split(self.joint_proj(mx.concatenate([state, e, h], axis=-1)), 3, axis=-1)
            g = mx.sigmoid(g)
            self._state = g * state + (1.0 - g) * mx.tanh(c)
            latent = mx.tanh(o)
        return logits + self.markov_w2(latent)

    def sample_block(self, base_logits, *, first_prev_tokens, sampler, hidden):
        previous, sampled, self._state = first_prev_tokens.reshape(-1), [], None
        for step in range(base_logits.shape[1]):
            self._h = hidden[:, step]
            previous = sampler(self.apply_step_logits(base_logits[:, step], previous)).reshape(-1)
            sampled.append(previous[:, None])
        return mx.concatenate(sampled, axis=1)


class ReducedMarkov(nn.Module):
    """speculators' vanilla `MarkovHead` over a reduced draft vocabulary:
    `markov_w1` reads the previous token by its verifier id, `markov_w2`
    corrects the draft vocabulary's logits; each pick is mapped back to its
    verifier id (`ids`, d2t's `i + d2t[i]`) before it feeds the next step."""

    def __init__(self, vocab, draft_vocab, rank, ids):
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab, rank)
        self.markov_w2 = nn.Linear(rank, draft_vocab, bias=False)
        self._ids = ids

    def get_prev_embeddings(self, token_ids):
        return self.markov_w1(token_ids)

    def apply_step_logits(self, logits, token_ids):
        return logits + self.markov_w2(self.get_prev_embeddings(token_ids))

    def sample_block(self, base_logits, *, first_prev_tokens, sampler, hidden):
        previous, sampled = first_prev_tokens.reshape(-1), []
        for step in range(base_logits.shape[1]):
            previous = self._ids[sampler(self.apply_step_logits(base_logits[:, step], previous)).reshape(-1)]
            sampled.append(previous[:, None])
        return mx.concatenate(sampled, axis=1)


class SpeculatorsDSpark(DSparkDraftModel):
    """mlx-vlm's DSpark drafter with a `SpeculatorsMarkov` head: its
    `draft_block`, with the block's output per draft slot handed to the
    head (mlx-vlm's vanilla head takes none)."""

    def draft_block(self, last_bonus, hidden, cache, block_size, sampler, token_dtype=mx.int32):
        anchor = mx.array([last_bonus], dtype=token_dtype)
        masks = mx.full((1, block_size - 1 - int(self.config.sample_from_anchor)), int(self.config.mask_token_id), dtype=token_dtype)
        draft_hidden = self._hidden(mx.concatenate([anchor[:, None], masks], axis=1), hidden, cache)
        if not self.config.sample_from_anchor:
            draft_hidden = draft_hidden[:, 1:]
        return self.markov_head.sample_block(
            self._logits(draft_hidden), first_prev_tokens=anchor, sampler=sampler, hidden=draft_hidden
        ).astype(token_dtype)


class ReducedLogits:
    """speculators' reduced draft vocabulary (`DraftVocabMixin`) on an
    mlx-vlm drafter: logits over the D tokens `_ids` lists, from the
    verifier's head at those rows, or from `draft_lm_head` `[D, H]` when
    set (a checkpoint's own `lm_head`)."""

    def _logits(self, hidden):
        if "draft_lm_head" in self:
            return self.draft_lm_head(hidden)
        return self.lm_head(hidden)[..., self._ids]


class ReducedDFlash(ReducedLogits, DFlashDraftModel):
    """mlx-vlm's DFlash drafter over a reduced draft vocabulary: its drafts
    mapped back to verifier ids."""

    def draft_block(self, *args, **kw):
        return self._ids[super().draft_block(*args, **kw)]

    def draft_block_greedy(self, *args, **kw):
        return self.draft_block(*args, **kw)


class ReducedDSpark(ReducedLogits, SpeculatorsDSpark):
    """The DSpark drafter over a reduced draft vocabulary, with a
    `ReducedMarkov` head (which maps the drafts)."""


def draft_vocabulary(tokens):
    """speculators' maps of a reduced draft vocabulary of DRAFT_VOCAB
    tokens: `tokens` (what the target says, so drafts can agree) topped up
    with others drawn at random, never the mask: t2d `[V]` (bool) and d2t
    `[D]` (draft id i is verifier id i + d2t[i]), and the ids ascending."""
    import random

    chosen = set(t for t in tokens if t != MASK)
    rest = [t for t in range(base.VOCAB) if t != MASK and t not in chosen]
    random.Random(41).shuffle(rest)
    ids = sorted(chosen | set(rest[: DRAFT_VOCAB - len(chosen)]))
    assert len(ids) == DRAFT_VOCAB
    t2d = mx.zeros((base.VOCAB,), dtype=mx.bool_)
    t2d[mx.array(ids)] = True
    d2t = mx.array([t - i for i, t in enumerate(ids)], dtype=mx.int64)
    return t2d, d2t, mx.array(ids, dtype=mx.int32)


def reduce(model, kind, ids, lm):
    """Turns a drafter built as `REDUCED[kind]` into `kind`: the DSpark
    one gets a `ReducedMarkov` head and a head of its own (the verifier's
    rows plus noise, so that a checkpoint's head is seen to be used)."""
    model._ids = ids
    if kind == "dspark-reduced":
        rank = CONFIGS[kind]["dflash_config"]["markov_rank"]
        model.markov_head = ReducedMarkov(base.VOCAB, DRAFT_VOCAB, rank, ids)
        model.markov_head.markov_w2.weight = MARKOV_GAIN * model.markov_head.markov_w2.weight
        rows = lm.model.embed_tokens.weight[ids]
        model.draft_lm_head = nn.Linear(base.HIDDEN, DRAFT_VOCAB, bias=False)
        model.draft_lm_head.weight = rows + 0.02 * mx.random.normal(rows.shape)


# How much of the anchor each slot carries (see the docstring).
QUERY_NORM = 0.3
CONTEXT_NORM = 0.05
MLP_GAIN = 0.1
MARKOV_GAIN = 0.3


def build(kind, cfg):
    """The reference's class for `kind` over config `cfg`."""
    if kind == "deepspec":
        model = Gemma4DSparkDraftModel(Gemma4DsparkConfig.from_dict(cfg))
        # mlx-vlm 0.7.10's fused context projection reads `v_proj`, which
        # k_eq_v layers lack; None selects its per-layer `_project_kv`.
        model._project_context_kv = lambda hidden: None
        return model
    if kind == "dspark":
        return DSparkDraftModel(DSparkConfig.from_dict(cfg))
    if kind == "dflash-reduced":
        return ReducedDFlash(DFlashConfig.from_dict(cfg))
    if kind == "dspark-reduced":
        return ReducedDSpark(DSparkConfig.from_dict(cfg))
    if kind.startswith("dspark-"):
        head = cfg["dflash_config"]["markov_head_type"]
        vanilla = dict(cfg, dflash_config=dict(cfg["dflash_config"], markov_head_type="vanilla"))
        model = SpeculatorsDSpark(DSparkConfig.from_dict(vanilla))
        model.markov_head = SpeculatorsMarkov(head, cfg["vocab_size"], cfg["dflash_config"]["markov_rank"], cfg["hidden_size"])
        return model
    return DFlashDraftModel(DFlashConfig.from_dict(cfg))


def make_drafter(kind, lm, ids=None):
    model = build(kind, CONFIGS[kind])
    model.set_dtype(mx.float32)
    seeds = {"dflash": 19, "dspark": 23, "deepspec": 29, "dspark-gated": 31, "dspark-rnn": 37}
    seeds.update({"dflash-reduced": 43, "dspark-reduced": 47})
    mx.random.seed(seeds[kind])
    h = base.HIDDEN
    gemma = kind == "deepspec"
    # Head width and KV heads: Gemma 4 layers attend at global_head_dim
    # over one KV head whose values are the keys' projection.
    d, kv_heads = (32, 1) if gemma else (16, 2)
    kv = kv_heads * d
    for layer in model.layers:
        a = layer.self_attn
        carry = mx.eye(h)[:kv] + 0.05 * mx.random.normal((kv, h))
        if gemma:
            a.k_proj.weight = carry
        else:
            a.v_proj.weight = carry
        # The attention's output per query head is its KV head's value:
        # o_proj puts each back where the value projection took it from.
        o = mx.zeros((h, 4 * d))
        for q_head in range(4):
            kv_head = q_head * kv_heads // 4
            rows = mx.arange(kv_head * d, kv_head * d + d)
            cols = mx.arange(q_head * d, q_head * d + d)
            o[rows, cols] = kv_heads / 4
        a.o_proj.weight = o + 0.05 * mx.random.normal((h, 4 * d))
        a.q_norm.weight = QUERY_NORM * (1.0 + 0.2 * mx.random.normal((d,)))
        a.k_norm.weight = 1.0 + 0.2 * mx.random.normal((d,))
        layer.mlp.down_proj.weight = MLP_GAIN * layer.mlp.down_proj.weight
        layer.input_layernorm.weight = 1.0 + 0.2 * mx.random.normal((h,))
        layer.post_attention_layernorm.weight = 1.0 + 0.2 * mx.random.normal((h,))
        if gemma:
            layer.pre_feedforward_layernorm.weight = 1.0 + 0.2 * mx.random.normal((h,))
            layer.post_feedforward_layernorm.weight = MLP_GAIN * (1.0 + 0.2 * mx.random.normal((h,)))
            layer.layer_scalar = 1.0 + 0.1 * mx.random.normal((1,))
    model.hidden_norm.weight = CONTEXT_NORM * (1.0 + 0.2 * mx.random.normal((h,)))
    model.norm.weight = 1.0 + 0.2 * mx.random.normal((h,))
    if gemma:
        # Its own vocabulary head: copies of the target's (tied) embedding.
        model.embed_tokens.weight = lm.model.embed_tokens.weight
        model.lm_head.weight = lm.model.embed_tokens.weight
    if kind in REDUCED:
        reduce(model, kind, ids, lm)
    elif kind != "dflash":
        m = model.markov_head
        m.markov_w2.weight = MARKOV_GAIN * m.markov_w2.weight
    mx.eval(model.parameters())
    return model


def reload(kind, folder):
    """The drafter as the reference loads a checkpoint: its config class,
    its `sanitize`, strict weights."""
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    model = build(kind, config)
    if "quantization" in config:
        base.quantize_whole_groups(model, config["quantization"]["bits"])
    weights = mx.load(os.path.join(folder, "model.safetensors"))
    model.load_weights(list(model.sanitize(weights).items()), strict=True)
    mx.eval(model.parameters())
    return model


def reference_rounds(lm, drafter, prompt, max_tokens):
    """`_dflash_rounds` as mlx-vlm's generate runs it for one greedy
    request, with the drafter's logits recorded at each draft step."""
    trace, steps = [], []
    if isinstance(drafter, DSparkDraftModel):
        apply = drafter.markov_head.apply_step_logits

        def recorded_step(logits, tokens):
            out = apply(logits, tokens)
            steps.append(out.astype(mx.float32).reshape(-1).tolist())
            return out

        drafter.markov_head.apply_step_logits = recorded_step
    else:
        hidden_fn = drafter._hidden

        def recorded_hidden(inputs, target_hidden, cache):
            h = hidden_fn(inputs, target_hidden, cache)
            for row in drafter._logits(h[:, 1:]).astype(mx.float32)[0]:
                steps.append(row.tolist())
            return h

        drafter._hidden = recorded_hidden
    draft_block = drafter.draft_block_greedy if hasattr(drafter, "draft_block_greedy") else drafter.draft_block

    def recorded_block(last_bonus, hidden, cache, block_size, sampler, token_dtype=mx.int32, **kw):
        start = len(steps)
        captured = {}
        if isinstance(drafter, DSparkDraftModel):
            inner = drafter._hidden

            def keep_hidden(inputs, target_hidden, c):
                captured["h"] = inner(inputs, target_hidden, c)
                return captured["h"]

            drafter._hidden = keep_hidden
        tokens = draft_block(last_bonus, hidden, cache, block_size, sampler, token_dtype, **kw)
        row = {"drafts": tokens.reshape(-1).tolist(), "logits": steps[start:]}
        if isinstance(drafter, DSparkDraftModel):
            drafter._hidden = inner
            anchor = mx.array([int(last_bonus)], dtype=mx.int32)
            c = drafter.confidence(captured["h"], anchor, tokens.astype(mx.int32))
            row["confidence"] = c.reshape(-1).tolist()
        trace.append(row)
        return tokens

    drafter.draft_block_greedy = recorded_block
    record = base.record_accepted(rounds, trace)

    cache = lm.make_cache()
    out = lm(mx.array([prompt], dtype=mx.int32), cache=cache, capture_layer_ids=TAPS)
    hidden = mx.concatenate(out.hidden_states, axis=-1)
    first = int(mx.argmax(out.logits[0, -1]).item())
    emitted = [first]
    argmax = lambda logits: mx.argmax(logits, axis=-1)  # noqa: E731
    for tok, _ in rounds._dflash_rounds(
        lm,
        drafter,
        cache,
        hidden,
        first_bonus=first,
        max_tokens=max_tokens,
        sampler=argmax,
        token_dtype=mx.int32,
        use_model_initial_block_size=False,
        greedy_sampling=True,
    ):
        emitted.append(int(tok))
    rounds._record_speculative_round = record
    return emitted, trace


def main():
    out, prompt, max_tokens = sys.argv[1], [int(t) for t in sys.argv[2].split(",")], int(sys.argv[3])
    bits = int(sys.argv[4]) if len(sys.argv) > 4 else None
    assert all(0 <= t < MASK for t in prompt), f"prompt ids must be below {MASK}"
    lm = base.make_target()
    # DSpark's target check reads the text config through `config`.
    lm.config.text_config = lm.args
    # The mask token carries nothing in (see the docstring).
    w = lm.model.embed_tokens.weight
    lm.model.embed_tokens.weight = mx.concatenate([w[:MASK], mx.zeros((1, w.shape[1]))], axis=0)
    mx.eval(lm.parameters())
    target_dir = os.path.join(out, "target")
    base.save(target_dir, {f"language_model.{k}": v for k, v in tree_flatten(lm.parameters())}, base.TARGET)
    base.save_tokenizer(target_dir)
    result = {"plain": base.greedy(lm, prompt, max_tokens)}
    summary = {}
    t2d, d2t, ids = draft_vocabulary(result["plain"])
    for kind in KINDS:
        if kind in REDUCED:
            if bits:
                continue
            # mlx-vlm reads no reduced vocabulary: only speculators' folder,
            # and the reference runs the drafter as made.
            drafter = make_drafter(kind, lm, ids)
            tensors = dict(tree_flatten(drafter.parameters()))
            if "draft_lm_head.weight" in tensors:
                tensors["lm_head.weight"] = tensors.pop("draft_lm_head.weight")
            speculators_layout.write_block(
                None,
                os.path.join(out, f"speculators-{kind}"),
                CONFIGS[kind],
                base.TARGET["architectures"],
                tensors=dict(tensors, t2d=t2d, d2t=d2t),
                draft_vocab=DRAFT_VOCAB,
            )
            emitted, trace = reference_rounds(lm, drafter, prompt, max_tokens)
            result[kind] = {"emitted": emitted, "rounds": trace}
            summary[kind] = {"rounds": len(trace), "accepted": [r["accepted"] for r in trace], "lossless": emitted == result["plain"]}
            continue
        folder = os.path.join(out, kind)
        drafter, config = make_drafter(kind, lm), CONFIGS[kind]
        if bits:
            base.quantize_whole_groups(drafter, bits)
            config = dict(config, quantization={"group_size": base.QUANT_GROUP, "bits": bits})
        base.save(folder, dict(tree_flatten(drafter.parameters())), config)
        if not bits and kind != "deepspec":
            # speculators builds no Gemma 4 drafter.
            speculators_layout.write_block(folder, os.path.join(out, f"speculators-{kind}"), config, base.TARGET["architectures"])
        emitted, trace = reference_rounds(lm, reload(kind, folder), prompt, max_tokens)
        result[kind] = {"emitted": emitted, "rounds": trace}
        margin = min(sorted(s, reverse=True)[0] - sorted(s, reverse=True)[1] for r in trace for s in r["logits"])
        summary[kind] = {
            "rounds": len(trace),
            "accepted": [r["accepted"] for r in trace],
            "lossless": emitted == result["plain"],
            "margin": margin,
        }
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump(result, f)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
