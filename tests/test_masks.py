"""4-D attention masks kept alive by gradient checkpointing, against counts from a gc scan of real CPU tensors
(transformers 5.24, see perfguide/memory/masks.py): eager keeps one float mask per attention kind in the hidden
states' dtype, SDPA a bool mask only for a sliding window shorter than the sequence, flash none."""

from __future__ import annotations

from typing import Any

from perfguide import LoraSpec, ModelSpec, Setup
from perfguide.memory.analytic import training_memory
from perfguide.memory.masks import checkpointed_mask_bytes, eager_backward_transient_bytes, sdpa_bias_bytes

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


def test_sdpa_saves_an_additive_bias_of_the_query_dtype() -> None:
    """Real CPU tensors: SDPA given a bool sliding mask saves for backward an additive bias in the query's dtype,
    b x 1 x s x s (ATen convert_boolean_attn_mask), not the bool mask: 2 bytes per element in bf16."""
    import torch
    import torch.nn.functional as F

    b, h, s, d, window = 2, 4, 64, 16, 16
    q, k, v = (torch.randn(b, h, s, d, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    i = torch.arange(s)
    mask = ((i[:, None] >= i[None, :]) & (i[:, None] - i[None, :] < window)).expand(b, 1, s, s).contiguous()
    saved: list[Any] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    square = [t for t in saved if t.shape[-2:] == (s, s)]
    assert [(t.dtype, t.untyped_storage().nbytes()) for t in square] == [(torch.bfloat16, b * s * s * 2)]
    spec = _spec("gemma3_text", sliding_window=window, num_hidden_layers=6)
    setup = _setup("sdpa", weights_dtype="bf16").replace(micro_batch_size=b, seq_len=s)
    assert sdpa_bias_bytes(spec, setup, checkpointed=True) == b * s * s * 2


def test_sdpa_bias_by_hand() -> None:
    """Gemma 3's pattern (every 6th layer full): 5 of 6 layers slide. Checkpointed, one block's bias lives from its
    recompute to its backward; without, every sliding layer's is saved at once. fp32 queries: 4 bytes."""
    gemma3 = _spec("gemma3_text", sliding_window=32, num_hidden_layers=6)
    bf16 = _setup("sdpa", weights_dtype="bf16")
    assert sdpa_bias_bytes(gemma3, bf16, checkpointed=True) == B * S * S * 2
    assert sdpa_bias_bytes(gemma3, bf16, checkpointed=False) == 5 * B * S * S * 2
    assert sdpa_bias_bytes(gemma3, _setup("sdpa", autocast="bf16"), checkpointed=True) == B * S * S * 2
    assert sdpa_bias_bytes(gemma3, _setup("sdpa", weights_dtype="fp32"), checkpointed=True) == B * S * S * 4
    for other in (_setup("flash_attention_2", weights_dtype="bf16"), _setup("eager", weights_dtype="bf16")):
        assert sdpa_bias_bytes(gemma3, other, checkpointed=True) == 0
    assert sdpa_bias_bytes(_spec("gemma3_text", sliding_window=S, num_hidden_layers=6), bf16, checkpointed=False) == 0
    assert sdpa_bias_bytes(_spec("llama"), bf16, checkpointed=False) == 0


def test_step_s2_coefficient_by_hand() -> None:
    """Gemma 3 (5 sliding + 1 full layer, window 32, bf16, 64-token vocabulary so that no logits term competes): the
    only s^2 terms of an SDPA step are the masks. Checkpointed: the kept bool mask (1 byte per b x s^2) plus one
    recomputed block's bf16 bias (2) = 3; without checkpointing the five sliding layers' biases, 5 x 2 = 10. The
    coefficient is read off three lengths s, 2s, 4s (d2 - 2 d1 cancels the linear and constant terms)."""
    spec = _spec("gemma3_text", sliding_window=32, num_hidden_layers=6, vocab_size=64)
    lengths = (512, 1024, 2048)
    for gc, per_b_s2 in ((True, 3), (False, 10)):
        setup = _setup("sdpa", weights_dtype="bf16", optimizer="adamw_torch").replace(gradient_checkpointing=gc)
        peaks = [training_memory(spec, setup.replace(seq_len=s)) for s in lengths]
        assert len({p.notes[0] for p in peaks}) == 1, gc   # one phase holds the peak at every length
        d1, d2 = (peaks[i + 1].peak_allocated - peaks[i].peak_allocated for i in (0, 1))
        s1, s2, s3 = lengths
        expected = per_b_s2 * B * (s3 * s3 - s2 * s2 - 2 * (s2 * s2 - s1 * s1))
        assert abs(d2 - 2 * d1 - expected) <= 2, gc   # the fitted per-token coefficients round to whole bytes


def test_dpo_reference_forward_builds_its_own_mask_and_bias_by_hand() -> None:
    """DPO's no-grad reference forward over the 2 b sequences builds its own bool sliding mask (1 byte per element,
    alive through its blocks) and, one layer at a time, the bf16 SDPA bias (2): 3 x 2b x s^2 on top of its layer
    buffers. At 16,384 tokens that branch outgrows the fused head's, so the loss path is the head's saved hidden
    states + the reference's layer buffers + the masks."""
    from perfguide.data.techniques import constant
    from perfguide.memory.fused_head import fused_head_parts
    from perfguide.memory.inference import prefill_transient_bytes
    from perfguide.memory.masks import no_grad_forward_mask_bytes
    from perfguide.techniques.dpo import label_positions, loss_path_bytes

    s = 16384
    setup = _setup("sdpa", weights_dtype="bf16", objective="dpo", trainer="trl").replace(seq_len=s)
    spec = _spec("gemma3_text", sliding_window=32, num_hidden_layers=6, vocab_size=64, max_position_embeddings=s)
    doubled = setup.replace(micro_batch_size=2 * B)
    assert no_grad_forward_mask_bytes(spec, doubled) == 3 * 2 * B * s * s
    assert no_grad_forward_mask_bytes(spec, doubled.replace(attn_implementation="flash_attention_2")) == 0
    head = fused_head_parts(spec, setup, label_positions(setup), 2, int(constant("dpo_logprob_fp32_per_token")))
    assert loss_path_bytes(spec, setup, 2) == head.saved + prefill_transient_bytes(spec, doubled, 2) + 3 * 2 * B * s * s
