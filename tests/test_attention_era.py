"""Older transformers attention code saves more for backward (eras.attention_era_bytes, data/activations.json
attention_eras): OPT before 4.49.

Expected bytes are hand-derived from the 4.46.3 / 4.48.0 modeling_opt.py (read in the released wheels):
- eager: ``torch.max(attn_weights, finfo.min)`` after the mask add; the maximum's backward keeps its s x s input,
  one element per (b x heads x s^2) more than 5.x, whose softmax(dtype=float32).to(fp16) + matmul save the rest;
- sdpa: q/k/v made contiguous head-first (``_shape``), so ``attn_output.transpose(1, 2).contiguous()`` copies
  SDPA's output for out_proj: one hidden-size element per token more than 5.x.
The same numbers came out of a trace sdpa2 ran (saved_tensors_hooks on a real CPU OPT, h 64, 4 heads, b 2 x s
64/128, 2-block minus 1-block, the 4.46.3 wheel imported from a temp dir vs the installed 5.24.0): eager 8.0 vs
6.0 B per (b*heads*s^2) in fp16 and 8.0 vs 4.0 in fp32; sdpa 26.375 vs 24.375 B per h per token in fp16, 52.5 vs
48.5 in fp32. The two mechanisms are also checked here on real torch tensors.
"""

from __future__ import annotations

import pytest

from perfguide.memory.eras import attention_era_bytes
from perfguide.model.types import ModelSpec
from perfguide.setup import Setup

#: facebook/opt-350m's config.json shape (the transformers docs' OPT SDPA table)
OPT_350M = {"model_type": "opt", "architectures": ["OPTForCausalLM"], "hidden_size": 1024, "num_attention_heads": 16,
            "num_hidden_layers": 24, "ffn_dim": 4096, "vocab_size": 50272, "word_embed_proj_dim": 512,
            "max_position_embeddings": 2048, "do_layer_norm_before": False}


def _spec(**extra: object) -> ModelSpec:
    return ModelSpec.from_any({**OPT_350M, **extra})


def _setup(attn: str = "eager", **kw: object) -> Setup:
    fields: dict[str, object] = dict(task="train", micro_batch_size=2, seq_len=2048, weights_dtype="fp16",
                                     attn_implementation=attn, optimizer="adamw_torch")
    fields.update(kw)
    return Setup(**fields)  # type: ignore[arg-type]


def test_opt_eager_4_46_keeps_the_clamped_scores_by_hand() -> None:
    # 1 fp16 element x b 2 x 16 heads x 2048^2 x 24 blocks
    assert attention_era_bytes(_spec(), _setup(), "4.46.0") == 2 * 2 * 16 * 2048 * 2048 * 24 == 6_442_450_944


def test_opt_sdpa_4_46_keeps_a_copy_of_the_attention_output_by_hand() -> None:
    # 1 fp16 element x h 1024 x b 2 x s 2048 x 24 blocks
    assert attention_era_bytes(_spec(), _setup("sdpa"), "4.48.0") == 2 * 1024 * 2 * 2048 * 24 == 201_326_592


def test_fp32_doubles_and_checkpointing_keeps_one_block() -> None:
    assert attention_era_bytes(_spec(), _setup(weights_dtype="fp32"), "4.46.3") == 4 * 2 * 16 * 2048 * 2048 * 24
    assert attention_era_bytes(_spec(), _setup(), "4.46.3", checkpointed=True) == 2 * 2 * 16 * 2048 * 2048


@pytest.mark.parametrize("release", ["4.49.0", "4.50.0", "5.24.0"])
def test_the_refactored_code_saves_what_the_installed_traces_count(release: str) -> None:
    assert attention_era_bytes(_spec(), _setup(), release) == 0
    assert attention_era_bytes(_spec(), _setup("sdpa"), release) == 0


def test_a_model_type_without_an_entry_is_charged_nothing() -> None:
    llama = ModelSpec.from_any({"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 1024,
                                "intermediate_size": 4096, "num_attention_heads": 16, "num_hidden_layers": 24,
                                "vocab_size": 32000})
    assert attention_era_bytes(llama, _setup(), "4.46.0") == 0


def test_the_two_mechanisms_on_real_torch() -> None:
    """torch.max(x, scalar tensor) saves x for backward; a head-first contiguous tensor's transpose(1, 2).contiguous()
    is a new storage while a transposed view's is the same one."""
    import torch

    x = torch.randn(2, 4, 8, 8, dtype=torch.float16, requires_grad=True) + 0   # non-leaf, as the masked scores are
    saved: list[int] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.untyped_storage().data_ptr()) or t, lambda t: t):
        torch.max(x, torch.tensor(torch.finfo(x.dtype).min))
    assert x.untyped_storage().data_ptr() in saved

    head_first = torch.randn(2, 8, 4, 16).transpose(1, 2).contiguous()     # 4.46 _shape: (b, heads, s, d) in memory
    assert head_first.transpose(1, 2).contiguous().untyped_storage().data_ptr() != head_first.untyped_storage().data_ptr()
    token_first = torch.randn(2, 8, 4, 16).transpose(1, 2)                  # 4.49+: a view over (b, s, heads, d)
    assert token_first.transpose(1, 2).contiguous().untyped_storage().data_ptr() == token_first.untyped_storage().data_ptr()
