"""PEFT ``modules_to_save`` (``LoraSpec.modules_to_save``): a trained copy of the embedding and the head, priced.

PEFT's ModulesToSaveWrapper keeps the original module frozen and trains a deep copy, so each named embedding or head
adds one vocabulary x hidden matrix with its gradient and optimizer state. Checked by hand for Llama-3.1-8B and against
the bytes of a real bitsandbytes 4-bit CPU model that ``prepare_model`` wrapped.
"""

from __future__ import annotations

import pytest

from perfguide import ModelSpec, Setup
from perfguide.errors import InvalidSetupError
from perfguide.memory.ledger import ledger

SAVED = ("lm_head", "embed_tokens")


def _qlora(**extra: object) -> Setup:
    return Setup(weights_dtype="nf4", autocast="bf16", optimizer="adamw_torch",
                 lora={"r": 16, "alpha": 16, "target_modules": "all-linear", "modules_to_save": SAVED}, **extra)  # type: ignore[arg-type]


def test_each_saved_module_adds_a_trained_vocab_by_hidden_copy_by_hand() -> None:
    spec = ModelSpec.from_any("meta-llama/Llama-3.1-8B")
    copy = 128256 * 4096   # Llama-3.1-8B's embedding and head, each vocab x hidden
    plain = ledger(spec, _qlora().replace(lora={"r": 16, "alpha": 16, "target_modules": "all-linear"}))
    for recast, nbytes in ((False, 4), (True, 2)):
        saved = ledger(spec, _qlora(kbit_recast_bf16=recast, kbit_recast_adapters=recast))   # TRL 0.7.5-0.8.6's recast
        assert saved.trainable_params - plain.trainable_params == 2 * copy == 1_050_673_152
        assert saved.param_bytes == nbytes
    upcast = ledger(spec, _qlora())
    # stored: adapters and copies at 4 B each on the upcast base
    assert upcast.weight_bytes - plain.weight_bytes == 2 * copy * 4


def test_copies_of_another_width_than_the_adapters_take_their_own() -> None:
    spec = ModelSpec.from_any("meta-llama/Llama-3.1-8B")
    copy = 128256 * 4096
    # a bf16 base's copies stay bf16 beside fp32 adapters; TRL 0.9.2-0.21's recast takes the copies to bf16 (their
    # names contain lm_head / embed_tokens), not the adapters (tests/test_mixed_width.py checks a real peft model)
    for setup in (Setup(weights_dtype="bf16", lora={"r": 8, "modules_to_save": SAVED}), _qlora(kbit_recast_bf16=True)):
        led = ledger(spec, setup)
        assert led.param_bytes == 4
        assert [(g.total, g.width) for g in led.trainable if g.kind in ("embedding", "head")] == [(copy, 2), (copy, 2)]
    with pytest.raises(InvalidSetupError, match="classifier"):
        ledger(spec, _qlora().replace(lora={"r": 8, "modules_to_save": ("classifier",)}))


@pytest.mark.parametrize(("recast", "adapters"), [(False, False), (True, True), (True, False)])
def test_prepare_model_holds_the_bytes_and_trainable_count_priced(tmp_path, recast, adapters) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    pytest.importorskip("bitsandbytes")
    try:
        from helpers import prepared_tiny_qlora
        from test_adapted_models import _bytes
    except ImportError:  # pragma: no cover
        from tests.helpers import prepared_tiny_qlora
        from tests.test_adapted_models import _bytes

    spec, rec, model = prepared_tiny_qlora(tmp_path, lora={"r": 4, "modules_to_save": SAVED}, kbit_recast_bf16=recast,
                                           kbit_recast_adapters=adapters)
    priced = ledger(spec, rec.setup)
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert trained == priced.trainable_params
    widths: dict[int, int] = {}
    for p in model.parameters():
        if p.requires_grad:
            widths[p.element_size()] = widths.get(p.element_size(), 0) + p.numel()
    by_group: dict[int, int] = {}
    for g in priced.trainable:
        by_group[g.width or priced.param_bytes] = by_group.get(g.width or priced.param_bytes, 0) + g.total
    assert widths == by_group   # (True, False): TRL 0.9.2-0.21's recast, bf16 copies beside fp32 adapters
    assert abs(_bytes(model) - priced.weight_bytes) <= 64, (_bytes(model), priced.weight_bytes)


def test_adapters_in_the_base_dtype_take_two_bytes_by_hand() -> None:
    """peft before 0.12 casts each adapter to its base weight's dtype (LoraLayer.update_layer); 0.12's
    ``autocast_adapter_dtype=True`` upcasts bf16/fp16 adapters to fp32. Llama-3.1-8B r=16 on every block Linear:
    32 x 16 x (2 x (4096 + 4096) + 2 x (4096 + 1024) + 3 x (4096 + 14336)) = 41,943,040 adapter elements."""
    spec = ModelSpec.from_any("meta-llama/Llama-3.1-8B")
    lora = {"r": 16, "target_modules": "all-linear"}
    upcast = ledger(spec, Setup(weights_dtype="bf16", lora=lora))
    kept = ledger(spec, Setup(weights_dtype="bf16", lora={**lora, "autocast_adapter_dtype": False}))
    assert upcast.trainable_params == kept.trainable_params == 41_943_040
    assert (upcast.param_bytes, kept.param_bytes) == (4, 2)
    assert upcast.weight_bytes - kept.weight_bytes == 41_943_040 * 2
    # and the copies of modules_to_save now share the adapters' width
    saved = ledger(spec, Setup(weights_dtype="bf16", lora={**lora, "autocast_adapter_dtype": False, "modules_to_save": SAVED}))
    assert saved.trainable_params - kept.trainable_params == 2 * 128256 * 4096


def test_a_bf16_base_without_the_upcast_holds_what_is_priced(tmp_path) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("peft")
    try:
        from helpers import make_rec, tiny_model
        from test_adapted_models import _bytes
    except ImportError:  # pragma: no cover
        from tests.helpers import make_rec, tiny_model
        from tests.test_adapted_models import _bytes

    base = tiny_model(vocab_size=512, hidden_size=64, intermediate_size=128).to(torch.bfloat16)
    spec = ModelSpec.from_any(base)
    rec = make_rec({"device": "cpu", "weights_dtype": "bf16", "optimizer": "adamw_torch",
                    "lora": {"r": 4, "autocast_adapter_dtype": False, "modules_to_save": SAVED}}, spec=spec)
    model = rec.prepare_model(base)
    priced = ledger(spec, rec.setup)
    assert {p.dtype for p in model.parameters() if p.requires_grad} == {torch.bfloat16}
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == priced.trainable_params
    assert abs(_bytes(model) - priced.weight_bytes) <= 64, (_bytes(model), priced.weight_bytes)
    # the plan read back from the PeftModel keeps the adapter's width and its saved modules
    import perfguide
    again = perfguide.recommend(model, "train_cpu", seq_len=16, global_batch_size=4).setup.lora
    assert again is not None and not again.autocast_adapter_dtype and set(again.modules_to_save) == set(SAVED)
