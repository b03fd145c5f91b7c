"""A published-measurements row's model as its run trained it: the catalog entry, re-upload or config dict it names
(bench/accuracy_configs.py), then what the run changed about it (FSDP1 size-based wrapping, frozen embeddings).

bench/accuracy.py prices the spec this module reads with the Setup bench/accuracy_setup.py reads.
"""

from __future__ import annotations

import re

from accuracy_configs import CONFIGS
from accuracy_setup import Skip

from perfguide.errors import PerfGuideError
from perfguide.memory.sharding import size_wrapped_spec
from perfguide.model.types import ModelSpec

_SPECS: dict[str, ModelSpec] = {}

# Community re-uploads of a catalog model (same config.json, same weights); the catalog deliberately does not
# resolve unknown organisations, so the bench names the original here.
REUPLOADS = {"daryl149/llama-2-13b-chat-hf": "meta-llama/Llama-2-13b-hf",
             "unsloth/Mistral-7B-v0.2": "mistralai/Mistral-7B-v0.2",
             # the Instruct release keeps the base's shape (lit-gpt 2647dbda lit_gpt/config.py builds both from one dict:
             # 4096 x 32, 8 query groups, FFN 14336, vocab 32000)
             "mistralai/Mistral-7B-Instruct-v0.1": "mistralai/Mistral-7B-v0.1",
             # Llama 3.3 70B reuses Llama 3.1 70B's config.json shape (80 x 8192, FFN 28672, 128256 vocab, GQA 8)
             "meta-llama/Llama-3.3-70B-Instruct": "meta-llama/Llama-3.1-70B",
             # Qwen2 and Qwen2.5 share each size's config.json shape (7B: 3584 x 28, FFN 18944, 28/4 heads; 72B:
             # 8192 x 80, FFN 29568, 64/8 heads; vocab 152064, untied)
             "Qwen/Qwen2-7B-Instruct": "Qwen/Qwen2.5-7B", "Qwen/Qwen2-72B-Instruct": "Qwen/Qwen2.5-72B",
             "unsloth/Meta-Llama-3.1-8B-Instruct-bnb-4bit": "meta-llama/Llama-3.1-8B",
             # Unsloth's 'dynamic' bnb 4-bit upload of Qwen3-14B: its config.json shape; the modules its quantization_config
             # leaves 16-bit are not known here, so it is priced with every block Linear nf4 (the row's notes say so)
             "unsloth/qwen3-14b-unsloth-bnb-4bit": "Qwen/Qwen3-14B",
             # the Instruct and Thinking releases of Qwen3-Next-80B-A3B share one architecture (48 layers of 2048, 36
             # gated-DeltaNet and 12 gated-attention, 512 experts of 512 and one shared expert); inferred, row 3110 says so
             "Qwen/Qwen3-Next-80B-A3B-Instruct": "Qwen/Qwen3-Next-80B-A3B-Thinking",
             "decapoda-research/llama-7b-hf": "meta-llama/Llama-2-7b-hf",
             # LLaMA-1 13B: Llama-2-13B's shape (5120 x 40 layers, FFN 13824, 40 heads, vocab 32000); only the position
             # limit differs (2048 vs 4096), which holds no memory (rotary)
             "decapoda-research/llama-13b-hf": "meta-llama/Llama-2-13b-hf",
             "NousResearch/Llama-2-7b-hf": "meta-llama/Llama-2-7b-hf",  # an ungated re-upload, the same config.json
             "NousResearch/Llama-2-70b-hf": "meta-llama/Llama-2-70b-hf",  # an ungated copy of Meta's checkpoint
             # the Instruct release keeps the base's config.json shape (4096 x 32, 8 experts of FFN 14336, top-2)
             "mistralai/Mixtral-8x7B-Instruct-v0.1": "mistralai/Mixtral-8x7B-v0.1",
             # T0 3B is T5 v1.1 XL LM-adapted, fine-tuned (huggingface.co/bigscience/T0_3B/config.json): Flan-T5-XL's
             # shape (2048 x 24 + 24 layers, 32 heads of 64, gated-GELU FFN 5120, vocab 32128, untied head)
             "bigscience/T0_3B": "google/flan-t5-xl",
             # Olmo 3 7B Instruct SFT is post-trained from the 1025 base, whose config.json shape it keeps (4096 x 32,
             # FFN 11008, 32 heads, sliding-window layers 3 in 4); inferred, row 3519 says so
             "allenai/Olmo-3-7B-Instruct-SFT": "allenai/Olmo-3-1025-7B",
             "casperhansen/llama-3-70b-fp16": "meta-llama/Meta-Llama-3-70B"}  # Meta's weights in fp16: the same config.json shape


