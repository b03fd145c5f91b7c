"""Published engine start-up logs as bench rows: what vLLM / SGLang printed, with the setup and version stated in
the same log or issue, and perfguide's prediction of the same figure from the model shape and datasheet alone.

Three kinds of figure, each checking one part of the account:
- ``weights``: "Model loading took X GiB" / "Load weight end ... mem usage" (vLLM printed GiB as "GB" before 0.8):
  the per-rank weight bytes of the format (experts included) under tensor parallelism;
- ``kv_tokens``: the tokens (or blocks x 16) the engine cut from the KV memory it logged: the per-token bytes of
  every layer, the block size, what a rank holds under TP;
- ``kv_gib``: "Available KV cache memory" / kv_cache_size: the whole budget rule (utilization, weights, the
  profiled activation peak, non-torch memory; CUDA graphs only from vLLM 0.21, where they entered the rule);
- ``pool_tokens``: SGLang's "#tokens" from mem_fraction_static: its whole rule, in tokens.
Nothing in perfguide/data/serving.json was fitted to a row marked out of sample.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from perfguide import Hardware, engines
from perfguide.memory.serving import kv_bytes_per_token, rank_weight_bytes
from perfguide.model.types import ModelSpec
from perfguide.setup import ServingSetup

GiB = 1024**3

#: Qwen3-Coder-480B-A35B-Instruct config.json (huggingface.co/Qwen/Qwen3-Coder-480B-A35B-Instruct), the fields that size it
QWEN3_CODER_480B: dict[str, Any] = {
    "model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 6144, "num_hidden_layers": 62,
    "num_attention_heads": 96, "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 8192,
    "moe_intermediate_size": 2560, "num_experts": 160, "num_experts_per_tok": 8, "vocab_size": 151936,
    "max_position_embeddings": 262144, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}


@dataclass(frozen=True)
class LogRow:
    model: str | dict[str, Any]
    label: str
    engine: str
    version: str
    kind: str                      # weights | kv_tokens | kv_gib | pool_tokens
    published: float
    source: str
    serving: dict[str, Any] = field(default_factory=dict)
    gpu: str | None = None
    kv_gib: float | None = None    # the KV memory the log printed (kv_tokens rows)
    in_sample: bool = False


ROWS: tuple[LogRow, ...] = (
    LogRow("meta-llama/Llama-3.1-8B", "Llama-3.1-8B bf16, RTX 3090, TP1", "vllm", "0.6", "weights", 14.9888,
           "github.com/vllm-project/vllm/issues/10517"),
    LogRow("meta-llama/Llama-3.1-8B", "Llama-3.1-8B bf16, RTX 3090, kv_cache_size 3.81 GiB -> 1952 blocks", "vllm", "0.6",
           "kv_tokens", 1952 * 16, "github.com/vllm-project/vllm/issues/10517", kv_gib=3.81),
    LogRow("meta-llama/Llama-3.1-8B", "Llama-3.1-8B bf16, RTX 3090, kv_cache_size 2.89 GiB -> 1478 blocks", "vllm", "0.6",
           "kv_tokens", 1478 * 16, "github.com/vllm-project/vllm/issues/10517", kv_gib=2.89),
    LogRow("meta-llama/Llama-3.1-8B", "Llama-3.1-8B bf16, RTX 3090, util 0.90, max_model_len 20000 (sets half the driver reserve)",
           "vllm", "0.6", "kv_gib", 3.81, "github.com/vllm-project/vllm/issues/10517", gpu="rtx3090", in_sample=True,
           serving=dict(max_model_len=20000, max_num_batched_tokens=20000, gpu_memory_utilization=0.9, enforce_eager=True)),
    LogRow("meta-llama/Llama-3.1-8B", "Llama-3.1-8B bf16, RTX 3090, util 0.90, max_model_len 29000", "vllm", "0.6", "kv_gib", 2.89,
           "github.com/vllm-project/vllm/issues/10517", gpu="rtx3090",
           serving=dict(max_model_len=29000, max_num_batched_tokens=29000, gpu_memory_utilization=0.9, enforce_eager=True)),
    LogRow("Qwen/Qwen3-30B-A3B", "Qwen3-30B-A3B bf16 (MoE), 4x A10, TP4", "vllm", "0.8.5", "weights", 14.2474,
           "github.com/vllm-project/vllm/issues/17469", serving=dict(tensor_parallel_size=4)),
    LogRow("Qwen/Qwen3-30B-A3B", "Qwen3-30B-A3B bf16 (MoE), one 288 GB AMD GPU, TP1", "sglang", "0.5 (2026-07)", "weights", 56.98,
           "github.com/sgl-project/sglang/pull/18263"),
    LogRow("Qwen/Qwen3-30B-A3B", "Qwen3-30B-A3B bf16, KV budget 152.88 GiB -> #tokens", "sglang", "0.5 (2026-07)", "kv_tokens", 1669816,
           "github.com/sgl-project/sglang/pull/18263", kv_gib=152.88),
    LogRow("openai/gpt-oss-120b", "gpt-oss-120b MXFP4 (MoE), H100, TP1", "vllm", "0.10.1", "weights", 65.9651,
           "github.com/vllm-project/vllm/issues/23278", serving=dict(weight_format="mxfp4")),
    LogRow("openai/gpt-oss-120b", "gpt-oss-120b MXFP4 (MoE), H100, TP1", "vllm", "0.14.1", "weights", 64.38,
           "github.com/vllm-project/vllm/issues/33155", serving=dict(weight_format="mxfp4")),
    LogRow("openai/gpt-oss-120b", "gpt-oss-120b MXFP4, H100, util 0.90, max_num_batched_tokens 8192, 1024 seqs", "vllm", "0.10.1",
           "kv_gib", -2.14, "github.com/vllm-project/vllm/issues/23278", gpu="h100-80gb",
           serving=dict(weight_format="mxfp4", gpu_memory_utilization=0.9, max_num_batched_tokens=8192, max_num_seqs=1024,
                        max_model_len=131072, enforce_eager=True)),
    LogRow("openai/gpt-oss-120b", "gpt-oss-120b MXFP4, H100, util 0.95, max_num_batched_tokens 1024, 1024 seqs", "vllm", "0.11",
           "kv_gib", 1.71, "github.com/vllm-project/vllm/issues/27508", gpu="h100-80gb",
           serving=dict(weight_format="mxfp4", gpu_memory_utilization=0.95, max_num_batched_tokens=1024, max_num_seqs=1024,
                        max_model_len=131072, enforce_eager=True)),
    LogRow("meta-llama/Llama-3.1-405B", "Llama-3.1-405B FP8, 8x H100, TP8", "vllm", "0.5.3", "weights", 57.7520,
           "github.com/vllm-project/vllm/issues/6746", serving=dict(weight_format="fp8", tensor_parallel_size=8)),
    LogRow("meta-llama/Llama-3.1-70B", "Llama-3.1-70B W8A8 (8-bit, as fp8 bytes), TP1", "vllm", "0.7 (V1)", "weights", 67.7229,
           "github.com/vllm-project/vllm/pull/12569", serving=dict(weight_format="fp8")),
    LogRow("meta-llama/Llama-3.1-8B", "Llama-3-8B bf16 (same shapes), H100, TP1", "vllm", "0.6.5", "weights", 14.96,
           "github.com/vllm-project/vllm/pull/10511"),
    LogRow("meta-llama/Llama-3.1-8B", "Llama-3-8B bf16 (same shapes), H100, TP2", "vllm", "0.6.5", "weights", 7.48,
           "github.com/vllm-project/vllm/pull/10511", serving=dict(tensor_parallel_size=2)),
    LogRow("meta-llama/Llama-3.1-8B", "Llama-3-8B bf16, H100, util 0.90, max_model_len 8192, 256 seqs", "vllm", "0.6.5", "kv_gib", 53.29,
           "github.com/vllm-project/vllm/pull/10511", gpu="h100-80gb",
           serving=dict(max_model_len=8192, max_num_batched_tokens=8192, gpu_memory_utilization=0.9, enforce_eager=True)),
    LogRow("Qwen/Qwen3-235B-A22B", "Qwen3-235B-A22B-FP8 (MoE, fp8 blocks), 4x H100, TP4, KV 8.11 GiB -> tokens", "vllm", "0.9/0.10 (2025-07)",
           "kv_tokens", 178880, "github.com/vllm-project/vllm/issues/21348", kv_gib=8.11,
           serving=dict(weight_format="fp8_block", tensor_parallel_size=4)),
    LogRow("Qwen/Qwen3-235B-A22B", "Qwen3-235B-A22B-FP8, 4x H100, TP4, util 0.90, max_model_len 40960, 1024 seqs", "vllm",
           "0.9/0.10 (2025-07)", "kv_gib", 8.11, "github.com/vllm-project/vllm/issues/21348", gpu="h100-80gb:4",
           serving=dict(weight_format="fp8_block", tensor_parallel_size=4, gpu_memory_utilization=0.9, max_model_len=40960,
                        max_num_batched_tokens=8192, max_num_seqs=1024, enforce_eager=True)),
    LogRow("Qwen/Qwen3-235B-A22B", "Qwen3-235B-A22B-FP8, 4x H100, TP4, K+V 16.46 GiB -> #tokens", "sglang", "0.4.9 (2025-07)",
           "kv_tokens", 367404, "github.com/vllm-project/vllm/issues/21348", kv_gib=16.46,
           serving=dict(weight_format="fp8_block", tensor_parallel_size=4)),
    LogRow("Qwen/Qwen3-235B-A22B", "Qwen3-235B-A22B-FP8, 4x H100, TP4, mem_fraction_static 0.93 -> #tokens", "sglang",
           "0.4.9 (2025-07)", "pool_tokens", 367404, "github.com/vllm-project/vllm/issues/21348", gpu="h100-80gb:4",
           serving=dict(weight_format="fp8_block", tensor_parallel_size=4, gpu_memory_utilization=0.93, max_model_len=40960)),
    LogRow(QWEN3_CODER_480B, "Qwen3-Coder-480B-A35B FP8, 8x H20, DP8 + EP, KV 48.66 GiB -> max model len", "vllm", "0.10.1",
           "kv_tokens", 205728, "github.com/vllm-project/recipes/pull/12", kv_gib=48.66),
    LogRow(QWEN3_CODER_480B, "Qwen3-Coder-480B-A35B FP8, 8x H20, DP8 + EP, util 0.95, KV 55.65 GiB -> max model len", "vllm", "0.10.1",
           "kv_tokens", 235296, "github.com/vllm-project/recipes/pull/12", kv_gib=55.65),
)


def _spec(model: str | dict[str, Any]) -> ModelSpec:
    return ModelSpec.from_any(model)


def predict(row: LogRow) -> float:
    """perfguide's figure for the row, from the model shape and the GPU datasheet."""
    spec = _spec(row.model)
    serving = ServingSetup(engine=row.engine, **row.serving)
    if row.kind == "weights":
        return rank_weight_bytes(spec, serving) / GiB
    engine = engines.server(row.engine)
    if row.kind == "kv_tokens":
        assert row.kv_gib is not None
        block = engine.facts.block_size
        return int(row.kv_gib * GiB) // (block * kv_bytes_per_token(spec, serving)) * block
    assert row.gpu is not None
    mem = engine.memory(spec, serving, Hardware.from_name(row.gpu))
    return mem.kv_cache_tokens if row.kind == "pool_tokens" else mem.kv_cache_bytes / GiB


def error(row: LogRow, predicted: float) -> float:
    """Relative error; a KV budget near zero is compared in GiB of the GPU's memory instead (1 GiB of 80 = 1.3%)."""
    if row.kind == "kv_gib" and abs(row.published) < 4:
        total = Hardware.from_name(row.gpu or "h100-80gb").smallest_gpu
        assert total is not None
        return (predicted - row.published) * GiB / total.memory_total
    return predicted / row.published - 1
