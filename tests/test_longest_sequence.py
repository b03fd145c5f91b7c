"""A training plan that does not fit at the requested length names the longest multiple of 256 that does, at the same
global batch: asked for, that length fits and 256 tokens more does not."""

from __future__ import annotations

import re

import pytest

import perfguide

CASES = [("meta-llama/Llama-3.1-8B", "rtx4090", "qlora", 65536), ("mistralai/Mistral-Small-24B-Instruct-2501", "rtx4090", "qlora", 16384)]


@pytest.mark.parametrize(("model", "hardware", "finetune", "seq_len"), CASES)
def test_the_longest_sequence_named_is_the_boundary(model: str, hardware: str, finetune: str, seq_len: int) -> None:
    rec = perfguide.recommend(model, "train_gpu_one", hardware=hardware, finetune=finetune, seq_len=seq_len)
    assert not rec.fits and rec.request.seq_len == seq_len          # the request is kept as asked
    line = next(s for s in rec.suggestions if s.startswith("seq_len="))
    longest = int(re.match(r"seq_len=(\d+)", line).group(1))
    assert longest % 256 == 0 and 256 <= longest < seq_len
    assert perfguide.recommend(model, "train_gpu_one", hardware=hardware, finetune=finetune, seq_len=longest).fits
    assert not perfguide.recommend(model, "train_gpu_one", hardware=hardware, finetune=finetune, seq_len=longest + 256).fits


def test_no_length_is_offered_below_the_grid() -> None:
    rec = perfguide.recommend("meta-llama/Llama-3.1-70B", "train_gpu_one", hardware="t4", finetune="full", seq_len=256)
    assert not rec.fits and not any(s.startswith("seq_len=") for s in rec.suggestions)


def test_a_model_too_big_at_any_length_gets_no_length() -> None:
    """The search tries the shortest length as soon as the middle one fails, and stops there when even it does not fit."""
    kw = {"scenario": "train_gpu_many", "hardware": "a100-80gb:8", "finetune": "full"}
    rec = perfguide.recommend("meta-llama/Llama-3.1-405B", seq_len=4096, **kw)
    assert not rec.fits and not any(s.startswith("seq_len=") for s in rec.suggestions)
    assert not perfguide.recommend("meta-llama/Llama-3.1-405B", seq_len=256, **kw).fits
