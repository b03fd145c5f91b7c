"""Published serving speed measurements (decode and throughput), each with the setup its source states.

One row a measured number: the engine and version, model, GPU, tensor-parallel size, weight format, input / output
lengths, the requests in flight (``concurrency``; None where the source ran an offline batch: as many as the predicted
KV cache holds) and the metric (``tpot_ms`` time per output token, ``decode_tok_s`` one request's tokens/s,
``output_tok_s`` all requests' output tokens/s, ``gain`` the throughput at ``concurrency`` over ``base``'s).
``inferred`` says what the source leaves unstated and how the row fills it; ``in_sample`` marks the rows a constant
of perfguide/data/serving.json was taken from (excluded from the error summary).

perfguide predicts each from the model shape and the GPU datasheet with the engine's speed rule
(perfguide/speed/serving.py via engines.server(...).speed), nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from perfguide import Hardware, engines
from perfguide.model.types import ModelSpec
from perfguide.setup import ServingSetup

Metric = Literal["tpot_ms", "decode_tok_s", "output_tok_s", "gain"]

MUSGRAVE = "https://johnmusgrave.com/p/vllm-throughput-latency-sweep-on"
YOBITEL = "https://yobitelcomm.github.io/bench/recipes/concurrency-sweep/"
KVCACHED = "https://github.com/ovg-project/kvcached/pull/331 (benchmarks/bench_layout/H100_results.md)"
REDHAT = "https://www.redhat.com/en/blog (MLPerf Inference v5.1, 'efficient and reproducible LLM inference')"
GPTOSS = "https://github.com/vllm-project/vllm/issues/22331"
TT_QWEN3 = "https://github.com/tenstorrent/tt-inference-server/issues/340"
QWEN14_AWQ = "https://github.com/vllm-project/vllm/issues/20469"
ACHATBOT = "https://github.com/ai-bot-pro/achatbot/pull/183"
IX_R1 = "https://github.com/SemiAnalysisAI/InferenceX/issues/870"
IX_OSS_H100 = "https://github.com/SemiAnalysisAI/InferenceX/issues/828"
IX_OSS_MI300X = "https://github.com/SemiAnalysisAI/InferenceX/pull/1061"


@dataclass(frozen=True)
class SpeedRow:
    label: str
    source: str
    engine: str
    version: str
    model: str
    hardware: str                 # a perfguide hardware name, the GPU count = TP
    weight_format: str
    prompt: int
    output: int
    concurrency: int | None       # requests in flight (None: as many as the KV cache holds, up to max_num_seqs)
    metric: Metric
    published: float
    tp: int = 1
    base: int = 1                 # for a gain: the concurrency it is relative to
    max_model_len: int | None = None
    max_num_seqs: int = 256
    gpu_memory_utilization: float = 0.9
    enforce_eager: bool = False
    checkpoint_format: str | None = None
    inferred: str = ""
    in_sample: bool = False


ROWS: tuple[SpeedRow, ...] = (
    SpeedRow("Llama-3.1-8B bf16, A100-40GB, 1024 in / 128 out, 1 request", MUSGRAVE, "vllm", "0.23", "meta-llama/Llama-3.1-8B",
             "a100-40gb", "bf16", 1024, 128, 1, "decode_tok_s", 75.0, in_sample=True,
             inferred="sets decode_bandwidth_efficiency (data/serving.json)"),
    SpeedRow("Llama-3.1-8B bf16, A100-40GB, 1024 in / 128 out, 8 requests vs 1", MUSGRAVE, "vllm", "0.23", "meta-llama/Llama-3.1-8B",
             "a100-40gb", "bf16", 1024, 128, 8, "gain", 6.6),
    SpeedRow("Llama-3.1-8B fp16, H100-80GB, 1 request (TPOT p50)", YOBITEL, "vllm", "0.21", "meta-llama/Llama-3.1-8B",
             "h100-80gb", "fp16", 256, 256, 1, "tpot_ms", 6.48, inferred="'chatbot-short' lengths not stated: 256 in / 256 out"),
    SpeedRow("Llama-3.1-8B fp16, H100-80GB, 4 requests (TPOT p50)", YOBITEL, "vllm", "0.21", "meta-llama/Llama-3.1-8B",
             "h100-80gb", "fp16", 256, 256, 4, "tpot_ms", 6.59, inferred="'chatbot-short' lengths not stated: 256 in / 256 out"),
    SpeedRow("Llama-3.1-8B fp16, H100-80GB, 16 requests (TPOT p50)", YOBITEL, "vllm", "0.21", "meta-llama/Llama-3.1-8B",
             "h100-80gb", "fp16", 256, 256, 16, "tpot_ms", 10.94, inferred="'chatbot-short' lengths not stated: 256 in / 256 out"),
    SpeedRow("Qwen3-0.6B bf16, H100-80GB, util 0.5, 512 in / 128 out at 16 req/s (TPOT)", KVCACHED, "vllm", "0.19", "Qwen/Qwen3-0.6B",
             "h100-80gb", "bf16", 512, 128, 5, "tpot_ms", 2.39, max_model_len=2048, gpu_memory_utilization=0.5, in_sample=True,
             inferred="requests in flight by Little's law from the same table: 15.87 req/s x (38.9 ms + 127 x 2.39 ms) = 5; "
                      "sets vLLM's step_overhead_s (data/serving.json)"),
    SpeedRow("Qwen3-0.6B bf16, H100-80GB, util 0.5, 512 in / 128 out, 500 prompts at once", KVCACHED, "vllm", "0.19", "Qwen/Qwen3-0.6B",
             "h100-80gb", "bf16", 512, 128, None, "output_tok_s", 94.91 * 128, max_model_len=2048, gpu_memory_utilization=0.5,
             max_num_seqs=1024, inferred="94.91 req/s x 128 tokens; vLLM's default max_num_seqs 1024 on an 80 GB GPU"),
    SpeedRow("Llama-3.1-8B FP8, H100, MLPerf v5.1 offline (CNN-DailyMail ~870 in / <=128 out)", REDHAT, "vllm", "0.10",
             "meta-llama/Llama-3.1-8B", "h100-80gb", "fp8", 870, 128, None, "output_tok_s", 5777.0, max_model_len=2048,
             max_num_seqs=1024, inferred="offline: mean lengths, the largest batch the predicted KV cache holds"),
    SpeedRow("gpt-oss-120b MXFP4, A100-80GB, TP1, 1 request", GPTOSS, "vllm", "0.10 (gptoss image)", "openai/gpt-oss-120b",
             "a100-80gb", "mxfp4", 128, 512, 1, "decode_tok_s", 90.0, checkpoint_format="mxfp4", in_sample=True,
             inferred="chat lengths not stated: 128 in / 512 out; sets moe_layer_decode_latency_s (data/serving.json)"),
    SpeedRow("gpt-oss-120b MXFP4, 2x A100-80GB, TP2, 1 request", GPTOSS, "vllm", "0.10 (gptoss image)", "openai/gpt-oss-120b",
             "a100-80gb:2", "mxfp4", 128, 512, 1, "decode_tok_s", 77.5, tp=2, checkpoint_format="mxfp4",
             inferred="'TP=2/4: 77-78 tps'; chat lengths not stated: 128 in / 512 out"),
    SpeedRow("Qwen3-0.6B bf16, A100, 128 in / 128 out, 1 request", TT_QWEN3, "vllm", "0.9 (2025-06)", "Qwen/Qwen3-0.6B",
             "a100-80gb", "bf16", 128, 128, 1, "tpot_ms", 4.2, inferred="the A100's memory not stated: 80 GB"),
    SpeedRow("Qwen3-0.6B bf16, A100, 1024 in / 128 out, 1 request", TT_QWEN3, "vllm", "0.9 (2025-06)", "Qwen/Qwen3-0.6B",
             "a100-80gb", "bf16", 1024, 128, 1, "tpot_ms", 4.4, inferred="the A100's memory not stated: 80 GB"),
    SpeedRow("Qwen3-30B-A3B bf16 (MoE), A100, 128 in / 128 out, 1 request", TT_QWEN3, "vllm", "0.9 (2025-06)", "Qwen/Qwen3-30B-A3B",
             "a100-80gb", "bf16", 128, 128, 1, "tpot_ms", 9.6, inferred="80 GB (61 GB of bf16 weights on one A100)"),
    SpeedRow("Qwen3-30B-A3B bf16 (MoE), A100, 1024 in / 128 out, 1 request", TT_QWEN3, "vllm", "0.9 (2025-06)", "Qwen/Qwen3-30B-A3B",
             "a100-80gb", "bf16", 1024, 128, 1, "tpot_ms", 9.8, inferred="80 GB (61 GB of bf16 weights on one A100)"),
    SpeedRow("Qwen3-30B-A3B bf16 (MoE), A100, 8192 in / 128 out, 1 request", TT_QWEN3, "vllm", "0.9 (2025-06)", "Qwen/Qwen3-30B-A3B",
             "a100-80gb", "bf16", 8192, 128, 1, "tpot_ms", 10.6, inferred="80 GB (61 GB of bf16 weights on one A100)"),
    SpeedRow("Qwen3-14B-AWQ, A100-80GB, enforce-eager, 16000 in / 200 out, 1 request (mean TPOT)", QWEN14_AWQ, "vllm", "0.9.1",
             "Qwen/Qwen3-14B", "a100-80gb", "awq", 16000, 200, 1, "tpot_ms", 20.63, max_model_len=16384, max_num_seqs=30,
             gpu_memory_utilization=0.95, enforce_eager=True, checkpoint_format="awq",
             inferred="Qwen/Qwen3-14B's shapes for the AWQ checkpoint (same config, 4-bit group-128 Linears)"),
    SpeedRow("gpt-oss-20b MXFP4, H100, 512 in / 1024 out, 4 requests (20 prompts)", ACHATBOT, "sglang", "0.5 (2025-08)", "openai/gpt-oss-20b",
             "h100-80gb", "mxfp4", 512, 1024, 4, "output_tok_s", 481.95, checkpoint_format="mxfp4", gpu_memory_utilization=0.83,
             inferred="lengths from its totals (10240 in, 20480 out over 20 requests); SGLang's default mem_fraction_static on an H100"),
    SpeedRow("gpt-oss-20b MXFP4, H100, 512 in / 1024 out, 32 requests (160 prompts)", ACHATBOT, "sglang", "0.5 (2025-08)",
             "openai/gpt-oss-20b", "h100-80gb", "mxfp4", 512, 1024, 32, "output_tok_s", 2765.40, checkpoint_format="mxfp4",
             gpu_memory_utilization=0.83, inferred="lengths from its totals (81920 in, 163840 out over 160 requests)"),
    *(SpeedRow(f"DeepSeek-R1-0528 FP8 (block), 8x H200, TP8 EP1, 1024 in / 1024 out, {c} requests (mean TPOT)", IX_R1, "sglang",
               "0.5.7", "deepseek-ai/DeepSeek-R1", "h200-141gb:8", "fp8_block", 1024, 1024, c, "tpot_ms", tpot, tp=8,
               checkpoint_format="fp8_block", in_sample=c == 64,
               inferred="DeepSeek-R1's shapes for the 0528 checkpoint (same config)" + (
                   "; sets moe_expert_read_efficiency (data/serving.json): 87% of the experts read a step" if c == 64 else ""))
      for c, tpot in ((8, 12.8), (16, 17.2), (32, 25.6), (64, 34.6))),
    *(SpeedRow(f"gpt-oss-120b MXFP4, 8x H100, TP8, 1024 in / 1024 out, {c} requests (TPOT)", IX_OSS_H100, "vllm",
               "2026-03 (InferenceX image; version not in the thread)", "openai/gpt-oss-120b", "h100-80gb:8", "mxfp4", 1024, 1024, c,
               "tpot_ms", tpot, tp=8, checkpoint_format="mxfp4",
               inferred="TP8 from the thread's own findings ('1k/8k ... at TP8 conc64') for the 1k/1k table above them")
      for c, tpot in ((4, 3.72), (8, 4.05), (16, 4.83), (32, 5.82), (64, 7.36))),
    *(SpeedRow(f"gpt-oss-120b MXFP4, one MI300X, TP1, 1024 in / 1024 out, {c} requests (median TPOT)", IX_OSS_MI300X, "vllm",
               "0.17.0", "openai/gpt-oss-120b", "mi300x", "mxfp4", 1024, 1024, c, "tpot_ms", tpot, checkpoint_format="mxfp4")
      for c, tpot in ((64, 31.4), (96, 36.6), (128, 41.3), (256, 58.3))),
)


def predict(row: SpeedRow) -> float:
    """The row's metric from perfguide's speed rule at the row's setup."""
    spec = ModelSpec.from_any(row.model)
    hw = Hardware.from_name(row.hardware)
    serving = ServingSetup(engine=row.engine, weight_format=row.weight_format, checkpoint_format=row.checkpoint_format,
                           dtype="fp16" if row.weight_format == "fp16" else "bf16", tensor_parallel_size=row.tp,
                           max_model_len=row.max_model_len or max(row.prompt + row.output, 4096), max_num_seqs=row.max_num_seqs,
                           gpu_memory_utilization=row.gpu_memory_utilization, enforce_eager=row.enforce_eager)
    engine = engines.server(row.engine)

    def at(batch: int | None) -> float:
        if batch is None:
            mem = engine.memory(spec, serving, hw)
            batch = max(1, min(row.max_num_seqs, mem.kv_cache_tokens // (row.prompt + row.output)))
        speed = engine.speed(spec, serving, hw, row.prompt, row.output, batch)
        if row.metric == "tpot_ms":
            return speed.time_per_output_token_ms
        if row.metric == "decode_tok_s":
            return 1000 / speed.time_per_output_token_ms
        return speed.output_tokens_per_s

    if row.metric == "gain":
        return at(row.concurrency) / at(row.base)
    return at(row.concurrency)


#: every out-of-sample row off by more than 20%, with who is right and the evidence (rendered under the table)
DISAGREEMENTS: dict[str, str] = {
    "Llama-3.1-8B fp16, H100-80GB, 16 requests (TPOT p50)":
        "the source is right about its run, but the run was not GPU bound: its own sweep's throughput falls from 16 to 64 "
        "requests (1,384 -> 1,312 tok/s) while TPOT quadruples, which no GPU has room for at 8B (the predicted step at 16 "
        "sequences is still weight-read bound); the client or host set the pace",
    "Qwen3-0.6B bf16, H100-80GB, util 0.5, 512 in / 128 out, 500 prompts at once":
        "the source is right: 500 streams of a 0.6B model are bound by host work that grows with the batch (sampling, "
        "detokenizing, one HTTP stream per request), which perfguide prices once per step, not per sequence; GPU-side the "
        "step is 2x faster than measured. Serving a tiny model at high concurrency is not what perfguide plans for",
    "gpt-oss-120b MXFP4, 2x A100-80GB, TP2, 1 request":
        "the source is right: TP2 was slower than TP1 (77-78 vs 90 tok/s, two users). perfguide halves the bytes per rank and "
        "adds two all-reduces per layer, so it predicts TP2 faster even with the Marlin path's per-MoE-layer latency (fitted "
        "at TP1) kept whole; the same thread reports the MoE kernel slowing as the experts per GPU shrink ('if local expert "
        "count per device is small, the MoE layer start to slow down'), a cost perfguide does not model",
    "Qwen3-0.6B bf16, A100, 128 in / 128 out, 1 request":
        "the source is right about its host: 4.2 ms a token for 1.2 GB of weights is host-bound; the same model on an H100 "
        "under vLLM 0.19 (kvcached) decodes at 2.39 ms, which sets the 1.9 ms per-step host cost perfguide uses. Per-step host "
        "work differs by host CPU and vLLM version; perfguide uses one figure",
    "Qwen3-0.6B bf16, A100, 1024 in / 128 out, 1 request": "as the 128-token row: host-bound decode of a tiny model",
    "Qwen3-30B-A3B bf16 (MoE), A100, 128 in / 128 out, 1 request":
        "the source is right about its host, perfguide's step is too fast there: the same machine decodes Qwen3-0.6B at "
        "4.2 ms a token where perfguide's reads and 1.9 ms of host work give 2.55 ms, i.e. ~1.65 ms more host work a step; "
        "with it these rows sit near -10%. The routed-expert read rate (0.57 of a dense GEMM's, set on SGLang's DeepSeek-R1 "
        "row on H200) is not what misses: on vLLM's H100 gpt-oss rows it holds within 9% (median)",
    "Qwen3-30B-A3B bf16 (MoE), A100, 1024 in / 128 out, 1 request": "as the 128-token row: that host's per-step work",
    "Qwen3-30B-A3B bf16 (MoE), A100, 8192 in / 128 out, 1 request": "as the 128-token row: that host's per-step work",
    "Qwen3-14B-AWQ, A100-80GB, enforce-eager, 16000 in / 200 out, 1 request (mean TPOT)":
        "the source is right: eager mode (no CUDA graphs) with a 16k-token context; perfguide's eager cost (0.15 ms a layer, "
        "a heuristic) undercounts it. The same issue reports a severe slowdown above one request, so only the 1-request row is used",
    "Llama-3.1-8B FP8, H100, MLPerf v5.1 offline (CNN-DailyMail ~870 in / <=128 out)":
        "open: the submission tunes its own batch and stops each request at EOS, neither stated; the prediction takes the mean "
        "lengths and the largest batch the predicted KV cache holds, an upper bound the measured throughput sits 17% below",
    "gpt-oss-20b MXFP4, H100, 512 in / 1024 out, 4 requests (20 prompts)":
        "the source is right about its run, which was not in steady state: its mean TTFT is 2,731 ms for 512-token prompts "
        "(a third of each request's 8.4 s end to end; a 20-prompt run on a fresh Modal container), where perfguide prices "
        "prefill in milliseconds; the run's own decode (5.7 s over 1,023 tokens) with a short TTFT gives ~720 tok/s, 14% "
        "under perfguide. The same server's 32-request row is within 18%",
    "gpt-oss-120b MXFP4, one MI300X, TP1, 1024 in / 1024 out, 256 requests (median TPOT)":
        "the source is right: its 64-128 request rows are within 18% (MXFP4 is dequantized in software there: the MI300X has "
        "no FP4 datapath, so each MoE layer pays the fixed latency), but from 128 to 256 requests its step grows by 17 ms "
        "where perfguide, already reading nearly every expert, adds only KV reads and FLOPs at H100-derived rates; the "
        "extra cost of the larger grouped GEMMs and attention on ROCm is not priced",
    "DeepSeek-R1-0528 FP8 (block), 8x H200, TP8 EP1, 1024 in / 1024 out, 8 requests (mean TPOT)":
        "not explained; perfguide's step is 2.9 ms short. It moved from -19% when the three dense first layers' MLPs came to "
        "be counted as the FP8 Linears the checkpoint stores them as, split by tensor parallel (they had been priced 16-bit "
        "and replicated on every GPU, as 'rest': 2.4 GB read per GPU a step, now 0.15 GB). The 16-64 "
        "request rows are within 6%, so what is missing is a fixed cost of the small step (61 layers of MLA kernels and "
        "two TP8 all-reduces each), not weight reads; no trace here says which",
}
