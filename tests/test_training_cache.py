"""The KV cache a training forward returns (eras.training_cache_bytes, data/activations.json training_cache).

Expected bytes are hand-derived: GPT-2's present = (key, value) are views of the fused c_attn output
(b x s x 3h), so that whole output stays alive while the model output does: 3 x h x (4 B fp32 | 2 B under
autocast) per block per token, times the outputs alive at the forward peak. The mechanism itself (a view keeps
its base storage) is checked on real torch tensors shaped as GPT2Attention builds them.
"""

from __future__ import annotations

import pytest

from perfguide.memory.activations_data import activations_data
from perfguide.memory.eras import training_cache_bytes
from perfguide.model.types import ModelSpec
from perfguide.setup import Setup

#: openai-community/gpt2-large's config.json shape (the HF PyTorch-FSDP blog's model)
GPT2_LARGE = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 1280, "n_layer": 36, "n_head": 20,
              "n_positions": 1024, "vocab_size": 50257}


def _spec(**extra: object) -> ModelSpec:
    return ModelSpec.from_any({**GPT2_LARGE, **extra})


def _setup(**kw: object) -> Setup:
    fields: dict[str, object] = dict(task="train", micro_batch_size=7, seq_len=128, weights_dtype="fp32",
                                     attn_implementation="eager", optimizer="adamw_torch")
    fields.update(kw)
    return Setup(**fields)  # type: ignore[arg-type]


def test_gpt2_large_fp32_at_4_18_hand_derived() -> None:
    # 3 x 1280 elements x 4 B x 36 blocks x 7 x 128 tokens
    assert training_cache_bytes(_spec(), _setup(), "4.18.0") == 3 * 1280 * 4 * 36 * 7 * 128 == 495_452_160


def test_rebinding_loop_keeps_two_outputs_at_the_forward_peak() -> None:
    assert training_cache_bytes(_spec(), _setup(), "4.18.0", outputs_alive=2) == 2 * 495_452_160


def test_autocast_halves_the_cache() -> None:
    # under fp16 autocast c_attn's addmm returns fp16: 2 B per element
    assert training_cache_bytes(_spec(), _setup(autocast="fp16"), "4.46.3") == 3 * 1280 * 2 * 36 * 7 * 128


@pytest.mark.parametrize(("release", "setup_kw", "extra"), [
    ("5.24.0", {}, {}),                                   # traced: the DynamicCache of 5.x keeps nothing extra
    ("4.18.0", {"checkpointed": True}, {}),               # HF switches use_cache off under checkpointing in training
    ("4.18.0", {"attn_implementation": "sdpa"}, {}),      # no traced entry for SDPA: not charged
    ("4.18.0", {}, {"use_cache": False}),                 # the config turned the cache off
])
def test_no_cache_bytes_where_none_is_kept(release: str, setup_kw: dict[str, object], extra: dict[str, object]) -> None:
    checkpointed = bool(setup_kw.pop("checkpointed", False))
    assert training_cache_bytes(_spec(**extra), _setup(**setup_kw), release, checkpointed=checkpointed) == 0


def test_other_model_types_are_not_charged() -> None:
    llama = ModelSpec.from_any({"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 256,
                                "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 4,
                                "num_hidden_layers": 2, "vocab_size": 1000})
    assert training_cache_bytes(llama, _setup(), "4.18.0") == 0


def test_entries_name_their_traced_release_and_source() -> None:
    entries = activations_data().training_cache.entries
    gpt2 = [e for e in entries if e.model_type == "gpt2"]
    assert {e.since for e in gpt2} == {"0.0", "5.24.0"}
    assert all("c_attn" in e.source or "traced" in e.source for e in gpt2)


def test_split_heads_views_keep_the_fused_projection_alive() -> None:
    """GPT2Attention (4.18 - 4.46): c_attn(x).split(h, dim=2), then view + permute per head: key and value are
    views whose storage is the whole b x s x 3h output, which the returned present therefore keeps."""
    torch = pytest.importorskip("torch")
    b, s, h, heads = 2, 16, 64, 4
    fused = torch.randn(b, s, 3 * h)
    _, key, value = fused.split(h, dim=2)
    key = key.view(b, s, heads, h // heads).permute(0, 2, 1, 3)
    value = value.view(b, s, heads, h // heads).permute(0, 2, 1, 3)
    present = (key, value)
    del fused
    assert {t.untyped_storage().nbytes() for t in present} == {b * s * 3 * h * 4}


def test_plans_charge_the_cache_of_the_installed_release(monkeypatch: pytest.MonkeyPatch) -> None:
    """training_memory prices HF's own loss with the installed transformers: on a 4.x release the cache GPT-2's
    forward returns is alive at the loss peak (once: Trainer drops the output before backward), and GPT-2's blocks
    still keep their tril(n_positions^2) causal-mask buffer (1 B per position^2 per block; gone from 5.2.0)."""
    from perfguide.memory import analytic

    # fused AdamW (no parameter-sized step temporary): both releases peak at the loss, where these bytes are
    spec, setup = _spec(), _setup(optimizer="adamw_torch_fused")
    monkeypatch.setattr(analytic, "installed_transformers", lambda: "5.24.0")
    now = analytic.training_memory(spec, setup).peak_allocated
    monkeypatch.setattr(analytic, "installed_transformers", lambda: "4.46.3")
    old = analytic.training_memory(spec, setup).peak_allocated
    assert old - now == 495_452_160 + 36 * 1024 * 1024
