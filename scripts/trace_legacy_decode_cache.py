"""Count the KV-cache tensors alive as each decode forward of ``generate`` returns, on the installed transformers.

A release whose generate passes the legacy tuple cache (up to 4.41) keeps the previous step's cache (one position
shorter, every layer) referenced while the model builds the next one; from 4.42 generate passes a Cache object that
the model updates in place. Prints one JSON line: {"transformers": release, "steps": [{length: tensors, ...}, ...]}
for a 3-layer tiny Llama (batch 2, 3 key/value heads of 24), a 20-token prompt and 6 new tokens. Run it with an
older release on the path to see the other behaviour, e.g. (releases traced for bench/accuracy_prefill.py):

    pip install --no-deps --target /tmp/tf441 transformers==4.41.2 tokenizers==0.19.1 huggingface_hub==0.23.5 \\
        requests urllib3 idna charset_normalizer certifi
    PYTHONPATH=/tmp/tf441 python scripts/trace_legacy_decode_cache.py
"""

from __future__ import annotations

import gc
import json
from typing import Any

LAYERS, KV_HEADS, HEAD_DIM, BATCH, PROMPT, NEW = 3, 3, 24, 2, 20, 6


def _cache_tensors() -> dict[int, int]:
    """Live tensors shaped like one layer's key or value cache at a length the run can cache, by that length (other
    tensors of the process that happen to share the shape are left out by the length)."""
    import torch

    gc.collect()
    by_length: dict[int, int] = {}
    for obj in gc.get_objects():
        if isinstance(obj, torch.Tensor) and obj.dim() == 4 and (obj.shape[0], obj.shape[1], obj.shape[3]) == (
                BATCH, KV_HEADS, HEAD_DIM) and PROMPT <= obj.shape[2] <= PROMPT + NEW:
            by_length[obj.shape[2]] = by_length.get(obj.shape[2], 0) + 1
    return by_length


def trace() -> dict[str, Any]:
    import torch
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=128, hidden_size=KV_HEADS * HEAD_DIM, intermediate_size=128,
                         num_hidden_layers=LAYERS, num_attention_heads=KV_HEADS, num_key_value_heads=KV_HEADS,
                         max_position_embeddings=256, pad_token_id=0)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    steps: list[dict[int, int]] = []
    model.model.register_forward_hook(lambda *_: steps.append(_cache_tensors()))
    ids = torch.randint(1, 128, (BATCH, PROMPT))
    with torch.no_grad():
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False)
    return {"transformers": transformers.__version__, "steps": steps}


if __name__ == "__main__":
    print(json.dumps(trace()))
