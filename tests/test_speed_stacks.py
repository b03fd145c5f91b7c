"""The speed model's encoder-decoder lengths (perfguide/speed/stacks.py), against FLOPs counted by hand from
t5-small's shapes (d_model 512, d_ff 2048, 8 heads x 64, 6 + 6 layers, tied 32,128-token head): the encoder's
blocks at the source length S, the decoder's self-attention, FFN, cross-attention q / o and the head at the target
length T, the cross-attention's k / v on the encoder output at S; scores S^2 per encoder layer, T^2 + T x S per
decoder layer."""

from __future__ import annotations

import pytest

from perfguide import Setup, estimate_speed
from perfguide.hardware.types import CPU, GPU, Hardware
from perfguide.model.resolve import spec_from_any

GiB = 2**30
A100 = GPU(name="A100-SXM4-80GB", memory_total=80 * GiB, memory_free=80 * GiB, compute_capability=(8, 0), bf16_tflops=312,
           fp16_tflops=312, tf32_tflops=156, fp32_tflops=19.5, memory_bandwidth_gbps=2039)
HOST = CPU(model_name="test cpu", physical_cores=32, logical_cores=64, ram_total=512 * GiB, ram_available=500 * GiB, fp32_gflops=2000.0)
MACHINE = Hardware(gpus=(A100,), cpu=HOST, interconnect="none", source="named")

D, FF, LAYERS, VOCAB = 512, 2048, 6, 32128
SELF_FFN = 4 * D * D + 2 * D * FF       # q, k, v, o and wi, wo of one block
CROSS_HALF = 2 * D * D                   # the cross-attention's q + o (at T), or its k + v (at S)
NORMS_AND_BIAS = 16_896                  # layer-norm weights and relative-position tables (counted, run per token)


def forward_matmul(source: int, target: int) -> float:
    at_source = LAYERS * SELF_FFN + LAYERS * CROSS_HALF + NORMS_AND_BIAS
    at_target = LAYERS * SELF_FFN + LAYERS * CROSS_HALF + VOCAB * D
    return 2.0 * (at_source * source + at_target * target)


def forward_scores(source: int, target: int) -> float:
    return 4.0 * (8 * 64) * (LAYERS * source ** 2 + LAYERS * (target ** 2 + target * source))


def _flops(**kw: object) -> float:
    setup = Setup(weights_dtype="fp32", autocast="bf16", micro_batch_size=1, **kw)  # type: ignore[arg-type]
    return estimate_speed(spec_from_any("google-t5/t5-small"), setup, hardware=MACHINE).flops_per_step


@pytest.mark.parametrize("source, target", [(512, 128), (64, 256)])
def test_each_stack_runs_its_own_length(source: int, target: int) -> None:
    """Full fine-tuning, no checkpointing: forward + backward (2x) + weight gradients (1x) of every matmul, and three
    passes over the scores."""
    flops = _flops(seq_len=source, target_len=target)
    assert flops == pytest.approx(3 * forward_matmul(source, target) + 3 * forward_scores(source, target), rel=1e-9)


def test_equal_lengths_count_the_cross_attention_scores() -> None:
    flops = _flops(seq_len=256)
    assert flops == pytest.approx(3 * forward_matmul(256, 256) + 3 * forward_scores(256, 256), rel=1e-9)


def test_recompute_reruns_the_blocks_at_their_lengths() -> None:
    """Checkpointing re-runs each block's forward at its stack's length, never the head."""
    plain = _flops(seq_len=512, target_len=128)
    ckpt = _flops(seq_len=512, target_len=128, gradient_checkpointing=True)
    blocks = forward_matmul(512, 128) - 2.0 * VOCAB * D * 128
    assert ckpt - plain == pytest.approx(blocks + forward_scores(512, 128), rel=1e-9)


def test_a_shorter_target_is_faster() -> None:
    spec = spec_from_any("google-t5/t5-small")
    long = estimate_speed(spec, Setup(seq_len=512, micro_batch_size=8), hardware=MACHINE)
    short = estimate_speed(spec, Setup(seq_len=512, target_len=64, micro_batch_size=8), hardware=MACHINE)
    assert short.step_time_s < long.step_time_s
