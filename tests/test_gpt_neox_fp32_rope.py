"""GPT-NeoX before transformers 4.45 keeps its rotary cos/sin tables in fp32 (eras.attention_era_bytes,
data/activations.json attention_eras ``fp32_rope_bytes_per_h``; bench/accuracy_loss.py HELD_CACHE_BYTES_PER_H).

Read in the 4.42.4 and 4.44.2 wheels: ``GPTNeoXRotaryEmbedding`` builds ``inv_freq`` with ``.float()`` and
``cos_cached = emb.cos()`` from it, and its forward returns ``self.cos_cached[:seq_len]`` uncast; 4.45.2 returns
``cos.to(dtype=x.dtype)``. A model loaded with ``from_pretrained(torch_dtype=torch.float16)`` (as the docs table's
benchmark script loads it) keeps those non-persistent buffers in fp32, so ``q * cos`` promotes the rotated query and
key, and ``torch.cat((query, query_pass))`` makes all of q and k fp32.

Hand counts for pythia-410m (h 1024, 24 blocks), b 4 x s 1024 (the OOM row 357):
- eager: baddbmm saves q and k at 4 B instead of 2: +2 +2 B per h per token per block =
  4 x 1024 x 4 x 1024 x 24 = 402,653,184 B; SDPA casts q and k back before the kernel: +0.
- the benchmark loop's returned caches (``outputs = model(...)`` rebinds, so the previous output lives through the next
  forward): previous output 4 (fp32 key) + 6 (value, a view of the 3h fused qkv output) B per h; the current one adds
  6 under eager (matmul saved a contiguous copy of value, so only the cache keeps qkv) and 4 under SDPA (the fp32 key):
  16 and 14 B per h per token per block.
A live-bytes trace of that loop on the 4.42.4 wheel (real CPU fp16, 12 minus 6 blocks) gives the same: torch_dtype
load minus ``.half()`` +6.125 B per h per token per block; use_cache true minus false 16.0 (eager) and 14.0 (sdpa).
"""

from __future__ import annotations

from types import ModuleType

import pytest
from helpers import load_bench

from perfguide.memory.eras import attention_era_bytes
from perfguide.model.types import ModelSpec
from perfguide.setup import Setup

#: EleutherAI/pythia-410m-deduped's config.json shape (the transformers docs' GPT-NeoX SDPA table)
PYTHIA_410M = {"model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"], "hidden_size": 1024,
               "num_attention_heads": 16, "num_hidden_layers": 24, "intermediate_size": 4096, "vocab_size": 50304,
               "max_position_embeddings": 2048, "rotary_pct": 0.25, "tie_word_embeddings": False}
ROW_357 = 4 * 1024 * 4 * 1024 * 24


def _setup(attn: str = "eager", **kw: object) -> Setup:
    fields: dict[str, object] = dict(task="train", micro_batch_size=4, seq_len=1024, weights_dtype="fp16",
                                     attn_implementation=attn, optimizer=None)
    fields.update(kw)
    return Setup(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("release", ["4.42.0", "4.44.2"])
def test_eager_saves_fp32_q_and_k_before_4_45_by_hand(release: str) -> None:
    assert attention_era_bytes(ModelSpec.from_any(PYTHIA_410M), _setup(), release) == ROW_357 == 402_653_184


def test_autocast_promotes_too_and_fp32_has_nothing_to_promote() -> None:
    spec = ModelSpec.from_any(PYTHIA_410M)
    assert attention_era_bytes(spec, _setup(weights_dtype="fp32", autocast="fp16"), "4.42.0") == ROW_357
    assert attention_era_bytes(spec, _setup(weights_dtype="fp32"), "4.42.0") == 0


def test_checkpointing_keeps_one_block() -> None:
    assert attention_era_bytes(ModelSpec.from_any(PYTHIA_410M), _setup(), "4.42.0", checkpointed=True) == ROW_357 // 24


@pytest.mark.parametrize("release", ["4.45.0", "4.48.0", "5.24.0"])
def test_the_cast_tables_of_4_45_on_save_what_the_installed_traces_count(release: str) -> None:
    assert attention_era_bytes(ModelSpec.from_any(PYTHIA_410M), _setup(), release) == 0


def test_sdpa_saves_the_16_bit_copies() -> None:
    assert attention_era_bytes(ModelSpec.from_any(PYTHIA_410M), _setup("sdpa"), "4.42.0") == 0


def test_the_promotion_on_real_torch() -> None:
    """An fp16 tensor times an fp32 table is fp32, and cat of fp32 with fp16 is fp32: the whole head is promoted."""
    import torch

    q = torch.randn(2, 4, 8, 16, dtype=torch.float16)
    cos = torch.randn(1, 1, 8, 4)   # fp32, as cos_cached[position_ids].unsqueeze(1)
    rotated = q[..., :4] * cos
    whole = torch.cat((rotated, q[..., 4:]), dim=-1)
    assert rotated.dtype == whole.dtype == torch.float32
    assert whole.element_size() * whole.numel() == 2 * q.element_size() * q.numel()


@pytest.fixture(scope="module")
def acc() -> ModuleType:
    return load_bench("accuracy")


@pytest.mark.parametrize(("attn", "per_h"), [("eager", 16), ("sdpa", 14)])
def test_the_benchmark_loop_holds_both_outputs_caches_by_hand(acc: ModuleType, attn: str, per_h: int) -> None:
    from accuracy_loss import _held_cache_bytes

    assert _held_cache_bytes(ModelSpec.from_any(PYTHIA_410M), _setup(attn)) == per_h * 1024 * 24 * 4 * 1024
