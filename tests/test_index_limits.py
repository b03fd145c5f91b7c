"""flash-attn 2's 32-bit index: past 2^31 elements of q an attention call crashes at any free memory.

The numbers are hand counts (q's elements = micro-batch x tokens x heads x head_dim / ranks that split the sequence)
against the published crash: ArcticTraining's run-h100-sp1-llama-8b.yml runs 500,000 tokens and records
'555000 # Triton Error [CUDA]: an illegal memory access' (calibration.json attention_index_limit_elements).
"""

from __future__ import annotations

import pytest

from perfguide import Setup
from perfguide.hardware.types import Hardware
from perfguide.memory import estimate_memory
from perfguide.memory.index_limits import index_overflow, longest_indexed, q_elements
from perfguide.model.types import ModelSpec
from perfguide.scenarios.search import broken_limit, fits

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"   # 32 heads x 128 = 4,096 wide q
QWEN3_32B = "Qwen/Qwen3-32B"                    # 64 heads x 128 = 8,192 wide q (hidden 5,120)


def _setup(seq_len: int, attn: str = "flash_attention_2", **kw: object) -> Setup:
    base: dict[str, object] = dict(seq_len=seq_len, attn_implementation=attn, weights_dtype="bf16", gradient_checkpointing=True)
    return Setup(**{**base, **kw})


@pytest.mark.parametrize(("model", "longest"), [(LLAMA_8B, 524_287), (QWEN3_32B, 262_143)])
def test_longest_length_is_the_last_below_2_to_the_31(model: str, longest: int) -> None:
    spec = ModelSpec.from_any(model)
    assert longest_indexed(spec, _setup(1024)) == longest
    assert index_overflow(spec, _setup(longest)) is None
    assert index_overflow(spec, _setup(longest + 1)) is not None


def test_the_published_crash_and_the_published_run() -> None:
    spec = ModelSpec.from_any(LLAMA_8B)
    assert q_elements(spec, _setup(500_000)) == 2_048_000_000 < 2**31
    assert q_elements(spec, _setup(555_000)) == 2_273_280_000 >= 2**31
    assert index_overflow(spec, _setup(500_000)) is None
    assert "2,273,280,000 elements >= 2^31" in str(index_overflow(spec, _setup(555_000)))


def test_a_sequence_split_and_the_micro_batch_scale_the_reach() -> None:
    """Ulysses gives each rank the whole sequence for heads / sp heads: 8 ranks reach 8x the tokens; a batch of 2
    holds twice the elements per call."""
    spec = ModelSpec.from_any(LLAMA_8B)
    split = _setup(4_000_000, strategy="zero3", num_gpus=8, sequence_parallel=8)
    assert q_elements(spec, split) == 4_000_000 * 4096 // 8
    assert index_overflow(spec, split) is None and index_overflow(spec, split.replace(seq_len=4_200_000)) is not None
    assert longest_indexed(spec, _setup(1024, micro_batch_size=2)) == (2**31 - 1) // (2 * 4096)


@pytest.mark.parametrize("attn", ["flash_attention_3", "sdpa"])
def test_other_kernels_are_not_limited(attn: str) -> None:
    spec = ModelSpec.from_any(LLAMA_8B)
    assert index_overflow(spec, _setup(1_200_000, attn)) is None and longest_indexed(spec, _setup(1024, attn)) is None


def test_the_estimate_and_the_plan_search_judge_it_not_to_fit() -> None:
    spec, hw = ModelSpec.from_any(LLAMA_8B), Hardware.from_name("h200")
    past = estimate_memory(spec, _setup(600_000, activation_offloading=True, offload_optimizer=True, offload_params=True,
                                        strategy="zero3"), hw)
    assert past.kernel_limit is not None and not past.fits and past.kernel_limit in past.notes
    assert not fits(past, hw, 0.0) and broken_limit(past, hw, 0.0)[0] == past.kernel_limit
    fa3 = estimate_memory(spec, _setup(600_000, "flash_attention_3", activation_offloading=True, offload_optimizer=True,
                                       offload_params=True, strategy="zero3"), hw)
    assert fa3.kernel_limit is None


def test_activation_offload_host_ram_is_the_nodes() -> None:
    """Every rank of a node offloads its own checkpointed inputs: the node's host RAM grows by ranks x one rank's."""
    spec, hw = ModelSpec.from_any(LLAMA_8B), Hardware.from_name("h100-80gb:8")

    def offloaded(num_gpus: int) -> int:
        s = _setup(65_536, "sdpa", strategy="zero3", num_gpus=num_gpus)
        return estimate_memory(spec, s.replace(activation_offloading=True), hw).cpu_ram - estimate_memory(spec, s, hw).cpu_ram

    one = offloaded(1)
    assert one > 0 and offloaded(8) == 8 * one


def test_flash_attention_2_is_not_chosen_unasked_past_its_reach(monkeypatch: pytest.MonkeyPatch) -> None:
    """A local plan with flash-attn installed takes it unasked, but not for a sequence it cannot index: SDPA then."""
    from perfguide.scenarios import rules_attention

    monkeypatch.setattr(rules_attention, "flash_attn_available", lambda: True)
    spec, gpu = ModelSpec.from_any(LLAMA_8B), Hardware.from_name("h100-80gb").gpus[0]
    short = rules_attention.decide_attention(spec, None, gpu, "bf16", local=True, seq_len=8192)
    long = rules_attention.decide_attention(spec, None, gpu, "bf16", local=True, seq_len=600_000)
    assert short.value == "flash_attention_2" and long.value == "sdpa"
    assert any("32-bit offsets" in a.why_not for a in long.alternatives)


def test_flash_attention_3_is_chosen_unasked_where_it_is_installed_on_a_hopper(monkeypatch: pytest.MonkeyPatch) -> None:
    """A local plan takes what is installed: FA3 on a Hopper card that has flash_attn_interface, never elsewhere."""
    from perfguide.scenarios import rules_attention

    monkeypatch.setattr(rules_attention, "flash_attn_3_available", lambda: True)
    spec = ModelSpec.from_any(LLAMA_8B)
    h100, a100 = Hardware.from_name("h100-80gb").gpus[0], Hardware.from_name("a100-80gb").gpus[0]
    assert rules_attention.decide_attention(spec, None, h100, "bf16", local=True, seq_len=600_000).value == "flash_attention_3"
    assert rules_attention.decide_attention(spec, None, a100, "bf16", local=True, seq_len=8192).value != "flash_attention_3"
    assert rules_attention.decide_attention(spec, None, h100, "bf16", local=False, seq_len=8192).value == "sdpa"
    monkeypatch.setattr(rules_attention, "flash_attn_3_available", lambda: False)
    assert rules_attention.decide_attention(spec, None, h100, "bf16", local=True, seq_len=8192).value != "flash_attention_3"
