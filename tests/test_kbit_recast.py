"""TRL's re-cast after peft's kbit upcast (``Setup.kbit_recast_bf16``, ``kbit_recast_adapters``): what the plan prices
is what the model holds.

TRL's SFTTrainer (v0.7.5 of 2023-12-22 through v0.25.1, from v0.22.0 through trl/models/utils.py prepare_peft_model;
v0.26.0 dropped the cast) given a ``peft_config`` on a 4-bit model with
``bf16=True`` runs peft's ``prepare_model_for_kbit_training`` (every non-quantized parameter to fp32), then
``get_peft_model``, then ``peft_module_casting_to_bf16`` (trl/trainer/utils.py): norms to fp32, fp32 embeddings / head
to bf16, and in 0.7.5-0.8.6 only (read in their wheels; 0.9.2 on have no such branch) every PEFT tuner layer to bf16,
so the adapters, their gradients and their AdamW moments are bf16 there and fp32 later.
The bytes below are measured on a real bnb 4-bit CPU model and hand-counted for Llama-3.1-8B at r=256.
"""

from __future__ import annotations

import pytest

from perfguide import ModelSpec, Setup
from perfguide.memory.ledger import ledger

#: Llama-3.1-8B (config.json): hidden 4096, 32 layers, FFN 14336, 8 KV heads of 128, vocab 128256, untied head
H, LAYERS, FFN, KV, VOCAB = 4096, 32, 14336, 8 * 128, 128256


def _qlora(**extra: object) -> Setup:
    return Setup(weights_dtype="nf4", autocast="bf16", optimizer="adamw_torch", gradient_checkpointing=True,
                 lora={"r": 256, "alpha": 128, "target_modules": "all-linear"}, **extra)  # type: ignore[arg-type]


def test_recast_prices_bf16_embeddings_and_by_release_adapters_by_hand_count() -> None:
    spec = ModelSpec.from_any("meta-llama/Llama-3.1-8B")
    # r x (in + out) per adapted Linear: q, o (h, h); k, v (h, kv); gate, up (h, ffn); down (ffn, h)
    adapters = LAYERS * 256 * (2 * (H + H) + 2 * (H + KV) + 3 * (H + FFN))
    assert adapters == 671_088_640
    upcast = ledger(spec, _qlora())
    head = ledger(spec, _qlora(kbit_recast_bf16=True))                              # TRL 0.9.2-0.21
    both = ledger(spec, _qlora(kbit_recast_bf16=True, kbit_recast_adapters=True))  # TRL 0.7.5-0.8.6
    assert upcast.trainable_params == head.trainable_params == both.trainable_params == adapters
    # adapters (and so their gradients and AdamW moments): 4 B each unless the 0.7.5-0.8.6 branch cast them
    assert (upcast.param_bytes, head.param_bytes, both.param_bytes) == (4, 4, 2)
    # stored: the embedding and head (128256 x 4096 each) at 2 B instead of 4 in both; the adapters at 2 B in 0.7.5-0.8.6
    assert upcast.weight_bytes - head.weight_bytes == 2 * VOCAB * H * 2
    assert head.weight_bytes - both.weight_bytes == adapters * 2 == 1_342_177_280


def test_recast_needs_a_kbit_upcast_bf16_qlora_run() -> None:
    with pytest.raises(ValueError, match="kbit_recast_bf16"):
        Setup(lora={"r": 8}, autocast="bf16", kbit_recast_bf16=True)  # a 16-bit base: nothing was upcast
    with pytest.raises(ValueError, match="kbit_recast_bf16"):
        _qlora(kbit_upcast=False, kbit_recast_bf16=True)
    with pytest.raises(ValueError, match="kbit_recast_bf16"):
        Setup(weights_dtype="nf4", autocast="fp16", lora={"r": 8}, kbit_recast_bf16=True)  # TRL casts under bf16 only
    with pytest.raises(ValueError, match="sharded"):
        _qlora(kbit_recast_bf16=True, strategy="fsdp", num_gpus=2)  # TRL's is_sharded_qlora skips the cast
    with pytest.raises(ValueError, match="kbit_recast_adapters"):
        _qlora(kbit_recast_adapters=True)  # a branch of the recast: no release casts the adapters alone


def test_prepare_model_leaves_the_dtypes_and_bytes_the_plan_priced(tmp_path) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    pytest.importorskip("bitsandbytes")
    try:
        from helpers import prepared_tiny_qlora
        from test_adapted_models import _bytes
    except ImportError:  # pragma: no cover
        from tests.helpers import prepared_tiny_qlora
        from tests.test_adapted_models import _bytes

    measured = {}
    for recast, adapters in ((False, False), (True, False), (True, True)):
        spec, rec, model = prepared_tiny_qlora(tmp_path / f"{recast}{adapters}", lora={"r": 4}, kbit_recast_bf16=recast,
                                               kbit_recast_adapters=adapters)
        dtypes = {kind: {p.dtype for n, p in model.named_parameters() if kind in n} for kind in ("lora_", "norm", "embed_tokens", "lm_head")}
        low = torch.bfloat16 if recast else torch.float32
        lora = torch.bfloat16 if adapters else torch.float32
        assert dtypes == {"lora_": {lora}, "norm": {torch.float32}, "embed_tokens": {low}, "lm_head": {low}}
        measured[recast, adapters] = _bytes(model)
        assert abs(measured[recast, adapters] - ledger(spec, rec.setup).weight_bytes) <= 64, (recast, adapters, measured)
    # control: each cast is a real saving, priced each way
    assert measured[False, False] > measured[True, False] > measured[True, True]
