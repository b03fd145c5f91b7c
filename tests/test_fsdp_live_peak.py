"""FULL_SHARD FSDP's gathered window, traced live on two gloo ranks (scripts/trace_fsdp_live_peak.py: the CPU
allocator's events, FSDP's own unshard / reshard / reduce steps as marks) at a vocabulary of 2,048, which the pricing
(memory/fsdp_window.py) was not read from (512), against what perfguide prices.

Hand count of the traced Llama (h 128, FFN 344, 4 blocks, 4 heads of 32, 2 KV heads, vocab 2,048, untied): a block's
Linears are q and o 128 x 128, k and v 64 x 128, gate, up and down 344 x 128: 2 x 16,384 + 2 x 8,192 + 3 x 44,032 =
181,248, with its two RMSNorms 181,504 (even, so FSDP1 pads nothing on 2 ranks): 363,008 B gathered in bf16. The
root unit: embedding and head 2,048 x 128 = 262,144 each and the final norm's 128: 524,416 elements, 1,048,832 B.
LoRA r 8 on the seven Linears: 8 x (2 x 256 + 2 x 192 + 3 x 472) = 18,496 adapter elements per block.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import pytest

from perfguide.memory import analytic
from perfguide.memory.fsdp_window import unit_grad_bytes
from perfguide.model.types import ModelSpec
from perfguide.setup import Setup

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 2048
BLOCK = 2 * 128 * 128 + 2 * 64 * 128 + 3 * 344 * 128
BLOCK_GATHERED = (BLOCK + 2 * 128) * 2
ROOT_GATHERED = (2 * VOCAB * 128 + 128) * 2
ADAPTERS = 8 * (2 * 256 + 2 * 192 + 3 * 472)


def _script() -> Any:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        return importlib.import_module("trace_fsdp_live_peak")
    finally:
        sys.path.remove(str(ROOT / "scripts"))


def _setup(run: str) -> tuple[ModelSpec, Setup]:
    script = _script()
    spec = ModelSpec.from_any({"model_type": "llama", "architectures": ["LlamaForCausalLM"], **script.CONFIG, "vocab_size": VOCAB})
    lora = dict(r=script.LORA_R, alpha=16, target_modules=tuple(script.TARGETS), dropout=0.0) if "lora" in run else None
    return spec, Setup(task="train", micro_batch_size=script.B, seq_len=script.S, attn_implementation="eager",
                       optimizer="adamw_torch", strategy="fsdp", num_gpus=2, fsdp_version=int(run[4]), autocast="bf16",
                       weights_dtype="fp32", gradient_checkpointing=run.endswith("_ac"), lora=lora,
                       fsdp_adapter_units=False if "lora" in run and run.startswith("fsdp1") else None)   # the trace's plain wrap


@pytest.fixture(scope="module")
def traced() -> dict[str, Any]:
    script = _script()
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        report: dict[str, Any] = script.trace({**script.CONFIG, "vocab_size": VOCAB})
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    return report


def test_hand_count() -> None:
    spec, setup = _setup("fsdp1_lora")
    assert BLOCK == 181_248 and ADAPTERS == 18_496
    assert spec.embedding_params + spec.lm_head_params == 2 * VOCAB * 128
    assert analytic.ledger(spec, setup).trainable_params == 4 * ADAPTERS


def test_unit_gradient_width() -> None:
    """The unsharded gradient is in param_dtype: 16-bit under mixed precision or 16-bit weights, fp32 otherwise."""
    _, setup = _setup("fsdp1_full")
    assert unit_grad_bytes(setup) == 2
    assert unit_grad_bytes(setup.replace(autocast=None)) == 4
    assert unit_grad_bytes(setup.replace(autocast=None, weights_dtype="bf16")) == 2


def test_torch_1_12_keeps_the_former_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch 1.12's FSDP1 had no rate limiter and no root special case (fsdp_window.TRACED_RUNTIME_SINCE_TORCH): the
    former charge, two of the largest unit in compute dtype and its fp32 gradient, in every phase."""
    import perfguide.memory.overhead as overhead

    spec, setup = _setup("fsdp1_full")
    largest = max(BLOCK, VOCAB * 128)
    monkeypatch.setattr(overhead, "installed_torch", lambda: "1.12.1")
    assert analytic._fsdp_windows(spec, setup) is None
    assert analytic._gather_bytes(spec, setup)[0] == 2 * largest * 2 + largest * 4
    monkeypatch.setattr(overhead, "installed_torch", lambda: "2.13.0")
    assert analytic._fsdp_windows(spec, setup) is not None


