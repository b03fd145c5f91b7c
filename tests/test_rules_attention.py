"""Attention is decided by one rule (scenarios/rules_attention.py) for training and inference."""

from __future__ import annotations

import pytest

from perfguide import Hardware, ModelSpec, recommend
from perfguide.errors import ConflictingConstraintsError
from perfguide.scenarios import rules_attention


def _attn(rec):
    return next(d for d in rec.decisions if d.setting == "attn_implementation")


@pytest.mark.parametrize("scenario", ["train_gpu_one", "infer_gpu_one"])
def test_a_named_gpu_is_not_judged_by_the_planning_machines_packages(scenario: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """flash-attn installed here says nothing about a rented A100: SDPA, and the reason says the target is unknown."""
    monkeypatch.setattr(rules_attention, "flash_attn_available", lambda: True)
    d = _attn(recommend("meta-llama/Llama-3.1-8B", scenario, hardware="a100-80gb", seq_len=512, global_batch_size=8))
    assert d.value == "sdpa"
    assert "named GPU" in next(a.why_not for a in d.alternatives if a.value == "flash_attention_2")


def test_flash_attention_is_chosen_on_this_machine_only_with_the_package_card_and_16_bit_compute(
        monkeypatch: pytest.MonkeyPatch) -> None:
    spec = ModelSpec.from_any("meta-llama/Llama-3.1-8B")
    a100 = Hardware.from_name("a100-80gb").gpus[0]
    t4 = Hardware.from_name("t4").gpus[0]
    monkeypatch.setattr(rules_attention, "flash_attn_available", lambda: True)
    assert rules_attention.decide_attention(spec, None, a100, "bf16", local=True).value == "flash_attention_2"
    assert rules_attention.decide_attention(spec, None, a100, None, local=True).value == "sdpa"      # fp32 compute
    assert rules_attention.decide_attention(spec, None, t4, "fp16", local=True).value == "sdpa"      # Turing
    monkeypatch.setattr(rules_attention, "flash_attn_available", lambda: False)
    assert rules_attention.decide_attention(spec, None, a100, "bf16", local=True).value == "sdpa"


@pytest.mark.parametrize("scenario", ["train_gpu_one", "infer_gpu_one"])
def test_forced_flash_attention_on_a_t4_is_refused_the_same_way(scenario: str) -> None:
    with pytest.raises(ConflictingConstraintsError, match="flash_attention_2.*t4"):
        recommend("gpt2", scenario, hardware="t4", attn_implementation="flash_attention_2")
