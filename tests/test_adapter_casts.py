"""autocast's 16-bit copies of PEFT's fp32 adapters (memory/autocast_copies.py ``adapter_cast_bytes``; issue 24).

PEFT upcasts adapters on a 16-bit base to fp32 (``autocast_adapter_dtype``), so under HF Trainer's bf16 autocast each
``lora_A`` / ``lora_B`` weight is an fp32 leaf that requires grad, and autocast caches its bf16 cast until the region
exits. A checkpointed forward therefore ends with every adapter's copy alive; the loss's backward, after the model
returns, has none. Traced here on a real peft model (real CPU tensors); the bytes by hand; the phase rule on the
analytic estimate.
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from perfguide.memory import analytic
from perfguide.memory.autocast_copies import adapter_cast_bytes
from perfguide.memory.ledger import ledger
from perfguide.memory.loss_path import forward_loss_bytes, installed_transformers
from perfguide.model.types import ModelSpec
from perfguide.setup import LoraSpec, Setup

H, FFN, LAYERS, VOCAB, R = 256, 512, 4, 1000, 8


class _Casts(TorchDispatchMode):
    """Weak references to the bf16 copies of tensors of the adapters' shapes."""

    def __init__(self, shapes: set[tuple[int, ...]]) -> None:
        super().__init__()
        self.shapes = shapes
        self.refs: list[weakref.ref] = []  # type: ignore[type-arg]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__ == "_to_copy" and isinstance(out, torch.Tensor) \
                and out.dtype == torch.bfloat16 and tuple(out.shape) in self.shapes:
            self.refs.append(weakref.ref(out.untyped_storage()))
        return out

    def alive_bytes(self) -> int:
        gc.collect()
        return sum(s.nbytes() for r in self.refs if (s := r()) is not None)


def _config():  # type: ignore[no-untyped-def]
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=H, intermediate_size=FFN, num_hidden_layers=LAYERS, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=VOCAB, tie_word_embeddings=False)


def _peft_model(checkpointed: bool):  # type: ignore[no-untyped-def]
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = get_peft_model(LlamaForCausalLM(_config()).to(torch.bfloat16), LoraConfig(r=R, target_modules="all-linear"))
    if checkpointed:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    return model.train()


def _by_hand() -> int:
    """Per block: q (H->H), k, v (H->H/2), o (H->H), gate, up (H->FFN), down (FFN->H); r x (in + out) each, 2 B."""
    kv = H // 2
    per_block = (H + H) + 2 * (H + kv) + (H + H) + 2 * (H + FFN) + (FFN + H)
    return 2 * R * per_block * LAYERS


@pytest.mark.parametrize("checkpointed", [True, False])
def test_a_forward_ends_with_every_adapters_cast(checkpointed: bool) -> None:
    model = _peft_model(checkpointed)
    adapters = [p for n, p in model.named_parameters() if p.requires_grad]
    assert {p.dtype for p in adapters} == {torch.float32}          # peft's autocast_adapter_dtype upcast
    casts = _Casts({tuple(p.shape) for p in adapters})
    ids = torch.randint(0, VOCAB, (2, 32))
    with casts:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(input_ids=ids, labels=ids)               # HF's loss inside the region, as Trainer runs it
            at_return = casts.alive_bytes()
        after_exit = casts.alive_bytes()
        out.loss.backward()
    assert at_return == _by_hand() == 2 * sum(p.numel() for p in adapters)
    if checkpointed:
        assert after_exit == 0                 # the cache empties as the region exits: none beside the loss's backward
    else:
        assert after_exit > at_return // 2    # the matmuls keep their copies for backward (the first block's lora_A
        #                                       input needs no gradient, so not every one is saved)
    assert casts.alive_bytes() == 0


def _setup(**kw: object) -> Setup:
    base = {"task": "train", "micro_batch_size": 1, "seq_len": 64, "weights_dtype": "bf16", "autocast": "bf16",
            "gradient_checkpointing": True, "lora": LoraSpec(r=R, target_modules="all-linear")}
    return Setup(**{**base, **kw})  # type: ignore[arg-type]


def test_the_ledger_counts_the_adapters_peft_makes() -> None:
    spec = ModelSpec.from_any(_config())
    setup = _setup()
    assert adapter_cast_bytes(setup, ledger(spec, setup).linear_adapter_params) == _by_hand()


def test_only_fp32_adapters_under_plain_autocast_are_cast() -> None:
    n = 1_000
    assert adapter_cast_bytes(_setup(), n) == 2 * n
    assert adapter_cast_bytes(_setup(weights_dtype="nf4"), n) == 2 * n              # QLoRA: fp32 adapters too
    assert adapter_cast_bytes(_setup(autocast=None), n) == 0                          # pure bf16: nothing to cast
    assert adapter_cast_bytes(_setup(lora=LoraSpec(r=R, autocast_adapter_dtype=False)), n) == 0   # bf16 adapters
    assert adapter_cast_bytes(_setup(lora=LoraSpec(r=R, adapter_dtype="bf16")), n) == 0          # torchtune's
    assert adapter_cast_bytes(_setup(lora=None), n) == 0


@pytest.mark.parametrize("checkpointed", [True, False])
def test_the_casts_join_the_forward_not_the_losss_backward(checkpointed: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 1.1B Llama shape at r=256 on every Linear and 1 x 4,096 tokens, so the casts (0.36 GB) outweigh the gap
    between the loss's backward and its forward (2 B per logit, 0.26 GB): the forward peak rises by the casts less
    that gap when checkpointed, by the casts themselves where the matmuls save them."""
    spec = ModelSpec.from_any("TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T")
    setup = _setup(seq_len=4096, gradient_checkpointing=checkpointed, lora=LoraSpec(r=256, target_modules="all-linear"))
    casts = adapter_cast_bytes(setup, ledger(spec, setup).linear_adapter_params)
    with_casts = analytic.training_memory(spec, setup)
    monkeypatch.setattr(analytic, "adapter_cast_bytes", lambda *_: 0)
    without = analytic.training_memory(spec, setup)
    assert with_casts.notes[0] == without.notes[0] == "peak in forward/loss"
    logits = setup.seq_len * spec.vocab_size
    assert forward_loss_bytes(spec, setup, installed_transformers()) == 10 * logits   # head output, fp32 upcast, log-softmax
    gap = with_casts.logits - 10 * logits      # the loss's backward start: 12 B per logit (and the labels' few bytes)
    assert 0 <= gap - 2 * logits < 2**20
    assert with_casts.peak_allocated - without.peak_allocated == (casts - gap if checkpointed else casts)
