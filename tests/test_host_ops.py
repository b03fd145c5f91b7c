"""The op counts behind the launch floor (efficiency.json) against a real count of a transformers Llama's
forward + backward on the CPU (bench/host_ops.py), and the floor itself against ops x host cost by hand."""

from __future__ import annotations

import pytest
from helpers import load_bench

from perfguide._data import load
from perfguide.setup import LoraSpec, Setup


def _const(name: str) -> float:
    return float(load("efficiency")[name]["value"])


@pytest.fixture(scope="module")
def counted() -> dict[str, float]:
    return load_bench("host_ops").measure()


def test_shipped_op_counts_match_a_real_count(counted: dict[str, float]) -> None:
    assert _const("cuda_ops_per_layer") == pytest.approx(counted["full"], rel=0.1)
    assert _const("recompute_ops_factor") == pytest.approx(counted["recompute_factor"], rel=0.05)
    assert _const("lora_ops_per_adapted_linear") == pytest.approx(counted["lora_per_linear"], rel=0.1)
    assert _const("autocast_ops_factor") == pytest.approx(counted["autocast_factor"], rel=0.05)
    assert _const("param_wrapper_ops_per_moe_layer") == pytest.approx(counted["param_wrapper"], rel=0.1)
    assert _const("deltanet_reference_ops_per_chunk") == pytest.approx(counted["deltanet_chunk"], rel=0.1)


def test_launch_floor_by_hand() -> None:
    """A micro-step dispatches layers x (block ops + LoRA ops per adapted Linear x adapted Linears) x recompute."""
    from test_speed import llama7b

    from perfguide.speed.training import _launch_ops

    spec = llama7b()
    base = Setup(weights_dtype="bf16", seq_len=256)
    assert _launch_ops(spec, base) == pytest.approx(32 * _const("cuda_ops_per_layer"))
    lora = base.model_copy(update={"lora": LoraSpec(r=64), "gradient_checkpointing": True})
    per_layer = (_const("cuda_ops_per_layer") + 7 * _const("lora_ops_per_adapted_linear")) * _const("recompute_ops_factor")
    assert _launch_ops(spec, lora) == pytest.approx(32 * per_layer)
    only_qv = lora.model_copy(update={"lora": LoraSpec(r=64, target_modules=("q_proj", "v_proj"))})
    amp = base.model_copy(update={"weights_dtype": "fp32", "autocast": "bf16"})
    assert _launch_ops(spec, amp) == pytest.approx(32 * _const("cuda_ops_per_layer") * _const("autocast_ops_factor"))
    assert _launch_ops(spec, only_qv) == pytest.approx(32 * (_const("cuda_ops_per_layer") + 2 * _const("lora_ops_per_adapted_linear")) * _const("recompute_ops_factor"))


def test_launch_floor_of_moe_expert_lora_by_hand() -> None:
    """Qwen3-30B-A3B (48 layers, all MoE): all-linear LoRA adds the ParamWrapper ops to every layer, attention-only
    LoRA 4 adapted Linears' ops only."""
    from perfguide.model.types import ModelSpec
    from perfguide.speed.training import _launch_ops

    spec = ModelSpec.from_any("Qwen/Qwen3-30B-A3B")
    attention = Setup(weights_dtype="bf16", seq_len=256, lora=LoraSpec(r=16, dropout=0.0, target_modules=("q_proj", "k_proj", "v_proj", "o_proj")))
    block, adapter = _const("cuda_ops_per_layer"), _const("lora_ops_per_adapted_linear")
    assert _launch_ops(spec, attention) == pytest.approx(48 * (block + 4 * adapter))
    every = attention.model_copy(update={"lora": LoraSpec(r=16, dropout=0.0, target_modules="all-linear")})
    assert _launch_ops(spec, every) == pytest.approx(48 * (block + 4 * adapter + _const("param_wrapper_ops_per_moe_layer")))


def test_launch_floor_of_deltanet_reference_code_by_hand() -> None:
    """Qwen3.5-9B (32 layers, 24 of them gated DeltaNet): on transformers' reference code each DeltaNet layer adds its
    chunk loop's ops, ceil(s / 64) chunks; flash-linear-attention's kernel adds none."""
    from perfguide.model.types import ModelSpec
    from perfguide.speed.training import _launch_ops

    spec = ModelSpec.from_any("Qwen/Qwen3.5-9B")
    torch_path = Setup(weights_dtype="bf16", seq_len=4000)
    chunks = 63   # ceil(4000 / 64)
    assert _launch_ops(spec, torch_path) == pytest.approx(32 * _const("cuda_ops_per_layer")
                                                          + 24 * chunks * _const("deltanet_reference_ops_per_chunk"))
    fla = torch_path.model_copy(update={"linear_attention_kernels": "fla"})
    assert _launch_ops(spec, fla) == pytest.approx(32 * _const("cuda_ops_per_layer"))
