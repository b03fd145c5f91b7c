"""Two trainable widths under FSDP2 (fp32 LoRA adapters beside 16-bit modules_to_save copies), from the code that runs.

torch's ``fully_shard`` refuses a unit whose trainable parameters differ in dtype (``FSDPParamGroup._init_mp_dtypes``:
"FSDP expects uniform original parameter dtype"); accelerate's ``fsdp2_prepare_model`` therefore upcasts every
trainable parameter to fp32 when mixed precision is on (no Params4bit in the model), and without mixed precision its
wrap (each decoder layer, the embedding, the head, the root) gives every unit one trainable dtype, so it runs at two
widths. The accumulated (``no_sync``) gradients are 16-bit for every element under a 16-bit ``param_dtype``.

Checked by hand for Llama-3.1-8B and on a real peft model put through accelerate's own FSDP2 preparation (one-rank
gloo group, CPU): the trainable bytes by dtype, and the unsharded gradients an accumulation micro-step leaves.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from perfguide import ModelSpec, Setup
from perfguide.memory.analytic import _states
from perfguide.memory.ledger import ledger
from perfguide.memory.sharding import no_sync_grads
from perfguide.speed import rates, terms

try:
    from helpers import accelerate_fsdp2, make_rec, tiny_model
    from test_mixed_width import ADAPTERS, COPIES, SAVED  # Llama-3.1-8B's r=16 adapters and its two trained copies
except ImportError:  # pragma: no cover
    from tests.helpers import accelerate_fsdp2, make_rec, tiny_model
    from tests.test_mixed_width import ADAPTERS, COPIES, SAVED


def _lora(**fields: Any) -> Setup:
    return Setup.parse({"weights_dtype": "bf16", "optimizer": "adamw_torch", "strategy": "fsdp", "num_gpus": 2,
                        "gradient_accumulation_steps": 2, "lora": {"r": 16, "target_modules": "all-linear", "modules_to_save": SAVED},
                        **fields})


def test_fsdp2_accumulation_holds_every_gradient_by_hand() -> None:
    spec = ModelSpec.from_any("meta-llama/Llama-3.1-8B")
    # no mixed precision: bf16 copies beside fp32 adapters, each unsharded gradient in its own parameter's dtype
    plain = _lora()
    states, _ = _states(spec, plain, ledger(spec, plain))
    assert no_sync_grads(plain, states, 0) == ADAPTERS * 4 + COPIES * 2 == 2_269_118_464
    # bf16 mixed precision: accelerate upcasts the copies (fp32 storage), FSDP2 computes on bf16 gathers: 2 B each
    amp = _lora(autocast="bf16")
    led = ledger(spec, amp)
    assert (led.param_bytes, led.largest_width) == (4, 4)
    states, _ = _states(spec, amp, led)
    assert states.grads == (ADAPTERS + COPIES) * 4
    assert no_sync_grads(amp, states, 0) == (ADAPTERS + COPIES) * 2 == 2_185_232_384
    # FSDP2 QLoRA (Params4bit: accelerate upcasts nothing) with bf16 copies: still 2 B for every element, not
    # the old grads * 2 / 4 (which counted the bf16 copies at 1 B)
    qlora = _lora(autocast="bf16", weights_dtype="nf4", kbit_upcast=False)
    led = ledger(spec, qlora)
    assert (led.param_bytes, led.largest_width) == (4, 2)
    states, _ = _states(spec, qlora, led)
    assert states.grads == ADAPTERS * 4 + COPIES * 2
    assert no_sync_grads(qlora, states, 0) == (ADAPTERS + COPIES) * 2


def test_optimizer_and_recipe_traffic_at_each_width_by_hand() -> None:
    """adamw_torch (data/optimizers.json: 8 B of fp32 state per element streamed 2.5 times): per element 2.5 x (read
    and write the weight, read the grad, read and write both moments) + the grad-norm read. fp32 adapter: 2.5 x (8 + 4
    + 16) + 4 = 74 B; bf16 copy, moments in bf16: 2.5 x (4 + 2 + 8) + 2 = 37 B. torchtune's rescale: 1 more pass."""
    spec = ModelSpec.from_any("meta-llama/Llama-3.1-8B")
    single = Setup(weights_dtype="bf16", optimizer="adamw_torch", lora={"r": 16, "target_modules": "all-linear", "modules_to_save": SAVED})
    assert rates.optimizer_bytes(spec, single) == pytest.approx(74 * ADAPTERS + 37 * COPIES, rel=1e-12)
    assert terms.recipe_grad_bytes(spec, single, "torchtune") == 4 * ADAPTERS + 2 * COPIES
    # the peft < 0.12 layout (adapters in the base's bf16): every element at 2 bytes
    kept = single.replace(lora={"r": 16, "target_modules": "all-linear", "modules_to_save": SAVED, "autocast_adapter_dtype": False})
    assert rates.optimizer_bytes(spec, kept) == pytest.approx(37 * (ADAPTERS + COPIES), rel=1e-12)


