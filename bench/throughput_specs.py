"""Published throughput rows' models as ModelSpecs: the catalog entries and re-uploads a row names, and the shapes its
source states where no catalog entry exists (MPT, torchao's Llama2-1B, flash-attention's GPT-3 shapes, Qwen v1,
SantaCoder). Split from bench/throughput_rows.py, which maps the rest of a row (its Setup, GPU and published rate).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from accuracy_spec import REUPLOADS

from perfguide.errors import PerfGuideError
from perfguide.model.types import ModelSpec


class Skip(Exception):
    """A row perfguide cannot express; the message is the reason shown in the report."""



# MPT shapes from llm-foundry scripts/train/yamls/pretrain/mpt-*.yaml (d_model, n_layers, n_heads); the
# bench checks each against the row's exact NumParams (12*L*d^2 + vocab*d + seq*d learned positions).
MPT = {"mpt-125m": (768, 12, 12), "mpt-350m": (1024, 24, 16), "mpt-760m": (1536, 24, 12), "mpt-1b": (2048, 24, 16),
       "mpt-3b": (2560, 32, 20), "mpt-7b": (4096, 32, 32), "mpt-13b": (5120, 40, 40), "mpt-30b": (7168, 48, 56),
       "mpt-70b": (8192, 80, 64)}
MPT_VOCAB = 50368

@lru_cache(maxsize=64)
def mpt_spec(name: str, seq_len: int) -> ModelSpec:
    d, layers, heads = MPT[name]
    config = {"model_type": "mpt", "d_model": d, "n_layers": layers, "n_heads": heads, "vocab_size": MPT_VOCAB,
              "expansion_ratio": 4, "max_seq_len": seq_len, "_name_or_path": name}
    return ModelSpec.from_any(config)


LLAMA2_1B_TORCHAO = {  # torchao quantized_training README: "Llama2-1B (24 layers, dim 1536)"; the rest is
    # Llama-2's ModelArgs rule (FFN 4*dim*2/3 rounded up to 256 -> 4096), 32000 vocab, head_dim 128 (inferred)
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 1536, "num_hidden_layers": 24,
    "num_attention_heads": 12, "num_key_value_heads": 12, "intermediate_size": 4096, "vocab_size": 32000,
    "max_position_embeddings": 2048, "_name_or_path": "llama2-1b (torchao)"}

# flash-attention training/configs/experiment/pile (commit 4a6eaa9f): GPT-2 blocks at GPT-3 shapes (n_embd, n_layer,
# n_head), vocab 50257 padded to a multiple of 8 (pad_vocab_size_multiple: 8), learned positions up to max_length
GPT3_FLASH = {"gpt3-125m": (768, 12, 12), "gpt3-355m": (1024, 24, 16), "gpt3-760m": (1536, 24, 16),
              "gpt3-1.3b": (2048, 24, 16), "gpt3-2.7b": (2560, 32, 20)}


def _qwen_v1(hidden: int, layers: int, heads: int, ffn: int, vocab: int) -> dict[str, Any]:
    """Qwen (v1) as its Llama-shaped equivalent: RMSNorm, RoPE, SwiGLU (config.json's intermediate_size counts both
    SwiGLU halves, so the FFN width is half of it), untied head. Its fused c_attn (qkv) is priced as q/k/v."""
    return {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": hidden, "num_hidden_layers": layers,
            "num_attention_heads": heads, "num_key_value_heads": heads, "intermediate_size": ffn, "vocab_size": vocab,
            "max_position_embeddings": 8192, "tie_word_embeddings": False}


QWEN_V1 = {  # huggingface.co/Qwen/Qwen-{1_8B,7B,14B}-Chat config.json: hidden_size, num_hidden_layers, num_attention_heads,
    # intermediate_size (11008 / 22016 / 27392, both SwiGLU halves), vocab_size; 1.84B / 7.72B / 14.17B parameters
    "qwen-1.8b-chat": _qwen_v1(2048, 24, 16, 5504, 151936),
    "qwen-7b-chat": _qwen_v1(4096, 32, 32, 11008, 151936),
    "qwen-14b-chat": _qwen_v1(5120, 40, 40, 13696, 152064),
}

CATALOG = {"distilbert-base-uncased": "distilbert/distilbert-base-uncased", "bert-base-cased": "google-bert/bert-base-cased",
           "bert-large-uncased": "google-bert/bert-large-uncased", "gpt2": "openai-community/gpt2",
           "gpt2-medium": "openai-community/gpt2-medium", "gpt2-large": "openai-community/gpt2-large",
           "gpt2-xl": "openai-community/gpt2-xl", "llama 3.1 8b": "meta-llama/Llama-3.1-8B",
           "llama3-8b": "meta-llama/Meta-Llama-3-8B", "llama 3-8b": "meta-llama/Meta-Llama-3-8B",
           "llama 3 8b": "meta-llama/Meta-Llama-3-8B", "llama 3.2 3b": "meta-llama/Llama-3.2-3B",
           "llama2-7b": "meta-llama/Llama-2-7b-hf", "llama2-70b": "meta-llama/Llama-2-70b-hf",
           "llama2-13b": "meta-llama/Llama-2-13b-hf", "tinyllama-1.1b": "TinyLlama/TinyLlama-1.1B",
           # granite-7b-base has Llama-2-7B's shape (32 x 4096, FFN 11008, 32k vocab; its model card)
           "ibm-granite/granite-7b-base": "meta-llama/Llama-2-7b-hf", "mistralai/mistral-7b-v0.1": "mistralai/Mistral-7B-v0.1"}

# huggingface.co/bigcode/gpt_bigcode-santacoder config.json: 24 x 2048, 16 heads with one shared K/V head (multi_query),
# MLP 4 x 2048 (n_inner null), learned positions up to 2048, 49280 vocab, tied head: 1.12B parameters
SANTACODER = {"model_type": "gpt_bigcode", "architectures": ["GPTBigCodeForCausalLM"], "n_embd": 2048, "n_layer": 24, "n_head": 16,
              "multi_query": True, "vocab_size": 49280, "n_positions": 2048, "n_inner": None, "bos_token_id": 49152,
              "eos_token_id": 49152, "activation_function": "gelu_pytorch_tanh", "_name_or_path": "bigcode/gpt_bigcode-santacoder"}


@lru_cache(maxsize=64)
def _catalog(name: str) -> ModelSpec:
    return ModelSpec.from_any(name)


def model_spec(row: dict[str, str], seq_len: int) -> ModelSpec:
    """The row's model; Skip where it is no token model or no catalog entry / re-upload / stated shape names it."""
    name = row["model"].strip()
    key = name.lower()
    if key in MPT:
        return mpt_spec(key, seq_len)
    if key.startswith("llama2-1b"):
        return ModelSpec.from_any(LLAMA2_1B_TORCHAO)
    if key in QWEN_V1:
        return ModelSpec.from_any({**QWEN_V1[key], "_name_or_path": name})
    if key in GPT3_FLASH:
        d, layers, heads = GPT3_FLASH[key]
        return ModelSpec.from_any({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": d, "n_layer": layers,
                                   "n_head": heads, "vocab_size": 50264, "n_positions": seq_len, "_name_or_path": name})
    if key.startswith(("timm/", "vit")):
        raise Skip("vision transformer (image patches): perfguide prices token sequences")
    if key == "bigcode/gpt_bigcode-santacoder":
        return ModelSpec.from_any(SANTACODER)
    if key in CATALOG:
        return _catalog(CATALOG[key])
    if "/" in name:   # a Hub id, as the run loaded it: the catalog's entry, or the original a re-upload copies
        try:
            return _catalog(REUPLOADS.get(name, name))
        except PerfGuideError:
            pass
    raise Skip(f"model {name!r} not in perfguide's catalog")
