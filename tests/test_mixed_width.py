"""Trainable tensors of two widths: PEFT's ``modules_to_save`` copies keep their original's 16 bits (a deep copy; peft's
``autocast_adapter_dtype`` upcasts only the adapter layers) beside fp32 adapters, on a bf16 base or after TRL's bf16
recast of the embeddings and head. Each group's weights, gradients and optimizer states take its own width.

Checked by hand for Llama-3.1-8B and against a real peft model on CPU: its trainable parameters by dtype, torch
AdamW's state bytes by dtype after a step, and the live bytes of the next foreach step's temporaries.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from perfguide import ModelSpec, Setup
from perfguide.memory.analytic import _states
from perfguide.memory.ledger import ledger
from perfguide.memory.optimizers import optimizer_cost

try:
    from helpers import tiny_model
except ImportError:  # pragma: no cover
    from tests.helpers import tiny_model

SAVED = ("embed_tokens", "lm_head")
ADAPTERS = 41_943_040            # Llama-3.1-8B r=16 on every block Linear (tests/test_modules_to_save.py derives it)
COPIES = 2 * 128_256 * 4_096     # its embedding and head, one trained vocab x hidden copy each


def _bf16_lora(**lora: object) -> Setup:
    return Setup(weights_dtype="bf16", optimizer="adamw_torch",
                 lora={"r": 16, "target_modules": "all-linear", "modules_to_save": SAVED, **lora})  # type: ignore[arg-type]


def test_bf16_copies_beside_fp32_adapters_by_hand() -> None:
    spec = ModelSpec.from_any("meta-llama/Llama-3.1-8B")
    setup = _bf16_lora()
    led = ledger(spec, setup)
    plain = ledger(spec, setup.replace(lora={"r": 16, "target_modules": "all-linear"}))
    one_copy = ADAPTERS * 4 + COPIES * 2            # fp32 adapters, bf16 copies: 2,269,118,464 B
    assert led.trainable_params == ADAPTERS + COPIES
    assert (led.param_bytes, led.largest_width) == (4, 2)
    assert led.weight_bytes - plain.weight_bytes == COPIES * 2
    states, cost = _states(spec, setup, led)
    assert states.grads == one_copy == 2_269_118_464
    assert cost.states == states.optimizer == 2 * one_copy          # exp_avg, exp_avg_sq in each parameter's dtype
    # foreach AdamW: one temporary per dtype group, the first still alive while the second is built
    assert cost.step_temp == one_copy
    # the peft < 0.12 layout (adapters in the base's bf16) prices all of it at 2 bytes, one width
    kept = ledger(spec, _bf16_lora(autocast_adapter_dtype=False))
    assert kept.trainable_bytes == (ADAPTERS + COPIES) * 2 and all(g.width is None for g in kept.trainable)


def test_the_per_width_split_prices_other_families_per_group() -> None:
    spec = ModelSpec.from_any("meta-llama/Llama-3.1-8B")
    groups = list(ledger(spec, _bf16_lora()).trainable)
    # bitsandbytes keeps 32-bit state whatever the parameter's width: the split changes nothing there
    eight = optimizer_cost("adamw_bnb_8bit", groups, 4)
    uniform = optimizer_cost("adamw_bnb_8bit", [replace(g, width=None) for g in groups], 4)
    assert eight == uniform
    # fused AdamW updates in place: no temporary in either group
    fused = optimizer_cost("adamw_torch_fused", groups, 4)
    assert (fused.states, fused.step_temp) == (2 * (ADAPTERS * 4 + COPIES * 2), 0)


def test_a_real_peft_model_holds_the_widths_and_adamw_state_priced() -> None:
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    pytest.importorskip("transformers")
    from perfguide.memory.tracing.tracker import make_tracker

    base = tiny_model(vocab_size=512, hidden_size=64, intermediate_size=128).to(torch.bfloat16)
    spec = ModelSpec.from_any(base)
    model = peft.get_peft_model(base, peft.LoraConfig(r=4, target_modules="all-linear", modules_to_save=list(SAVED)))
    trained = [p for p in model.parameters() if p.requires_grad]
    by_dtype: Counter[int] = Counter()
    for p in trained:
        by_dtype[p.element_size()] += p.numel()
    setup = Setup(weights_dtype="bf16", optimizer="adamw_torch", lora={"r": 4, "target_modules": "all-linear", "modules_to_save": SAVED})
    led = ledger(spec, setup)
    priced: Counter[int] = Counter()
    for g in led.trainable:
        priced[g.width or led.param_bytes] += g.total
    assert by_dtype == priced and set(by_dtype) == {2, 4}
    assert by_dtype[2] == 2 * 512 * 64   # the two copies, bf16

    opt = torch.optim.AdamW(trained, lr=1e-3, foreach=True)   # the Trainer's adamw_torch: torch's default foreach step
    for p in trained:
        p.grad = torch.ones_like(p)
    opt.step()
    state: Counter[int] = Counter()
    for s in opt.state.values():
        for v in s.values():
            if v.dim():   # the moments; ``step`` is a 0-d counter
                state[v.element_size()] += v.numel() * v.element_size()
    assert state == Counter({w: 2 * n * w for w, n in by_dtype.items()})
    states, cost = _states(spec, setup, led)
    assert cost.states == sum(state.values())
    assert states.grads == sum(p.grad.numel() * p.grad.element_size() for p in trained)

    # the next step's temporaries, live bytes counted on the real tensors (every existing storage charged first)
    tracker = make_tracker(1)
    with tracker:
        tracker.set_phase("optimizer")
        for p in trained:
            tracker.charge(p, "weights")
            tracker.charge(p.grad, "gradients")
        for s in opt.state.values():
            for v in s.values():
                tracker.charge(v, "optimizer_states")
        held = tracker.total
        opt.step()
    peak = tracker.peaks["optimizer"][0] - held
    assert peak == sum(w * n for w, n in by_dtype.items())   # both dtype groups' temporaries at once, not the larger
    assert cost.step_temp == peak
