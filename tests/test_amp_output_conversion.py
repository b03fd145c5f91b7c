"""accelerate's fp32 copies of a 16-bit model output (eras.amp_output_conversion_bytes).

accelerate prepares a model for fp16/bf16 mixed precision as ``convert_outputs_to_fp32(autocast(model.forward))``
(0.7.0 Accelerator.prepare_model), so the end of the forward holds the 16-bit output and its fp32 copy at once.
Expected bytes are hand-derived for the 2022 HF PyTorch-FSDP blog's gpt2-large DDP + FP16 row (b 8 x s 128,
transformers 4.18, a loop that rebinds ``outputs``); the copy mechanism is checked on real torch tensors shaped as
GPT2Attention returns its cache.
"""

from __future__ import annotations

import torch

from perfguide.memory.eras import amp_output_conversion_bytes
from perfguide.model.types import ModelSpec
from perfguide.setup import Setup

#: openai-community/gpt2-large's config.json shape
GPT2_LARGE = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 1280, "n_layer": 36, "n_head": 20,
              "n_positions": 1024, "vocab_size": 50257}


def _setup(**kw: object) -> Setup:
    fields: dict[str, object] = dict(task="train", micro_batch_size=8, seq_len=128, weights_dtype="fp32",
                                     autocast="fp16", attn_implementation="eager", optimizer="adamw_torch")
    fields.update(kw)
    return Setup(**fields)  # type: ignore[arg-type]


LOGITS = 8 * 128 * 50257            # b x s x V
BLOCK_TOKENS = 8 * 128 * 36         # b x s x blocks


def test_gpt2_large_rebinding_loop_hand_count() -> None:
    # per logit: saved fp32 log-softmax 4 + 16-bit logits 2 + their fp32 copy 4 + the previous output's fp32 logits 4;
    # per h per block per token: 16-bit c_attn storage 3 x 2 + fp32 key and value 2 x 4 + the previous output's 2 x 4
    expected = LOGITS * 14 + BLOCK_TOKENS * 1280 * 22
    assert expected == 1_758_574_592
    assert amp_output_conversion_bytes(ModelSpec.from_any(GPT2_LARGE), _setup(), "4.18.0", outputs_alive=2) == expected


def test_one_output_alive_and_no_cache_under_checkpointing() -> None:
    spec = ModelSpec.from_any(GPT2_LARGE)
    assert amp_output_conversion_bytes(spec, _setup(), "4.18.0") == LOGITS * 10 + BLOCK_TOKENS * 1280 * 14
    assert amp_output_conversion_bytes(spec, _setup(gradient_checkpointing=True), "4.18.0", checkpointed=True) == LOGITS * 10


def test_nothing_without_autocast() -> None:
    assert amp_output_conversion_bytes(ModelSpec.from_any(GPT2_LARGE), _setup(autocast=None), "4.18.0", 2) == 0


def test_float_of_a_cache_view_is_a_new_contiguous_fp32_tensor() -> None:
    """GPT2Attention: key/value = _split_heads(c_attn(x).split(h, dim=2)): permuted views of the 16-bit b x s x 3h
    output. accelerate's ``tensor.float()`` of such a view allocates b x heads x s x head_dim fp32 elements and leaves
    the 16-bit storage to whoever still references it (the 16-bit output, until the wrapper returns)."""
    b, s, heads, hd = 2, 8, 4, 16
    fused = torch.zeros(b, s, 3 * heads * hd, dtype=torch.float16)
    key = fused.split(heads * hd, dim=2)[1].view(b, s, heads, hd).permute(0, 2, 1, 3)
    copy = key.float()
    assert key.untyped_storage().data_ptr() == fused.untyped_storage().data_ptr()
    assert copy.untyped_storage().data_ptr() != fused.untyped_storage().data_ptr()
    assert copy.untyped_storage().nbytes() == b * heads * s * hd * 4
