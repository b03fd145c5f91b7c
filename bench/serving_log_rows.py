"""The published engine start-up logs bench/serving_logs.py predicts: one row per printed figure, with the setup
and engine version the same log, issue or page states, and its address.

Flags a log does not print are the engine's defaults at that version, marked "(defaults, inferred)" in the label:
vLLM V0 (before 0.8): 256 sequences, max_num_batched_tokens = max_model_len, or 2048 where chunked prefill is
switched on for contexts over 32K (vllm/engine/arg_utils.py); vLLM V1 ``vllm serve``: 1024 sequences and 8192
batched tokens on GPUs of 70 GiB or more except the A100, else 256 and 2048 (arg_utils._set_default_args).
``graphs_in_budget`` marks vLLM 0.21 and later, where the estimated CUDA-graph memory entered the KV budget
(VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS on by default; the 0.22.1 log below says so); earlier versions
captured graphs after sizing the cache. ``total_gib`` is the CUDA total a log printed (an input of the budget,
used where printed); otherwise the GPU's datasheet total less the driver reserve.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from perfguide import Hardware
from perfguide.engines.vllm import ENGINE as VLLM_ENGINE
from perfguide.model.catalog import config_of


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
    total_gib: float | None = None  # the CUDA total the log printed (kv_gib rows)
    graphs_in_budget: bool = False
    in_sample: bool = False
    vendor: str = "nvidia"          # the GPU's vendor where no perfguide GPU row names it (SGLang's rotary table dtype)


#: Qwen3-Coder-480B-A35B-Instruct config.json (huggingface.co/Qwen/Qwen3-Coder-480B-A35B-Instruct), the fields that size it
QWEN3_CODER_480B: dict[str, Any] = {
    "model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 6144, "num_hidden_layers": 62,
    "num_attention_heads": 96, "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 8192,
    "moe_intermediate_size": 2560, "num_experts": 160, "num_experts_per_tok": 8, "vocab_size": 151936,
    "max_position_embeddings": 262144, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}


def llama_405b_fp8() -> dict[str, Any]:
    """meta-llama/Llama-3.1-405B-Instruct-FP8: fbgemm_fp8 (row-wise FP8) on the MLPs only, with attention and the
    first and last layers left in bf16 (Llama 3 paper, arXiv 2407.21783 sec. 6.2: no quantization in self-attention
    nor in the first and last Transformer layers), which its config.json lists in modules_to_not_convert."""
    config = config_of("meta-llama/Llama-3.1-405B")
    last = int(config["num_hidden_layers"]) - 1
    ignore = ["self_attn", "lm_head"] + [f"model.layers.{i}.mlp" for i in (0, last)]
    return config | {"quantization_config": {"quant_method": "fbgemm_fp8", "modules_to_not_convert": ignore}}


# vllm serve's own batching (V1), as the engine module states it: on an H100, and on the A100 and smaller GPUs
V1_H100 = VLLM_ENGINE.server_defaults(Hardware.from_name("h100-80gb").gpus[0], 1)
V1_SMALL = VLLM_ENGINE.server_defaults(Hardware.from_name("a100-80gb").gpus[0], 1)
V0_LONG = {"max_num_seqs": 256, "max_num_batched_tokens": 2048}    # V0 with chunked prefill (contexts over 32K)
LLMD = "github.com/llm-d/llm-d-benchmark/blob/main/config_explorer/empirical-vllm-memory-results.md"
LLMD_V = "V1 (late 2025: logs the --kv-cache-memory advice)"
AKS = "github.com/javakishore-veleti/LLM-Inference-Serving-Azure-AKS/blob/main/README_RUNPOD_LOGS_ANALSYS.md"
OCI = "github.com/oracle-samples/oci-data-science-ai-samples/blob/main/ai-quick-actions/troubleshooting-tips.md"
ASIAN = "myoceane.fr/index.php/ai-vllm-a100-gemma-4/"
PHI4 = "github.com/xinyuwei-david/david-share/blob/master/Deep-Learning/Phi4/readme.md"
ECS = "github.com/didier-durand/llms-in-clouds/blob/main/docs/sglang.md"
ECS_V = "0.4.3 (2025-03, from the date)"


def _llmd(model: str, name: str, weights: float, kv: float, fmt: str = "bf16", tp: int = 1, mml: int = 16000,
          util: float = 0.9, note: str = "") -> tuple[LogRow, LogRow]:
    """One llm-d run: vllm serve on one H100 (79.18 GiB printed), util 0.9, prefix caching, block 128.
    The budget rows are in sample: the sampler constant was counted with these peaks in view."""
    s = {"weight_format": fmt, "tensor_parallel_size": tp}
    return (LogRow(model, f"{name} {fmt}, H100, TP{tp}", "vllm", LLMD_V, "weights", weights, LLMD, s),
            LogRow(model, f"{name} {fmt}, H100, TP{tp}, util {util:.2f}{note}, max_model_len {mml} (1024 seqs / 8192 tokens: defaults, "
                   "inferred)", "vllm", LLMD_V, "kv_gib", kv, LLMD, s | V1_H100 | {"gpu_memory_utilization": util, "max_model_len": mml},
                   gpu="h100-80gb" if tp == 1 else f"h100-80gb:{tp}", total_gib=79.18, in_sample=True))


ROWS: tuple[LogRow, ...] = (
    LogRow("meta-llama/Llama-3.1-8B", "Llama-3.1-8B bf16, RTX 3090, TP1", "vllm", "0.6", "weights", 14.9888,
           "github.com/vllm-project/vllm/issues/10517"),
    LogRow("meta-llama/Llama-3.1-8B", "Llama-3.1-8B bf16, RTX 3090, kv_cache_size 3.81 GiB -> 1952 blocks", "vllm", "0.6",
           "kv_tokens", 1952 * 16, "github.com/vllm-project/vllm/issues/10517", kv_gib=3.81),
    LogRow("meta-llama/Llama-3.1-8B", "Llama-3.1-8B bf16, RTX 3090, kv_cache_size 2.89 GiB -> 1478 blocks", "vllm", "0.6",
           "kv_tokens", 1478 * 16, "github.com/vllm-project/vllm/issues/10517", kv_gib=2.89),
    LogRow("meta-llama/Llama-3.1-8B", "Llama-3.1-8B bf16, RTX 3090, util 0.90, max_model_len 20000 (sets half the driver reserve)",
           "vllm", "0.6", "kv_gib", 3.81, "github.com/vllm-project/vllm/issues/10517", gpu="rtx3090", in_sample=True,
           serving=dict(max_model_len=20000, max_num_batched_tokens=20000, gpu_memory_utilization=0.9)),
    LogRow("meta-llama/Llama-3.1-8B", "Llama-3.1-8B bf16, RTX 3090, util 0.90, max_model_len 29000", "vllm", "0.6", "kv_gib", 2.89,
           "github.com/vllm-project/vllm/issues/10517", gpu="rtx3090",
           serving=dict(max_model_len=29000, max_num_batched_tokens=29000, gpu_memory_utilization=0.9)),
    LogRow("Qwen/Qwen3-30B-A3B", "Qwen3-30B-A3B bf16 (MoE), 4x A10, TP4", "vllm", "0.8.5", "weights", 14.2474,
           "github.com/vllm-project/vllm/issues/17469", serving=dict(tensor_parallel_size=4)),
    LogRow("Qwen/Qwen3-30B-A3B", "Qwen3-30B-A3B bf16 (MoE), one 288 GB AMD GPU, TP1", "sglang", "0.5 (2026-07)", "weights", 56.98,
           "github.com/sgl-project/sglang/pull/18263", vendor="amd"),
    LogRow("Qwen/Qwen3-30B-A3B", "Qwen3-30B-A3B bf16, KV budget 152.88 GiB -> #tokens", "sglang", "0.5 (2026-07)", "kv_tokens", 1669816,
           "github.com/sgl-project/sglang/pull/18263", kv_gib=152.88),
    LogRow("Qwen/Qwen3.6-35B-A3B", "Qwen3.6-35B-A3B NVFP4 (hybrid: 10 attention + 30 gated-DeltaNet layers), RTX 5090, fp8 KV, "
           "prefix caching, max_model_len 131072: Available KV cache memory 5.98 GiB -> GPU KV cache size", "vllm", "0.24.0", "kv_tokens",
           567978, "github.com/noonghunna/club-3090/issues/612", kv_gib=5.98, graphs_in_budget=True,
           serving=dict(max_model_len=131072, kv_cache_dtype="fp8", enable_prefix_caching=True, max_num_seqs=1, max_num_batched_tokens=8192)),
    LogRow("Qwen/Qwen3.6-35B-A3B", "Qwen3.6-35B-A3B NVFP4, RTX 5090, fp8 KV, prefix caching, max_model_len 131072 (a later boot of the "
           "same service): Available KV cache memory 6.01 GiB -> GPU KV cache size", "vllm", "0.24.0", "kv_tokens", 569878,
           "github.com/noonghunna/club-3090/issues/652", kv_gib=6.01, graphs_in_budget=True,
           serving=dict(max_model_len=131072, kv_cache_dtype="fp8", enable_prefix_caching=True, max_num_seqs=1, max_num_batched_tokens=8192)),
    LogRow("google/gemma-4-31B-it", "Gemma-4-31B-it AWQ 4-bit (cyankiwi), A100 80GB, util 0.90: '~50 GB' of KV -> '~525k tokens' "
           "(both rounded by the issue; 10 full layers of 4 K/V heads of 512 beside 50 sliding of 16 of 256; max_model_len the "
           "model's 262,144 and 2048 batched tokens: defaults, inferred)", "vllm", "0.21.0", "kv_tokens", 525000,
           "github.com/vllm-project/vllm/issues/43308", kv_gib=50.0 * 1e9 / 1024**3,
           serving=dict(max_model_len=262144, max_num_batched_tokens=2048)),
    LogRow("openai/gpt-oss-120b", "gpt-oss-120b MXFP4 (MoE), H100, TP1", "vllm", "0.10.1", "weights", 65.9651,
           "github.com/vllm-project/vllm/issues/23278", serving=dict(weight_format="mxfp4")),
    LogRow("openai/gpt-oss-120b", "gpt-oss-120b MXFP4 (MoE), H100, TP1", "vllm", "0.14.1", "weights", 64.38,
           "github.com/vllm-project/vllm/issues/33155", serving=dict(weight_format="mxfp4")),
    LogRow("openai/gpt-oss-120b", "gpt-oss-120b MXFP4, H100, util 0.90, max_num_batched_tokens 8192, 1024 seqs", "vllm", "0.10.1",
           "kv_gib", -2.14, "github.com/vllm-project/vllm/issues/23278", gpu="h100-80gb",
           serving=dict(weight_format="mxfp4", gpu_memory_utilization=0.9, max_num_batched_tokens=8192, max_num_seqs=1024,
                        max_model_len=131072)),
    LogRow("openai/gpt-oss-120b", "gpt-oss-120b MXFP4, H100, util 0.95, max_num_batched_tokens 1024, 1024 seqs", "vllm", "0.11",
           "kv_gib", 1.71, "github.com/vllm-project/vllm/issues/27508", gpu="h100-80gb",
           serving=dict(weight_format="mxfp4", gpu_memory_utilization=0.95, max_num_batched_tokens=1024, max_num_seqs=1024,
                        max_model_len=131072)),
    LogRow(llama_405b_fp8(), "Llama-3.1-405B-Instruct-FP8 (MLPs fp8, attention + first/last layers bf16), 8x H100, TP8", "vllm", "0.5.3",
           "weights", 57.7520, "github.com/vllm-project/vllm/issues/6746", serving=dict(weight_format="fp8", tensor_parallel_size=8)),
    LogRow("meta-llama/Llama-3.1-70B", "Llama-3.1-70B W8A8 (8-bit, as fp8 bytes), TP1", "vllm", "0.7 (V1)", "weights", 67.7229,
           "github.com/vllm-project/vllm/pull/12569", serving=dict(weight_format="fp8")),
    LogRow("meta-llama/Meta-Llama-3-8B", "Llama-3-8B bf16, H100, TP1", "vllm", "0.6.5", "weights", 14.96,
           "github.com/vllm-project/vllm/pull/10511"),
    LogRow("meta-llama/Meta-Llama-3-8B", "Llama-3-8B bf16, H100, TP2", "vllm", "0.6.5", "weights", 7.48,
           "github.com/vllm-project/vllm/pull/10511", serving=dict(tensor_parallel_size=2)),
    LogRow("meta-llama/Meta-Llama-3-8B", "Llama-3-8B bf16, H100, util 0.90, max_model_len 8192, 256 seqs", "vllm", "0.6.5", "kv_gib", 53.29,
           "github.com/vllm-project/vllm/pull/10511", gpu="h100-80gb", total_gib=79.22,
           serving=dict(max_model_len=8192, max_num_batched_tokens=8192, gpu_memory_utilization=0.9)),
    LogRow("Qwen/Qwen3-235B-A22B", "Qwen3-235B-A22B-FP8 (MoE, fp8 blocks), 4x H100, TP4, KV 8.11 GiB -> tokens", "vllm", "0.9/0.10 (2025-07)",
           "kv_tokens", 178880, "github.com/vllm-project/vllm/issues/21348", kv_gib=8.11,
           serving=dict(weight_format="fp8_block", tensor_parallel_size=4)),
    LogRow("Qwen/Qwen3-235B-A22B", "Qwen3-235B-A22B-FP8, 4x H100, TP4, util 0.90, max_model_len 40960, 1024 seqs", "vllm",
           "0.9/0.10 (2025-07)", "kv_gib", 8.11, "github.com/vllm-project/vllm/issues/21348", gpu="h100-80gb:4",
           serving=dict(weight_format="fp8_block", tensor_parallel_size=4, gpu_memory_utilization=0.9, max_model_len=40960,
                        max_num_batched_tokens=8192, max_num_seqs=1024)),
    LogRow("Qwen/Qwen3-235B-A22B", "Qwen3-235B-A22B-FP8, 4x H100, TP4, K+V 16.46 GiB -> #tokens", "sglang", "0.4.9 (2025-07)",
           "kv_tokens", 367404, "github.com/vllm-project/vllm/issues/21348", kv_gib=16.46,
           serving=dict(weight_format="fp8_block", tensor_parallel_size=4)),
    LogRow("Qwen/Qwen3-235B-A22B", "Qwen3-235B-A22B-FP8, 4x H100, TP4, mem_fraction_static 0.93 -> #tokens", "sglang",
           "0.4.9 (2025-07)", "pool_tokens", 367404, "github.com/vllm-project/vllm/issues/21348", gpu="h100-80gb:4",
           serving=dict(weight_format="fp8_block", tensor_parallel_size=4, gpu_memory_utilization=0.93, max_model_len=40960)),
    # SGLang PR #11309 ("Include indexer kv cache when estimating kv cache size"), 8x B200, `--tp 8 --dp 8
    # --enable-dp-attention`: "KV Cache is allocated. #tokens: 975424, KV size: 43.67 GB" (SGLang's GB is 2^30 bytes);
    # the fp8 latent cache is forced on Blackwell at that version, and the pool holds the indexer keys beside it
    LogRow("deepseek-ai/DeepSeek-V3.2-Exp", "DeepSeek-V3.2-Exp, fp8 latent + indexer keys, 8x B200, TP8 DP8, KV 43.67 GiB -> #tokens",
           "sglang", "main (2025-10-07)", "kv_tokens", 975424, "github.com/sgl-project/sglang/pull/11309", kv_gib=43.67,
           serving=dict(weight_format="fp8_block", tensor_parallel_size=8, kv_cache_dtype="fp8")),
    LogRow(QWEN3_CODER_480B, "Qwen3-Coder-480B-A35B FP8, 8x H20, DP8 + EP, KV 48.66 GiB -> max model len", "vllm", "0.10.1",
           "kv_tokens", 205728, "github.com/vllm-project/recipes/pull/12", kv_gib=48.66),
    LogRow(QWEN3_CODER_480B, "Qwen3-Coder-480B-A35B FP8, 8x H20, DP8 + EP, util 0.95, KV 55.65 GiB -> max model len", "vllm", "0.10.1",
           "kv_tokens", 235296, "github.com/vllm-project/recipes/pull/12", kv_gib=55.65),
    # --- llm-d config explorer: seven vllm serve runs on one H100 ---
    *_llmd("openai/gpt-oss-20b", "gpt-oss-20b (MoE)", 13.47, 50.28, fmt="mxfp4"),
    *_llmd("openai/gpt-oss-120b", "gpt-oss-120b (MoE)", 64.38, 3.33, fmt="mxfp4", util=0.95,
           note=" (inferred: 0.95 x 79.18 - 64.38 - 7.38 - 0.13 = 3.33; the summary's 0.9 does not add up)"),
    *_llmd("meta-llama/Llama-3.1-8B", "Llama-3.1-8B-Instruct", 14.99, 51.38),
    *_llmd("Qwen/Qwen3-0.6B", "Qwen3-0.6B", 1.12, 64.45),
    *_llmd("Qwen/Qwen3-32B", "Qwen3-32B", 61.03, 4.45),
    *_llmd("meta-llama/Llama-3.1-70B", "Llama-3.3-70B-Instruct-FP8-dynamic (3.1-70B shapes)", 33.88, 32.0, fmt="fp8", tp=2),
    *_llmd("meta-llama/Llama-3.1-70B", "Llama-3.3-70B-Instruct-FP8-dynamic (3.1-70B shapes)", 67.72, -1.44, fmt="fp8"),
    # --- single logs ---
    LogRow("Qwen/Qwen3-14B", "Qwen3-14B bf16, one GPU, KV 6.51 GiB -> tokens", "vllm", "V1 (2025-10)", "kv_tokens", 42656,
           "github.com/LMCache/LMCache/issues/1739", kv_gib=6.51),
    LogRow("openai/gpt-oss-20b", "gpt-oss-20b MXFP4 (MoE), A100, TP1", "vllm", "0.19.0", "weights", 13.72, ASIAN,
           serving=dict(weight_format="mxfp4")),
    LogRow("openai/gpt-oss-20b", "gpt-oss-20b MXFP4, A100 (80 GB, inferred), util 0.65, max_model_len 131072 (256 seqs / 2048 tokens: "
           "defaults, inferred)", "vllm", "0.19.0", "kv_gib", 36.56, ASIAN, gpu="a100-80gb",
           serving=dict(weight_format="mxfp4", gpu_memory_utilization=0.65, max_model_len=131072) | V1_SMALL),
    LogRow("openai/gpt-oss-20b", "gpt-oss-20b MXFP4 (MoE), RTX 3090, TP1", "vllm", "0.10.1 (gptoss image)", "weights", 12.8848,
           "github.com/vllm-project/vllm/issues/22331", serving=dict(weight_format="mxfp4")),
    LogRow("Qwen/Qwen3-4B", "Qwen3-4B fp16, AMD Strix Halo (ROCm), TP1", "vllm", "V1 (2025-10)", "weights", 7.6785,
           "github.com/kyuz0/amd-strix-halo-vllm-toolboxes/pull/5", serving=dict(dtype="fp16")),
    LogRow("Qwen/Qwen2.5-14B", "DeepSeek-R1-Distill-Qwen-14B bf16 (Qwen2.5-14B shapes), 2x RTX 4090, TP2", "vllm", "0.7.2 (V0)", "weights",
           13.9476, "github.com/vllm-project/vllm/issues/13061", serving=dict(tensor_parallel_size=2)),
    LogRow("Qwen/Qwen2.5-14B", "R1-Distill-Qwen-14B, 2x RTX 4090, TP2, util 0.98, max_model_len 131072 (256 seqs / 2048 tokens: defaults, "
           "inferred); KV of the sampling rank inferred from its 81,536-token limit x 96 KiB", "vllm", "0.7.2 (V0)", "kv_gib",
           81536 * 98304 / 1024**3, "github.com/vllm-project/vllm/issues/13061", gpu="rtx4090:2",
           serving=dict(tensor_parallel_size=2, gpu_memory_utilization=0.98, max_model_len=131072) | V0_LONG),
    LogRow("meta-llama/Llama-3.1-8B", "Llama-3.1-8B bf16, A10 (22.07 GiB printed), TP1", "vllm", "0.7 (V0)", "weights", 14.9888, OCI),
    LogRow("meta-llama/Llama-3.1-8B", "Llama-3.1-8B bf16, A10, KV 4.60 GiB -> 2356 blocks", "vllm", "0.7 (V0)", "kv_tokens", 2356 * 16, OCI,
           kv_gib=4.60),
    LogRow("meta-llama/Llama-3.1-8B", "Llama-3.1-8B bf16, A10, util 0.90, max_model_len 131072 (256 seqs / 2048 tokens: defaults, inferred)",
           "vllm", "0.7 (V0)", "kv_gib", 4.60, OCI, gpu="a10", total_gib=22.07,
           serving=dict(gpu_memory_utilization=0.9, max_model_len=131072) | V0_LONG),
    LogRow("Qwen/Qwen2.5-32B", "QwQ-32B bf16 (Qwen2.5-32B shapes), 4x L4, TP4", "sglang", ECS_V, "weights", 15.54, ECS,
           serving=dict(tensor_parallel_size=4)),
    LogRow("Qwen/Qwen2.5-32B", "QwQ-32B, 4x L4, TP4, K+V 2.84 GiB -> #tokens", "sglang", ECS_V, "kv_tokens", 46611, ECS, kv_gib=2.84,
           serving=dict(tensor_parallel_size=4)),
    LogRow("Qwen/Qwen2.5-32B", "QwQ-32B, 4x L4, TP4, mem_fraction_static 0.85 (its default), chunked_prefill 2048 -> #tokens", "sglang",
           ECS_V, "pool_tokens", 46611, ECS, gpu="l4:4",
           serving=dict(tensor_parallel_size=4, gpu_memory_utilization=0.85, max_num_batched_tokens=2048, max_model_len=131072)),
    LogRow("microsoft/phi-4", "Phi-4-AutoRound-GPTQ-4bit (gptq_marlin), H100, TP1", "vllm", "0.6 (V0, 2024-12)", "weights", 8.5107, PHI4,
           serving=dict(weight_format="gptq")),
    LogRow("microsoft/phi-4", "Phi-4 GPTQ, H100, KV 2.18 GiB -> 715 blocks", "vllm", "0.6 (V0, 2024-12)", "kv_tokens", 715 * 16, PHI4,
           kv_gib=2.18, serving=dict(weight_format="gptq")),
    LogRow("microsoft/phi-4", "Phi-4 GPTQ, H100 (79.25 GiB printed), LLM(max_model_len=2048, gpu_memory_utilization=0.15) "
           "(256 seqs / 2048 tokens: defaults, inferred)", "vllm", "0.6 (V0, 2024-12)", "kv_gib", 2.18, PHI4, gpu="h100-80gb",
           total_gib=79.25, serving=dict(weight_format="gptq", gpu_memory_utilization=0.15, max_model_len=2048, max_num_seqs=256,
                                         max_num_batched_tokens=2048)),
    LogRow("Qwen/Qwen2.5-7B", "Qwen2.5-7B-Instruct-AWQ (4-bit), RTX 3090, TP1", "vllm", "0.22.1", "weights", 5.29, AKS,
           serving=dict(weight_format="awq", dtype="fp16")),
    LogRow("Qwen/Qwen2.5-7B", "Qwen2.5-7B-Instruct-AWQ, RTX 3090, KV 14.43 GiB -> tokens", "vllm", "0.22.1", "kv_tokens", 270144, AKS,
           kv_gib=14.43, serving=dict(weight_format="awq", dtype="fp16")),
    LogRow("Qwen/Qwen2.5-7B", "Qwen2.5-7B-Instruct-AWQ, RTX 3090, util 0.90, max_model_len 4096, 8 seqs, 2048 tokens (its compile range)",
           "vllm", "0.22.1", "kv_gib", 14.43, AKS, gpu="rtx3090", graphs_in_budget=True,
           serving=dict(weight_format="awq", dtype="fp16", gpu_memory_utilization=0.9, max_model_len=4096, max_num_seqs=8,
                        max_num_batched_tokens=2048)),
)
