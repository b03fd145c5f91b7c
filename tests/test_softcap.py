"""Gemma 2's soft-caps and HF eager's sliding window, each against bytes counted by hand from the modeling code
(transformers 4.42.3-5.24 modeling_gemma2.py; traced by scripts/trace_softcap.py).

Hand counts: ``attn_weights / cap; tanh; * cap`` keeps the tanh output, one b x heads x s x s tensor per block in
the scores' dtype (bf16: 2 B, fp32: 4 B); ``logits / cap; tanh; * cap`` keeps one b x s x vocab tensor in the head's
output dtype until the loss backward. Eager attention computes every s x s score and masks the window.
"""

from __future__ import annotations

from typing import Any

from perfguide import LoraSpec, ModelSpec, Setup, estimate
from perfguide.memory.activations import layer_bytes, logits_bytes
from perfguide.memory.loss_path import hf_loss_bytes

B, S, HEADS, V = 2, 256, 4, 1024


def _gemma2(**over: Any) -> ModelSpec:
    config = dict(model_type="gemma2", hidden_size=64, num_hidden_layers=2, num_attention_heads=HEADS, num_key_value_heads=2,
                  head_dim=16, intermediate_size=128, vocab_size=V, sliding_window=32, max_position_embeddings=1024,
                  attn_logit_softcapping=50.0, final_logit_softcapping=30.0)
    config.update(over)
    return ModelSpec.from_any({k: v for k, v in config.items() if v is not ...})


def test_eager_keeps_the_full_scores_whatever_the_window() -> None:
    """A window of 32 on s = 256 still costs the whole 256 x 256 per head (4.42.3-5.24: torch.where on the full mask)."""
    eager = Setup(attn_implementation="eager", micro_batch_size=B, seq_len=S, weights_dtype="bf16")
    windowed, unwindowed = _gemma2(), _gemma2(sliding_window=None)
    assert layer_bytes(windowed, eager) == layer_bytes(unwindowed, eager)


def test_attention_softcap_keeps_one_score_tensor_per_block() -> None:
    for kw, nbytes in (({"weights_dtype": "bf16"}, 2), ({"weights_dtype": "fp32"}, 4), ({"autocast": "bf16"}, 2)):
        eager = Setup(attn_implementation="eager", micro_batch_size=B, seq_len=S, **kw)
        extra = layer_bytes(_gemma2(), eager) - layer_bytes(_gemma2(attn_logit_softcapping=None), eager)
        assert extra == B * HEADS * S * S * nbytes, kw
    flash = Setup(attn_implementation="flash_attention_2", micro_batch_size=B, seq_len=S, weights_dtype="bf16")
    assert layer_bytes(_gemma2(), flash) == layer_bytes(_gemma2(attn_logit_softcapping=None), flash)


def test_final_softcap_keeps_one_head_sized_tensor() -> None:
    cases = ((Setup(micro_batch_size=B, seq_len=S, weights_dtype="bf16"), 2),
             (Setup(micro_batch_size=B, seq_len=S, weights_dtype="fp32"), 4),
             (Setup(micro_batch_size=B, seq_len=S, autocast="bf16"), 2),
             # peft's kbit upcast makes the (tied) head fp32 and no autocast casts it down: fp32 logits
             (Setup(micro_batch_size=B, seq_len=S, weights_dtype="nf4", lora=LoraSpec(r=8)), 4))
    for setup, nbytes in cases:
        hand = B * S * V * nbytes
        assert logits_bytes(_gemma2(), setup) - logits_bytes(_gemma2(final_logit_softcapping=None), setup) == hand
        for release in ("4.42.3", "4.46.3", "5.24.0"):
            with_cap = hf_loss_bytes(_gemma2(), setup, release, False)
            assert with_cap - hf_loss_bytes(_gemma2(final_logit_softcapping=None), setup, release, False) == hand


def test_config_class_default_applies_when_the_key_is_absent() -> None:
    """Gemma2Config(final_logit_softcapping=30.0): a config.json without the key still caps; null switches it off."""
    setup = Setup(micro_batch_size=B, seq_len=S, weights_dtype="bf16")
    absent = _gemma2(final_logit_softcapping=...)
    assert logits_bytes(absent, setup) == logits_bytes(_gemma2(), setup)
    assert logits_bytes(_gemma2(final_logit_softcapping=None), setup) == logits_bytes(absent, setup) - B * S * V * 2


def test_gemma2_9b_qlora_16k_on_80gb_flips_by_the_hand_counted_tanh() -> None:
    """Issue 24's case: nf4 + kbit upcast without autocast, so the head's logits are fp32 and the tanh output is
    1 x 16384 x 256000 x 4 B = 16.78 GB. Under flash-attn (>= 2.6 caps inside the kernel, no s x s tensor) the loss
    is the peak: without the tanh the step fits the card; with it, the allocated peak is beyond. Under the eager
    attention transformers loads by default the s x s terms already put the recompute peak beyond the card."""
    setup = Setup(task="train", micro_batch_size=1, seq_len=16384, weights_dtype="nf4", gradient_checkpointing=True,
                  lora=LoraSpec(r=16), optimizer="adamw_torch", attn_implementation="flash_attention_2")
    spec = ModelSpec.from_any("google/gemma-2-9b")
    uncapped = spec.model_copy(update={"config": {**(spec.config or {}), "final_logit_softcapping": None}})
    hand = 1 * 16384 * 256000 * 4
    with_cap, without = estimate(spec, setup, hardware="a100-80gb"), estimate(uncapped, setup, hardware="a100-80gb")
    assert with_cap.peak_allocated - without.peak_allocated == hand
    assert with_cap.capacity is not None and without.capacity is not None
    assert without.fits and without.peak_allocated < without.capacity
    assert without.peak_allocated + hand > with_cap.capacity and not with_cap.fits
    unnamed = Setup(task="train", micro_batch_size=1, seq_len=16384, weights_dtype="nf4", gradient_checkpointing=True,
                    lora=LoraSpec(r=16), optimizer="adamw_torch")   # no kernel named: transformers loads eager
    default = estimate(spec, unnamed, hardware="a100-80gb")
    assert any("eager" in n for n in default.notes) and not default.fits


def test_gemma2_blocks_keep_two_more_norms_than_llama() -> None:
    """Gemma2RMSNorm keeps x.float() and its fp32 normed output (4 + 4 B per h), Llama's the fp32 input and a 16-bit
    normed copy (4 + 2); Gemma 2 norms four times per block, Llama twice: 32 - 12 = 20 B per h per token in bf16,
    4 x 8 - 2 x 8 = 16 with fp32 weights (the stream stays fp32 under autocast). Checked on the h slope (constants
    cancel), flash attention (no s^2 part)."""
    def gap(h: int, kw: dict[str, Any]) -> int:
        setup = Setup(attn_implementation="flash_attention_2", micro_batch_size=B, seq_len=S, **kw)
        dims = dict(hidden_size=h, num_hidden_layers=2, num_attention_heads=HEADS, num_key_value_heads=2, head_dim=16,
                    intermediate_size=128, vocab_size=V, max_position_embeddings=1024)
        llama = ModelSpec.from_any({"model_type": "llama", **dims})
        return layer_bytes(_gemma2(hidden_size=h, attn_logit_softcapping=None), setup) - layer_bytes(llama, setup)

    for kw, per_h in (({"weights_dtype": "bf16"}, 20), ({"weights_dtype": "fp32", "autocast": "bf16"}, 16)):
        assert gap(128, kw) - gap(64, kw) == B * S * per_h * 64, kw
