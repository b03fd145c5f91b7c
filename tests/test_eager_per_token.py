"""Eager attention's per-token bytes beyond SDPA (data/activations.json ``eager_per_token``).

Checked two ways: the coefficient against a fresh run of scripts/fit_activations.py for GPT-2 fp32 (fake tensors,
seconds), and the whole eager block (per token + s^2 + dropout terms) against a live-bytes trace of the installed
transformers' GPT-2 on real CPU tensors with CUDA's 1-byte dropout masks, with an attention mask and labels as a
training loop passes them, 2-block minus 1-block model at two batch sizes. Before this term the model charged GPT-2
eager blocks the SDPA trace's per-token bytes: 8.25 B per hidden element per token too many in fp32 (+6% at h=64,
s=32), which the fit script printed as "not expressible in the format; folded out".
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from perfguide.memory.activations import family_coefficients, layer_bytes
from perfguide.model.types import ModelSpec
from perfguide.setup import Setup

ROOT = Path(__file__).resolve().parents[1]
H, HEADS, S = 64, 4, 32


def _live_block_bytes(batch: int) -> int:
    """End-of-forward live bytes of a 2-block minus a 1-block GPT-2 (eager, fp32, dropout 0.1)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from perfguide.memory.tracing.cuda_emulation import make_cuda_emulation
    from perfguide.memory.tracing.tracker import make_tracker

    out = []
    for layers in (1, 2):
        torch.manual_seed(0)
        cfg = transformers.GPT2Config(n_layer=layers, n_embd=H, n_head=HEADS, vocab_size=96, n_positions=128)
        cfg._attn_implementation = "eager"
        model = transformers.GPT2LMHeadModel(cfg).train()
        ids = torch.randint(0, 96, (batch, S))
        tracker, emulation = make_tracker(1), make_cuda_emulation(None, emulate_sdpa=True)
        with tracker, emulation:
            loss = model(input_ids=ids, labels=ids, attention_mask=torch.ones(batch, S, dtype=torch.long)).loss
            out.append(tracker.total)
        del loss
    return out[1] - out[0]


def test_gpt2_eager_block_matches_a_live_trace() -> None:
    spec = ModelSpec.from_any({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": H, "n_layer": 2,
                               "n_head": HEADS, "n_positions": 128, "vocab_size": 96})
    setup = Setup(task="train", micro_batch_size=2, seq_len=S, weights_dtype="fp32", attn_implementation="eager",
                  optimizer="sgd")
    traced = (_live_block_bytes(4) - _live_block_bytes(2)) / 2          # one more sequence: per-block constants cancel
    assert layer_bytes(spec, setup) / 2 == pytest.approx(traced, rel=0.01)


def test_gpt2_fp32_coefficient_matches_a_fresh_fit() -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import fit_activations
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    build, free = fit_activations.FAMILIES["gpt2"]
    fresh = fit_activations.eager_per_token(build, free, fit_activations.REGIMES["fp32"])
    assert fresh == pytest.approx(dict(family_coefficients("gpt2")["fp32"].eager_per_token))
