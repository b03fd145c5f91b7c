"""Trace what Gemma 2's tanh soft-caps keep for backward (data/activations.json ``softcap``) and that HF eager
attention keeps the full s x s scores whatever the sliding window.

Run: ``HF_HUB_OFFLINE=1 .venv/bin/python scripts/trace_softcap.py``. Uses perfguide's fake-tensor tracer (the one
scripts/fit_activations.py fits with) on a tiny Gemma2 (h 64, 4 heads x 16, 2 KV heads, vocab 4096), eager attention,
b 2 x s 64 / 128, in each dtype regime: one block = the two-block trace minus the one-block trace. Prints bytes per
b x heads x s^2 that ``attn_logit_softcapping`` adds per block, bytes per b x s x vocab that ``final_logit_softcapping``
adds at the forward/loss peak and at the start of backward, and the block bytes with a window of 16 and of 4096.
"""

from __future__ import annotations

import os
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from perfguide.memory.tracing.build import with_depth
from perfguide.memory.tracing.step import run_step
from perfguide.setup import Setup

REGIMES: dict[str, dict[str, Any]] = {"half": {"weights_dtype": "bf16"}, "fp32": {}, "amp": {"autocast": "bf16"}}
B, HEADS, VOCAB = 2, 4, 4096


def gemma2(attn_cap: float | None, final_cap: float | None, window: int = 4096) -> dict[str, Any]:
    return dict(model_type="gemma2", hidden_size=64, intermediate_size=128, num_attention_heads=HEADS, num_key_value_heads=2,
                head_dim=16, num_hidden_layers=2, vocab_size=VOCAB, max_position_embeddings=1024, query_pre_attn_scalar=16,
                attn_logit_softcapping=attn_cap, final_logit_softcapping=final_cap, sliding_window=window,
                tie_word_embeddings=True, hidden_activation="gelu_pytorch_tanh")


def block(config: dict[str, Any], setup: Setup) -> int:
    """Activation bytes of one block at the forward/loss peak."""
    two = run_step(with_depth(config, 2), setup).phases["head"].parts.get("activations", 0)
    return two - run_step(with_depth(config, 1), setup).phases["head"].parts.get("activations", 0)


def main() -> int:
    for name, kw in REGIMES.items():
        for s in (64, 128):
            setup = Setup(attn_implementation="eager", micro_batch_size=B, seq_len=s, optimizer=None, **kw)
            capped, plain = block(gemma2(50.0, None), setup), block(gemma2(None, None), setup)
            print(f"{name} s={s}: attention soft-cap +{(capped - plain) / (B * HEADS * s * s):.3f} B per b*heads*s^2; "
                  f"block bytes window 4096 / 16: {plain} / {block(gemma2(None, None, 16), setup)}")
            with_cap, without = run_step(gemma2(None, 30.0), setup).phases, run_step(gemma2(None, None), setup).phases
            for phase in ("head", "backward_head"):
                extra = with_cap[phase].total - without[phase].total
                print(f"{name} s={s}: final soft-cap +{extra / (B * s * VOCAB):.3f} B per b*s*vocab at {phase}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
