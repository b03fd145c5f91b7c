"""The step time of LoRA on a transformers-5 MoE's fused experts (speed/moe_lora.py), against real peft models on CPU.

peft's ParamWrapper runs the experts on a merged weight ``W + s A B``: every forward rebuilds the whole stack (twice:
register_parametrization's consistency check, then the access), and backward computes the merged stacks' full weight
gradient over the routed tokens before the factors' gradients. Checked against hand counts and two traces of a
real step (forward + backward), all-linear minus attention-only LoRA, at two shapes, with and without checkpointing:
FLOPs by ``torch.utils.flop_counter.FlopCounterMode`` (the eager experts loop with torch's own formulas, and the
grouped_mm experts with ``aten._grouped_mm`` counted from its operands' shapes), bytes by a dispatch trace of the
expert-stack-sized tensors each op reads or writes.
"""

from __future__ import annotations

from typing import Any

import pytest
from helpers import moe_config, moe_peft_model

from perfguide.hardware.types import Hardware
from perfguide.model.types import ModelSpec
from perfguide.setup import LoraSpec, Setup
from perfguide.speed import estimate_speed
from perfguide.speed.moe_lora import merged_cost

ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
#: (hidden, expert width, experts, top-k, r, batch, seq): shapes of no other test
SHAPES = [(80, 56, 5, 2, 4, 1, 24), (96, 40, 6, 3, 2, 2, 16)]
LAYERS = 2


def _hand_flops(h: int, w: int, e: int, k: int, r: int, batch: int, seq: int, checkpointing: bool) -> int:
    """All-linear minus attention-only FLOPs of one step, counted off peft 0.21 / transformers 5.24 (module doc)."""
    tokens, forwards = batch * seq, 1 + int(checkpointing)
    per_layer = 0
    for i, o, rank in ((h, 2 * w, 2 * r), (w, h, r)):         # gate_up at rank 2r (peft's rank_pattern), down at r
        merge = 2 * e * i * o * rank                          # baddbmm(W, lhs, rhs): one multiply-add per element per rank
        per_layer += forwards * 2 * merge + 2 * merge + 2 * tokens * k * i * o   # 2 merges a forward; dlhs, drhs; dW routed
    per_layer += forwards * 2 * h * e * r + 4 * h * e * r + 2 * tokens * h * e  # router: B A; dA, dB; its weight's grad
    return LAYERS * per_layer


def _hand_bytes(h: int, w: int, e: int, checkpointing: bool, nbytes: int) -> int:
    """Merged stacks: each merge reads W and writes W + s A B (2 a forward); backward writes the gradient, reads it twice."""
    stacks = e * 3 * h * w * nbytes
    return LAYERS * ((1 + int(checkpointing)) * 2 * 2 * stacks + 3 * stacks)


def _step(model: Any, batch: int, seq: int, checkpointing: bool, mode: Any) -> None:
    import torch

    if checkpointing:
        model.activation_checkpointing_enable()
        model.enable_input_require_grads()
    ids = torch.randint(0, 384, (batch, seq))
    with mode:
        model(input_ids=ids, labels=ids).loss.backward()


def _grouped_mm_flops(a: Any, b: Any, *_: Any, out_shape: Any = None, **__: Any) -> int:
    """(S, k) x (E, k, n) -> (S, n), or the weight gradient (m, S) x (S, n) -> (E, m, n): 2 x a's elements x n."""
    return 2 * a[0] * a[1] * b[-1]


def _traced_flops(config: dict[str, Any], targets: Any, r: int, batch: int, seq: int, checkpointing: bool, impl: str) -> int:
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False, custom_mapping={torch.ops.aten._grouped_mm: _grouped_mm_flops})
    _step(moe_peft_model(config, targets, torch.float32, r, impl), batch, seq, checkpointing, counter)
    return int(counter.get_total_flops())


def _setup(targets: Any, r: int, batch: int, seq: int, checkpointing: bool, weights: str = "fp32") -> Setup:
    return Setup(task="train", micro_batch_size=batch, seq_len=seq, weights_dtype=weights, optimizer="sgd",
                 gradient_checkpointing=checkpointing, lora=LoraSpec(r=r, alpha=8, target_modules=targets, dropout=0.0))


