"""DeepSeek-V4's cache (memory/compressed_cache.py) against the cache a real bf16 ``generate`` leaves.

V4 keeps a sliding window of its one K/V head and, in its compressed layers, pooled entries that grow with the length
(transformers 5.24 DeepseekV4HCACache / DeepseekV4CSACache). perfguide read only the window: flat in the length,
0.16% of DeepSeek-V4-Flash's cache at 2^20 positions. Checked to the byte on a tiny model whose window and rates are small
enough that every part (window, entries, buffers, the overlapping series, the indexer's own compressor) is filled.
"""

from __future__ import annotations

from typing import Any

import pytest

from perfguide.memory.inference import cached_tokens, kv_cache_bytes
from perfguide.model.types import ModelSpec
from perfguide.setup import Setup

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

CONFIG: dict[str, Any] = {
    "model_type": "deepseek_v4", "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
    "num_key_value_heads": 1, "head_dim": 32, "qk_rope_head_dim": 8, "q_lora_rank": 32, "o_lora_rank": 32,
    "o_groups": 2, "index_head_dim": 16, "index_n_heads": 2, "index_topk": 8, "sliding_window": 12,
    "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
    "layer_types": ["compressed_sparse_attention", "heavily_compressed_attention", "sliding_attention"],
    "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "n_shared_experts": 1,
    "vocab_size": 256, "max_position_embeddings": 512, "hc_mult": 2, "pad_token_id": 0, "eos_token_id": 1,
    "bos_token_id": 2, "tie_word_embeddings": False,
}


def _real_bytes(cache: Any) -> int:
    """The bytes of every tensor the cache's layers hold, a tensor held twice (V4's ``values = keys``) once. Views count
    their own elements: a buffer or window sliced off the last call's projection keeps that whole storage alive
    until the next call, up to one window more, which is not priced."""
    seen: dict[tuple[int, tuple[int, ...]], int] = {}
    for layer in cache.layers:
        for value in vars(layer).values():
            for t in (value.values() if isinstance(value, dict) else [value]):
                if hasattr(t, "data_ptr") and t.numel() and t.dim() > 0:
                    seen[(t.data_ptr(), tuple(t.shape))] = t.numel() * t.element_size()
    return sum(seen.values())


@pytest.mark.parametrize("prompt", [6, 21, 43])
def test_v4_cache_is_what_generate_leaves(prompt: int) -> None:
    hf = transformers.AutoConfig.for_model(**CONFIG)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(hf).to(torch.bfloat16).eval()
    ids = torch.randint(3, 200, (2, prompt))
    out = model.generate(ids, max_new_tokens=5, min_new_tokens=5, do_sample=False, return_dict_in_generate=True,
                         pad_token_id=0)
    spec = ModelSpec.from_any(CONFIG)
    setup = Setup(task="infer", device="cpu", micro_batch_size=2, seq_len=prompt, new_tokens=5, weights_dtype="bf16")
    assert kv_cache_bytes(spec, 2, cached_tokens(setup, spec), 2) == _real_bytes(out.past_key_values)


def test_v4_flash_cache_grows_with_the_length() -> None:
    """The released config's compress_ratios (0 / 4 / 128 per layer, 43 layers): between two lengths that are whole
    windows of both rates, the cache grows by the entries alone, (512 + 128 indexer) x 2 B per 4 positions in each of
    its 21 CSA layers and 512 x 2 B per 128 in each of its 20 HCA layers, where the window alone was flat."""
    spec = ModelSpec.from_any("deepseek-ai/DeepSeek-V4-Flash")
    short, long = (kv_cache_bytes(spec, 1, n, 2) for n in (2**19, 2**20))
    ratios = spec.config["compress_ratios"][: spec.num_layers]
    csa, hca = ratios.count(4), ratios.count(128)
    assert (csa, hca) == (21, 20)
    assert long - short == csa * 2**19 // 4 * (512 + 128) * 2 + hca * 2**19 // 128 * 512 * 2
