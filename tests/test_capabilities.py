"""Rules read a card's capability flags, never its CUDA compute capability, so a non-NVIDIA card is just data.

The thresholds checked for the NVIDIA rule are the published ones: bf16/TF32 from Ampere (transformers
``is_torch_tf32_available`` needs major >= 8), fp8 from Ada (8.9), bitsandbytes 4-bit from 6.0 and LLM.int8() from
7.5 (bitsandbytes 0.50 installation guide).
"""

from __future__ import annotations

import json

import pytest
from helpers import damaged_data
from pydantic import ValidationError
from test_speed import A100, CPU32, gpt2

from perfguide.errors import ConflictingConstraintsError
from perfguide.hardware import specs
from perfguide.hardware.types import GPU, Capabilities, Hardware
from perfguide.scenarios.train_gpu_one import plan
from perfguide.scenarios.types import Constraints, Request


def _plan(gpu: GPU, **cons: object):
    hw = Hardware(gpus=(gpu,), cpu=CPU32, source="named", name=gpu.name)
    return plan(Request(scenario="train_gpu_one", model=gpt2(), hardware=hw, seq_len=512, global_batch_size=8,
                        constraints=Constraints(**cons)))


@pytest.mark.parametrize(("cc", "bf16", "fp8", "fp16", "bnb", "int8"), [
    ((6, 0), False, False, False, True, False),  # P100: bnb 4-bit yes, LLM.int8 no
    ((7, 0), False, False, True, True, False),   # V100
    ((7, 5), False, False, True, True, True),    # T4
    ((8, 0), True, False, True, True, True),     # A100
    ((8, 9), True, True, True, True, True),      # L4 / RTX 4090
    ((10, 0), True, True, True, True, True),     # B200
])
def test_nvidia_rule_matches_published_thresholds(cc, bf16, fp8, fp16, bnb, int8) -> None:
    c = Capabilities.from_compute_capability(cc)
    assert (c.bf16, c.tf32, c.fp8, c.fp16, c.bitsandbytes, c.llm_int8) == (bf16, bf16, fp8, fp16, bnb, int8)


def test_a_hand_built_nvidia_gpu_gets_its_generations_flags() -> None:
    t4 = GPU(name="Tesla T4", memory_total=16 * 2**30, memory_free=16 * 2**30, compute_capability=(7, 5))
    assert not t4.supports_bf16 and t4.has_tensor_cores and not t4.supports_flash_attention and t4.generation == "cc 7.5"


def test_a_non_nvidia_gpu_must_say_what_it_can_do() -> None:
    with pytest.raises(ValidationError, match="explicit capabilities"):
        GPU(name="MI300X", vendor="amd", memory_total=2**30, memory_free=2**30)
    with pytest.raises(ValidationError, match="needs its efficiency_class and attention_class"):
        GPU(name="MI300X", vendor="amd", memory_total=2**30, memory_free=2**30, capabilities=Capabilities(bf16=True, fp16=True))


def test_flags_decide_not_the_compute_capability() -> None:
    # same cc 8.0 as the A100, but a card whose row says no bf16 and no tf32: the plan must follow the flags
    odd = A100.model_copy(update={"capabilities": Capabilities(fp16=True)})
    s = _plan(odd).setup
    assert (s.autocast, s.tf32) == ("fp16", False)
    with pytest.raises(ConflictingConstraintsError, match="flash-attn supports"):
        _plan(odd, attn_implementation="flash_attention_2")


def test_an_amd_card_plans_bf16_without_tf32() -> None:
    # ROCm: bf16 matrix cores, but transformers refuses tf32=True without torch.version.cuda
    amd = GPU(name="mi-like", vendor="amd", memory_total=80 * 2**30, memory_free=80 * 2**30, bf16_tflops=1000, fp32_tflops=160,
              capabilities=Capabilities(bf16=True, fp16=True, fp8=True, flash_attention=True), efficiency_class="cdna",
              attention_class="cdna")
    s = _plan(amd).setup
    assert (s.autocast, s.tf32) == ("bf16", False)
    assert amd.generation == "AMD"


def test_every_table_row_is_validated_and_nvidia_rows_agree_with_the_rule() -> None:
    for key in specs.canonical_names():
        row = specs.entry(key)
        if row.vendor == "nvidia":
            assert row.capabilities == Capabilities.from_compute_capability(row.compute_capability), key
        gpu = specs.gpu_from_spec(key)
        assert gpu.capabilities == row.capabilities and gpu.vendor == row.vendor


def test_a_bad_row_fails_at_load(monkeypatch: pytest.MonkeyPatch) -> None:
    from perfguide import _data
    from perfguide.errors import DataFileError

    real = _data.load
    raw = json.loads(json.dumps(real("gpus")))
    raw["gpus"]["a100-80gb"]["capabilities"]["bf16"] = "maybe"
    monkeypatch.setattr(_data, "load", lambda name: raw if name == "gpus" else real(name))
    _data.validated.cache_clear()
    try:
        with pytest.raises(DataFileError, match=r"gpus\.json .*gpus\.a100-80gb\.capabilities\.bf16") as exc:
            specs.entry("a100-80gb")
        assert "\n" not in str(exc.value)
    finally:
        _data.validated.cache_clear()


@pytest.mark.parametrize(("edit", "where"), [
    (lambda raw: raw["nodes"]["dgx-a100"].update(gpu="a100-999gb"), "a100-999gb"),
    (lambda raw: raw["network"].update(inter_node_bandwidth_gbps="fast"), "network.inter_node_bandwidth_gbps"),
    (lambda raw: raw["cpu"].pop("ram_gib"), "cpu.ram_gib"),
])
def test_every_part_of_gpus_json_is_validated_at_load(monkeypatch: pytest.MonkeyPatch, edit: object, where: str) -> None:
    """One loader for the whole file: node rows, the default host and the network row fail at load like a GPU row."""
    from perfguide.errors import DataFileError

    with damaged_data(monkeypatch, "gpus", edit), pytest.raises(DataFileError, match=where):  # type: ignore[arg-type]
        specs.canonical_names()


def test_flash_attention_3_is_asked_of_the_card() -> None:
    """FlashAttention-3 is flash-attn's Hopper build: the NVIDIA rule grants it at 9.x only, and a forced
    flash_attention_3 on an A100 is one line naming what it needs."""
    assert [Capabilities.from_compute_capability(cc).flash_attention_3 for cc in ((8, 0), (8, 9), (9, 0), (10, 0))] == [
        False, False, True, False]
    with pytest.raises(ConflictingConstraintsError, match="Hopper build"):
        _plan(A100, attn_implementation="flash_attention_3")
