"""4-D attention masks kept alive by gradient checkpointing, against counts from a gc scan of real CPU tensors
(transformers 5.24, see perfguide/memory/masks.py): eager keeps one float mask per attention kind in the hidden
states' dtype, SDPA a bool mask only for a sliding window shorter than the sequence, flash none."""

from __future__ import annotations

from typing import Any

from perfguide import LoraSpec, ModelSpec, Setup
from perfguide.memory.analytic import training_memory
from perfguide.memory.masks import checkpointed_mask_bytes, eager_backward_transient_bytes

B, S = 2, 256
BASE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            intermediate_size=128, vocab_size=1024, max_position_embeddings=1024)


def _spec(model_type: str, **over: Any) -> ModelSpec:
    return ModelSpec.from_any({"model_type": model_type, **BASE, **over})


def _setup(attn: str, **kw: Any) -> Setup:
    return Setup(attn_implementation=attn, micro_batch_size=B, seq_len=S, gradient_checkpointing=True, **kw)


def test_mask_counts_by_hand() -> None:
    bf16, amp = {"weights_dtype": "bf16"}, {"autocast": "bf16"}
    gemma2 = _spec("gemma2", sliding_window=32)
    assert checkpointed_mask_bytes(gemma2, _setup("eager", **bf16)) == 2 * B * S * S * 2   # sliding + full, bf16
    assert checkpointed_mask_bytes(gemma2, _setup("eager", **amp)) == 2 * B * S * S * 4    # fp32 stream under autocast
    assert checkpointed_mask_bytes(_spec("llama"), _setup("eager", **bf16)) == B * S * S * 2
    assert checkpointed_mask_bytes(_spec("llama"), _setup("sdpa", **bf16)) == 0           # is_causal, no mask
    mistral = _spec("mistral", sliding_window=32)
    assert checkpointed_mask_bytes(mistral, _setup("sdpa", **bf16)) == B * S * S          # bool sliding mask
    assert checkpointed_mask_bytes(_spec("mistral", sliding_window=4096), _setup("sdpa", **bf16)) == 0
    assert checkpointed_mask_bytes(mistral, _setup("flash_attention_2", **bf16)) == 0


def test_masks_sit_at_the_loss_peak_of_a_checkpointed_step() -> None:
    """With a 256k vocabulary the peak is the loss; there eager and flash differ only by the masks (checkpointed
    blocks keep just their inputs, the s x s scores come back one block at a time in backward)."""
    spec = _spec("gemma2", sliding_window=32, vocab_size=256000)
    kw = dict(weights_dtype="nf4", lora=LoraSpec(r=8), optimizer="adamw_torch")
    eager, flash = training_memory(spec, _setup("eager", **kw)), training_memory(spec, _setup("flash_attention_2", **kw))
    assert eager.notes[0] == flash.notes[0] == "peak in forward/loss"
    assert eager.peak_allocated - flash.peak_allocated == 2 * B * S * S * 4   # kbit upcast: fp32 stream, fp32 masks


def test_eager_backward_holds_the_fp32_gradients_by_hand() -> None:
    """Llama's eager backward, hand count per b x heads x s^2: at the .to() backward the fp32 softmax output (4), the
    16-bit probabilities (2), their gradient (2) and its fp32 copy (4) coexist: 12, of which the forward saved 6 (bf16
    weights or autocast); in fp32 the softmax output (4) plus the probability and score gradients (4 + 4): 8 beyond."""
    llama = _spec("llama")
    for kw, beyond in (({"weights_dtype": "bf16"}, 6), ({"autocast": "bf16"}, 6), ({"weights_dtype": "fp32"}, 8)):
        setup = _setup("eager", **kw)
        assert eager_backward_transient_bytes(llama, setup) == B * 4 * S * S * beyond, kw
        assert eager_backward_transient_bytes(llama, setup.replace(attn_implementation="sdpa")) == 0
