"""perfguide's s^2 price at the checkpoint recompute against a real TRL step (scripts/trace_trl_gemma.py).

The installed SFTTrainer and DPOTrainer run one step on a tiny Gemma 3 (5 sliding + 1 full layer, window 16, bf16,
SDPA, checkpointing as Trainer.train() switches it on) on real CPU tensors, and every s x s tensor alive at each
block's recompute peak is counted: the bool sliding mask the checkpointed blocks keep (1 byte per row x s^2) and, in
a sliding block, the bf16 bias SDPA makes of it (2). memory/masks.py prices the same; the trainer's count is the
independent reference; so is DPO's no-grad reference forward (its own mask and one bias beside the policy's kept
mask: 4 B per row x s^2 at most). A DPO pair whose rejected completion is shorter is padded, so the full-attention
layer gets a materialised mask too (one more byte per row while the full layer is ahead in backward, two more in the
reference forward): not priced, shown here.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
S = 256
pytestmark = pytest.mark.slow


def _trace(name: str, pad: int = 0) -> tuple[Any, Any]:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import trace_trl_gemma as t
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    with tempfile.TemporaryDirectory() as out:
        trainer, batch = t.sft_trainer(out, S) if name == "sft" else t.dpo_trainer(out, S, pad)
        return t.traced_step(trainer, batch, S), t


def _square(peaks: dict[str, Any], phase: str, t: Any) -> list[tuple[str, str, int]]:
    return sorted((op.split(" in ")[0], dtype, nbytes) for op, _shape, dtype, nbytes in t.square_bytes(peaks[phase], S))


@pytest.mark.parametrize(("name", "rows"), [("sft", 1), ("dpo", 2)])
def test_recompute_holds_the_mask_and_one_bias(name: str, rows: int) -> None:
    meter, t = _trace(name)
    peaks = meter.peaks
    mask, bias = rows * S * S, 2 * rows * S * S   # bool: 1 byte; bf16 bias: 2
    for i in range(5):
        phase = f"recompute+backward block {i} (sliding_attention)"
        assert _square(peaks, phase, t) == [("bitwise_and", "torch.bool", mask), ("where", "torch.bfloat16", bias)], phase
        assert t.perfguide_s2(rows, S) * rows * S * S == mask + bias
    full = "recompute+backward block 5 (full_attention)"
    assert _square(peaks, full, t) == [("bitwise_and", "torch.bool", mask)]
    assert t.perfguide_s2(rows, S, sliding=False) * rows * S * S == mask
    if name == "dpo":   # the no-grad reference forward: its own mask and one bias beside the policy's kept mask
        from perfguide import ModelSpec, Setup
        from perfguide.memory.masks import checkpointed_mask_bytes, no_grad_forward_mask_bytes

        spec = ModelSpec.from_any({**t.GEMMA3, "max_position_embeddings": S})
        setup = Setup(attn_implementation="sdpa", micro_batch_size=rows, seq_len=S, gradient_checkpointing=True,
                      weights_dtype="bf16")
        priced = checkpointed_mask_bytes(spec, setup) + no_grad_forward_mask_bytes(spec, setup)
        assert meter.square_peaks["reference forward"][0] == priced == 4 * rows * S * S


def test_padded_dpo_pair_materialises_the_full_mask() -> None:
    meter, t = _trace("dpo", pad=64)
    rows = 2
    full = _square(meter.peaks, "recompute+backward block 5 (full_attention)", t)
    assert full == [("bitwise_and", "torch.bool", rows * S * S)] * 2 + [("where", "torch.bfloat16", 2 * rows * S * S)]
    assert meter.square_peaks["reference forward"][0] == 6 * rows * S * S   # both masks twice, one bias
