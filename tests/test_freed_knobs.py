"""A plan that does not fit because of what the request forces (a micro-batch, checkpointing off) says which value
fits at the same global batch, and that value, asked for, fits; a card of the same nominal size is never offered as
the bigger one."""

from __future__ import annotations

import re

import perfguide
from perfguide.hardware.types import Hardware

QWEN3_8B = "Qwen/Qwen3-8B"


def _suggestion(rec: perfguide.Recommendation, start: str) -> str:
    lines = [s for s in rec.suggestions if s.startswith(start)]
    assert lines, rec.suggestions
    return lines[0]


def test_forced_micro_batch_names_the_one_that_fits_and_it_does() -> None:
    rec = perfguide.recommend(QWEN3_8B, "train_gpu_one", hardware="rtx4090", finetune="lora", micro_batch_size=16, seq_len=4096)
    assert not rec.fits and rec.setup.micro_batch_size == 16       # the request is kept, not replaced
    line = _suggestion(rec, "micro_batch_size=")
    micro = int(re.match(r"micro_batch_size=(\d+)", line).group(1))
    assert micro < 16 and "global batch 32 kept" in line
    again = perfguide.recommend(QWEN3_8B, "train_gpu_one", hardware="rtx4090", finetune="lora", micro_batch_size=micro, seq_len=4096)
    assert again.fits and again.setup.micro_batch_size == micro
    assert not any("rtx3090" in s for s in rec.suggestions)       # same 24 GB class: no answer to a forced micro-batch


def test_forced_checkpointing_off_on_two_gpus() -> None:
    rec = perfguide.recommend(QWEN3_8B, "train_gpu_many", hardware="rtx4090:2", finetune="lora", micro_batch_size=16,
                              gradient_checkpointing=False, seq_len=4096)
    assert not rec.fits and rec.setup.gradient_checkpointing is False
    line = _suggestion(rec, "gradient_checkpointing=True, micro_batch_size=")
    micro = int(re.search(r"micro_batch_size=(\d+) fits", line).group(1))
    again = perfguide.recommend(QWEN3_8B, "train_gpu_many", hardware="rtx4090:2", finetune="lora", micro_batch_size=micro,
                                gradient_checkpointing=True, seq_len=4096)
    assert again.fits


def test_a_bigger_gpu_is_bigger_than_its_class() -> None:
    """gpt2 fits every card: the 'smallest bigger' one is the first of a larger class, not the RTX 3090 (12 MiB more)."""
    from perfguide.model.resolve import spec_from_any
    from perfguide.scenarios.search import bigger_gpu
    from perfguide.setup import Setup

    hw = Hardware.from_name("rtx4090")
    found = bigger_gpu(spec_from_any("gpt2"), Setup(task="train", device="cuda", seq_len=128), hw, 0.1)
    assert found is not None
    assert Hardware.from_name(found[0]).gpus[0].memory_total >= 1.05 * hw.gpus[0].memory_total, found[0]