def _trainable_by_width(model: Any) -> Counter[int]:
    out: Counter[int] = Counter()
    for p in model.parameters():
        if p.requires_grad:
            out[p.element_size()] += p.numel()
    return out


def _priced_by_width(spec: ModelSpec, setup: Setup) -> Counter[int]:
    led = ledger(spec, setup)
    out: Counter[int] = Counter()
    for g in led.trainable:
        out[g.width or led.param_bytes] += g.total
    return out


@pytest.mark.parametrize("mixed_precision", ["no", "bf16"])
def test_accelerate_fsdp2_wraps_a_mixed_width_peft_model(gloo_group: None, mixed_precision: str) -> None:
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    from torch.distributed.fsdp import FSDPModule

    base = tiny_model(vocab_size=512, hidden_size=64, intermediate_size=128).to(torch.bfloat16)
    spec = ModelSpec.from_any(base)
    lora = {"r": 4, "target_modules": "all-linear", "modules_to_save": SAVED}
    setup = Setup(weights_dtype="bf16", optimizer="adamw_torch", strategy="fsdp", num_gpus=2, gradient_accumulation_steps=2,
                  autocast=None if mixed_precision == "no" else "bf16", lora=lora)  # type: ignore[arg-type]
    model = peft.get_peft_model(base, peft.LoraConfig(r=4, target_modules="all-linear", modules_to_save=list(SAVED)))
    assert set(_trainable_by_width(model)) == {2, 4}           # as peft builds it: bf16 copies, fp32 adapters
    model = accelerate_fsdp2(make_rec(setup, spec=spec), model, mixed_precision)
    held = _trainable_by_width(model)
    assert held == _priced_by_width(spec, setup)
    assert set(held) == ({2, 4} if mixed_precision == "no" else {4})

    model.set_requires_gradient_sync(False)                     # an accumulation micro-step (accelerate's no_sync)
    ids = torch.randint(0, 512, (1, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    unsharded = 0
    for module in model.modules():
        group = module._get_fsdp_state()._fsdp_param_group if isinstance(module, FSDPModule) else None
        for fp in group.fsdp_params if group is not None else ():
            grad = fp._unsharded_param.grad if fp.unsharded_accumulated_grad is None else fp.unsharded_accumulated_grad
            unsharded += grad.numel() * grad.element_size() if grad is not None else 0
    # bf16 policy: every element's gradient in bf16; none: each in its own parameter's dtype
    assert unsharded == (2 * sum(held.values()) if mixed_precision == "bf16" else sum(w * n for w, n in held.items()))
    states, _ = _states(spec, setup, ledger(spec, setup))
    assert no_sync_grads(setup, states, 0) == unsharded


def test_torch_refuses_one_unit_over_both_widths(gloo_group: None) -> None:
    """Why accelerate upcasts: one ``fully_shard`` unit over fp32 adapters and bf16 copies, under a bf16 policy."""
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    base = tiny_model(vocab_size=512, hidden_size=64, intermediate_size=128).to(torch.bfloat16)
    model = peft.get_peft_model(base, peft.LoraConfig(r=4, target_modules="all-linear", modules_to_save=list(SAVED)))
    fully_shard(model, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16))
    ids = torch.randint(0, 512, (1, 8))
    with pytest.raises(AssertionError, match="uniform original parameter dtype"):
        model(input_ids=ids)
