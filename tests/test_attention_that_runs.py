"""estimate / estimate_speed price the attention transformers will run: a class that refuses SDPA (Gemma 2's
soft-capped scores; transformers 5.24 modeling_gemma2.py `_supports_sdpa = False`) loads eager when the user names no
kernel, and naming SDPA for it is refused in one line instead of priced as if it ran."""

from __future__ import annotations

import pytest

import perfguide
from perfguide import Hardware, InvalidSetupError, LoraSpec, Setup

GEMMA2_9B = "google/gemma-2-9b"


def _setup(**kw: object) -> Setup:
    fields: dict[str, object] = dict(task="train", micro_batch_size=1, seq_len=4096, weights_dtype="nf4",
                                     gradient_checkpointing=True, lora=LoraSpec(r=16), optimizer="adamw_torch")
    fields.update(kw)
    return Setup(**fields)  # type: ignore[arg-type]


def test_a_class_without_sdpa_is_priced_with_the_eager_attention_it_loads() -> None:
    default = perfguide.estimate(GEMMA2_9B, _setup(), hardware="a100-80gb")
    eager = perfguide.estimate(GEMMA2_9B, _setup(attn_implementation="eager"), hardware="a100-80gb")
    assert default.peak_allocated == eager.peak_allocated
    assert any("eager" in n and "refuses SDPA" in n for n in default.notes)
    # and not as SDPA would price it (the memory layer below the API prices whatever kernel it is given)
    from perfguide.memory import estimate_memory

    as_sdpa = estimate_memory(perfguide.ModelSpec.from_any(GEMMA2_9B), _setup(), Hardware.from_name("a100-80gb"))
    assert as_sdpa.peak_allocated < default.peak_allocated


def test_naming_sdpa_for_such_a_class_is_one_clear_line() -> None:
    with pytest.raises(InvalidSetupError, match=r"attn_implementation='sdpa' is refused by .*gemma-2-9b") as info:
        perfguide.estimate(GEMMA2_9B, _setup(attn_implementation="sdpa"), hardware="a100-80gb")
    assert "\n" not in str(info.value)
    with pytest.raises(InvalidSetupError):
        perfguide.estimate_speed(GEMMA2_9B, _setup(attn_implementation="sdpa"), hardware="a100-80gb")


def test_a_class_with_sdpa_keeps_it() -> None:
    est = perfguide.estimate("meta-llama/Llama-3.1-8B", _setup(), hardware="a100-80gb")
    assert not any("refuses SDPA" in n for n in est.notes)
