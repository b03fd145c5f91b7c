"""fp8's cost from what torchao really runs (issue 11 item 8): the eager dynamic cast traced op by op on CPU (bytes per
element, kernels per cast) against the constants the speed model uses; fp8 GEMMs never credited with more than the 2x
of their peak; and small models, where the casts cost more than the GEMMs save, never get fp8."""

from __future__ import annotations

import pytest

import perfguide as pg
from perfguide import Hardware, ModelSpec, Setup
from perfguide.data.techniques import constant
from perfguide.speed import estimate_speed

torch = pytest.importorskip("torch")
pytest.importorskip("torchao")


def _trace_cast():
    """(kernels, bytes read + written per element) of torchao's eager dynamic tensorwise cast of one bf16 operand."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves
    from torchao.float8.float8_scaling_utils import hp_tensor_to_float8_dynamic
    from torchao.float8.float8_training_tensor import LinearMMConfig

    def nbytes(x):
        return x.numel() * x.element_size() if isinstance(x, torch.Tensor) else 0

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.kernels, self.moved = 0, 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            self.kernels += 1
            self.moved += sum(nbytes(a) for a in tree_leaves((args, kwargs))) + sum(nbytes(o) for o in tree_leaves(out))
            return out

    x = torch.randn(512, 1024, dtype=torch.bfloat16)
    with Count() as c:
        hp_tensor_to_float8_dynamic(x, torch.float8_e4m3fn, LinearMMConfig())
    return c.kernels, c.moved / x.numel()


def test_eager_cast_constants_match_torchaos_ops():
    kernels, per_element = _trace_cast()
    assert constant("fp8_cast_bytes_per_element_eager") == pytest.approx(per_element, abs=0.5)
    # three casts (input, weight, grad_output) per Linear plus the two transposed copies of the backward GEMMs
    assert constant("fp8_cast_kernels_per_linear") == 3 * kernels + 2
    assert constant("fp8_cast_bytes_per_element") < per_element   # fused under torch.compile


def _ratio(model: str, hw: str, mb: int, compiled: bool) -> float:
    spec, h = ModelSpec.from_any(model), Hardware.from_name(hw)
    base = dict(device="cuda", seq_len=2048, micro_batch_size=mb, weights_dtype="fp32", optimizer="adamw_torch_fused", torch_compile=compiled)
    bf16, fp8 = (estimate_speed(spec, Setup(**base, autocast=a), h).step_time_s for a in ("bf16", "fp8"))
    return bf16 / fp8


def test_fp8_never_credited_beyond_its_peak_ratio():
    """Even a GEMM-dominated step (8B, large batch, compiled casts) gains less than the fp8/bf16 peak ratio (2x on H100)."""
    h100 = Hardware.from_name("h100-80gb").gpus[0]
    assert _ratio("meta-llama/Llama-3.1-8B", "h100-80gb", 8, True) < h100.fp8_tflops / h100.half_tflops("bf16")


def test_eager_casts_cost_more_than_compiled_ones():
    assert _ratio("meta-llama/Llama-3.1-8B", "h100-80gb", 4, False) < _ratio("meta-llama/Llama-3.1-8B", "h100-80gb", 4, True)


@pytest.mark.parametrize("hw", ["h100-80gb", "mi300x"])
def test_small_model_never_gets_fp8(hw):
    rec = pg.recommend("gpt2", scenario="train_gpu_one", hardware=hw)
    assert rec.setup.autocast != "fp8"
    assert _ratio("gpt2", hw, rec.setup.micro_batch_size, False) < 1.0   # and it would lose there


def test_width_penalty_hand_formula():
    """sat(x) = x / (x + half): fp8 at width h fills like bf16 at h/2, so the ratio is sat(h/2) / sat(h)."""
    from perfguide.techniques.fp8 import width_penalty

    half = 256.0
    for h in (768, 4096, 16384):
        sat = lambda x: x / (x + half)  # noqa: E731
        assert width_penalty(h, half) == pytest.approx(sat(h / 2) / sat(h))
    assert width_penalty(768, half) < width_penalty(4096, half) < 1.0