@pytest.mark.slow
@pytest.mark.parametrize("run", ["fsdp1_full", "fsdp1_full_ac", "fsdp1_lora", "fsdp1_lora_ac"])
def test_fsdp1_holds_the_root_alone_at_the_loss(traced: dict[str, Any], run: str) -> None:
    """(a) At the loss FSDP1 has resharded every decoder unit and keeps the root (the hand count); perfguide prices
    the root's embedding and head (the final norm's 256 B left out), not two gathered units and a gradient."""
    assert traced[run]["gathered_at_loss"] == {"root": ROOT_GATHERED}
    spec, setup = _setup(run)
    window = analytic._fsdp_windows(spec, setup)
    assert window is not None and 0 <= ROOT_GATHERED - window.at_loss <= 2 * 128


@pytest.mark.slow
@pytest.mark.parametrize("run", ["fsdp1_full", "fsdp1_full_ac", "fsdp1_lora", "fsdp1_lora_ac"])
def test_fsdp1_backward_window(traced: dict[str, Any], run: str) -> None:
    """(b) Through backward: the root, the running unit and the prefetched one, and the running unit's unsharded
    gradient in bf16 (what it hands to the reduce-scatter; LoRA under use_orig_params: the whole unit's) against
    perfguide's window; they differ by the blocks' norms."""
    lora = "lora" in run
    unit = BLOCK_GATHERED + (2 * ADAPTERS if lora else 0)
    assert traced[run]["most_gathered_in_backward"] == ROOT_GATHERED + 2 * unit
    reduced = {(u, dtype, n) for u, dtype, n in traced[run]["reduced"] if u.startswith("L")}
    assert reduced == {(f"L{i}", "bfloat16", unit) for i in range(4)}
    spec, setup = _setup(run)
    window = analytic._fsdp_windows(spec, setup)
    assert window is not None
    traced_window = ROOT_GATHERED + 2 * unit + unit
    assert 0 <= traced_window - window.backward <= 3 * 2 * 2 * 128 + 2 * 128


@pytest.mark.slow
@pytest.mark.parametrize("run", ["fsdp2_full", "fsdp2_lora"])
def test_fsdp2_under_accelerate_keeps_the_head_and_two_units(traced: dict[str, Any], run: str) -> None:
    """accelerate 1.15's FSDP2 carves the [final norm, head] tail into a unit of its own (peft's model: the head): only
    it is gathered at the loss, and it is released early in backward. perfguide prices FSDP1's root (embedding and
    head) there, over by the embedding at the loss (fsdp_window's docstring: not priced)."""
    gathered = traced[run]["gathered_at_loss"]
    assert sum(gathered.values()) == (VOCAB * 128 + 128) * 2
    unit = BLOCK_GATHERED + (2 * ADAPTERS if "lora" in run else 0)
    # at this vocabulary the tail outweighs a decoder unit: the most is the tail beside the top unit, as backward starts
    assert traced[run]["most_gathered_in_backward"] == sum(gathered.values()) + unit < ROOT_GATHERED + 2 * unit
    spec, setup = _setup(run)
    window = analytic._fsdp_windows(spec, setup)
    assert window is not None and window.at_loss - sum(gathered.values()) == VOCAB * 128 * 2 - 128 * 2


@pytest.mark.slow
@pytest.mark.parametrize("run", ["fsdp1_full", "fsdp2_full", "fsdp2_lora"])
def test_persistent_bytes(traced: dict[str, Any], run: str) -> None:
    """Between steps a rank holds its fp32 parameter shard and its AdamW states: what perfguide prices."""
    spec, setup = _setup(run)
    est = analytic.training_memory(spec, setup)
    assert traced[run]["shard_weights"] == est.weights
    assert traced[run]["shard_states"] == est.optimizer_states


@pytest.mark.slow
@pytest.mark.parametrize("run", ["fsdp1_lora", "fsdp1_lora_ac"])
def test_fsdp1_lora_root_gets_no_gradient(traced: dict[str, Any], run: str) -> None:
    """FSDP1 LoRA under use_orig_params: every decoder unit reduce-scatters a gradient for all its elements, frozen
    ones too (4 x 200,000), the all-frozen root none; perfguide's gradient elements are the same but for the final
    norm's 128 (counted, untraced: it sits in the root)."""
    reduced = traced[run]["reduced"]
    assert {u for u, _, _ in reduced} == {"L0", "L1", "L2", "L3"}
    traced_elements = sum(n for _, _, n in reduced) // 2
    spec, setup = _setup(run)
    states, _ = analytic._states(spec, setup, analytic.ledger(spec, setup))
    assert traced_elements == 4 * (BLOCK + 2 * 128 + ADAPTERS) and states.grad_elements == traced_elements + 128