def _spec(hub_id: str) -> ModelSpec:
    if hub_id not in _SPECS:
        try:
            _SPECS[hub_id] = ModelSpec.from_any(CONFIGS.get(hub_id) or REUPLOADS.get(hub_id, hub_id))
        except PerfGuideError as exc:
            raise Skip(f"model not in the offline catalog ({type(exc).__name__})") from None
    return _SPECS[hub_id]


#: sources whose FSDP1 units came from accelerate's size-based auto-wrap, with the threshold a row without one ran:
#: accelerate 0.7's FullyShardedDataParallelPlugin sets ``default_auto_wrap_policy(min_num_params)`` whenever
#: FSDP_MIN_NUM_PARAMS > 0; ``accelerate config`` and ``accelerate launch --min_num_params`` default to the float 1e8,
#: which launch exports as '100000000.0' and the plugin's ``int(os.environ[...])`` rejects, so a run had a typed value
SIZE_WRAP_DEFAULT = {
    "hf_blog_pytorch_fsdp": 2_000,   # the SHARD_GRAD_OP row states none: the blog's sample config's 2000, since
                                     # accelerate 0.7's own 1e8 default cannot run (row 642's notes); for GPT-2 both
                                     # split the tied head alike (sharding.size_wrap_splits_tied_head)
}


def size_wrap_threshold(row: dict[str, str]) -> int | None:
    """The row's FSDP1 ``min_num_params`` ("min_num_params=1M", "FSDP 2K + CPU offload"), or its source's default;
    None for a row not wrapped by size."""
    if row["source_group"] not in SIZE_WRAP_DEFAULT or "FSDP" not in row["parallelism"]:
        return None
    m = re.search(r"(\d+)\s*([KM])\b", row["method"])
    return int(m.group(1)) * {"K": 1_000, "M": 1_000_000}[m.group(2)] if m else SIZE_WRAP_DEFAULT[row["source_group"]]


def frozen_embeddings_spec(spec: ModelSpec) -> ModelSpec:
    """The seq2seq examples' ``--freeze_embeds`` on T5 (transformers examples/seq2seq utils.py ``freeze_embeds``:
    ``freeze_params(model.shared)`` and each stack's ``embed_tokens``, the same Parameter): the token embedding trains
    no more, and neither does a head tied to it (T5 v1.0 ``tie_word_embeddings``: ``lm_head.weight`` is ``shared.weight``).
    DDP buckets and AdamW states skip a parameter without a gradient, and the 4.2 DeepSpeed integration hands the engine
    only ``filter(lambda p: p.requires_grad, model.parameters())`` (integrations.py ``init_deepspeed``), so neither
    gradients nor fp32 masters nor optimizer state exist for it; its weight stays."""
    trainable = (spec.trainable_params if spec.trainable_params is not None else spec.total_params) - spec.embedding_params
    return spec.model_copy(update={"trainable_params": max(0, trainable)})


def trained_spec(row: dict[str, str], spec: ModelSpec) -> ModelSpec:
    """The model as the row's run trained it: FSDP1's size-based auto-wrap unties a tied head (sharding.size_wrapped_spec);
    ``--freeze_embeds`` freezes the token embedding and the head tied to it (frozen_embeddings_spec)."""
    threshold = size_wrap_threshold(row)
    spec = spec if threshold is None else size_wrapped_spec(spec, threshold)
    return frozen_embeddings_spec(spec) if "--freeze_embeds" in row["method"] and spec.model_type == "t5" else spec