@pytest.mark.parametrize("model_type", ["mixtral", "qwen3_moe"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("checkpointing", [False, True])
def test_flops_against_flop_counter(model_type: str, shape: tuple[int, ...], checkpointing: bool) -> None:
    pytest.importorskip("peft")
    h, w, e, k, r, batch, seq = shape
    config = moe_config(model_type, h, w, e, k)
    hand = _hand_flops(h, w, e, k, r, batch, seq, checkpointing)
    for impl in ("eager", "grouped_mm"):   # torch's own mm formulas; transformers 5's default experts path
        traced = (_traced_flops(config, "all-linear", r, batch, seq, checkpointing, impl)
                  - _traced_flops(config, list(ATTN), r, batch, seq, checkpointing, impl))
        assert traced == hand, impl
    spec = ModelSpec.from_any(config)
    assert merged_cost(spec, _setup("all-linear", r, batch, seq, checkpointing), batch * seq, int(checkpointing)).flops == hand
    assert merged_cost(spec, _setup(ATTN, r, batch, seq, checkpointing), batch * seq, int(checkpointing)).flops == 0


def _traced_bytes(config: dict[str, Any], targets: Any, r: int, batch: int, seq: int, checkpointing: bool) -> int:
    """Bytes of the expert-stack-sized tensors every op of a bf16 step reads or writes (views and ``set_``, which
    parametrize's removal uses to swap storages, move nothing)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    experts = config.get("num_experts") or config["num_local_experts"]
    down = experts * config["hidden_size"] * config.get("moe_intermediate_size", config["intermediate_size"])
    sizes = {down, 2 * down}                                  # down_proj, gate_up_proj

    class Stacks(TorchDispatchMode):
        moved = 0

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            if not func.is_view and func is not torch.ops.aten.set_.source_Tensor:
                tensors = tree_flatten((args, kwargs, out))[0]
                self.moved += sum(t.nbytes for t in tensors if isinstance(t, torch.Tensor) and t.numel() in sizes)
            return out

    mode = Stacks()
    _step(moe_peft_model(config, targets, torch.bfloat16, r), batch, seq, checkpointing, mode)
    return mode.moved


@pytest.mark.parametrize("model_type", ["mixtral", "qwen3_moe"])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_bytes_against_dispatch_trace(model_type: str, checkpointing: bool) -> None:
    pytest.importorskip("peft")
    h, w, e, k, r, batch, seq = SHAPES[0]
    config = moe_config(model_type, h, w, e, k)
    traced = (_traced_bytes(config, "all-linear", r, batch, seq, checkpointing)
              - _traced_bytes(config, list(ATTN), r, batch, seq, checkpointing))
    assert traced == _hand_bytes(h, w, e, checkpointing, 2)
    priced = merged_cost(ModelSpec.from_any(config), _setup("all-linear", r, batch, seq, checkpointing, "bf16"), batch * seq,
                         int(checkpointing))
    assert priced.bytes == traced


def test_qwen3_30b_a3b_by_hand() -> None:
    """The real checkpoint's shapes (48 layers, 128 experts of 2048 x 768, top-8), r=16, 2048 tokens, checkpointed:
    per layer gate_up merges 128 x 2048 x 1536 x 32 and down 128 x 768 x 2048 x 16 multiply-adds, the routed weight
    gradient 2 x 2048 x 8 x 3 x 2048 x 768; bytes 11 passes over the 1.21 GB bf16 stack."""
    spec = ModelSpec.from_any("Qwen/Qwen3-30B-A3B")
    setup = Setup(task="train", micro_batch_size=1, seq_len=2048, weights_dtype="bf16", autocast="bf16", optimizer="adamw_torch",
                  gradient_checkpointing=True, lora=LoraSpec(r=16, alpha=32, target_modules="all-linear", dropout=0.0))
    ranked = 128 * 2048 * 1536 * 32 + 128 * 768 * 2048 * 16
    router = 128 * 2048 * 16
    flops = 2 * 2 * 2 * ranked + 4 * ranked + 2 * 2048 * 8 * 3 * 2048 * 768 + 2 * 2 * router + 4 * router + 2 * 2048 * 2048 * 128
    stack = 128 * 3 * 2048 * 768 * 2
    cost = merged_cost(spec, setup, 2048, 1)
    assert cost.flops == 48 * flops
    assert cost.bytes == 48 * (2 * 2 * 2 * stack + 3 * stack)
    assert cost.adapter_params == 48 * (16 * (2048 + 128) + 32 * 128 * (2048 + 1536) + 16 * 128 * (768 + 2048))


@pytest.mark.parametrize("model", ["Qwen/Qwen3-30B-A3B", "mistralai/Mixtral-8x7B-v0.1"])
def test_all_linear_steps_slower_than_attention_only(model: str) -> None:
    """On an H100 the merged path's bytes (the whole bf16 stack ~11 times a checkpointed micro-step) outweigh the
    6 x adapter parameters x tokens it no longer pays: all-linear is slower, where it was priced within 2% before."""
    spec, hw = ModelSpec.from_any(model), Hardware.from_name("h100")

    def step(targets: Any) -> float:
        setup = Setup(task="train", micro_batch_size=1, gradient_accumulation_steps=8, seq_len=2048, weights_dtype="bf16",
                      autocast="bf16", optimizer="adamw_torch_fused", gradient_checkpointing=True,
                      lora=LoraSpec(r=16, alpha=32, target_modules=targets, dropout=0.0))
        return estimate_speed(spec, setup, hw).step_time_s

    assert step("all-linear") > 1.5 * step(ATTN)


def test_the_plan_names_the_merged_cost() -> None:
    import perfguide

    rec = perfguide.recommend("Qwen/Qwen3-30B-A3B", scenario="train_gpu_one", hardware="h100-nvl", finetune="lora")
    decision = next(d for d in rec.decisions if d.setting == "finetune")
    assert "merged weight W + s*A@B" in decision.reason and "TFLOP" in decision.reason and " GB per micro-step" in decision.reason
