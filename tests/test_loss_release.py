"""The installed transformers release decides the loss-path copies a plan is priced with (issue 24, logits and
loss): 4.46-4.48 keep the 16-bit head logits, the fp32 upcast and its shift copy at batch > 1, 14 B per logit
where the traced release keeps 12; every other case is the traced term unchanged."""

from __future__ import annotations

import pytest

from perfguide.memory import analytic, loss_path
from perfguide.model.types import ModelSpec
from perfguide.setup import Setup

V = 50257  # gpt2's vocabulary


def _setup(batch: int, dtype: str = "bf16") -> Setup:
    return Setup(task="train", weights_dtype=dtype, micro_batch_size=batch, seq_len=128, optimizer="adamw_torch")  # type: ignore[arg-type]


@pytest.mark.parametrize(("release", "batch", "dtype", "units"), [
    ("4.47.1", 2, "bf16", 14 - 12),  # 2 (head) + 4 (upcast) + 4 (shift copy) + 4 (log-softmax) vs 12 at backward
    ("4.47.1", 1, "bf16", 0),        # one row minus its last position is already contiguous: no shift copy
    ("4.47.1", 2, "fp32", 0),        # fp32 head: no separate upcast, 4 + 4 + 4 = 12
    ("4.44.0", 2, "bf16", 0),        # the output holds the fp32 upcast: 4 + 4 + 4 = 12
    ("5.24.0", 2, "bf16", 0),        # the traced release itself
])
def test_release_delta_by_hand(release: str, batch: int, dtype: str, units: int) -> None:
    spec = ModelSpec.from_any("openai-community/gpt2")
    assert loss_path.release_delta_bytes(spec, _setup(batch, dtype), release) == units * batch * 128 * V


def test_training_memory_prices_the_installed_release(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = ModelSpec.from_any("openai-community/gpt2")
    setup = _setup(2)
    monkeypatch.setattr(analytic, "installed_transformers", lambda: "5.24.0")
    current = analytic.training_memory(spec, setup)
    monkeypatch.setattr(analytic, "installed_transformers", lambda: "4.47.1")
    older = analytic.training_memory(spec, setup)
    assert older.logits - current.logits == 2 * 2 * 128 * V
    assert any("transformers 4.47.1" in n for n in older.notes)
