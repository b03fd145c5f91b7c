"""The batch finder keeps micro x accumulation x world == global in every path, OOMs included."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from perfguide.decisions import Decision
from perfguide.errors import PerfGuideError
from perfguide.hardware.types import CPU, Hardware
from perfguide.measure.batch_finder import find_micro_batch
from perfguide.memory.types import MemoryEstimate
from perfguide.model.types import ModelSpec
from perfguide.recommendation import Recommendation
from perfguide.scenarios.types import Request
from perfguide.setup import Setup
from perfguide.speed.types import Throughput

GiB = 2**30


def make_rec(global_batch: int, micro: int, world: int = 1, capacity: int = 10 * GiB) -> Recommendation:
    spec = ModelSpec(name="tiny", hidden_size=64, num_layers=2, num_attention_heads=4, num_key_value_heads=4, head_dim=16,
                     intermediate_size=128, vocab_size=256, total_params=100_000, embedding_params=16_384, lm_head_params=0)
    hw = Hardware(cpu=CPU(physical_cores=2, logical_cores=2, ram_total=24 * GiB, ram_available=20 * GiB))
    setup = Setup(micro_batch_size=micro, gradient_accumulation_steps=global_batch // (micro * world), num_gpus=world, seq_len=128)
    mem = MemoryEstimate(weights=GiB, gradients=GiB, optimizer_states=2 * GiB, activations=micro * 100 * 2**20,
                         peak_allocated=5 * GiB, peak_reserved=5 * GiB, device_total=6 * GiB, capacity=capacity)
    return Recommendation(
        request=Request(scenario="train_gpu_one", model=spec, hardware=hw, seq_len=128, global_batch_size=global_batch),
        setup=setup, memory=mem, throughput=Throughput(step_time_s=1.0, tokens_per_s=1.0),
        decisions=(Decision(setting="x", value=1, reason="test"),),
    )


def linear_device(intercept: int, per_sample: int, capacity: int):
    """A simulated device: memory grows linearly and raises a real torch OOM error past capacity."""
    calls: list[int] = []

    def step(mb: int) -> int:
        calls.append(mb)
        peak = intercept + per_sample * mb
        if peak > capacity:
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {per_sample} bytes")
        return peak

    return step, calls


def test_fit_recovers_the_line_and_picks_the_largest_safe_divisor():
    rec = make_rec(global_batch=64, micro=4, capacity=10 * GiB)
    step, calls = linear_device(intercept=4 * GiB, per_sample=GiB // 2, capacity=10 * GiB)
    choice = find_micro_batch(rec, step, headroom=0.1)
    # limit 9 GiB: 4 GiB + 0.5 GiB * mb <= 9 GiB -> mb <= 10; largest divisor of 64 is 8
    assert choice.micro_batch_size == 8 and choice.gradient_accumulation_steps == 8
    assert abs(choice.slope_bytes_per_sample - GiB / 2) < 1 and abs(choice.intercept_bytes - 4 * GiB) < 1
    assert calls == [4, 2]


def test_after_a_simulated_oom_the_global_batch_is_unchanged():
    rec = make_rec(global_batch=48, micro=16, world=1, capacity=10 * GiB)
    step, calls = linear_device(intercept=2 * GiB, per_sample=GiB, capacity=7 * GiB)
    choice = find_micro_batch(rec, step, limit_bytes=7 * GiB)
    assert calls[0] == 16  # the predicted size OOMs first
    assert any(p.peak_bytes is None for p in choice.probes)
    assert choice.micro_batch_size * choice.gradient_accumulation_steps * choice.world_size == 48
    assert 2 * GiB + GiB * choice.micro_batch_size <= 7 * GiB


def test_every_size_oom_is_a_clear_error():
    rec = make_rec(global_batch=8, micro=2)
    step, _ = linear_device(intercept=20 * GiB, per_sample=GiB, capacity=10 * GiB)
    with pytest.raises(PerfGuideError, match="ran out of memory"):
        find_micro_batch(rec, step)


def test_non_oom_errors_propagate():
    rec = make_rec(global_batch=8, micro=2)

    def broken(mb: int) -> int:
        raise RuntimeError("shape mismatch")

    with pytest.raises(RuntimeError, match="shape mismatch"):
        find_micro_batch(rec, broken)


@settings(max_examples=60, deadline=None)
@given(
    world=st.sampled_from([1, 2, 4, 8]),
    per_rank=st.integers(min_value=1, max_value=96),
    start_exp=st.integers(min_value=0, max_value=6),
    per_sample=st.integers(min_value=2**20, max_value=4 * GiB),
    capacity=st.integers(min_value=GiB, max_value=80 * GiB),
)
def test_global_batch_is_invariant(world, per_rank, start_exp, per_sample, capacity):
    global_batch = per_rank * world
    micro = max(d for d in range(1, per_rank + 1) if per_rank % d == 0 and d <= 2**start_exp)
    rec = make_rec(global_batch=global_batch, micro=micro, world=world, capacity=capacity)
    step, _ = linear_device(intercept=GiB // 2, per_sample=per_sample, capacity=capacity)
    try:
        choice = find_micro_batch(rec, step, limit_bytes=capacity)
    except PerfGuideError:
        assert GiB // 2 + per_sample > capacity  # only when even one sample cannot fit
        return
    assert choice.micro_batch_size * choice.gradient_accumulation_steps * choice.world_size == global_batch
    assert per_rank % choice.micro_batch_size == 0


# --- issue 26: never a size its own probe measured over the limit; a broken step function is one line ----------
def test_a_size_measured_over_the_limit_is_never_chosen():
    """Every probe measures 56 GiB against a 30 GiB limit: there is no safe size, so it says so (it returned 16)."""
    rec = make_rec(global_batch=16, micro=16, capacity=80 * GiB)
    with pytest.raises(PerfGuideError, match="over the limit"):
        find_micro_batch(rec, lambda mb: 56 * GiB, limit_bytes=30 * GiB)


def test_a_probe_over_the_limit_caps_the_choice_even_when_the_fit_says_under():
    """Memory that is not linear: 8 fits (10 GiB), 16 measured 56 GiB; a least-squares line through three points
    may pass under the limit at 16, the measurement does not."""
    rec = make_rec(global_batch=32, micro=16, capacity=80 * GiB)
    peaks = {16: 56 * GiB, 8: 10 * GiB, 4: 9 * GiB, 2: 8 * GiB, 1: 8 * GiB}
    choice = find_micro_batch(rec, lambda mb: peaks[mb], limit_bytes=30 * GiB)
    assert choice.micro_batch_size < 16
    assert all(p.peak_bytes <= 30 * GiB for p in choice.probes if p.micro_batch_size == choice.micro_batch_size)


@pytest.mark.parametrize("bad", [None, float("nan"), "12GB", -1, float("inf"), True])
def test_a_step_function_returning_no_number_is_one_clear_line(bad):
    rec = make_rec(global_batch=8, micro=2)
    with pytest.raises(PerfGuideError) as exc:
        find_micro_batch(rec, lambda mb: bad)
    assert "try_step" in str(exc.value) and "\n" not in str(exc.value)
