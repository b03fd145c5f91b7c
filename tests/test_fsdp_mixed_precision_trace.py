"""FSDP mixed precision over fp32 weights, traced on two real gloo ranks (scripts/trace_fsdp_mixed_precision.py) as
accelerate builds it (FSDP1 MixedPrecision and FSDP2 MixedPrecisionPolicy, param_dtype bf16, forward under autocast),
against what perfguide prices: the activations of a bf16 model, no weight casts.

Hand count of the traced Llama (h 48, FFN 136, 2 blocks, 4 heads of 12, 2 KV heads, vocab 200, untied): a block's
Linears are q and o 48 x 48, k and v 24 x 48, gate and up 136 x 48, down 48 x 136: 2 x 2,304 + 2 x 1,152 + 3 x 6,528
= 26,496, so 52,992 in the blocks; the LM head 200 x 48 = 9,600. Plain AMP (fp32 weights, autocast) saves a bf16 cast
of every one of them for backward: 2 x (52,992 + 9,600) = 125,184 B.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import script_trace

from perfguide.memory import activations as act
from perfguide.memory.analytic import training_memory
from perfguide.memory.autocast_copies import head_cast_bytes
from perfguide.model.linears import linear_params
from perfguide.model.types import ModelSpec
from perfguide.setup import Setup

ROOT = Path(__file__).resolve().parents[1]
BLOCK_LINEARS = 2 * (2 * 48 * 48 + 2 * 24 * 48 + 3 * 136 * 48)
HEAD = 200 * 48
AMP_CASTS = 2 * (BLOCK_LINEARS + HEAD)


def _traced_model() -> tuple[ModelSpec, dict[str, Any]]:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from trace_fsdp_mixed_precision import CONFIG, B, S
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    spec = ModelSpec.from_any({"model_type": "llama", "architectures": ["LlamaForCausalLM"], **CONFIG})
    return spec, dict(task="train", micro_batch_size=B, seq_len=S, attn_implementation="eager", optimizer="adamw_torch")


@pytest.fixture(scope="module")
def traced() -> dict[str, Any]:
    result: dict[str, Any] = script_trace("trace_fsdp_mixed_precision")
    return result


def test_hand_count_and_amp_casts_priced() -> None:
    spec, kw = _traced_model()
    assert BLOCK_LINEARS == linear_params(spec) == 52_992 and AMP_CASTS == 125_184
    amp = Setup(weights_dtype="fp32", autocast="bf16", **kw)
    assert act.regime(amp) == "amp"
    assert linear_params(spec) * 2 + head_cast_bytes(spec, amp) == AMP_CASTS   # analytic's weight_casts + the head's


@pytest.mark.parametrize("version", [1, 2])
def test_fsdp_mixed_precision_is_priced_as_a_16bit_model(version: int) -> None:
    """fp32 weights + bf16 autocast under FSDP: the "half" regime, no weight casts, no head cast, so the same
    activation bytes as the model stored in bf16 (what the trace shows); plain AMP on one GPU keeps its casts."""
    spec, kw = _traced_model()
    mixed = Setup(weights_dtype="fp32", autocast="bf16", strategy="fsdp", fsdp_version=version, num_gpus=2, **kw)
    bf16 = Setup(weights_dtype="bf16", strategy="fsdp", fsdp_version=version, num_gpus=2, **kw)
    assert mixed.computes_on_16bit_copy and act.regime(mixed) == "half" and head_cast_bytes(spec, mixed) == 0
    assert training_memory(spec, mixed).activations == training_memory(spec, bf16).activations
    amp = training_memory(spec, Setup(weights_dtype="fp32", autocast="bf16", **kw)).activations
    assert amp - training_memory(spec, Setup(weights_dtype="bf16", **kw)).activations >= AMP_CASTS


@pytest.mark.parametrize("version", [1, 2])
def test_fsdp_fp8_training_gathers_the_same_16bit_copy(version: int) -> None:
    """fp8 training under FSDP (torchtitan's float8 recipes: FSDP2 with param_dtype bf16, only the float8 Linears'
    GEMMs cast to fp8) runs on the gathered bf16 unit as bf16 mixed precision does: no fp32 stream, no weight or head
    casts, so fp32 master weights price the same activations as bf16 ones (61e5f6c had left fp8 on plain AMP's casts)."""
    spec, kw = _traced_model()
    fp8 = Setup(weights_dtype="fp32", autocast="fp8", strategy="fsdp", fsdp_version=version, num_gpus=2, **kw)
    on_bf16 = Setup(weights_dtype="bf16", autocast="fp8", strategy="fsdp", fsdp_version=version, num_gpus=2, **kw)
    assert fp8.computes_on_16bit_copy and act.regime(fp8) == "half" and head_cast_bytes(spec, fp8) == 0
    assert training_memory(spec, fp8).activations == training_memory(spec, on_bf16).activations


@pytest.mark.slow
def test_traced_amp_saves_every_linear_cast(traced: dict[str, Any]) -> None:
    """The reference run: plain AMP saves the hand-counted bf16 copy of every Linear and runs them on fp32 weights."""
    assert traced["amp"]["saved"]["weight_copy:bfloat16"] == AMP_CASTS
    assert traced["amp"]["linear_weight_dtypes"] == ["torch.float32"]


@pytest.mark.slow
@pytest.mark.parametrize("run", ["fsdp1", "fsdp2"])
def test_traced_fsdp_mixed_precision_saves_what_a_bf16_model_saves(traced: dict[str, Any], run: str) -> None:
    """accelerate's FSDP mixed precision: every Linear runs on the bf16 gathered unit, autocast casts no weight, and the
    activations saved for backward are the bf16 model's, dtype by dtype (the gathered views are FSDP's unit buffers,
    freed as it reshards, which sharding.py prices as the gather)."""
    saved = dict(traced[run]["saved"])
    assert traced[run]["linear_weight_dtypes"] == ["torch.bfloat16"]
    assert not any(k.startswith("weight_copy") for k in saved)
    assert saved.pop("gathered_weight:bfloat16") > 0
    assert saved == traced["half"]["saved"]
    assert saved["activation:float32"] < traced["amp"]["saved"]["activation:float32"]   # AMP's fp32 stream


@pytest.mark.slow
@pytest.mark.parametrize("run", ["fsdp1", "fsdp2"])
def test_traced_unsharded_gradients_are_16bit(traced: dict[str, Any], run: str) -> None:
    """Each unit's unsharded gradient reaches the reduce-scatter in bf16 (reduce_dtype = param_dtype), the width
    sharding.no_sync_grads prices for the whole set FSDP keeps between accumulation micro-steps under autocast."""
    assert traced[run]["reduce_scatter_dtypes"] == ["torch.bfloat16"]
    spec, kw = _traced_model()
    # on 8 ranks the fp32 shards (72,432 x 4 / 8 B) are below the unsharded bf16 set, so the priced term shows its width
    setup = Setup(weights_dtype="fp32", autocast="bf16", strategy="fsdp", fsdp_version=2 if run == "fsdp2" else 1,
                  num_gpus=8, **kw, gradient_accumulation_steps=2)
    assert spec.total_params == BLOCK_LINEARS + HEAD + 200 * 48 + 5 * 48 == 72_432   # + embedding + 2 x 2 + 1 norms
    assert training_memory(spec, setup).gradients == 2 * 72_432


def test_bench_reads_fp32_param_dtype_without_autocast() -> None:
    """llama-recipes' bfSixteen_mixed (row 952's precision) keeps FSDP's param_dtype fp32 and runs no autocast: the
    bench reads it as fp32 weights without autocast, not as the AMP its 'mixed' and 'bf16' words would suggest; the
    other FSDP mixed-precision readings keep autocast."""
    from helpers import load_bench

    setup = load_bench("accuracy_setup")
    assert setup._precision("fp32 (mixed_precision True on an A100 picks bfSixteen_mixed: param_dtype float32, reduce "
                            "and buffers bf16, no autocast: compute and weights fp32)") == {"weights_dtype": "fp32"}
    assert setup._precision("bf16 mixed (--bf16 True: FSDP mixed precision over fp32 weights)") == {
        "weights_dtype": "fp32", "autocast": "bf16"}
