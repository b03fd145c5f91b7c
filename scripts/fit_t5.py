"""T5's own activation coefficients in perfguide/data/activations.json (family ``t5``; before it T5 borrowed BERT's).

Run: ``HF_HUB_OFFLINE=1 .venv/bin/python scripts/fit_t5.py [--dry-run]``. T5 is an encoder-decoder that HF runs with
eager attention up to 4.x (5.x also through SDPA, the relative position bias as a float mask), and its blocks differ from
BERT's in what they keep for backward: the decoder block has a cross-attention (its own q, the K/V projections of
the encoder output and a second s x s score map), T5LayerNorm upcasts to fp32 (``hidden_states.to(torch.float32)
.pow(2)`` keeps an fp32 copy in a 16-bit model), the softmax runs on ``scores.float()`` and T5 applies
``dropout_rate`` to the attention probabilities as well (T5Attention ``self.dropout = config.dropout_rate``).

One depth step of the tracer (tracing/build.py ``with_depth``) is one encoder plus one decoder block, while the
analytic model counts ``total_layers`` = encoder + decoder blocks, so the coefficients are half of a depth step's
bytes: the mean of an encoder and a decoder block at equal source and target length. Where the labels are shorter or longer than the
inputs (``Setup.target_len``) the decoder block is traced apart (``fit_split``: its bytes per target token, and per
source token its cross-attention's K/V) and memory/seq2seq.py prices the encoder block as twice the mean minus it. Per token per block from
two batch sizes (per-block constants cancel) at two lengths (the s^2 part separates), at one-at-a-time h/i/q steps.
``per_token`` is traced with SDPA (transformers 5.x runs T5 through SDPA with the position bias as a float mask: one bias
map per stack, shared by its blocks, so no s^2 term per block); ``eager_per_token`` is eager minus SDPA per token.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fit_activations import BASE, BATCHES, DATA, DROP, REGIMES, VOCAB, block_bytes, family_args

from perfguide.memory.tracing.step import run_step
from perfguide.setup import Setup

FREE = ("h", "i", "q")
LENGTHS = (64, 128)
HEAD_DIM = 16
#: blocks per traced depth step (one encoder + one decoder block)
PER_STEP = 2


#: the T5 families this script fits, by the FFN their T5 configs name (``feed_forward_proj``): T5 v1.0's ReLU block,
#: and T5 v1.1 / Flan-T5 / mT5 / T0's gated-GELU block (wi_0 and wi_1, gelu_new on the first, their product into wo)
FEED_FORWARD = {"t5": "relu", "t5-gated": "gated-gelu"}


def _t5(d: dict[str, int], drop: float = 0.0, layers: tuple[int, int] = (2, 2), ff: str = "relu") -> dict[str, Any]:
    return dict(model_type="t5", d_model=d["h"], d_ff=d["i"], num_heads=d["q"] // HEAD_DIM, d_kv=HEAD_DIM, num_layers=layers[0],
                num_decoder_layers=layers[1], vocab_size=VOCAB, dropout_rate=drop, feed_forward_proj=ff,
                tie_word_embeddings=True, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)


def _blenderbot(d: dict[str, int], drop: float = 0.0, layers: tuple[int, int] = (2, 2)) -> dict[str, Any]:
    """BlenderBot (facebook/blenderbot-400M-distill's block options: pre-LayerNorm, GELU FFN, learned positions,
    ``dropout`` on hidden states only, ``attention_dropout`` and ``activation_dropout`` 0)."""
    return dict(model_type="blenderbot", architectures=["BlenderbotForConditionalGeneration"], is_encoder_decoder=True,
                d_model=d["h"], encoder_ffn_dim=d["i"], decoder_ffn_dim=d["i"], encoder_attention_heads=d["q"] // HEAD_DIM,
                decoder_attention_heads=d["q"] // HEAD_DIM, encoder_layers=layers[0], decoder_layers=layers[1],
                vocab_size=VOCAB, dropout=drop, attention_dropout=0.0, activation_dropout=0.0, activation_function="gelu",
                max_position_embeddings=256, scale_embedding=True, decoder_start_token_id=1, pad_token_id=0,
                bos_token_id=1, eos_token_id=2)


def _whisper(d: dict[str, int], drop: float = 0.0, layers: tuple[int, int] = (2, 2)) -> dict[str, Any]:
    """Whisper (openai/whisper-*'s block options: pre-LayerNorm, GELU FFN, ``dropout`` on hidden states, attention and
    activation dropout 0, as their config.json files set them). The conv front end and the position tables are per
    step, not per block, so the one-minus-two depth steps cancel them (memory/audio.py prices the front end); the
    tracer builds the encoder at the traced length (tracing/build.py ``_speech_lengths``)."""
    return dict(model_type="whisper", architectures=["WhisperForConditionalGeneration"], d_model=d["h"], encoder_ffn_dim=d["i"],
                decoder_ffn_dim=d["i"], encoder_attention_heads=d["q"] // HEAD_DIM, decoder_attention_heads=d["q"] // HEAD_DIM,
                encoder_layers=layers[0], decoder_layers=layers[1], vocab_size=VOCAB, dropout=drop, attention_dropout=0.0,
                activation_dropout=0.0, activation_function="gelu", num_mel_bins=80, max_source_positions=128,
                max_target_positions=128, decoder_start_token_id=1, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                suppress_tokens=[], begin_suppress_tokens=[])


#: where each family's traced dropout applies
DROPOUT_NOTE = {"t5": "T5 applies dropout_rate to hidden states and attention probabilities alike",
                "blenderbot": "BlenderBot's dropout on hidden states; attention_dropout and activation_dropout 0",
                "whisper": "Whisper's dropout on hidden states; attention_dropout and activation_dropout 0"}


#: every family this script fits: its config builder (dims, dropout, (encoder, decoder) blocks) and what it is
BUILDERS: dict[str, tuple[Callable[..., dict[str, Any]], str]] = {
    **{name: (functools.partial(_t5, ff=ff), f"HF T5 encoder-decoder steps, feed_forward_proj {ff!r}")
       for name, ff in FEED_FORWARD.items()},
    "blenderbot": (_blenderbot, "HF BlenderbotForConditionalGeneration steps (dropout on hidden states only)"),
    "whisper": (_whisper, "HF WhisperForConditionalGeneration steps on log-mel input (dropout on hidden states only)"),
}


def _setup(kw: dict[str, Any], bs: int, seq: int, attn: str = "eager", **extra: Any) -> Setup:
    return Setup(micro_batch_size=bs, seq_len=seq, optimizer="sgd", attn_implementation=attn, **kw, **extra)


def _slope(config: dict[str, Any], kw: dict[str, Any], seq: int, attn: str = "eager", **extra: Any) -> float:
    """Bytes per token per block at ``seq``: two batch sizes, so per-block constants cancel."""
    a, b = (block_bytes(config, _setup(kw, bs, seq, attn, **extra)) for bs in BATCHES)
    return (b - a) / ((BATCHES[1] - BATCHES[0]) * seq * PER_STEP)


def _per_token_and_s2(config: dict[str, Any], kw: dict[str, Any], attn: str = "eager") -> tuple[float, float]:
    """(bytes per token per block without the s^2 part, bytes per b x heads x s^2 per block) from two lengths."""
    (s1, y1), (s2, y2) = ((s, _slope(config, kw, s, attn)) for s in LENGTHS)
    per_head_s = (y2 - y1) / (s2 - s1)   # heads x s x alpha per token
    heads = config["num_heads"] if "num_heads" in config else config["encoder_attention_heads"]
    return y1 - per_head_s * s1, per_head_s / heads


def _solve(ys: list[float], points: list[dict[str, int]]) -> dict[str, float]:
    import numpy as np

    rows = [[p[d] for d in FREE] + [1] for p in points]
    coef = np.linalg.lstsq(np.array(rows, dtype=float), np.array(ys), rcond=None)[0]
    out = {d: round(float(c), 3) for d, c in zip((*FREE, "1"), coef)}
    return {k: v for k, v in out.items() if abs(v) > 1e-6}


#: (source, target) lengths of the decoder split: the source steps at a fixed target, the target at a fixed source;
#: multiples of 32, where the emulated memory-efficient kernel's logsumexp needs no padding
SPLIT_LENGTHS = ((64, 32), (128, 32), (64, 64))


def _decoder_block(config: dict[str, Any], kw: dict[str, Any], source: int, target: int) -> float:
    """Bytes one decoder block keeps per batch row at (source, target): one encoder + two decoder blocks minus one
    + one (the stacks' own tensors cancel), at two batch sizes (per-block constants cancel). SDPA attention."""
    def rows(layers: tuple[int, int], bs: int) -> int:
        keys = ("encoder_layers", "decoder_layers") if "decoder_layers" in config else ("num_layers", "num_decoder_layers")
        cfg = {**config, keys[0]: layers[0], keys[1]: layers[1]}
        setup = Setup(micro_batch_size=bs, seq_len=source, target_len=target, optimizer="sgd", attn_implementation="sdpa", **kw)
        return run_step(cfg, setup).phases["head"].parts.get("activations", 0)

    lo, hi = BATCHES
    return ((rows((1, 2), hi) - rows((1, 1), hi)) - (rows((1, 2), lo) - rows((1, 1), lo))) / (hi - lo)


def _decoder_split(config: dict[str, Any], kw: dict[str, Any]) -> tuple[float, float]:
    """(bytes per target token, bytes per source token) one decoder block keeps: the per-block coefficients are
    the mean of an encoder and a decoder block at equal lengths, and only the decoder's cross-attention K/V run over
    the source, so a step whose labels are shorter than its inputs needs the two apart."""
    (s1, t1), (s2, _), (_, t3) = SPLIT_LENGTHS
    a, b, c = (_decoder_block(config, kw, s, t) for s, t in SPLIT_LENGTHS)
    per_source = (b - a) / (s2 - s1)
    return (c - a) / (t3 - t1), per_source


def fit_split(regimes: dict[str, Any], family: str = "t5") -> list[str]:
    """Add each regime's decoder split (``decoder_per_token``, ``cross_per_source_token``, ``decoder_dropout_per_token``)."""
    build = BUILDERS[family][0]
    points = [dict(BASE)] + [{**BASE, d: BASE[d] * 2} for d in FREE]
    notes = []
    for regime, kw in REGIMES.items():
        target, source, drop_target, drop_source = [], [], [], []
        for d in points:
            (t, s), (td, sd) = _decoder_split(build(d), kw), _decoder_split(build(d, DROP), kw)
            target.append(t)
            source.append(s)
            drop_target.append(td - t)
            drop_source.append(sd - s)
        assert max(map(abs, drop_source)) < 1e-6, f"dropout keeps bytes per source token in a decoder block ({drop_source})"
        regimes[regime]["decoder_per_token"] = _solve(target, points)
        regimes[regime]["cross_per_source_token"] = _solve(source, points)
        regimes[regime]["decoder_dropout_per_token"] = _solve(drop_target, points)
        notes.append(f"{regime} decoder split: per target token {target}, per source token {source}")
        print(f"  {family}/{regime} split: {json.dumps({k: regimes[regime][k] for k in SPLIT_KEYS})}", flush=True)
    return notes


SPLIT_KEYS = ("decoder_per_token", "cross_per_source_token", "decoder_dropout_per_token")
SPLIT_SOURCE = (f"decoder_per_token / cross_per_source_token / decoder_dropout_per_token: one decoder block (1 + 2 minus 1 + 1 "
                f"encoder + decoder blocks) per target and per source token, SDPA, from (source, target) = {list(SPLIT_LENGTHS)} "
                "(memory/seq2seq.py prices the encoder block as twice the mean minus the decoder's);")


def fit(family: str = "t5") -> tuple[dict[str, Any], list[str]]:
    build = BUILDERS[family][0]
    points = [dict(BASE)] + [{**BASE, d: BASE[d] * 2} for d in FREE]
    out, notes = {}, []
    for regime, kw in REGIMES.items():
        per, sdpa, alphas, drop, drop_alphas, sdpa_s2 = [], [], [], [], [], []
        for d in points:
            (p, a), (pd, ad) = _per_token_and_s2(build(d), kw), _per_token_and_s2(build(d, DROP), kw)
            ps, a_sdpa = _per_token_and_s2(build(d), kw, "sdpa")
            # T5's bias is one per stack; another family's SDPA s^2 bytes have no slot in the format: noted, not priced
            assert family not in FEED_FORWARD or abs(a_sdpa) < 1e-6, f"SDPA keeps an s^2 term per block ({a_sdpa})"
            sdpa_s2.append(a_sdpa)
            sdpa.append(ps)
            per.append(p)
            alphas.append(a)
            drop.append(pd - p)   # the hidden and feed-forward dropout masks (and outputs) per token
            drop_alphas.append(ad - a)
        base = points[0]
        seq, tokens = LENGTHS[0], BATCHES[1] * LENGTHS[0]
        ckpt = _slope(build(base), kw, seq, gradient_checkpointing=True) / base["h"]
        logits = run_step(build(base), _setup(kw, BATCHES[1], seq)).phases["backward_head"].parts["logits"] / (tokens * VOCAB)
        out[regime] = {
            "per_token": _solve(sdpa, points),
            "eager_per_head_s2": round(sorted(alphas)[len(alphas) // 2], 3),
            "eager_per_token": _solve([e - q for e, q in zip(per, sdpa)], points),
            "ckpt_per_token": {"h": round(ckpt, 3)},
            "logits_per_token_vocab": round(logits, 3),
            "dropout_per_token": _solve(drop, points),
            "eager_dropout_per_head_s2": round(sorted(drop_alphas)[len(drop_alphas) // 2], 3),
            "frozen_linear_inputs_per_token": {},
        }
        notes.append(f"{regime}: eager s^2 per step point {alphas}, dropout's {[round(a, 3) for a in drop_alphas]}"
                     + (f", SDPA's (not priced) {[round(a, 3) for a in sdpa_s2]}" if any(sdpa_s2) else ""))
        print(f"  {family}/{regime}: {json.dumps(out[regime])}", flush=True)
    fit_split(out, family)
    return out, notes


def main(argv: list[str] | None = None) -> int:
    args = family_args(__doc__ or "", tuple(BUILDERS), argv)
    import torch
    import transformers

    data = json.loads(DATA.read_text(encoding="utf-8"))
    for family in args.family or FEED_FORWARD:
        regimes, notes = fit(family)
        if args.dry_run:
            print("\n".join(notes))
            continue
        data["aliases"].pop(family, None)
        data["families"][family] = {
            "source": (f"scripts/fit_t5.py: fake-tensor traces of {BUILDERS[family][1]} "
                       f"(torch {torch.__version__}, "
                       f"transformers {transformers.__version__}), SDPA and eager attention, one-minus-two depth steps (one encoder + one "
                       f"decoder block each, halved: per block of total_layers) at h/i/q steps around {BASE} (kv = q), batches "
                       f"{list(BATCHES)} x lengths {list(LENGTHS)} (source = target length); {SPLIT_SOURCE} per_token is SDPA's, eager_per_token eager minus SDPA "
                       f"per token and eager_per_head_s2 eager's s^2 part (encoder self, decoder self and cross attention, averaged per block); "
                       f"dropout terms = dropout {DROP} minus 0 ({DROPOUT_NOTE.get(family, DROPOUT_NOTE['t5'])}); "
                       "frozen_linear_inputs: the generic fallback (activations.frozen_linear_inputs). "
                       + "; ".join(notes)),
            "regimes": regimes,
        }
    if not args.dry_run:
        DATA.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
