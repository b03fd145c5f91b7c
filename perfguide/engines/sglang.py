"""SGLang 0.5.23: its ``mem_fraction_static`` rule and the ``python -m sglang.launch_server`` command.

Memory (python/sglang/srt/mem_cache/kv_cache_configurator.py ``_profile_available_bytes``): the KV pool is
the memory free after loading less (1 - mem_fraction_static) of the memory free before it, so weights + pool
= mem_fraction_static x the memory free before loading; the pool is counted in tokens (page size 1). Its
default fraction (arg_groups/memory_hook.py) reserves room for activations, CUDA graphs and TP buffers.
Flag names are SGLang's own (python/sglang/srt/arg_groups/fields/*.py), in full (``--tp-size``, not the
``--tp`` prefix argparse would also accept) so the command never depends on prefix matching; tests check them
against tests/data/engine_flags.json, extracted from that version's sources by scripts/engine_flags.py.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from .._base import MiB
from ..errors import PerfGuideError
from ..hardware.types import GPU, Hardware
from ..memory.serving import EngineMemory, allocator_rounding_bytes, rank_weight_bytes, rank_weight_tensors, rope_cache_bytes
from ..model.types import ModelSpec
from ..setup import ServingSetup
from .base import Flag, Pool, ServerEngine

_KV = {"fp8": "fp8_e4m3", "auto": "auto"}


#: arg_groups/memory_hook.py handle_gpu_memory_settings: (GPU memory under, in MB) -> (chunked_prefill_size, decode
#: CUDA-graph max batch at tp < 4, at tp >= 4); the last tier (B200, MI300) is everything above 160 GB
_TIERS = ((20 * 1024, 2048, 8, 8), (35 * 1024, 4096, 48, 160), (60 * 1024, 4096, 32, 160), (90 * 1024, 8192, 256, 512),
          (160 * 1024, 8192, 256, 512), (float("inf"), 16384, 512, 512))


def _tier(total: int, tp: int) -> tuple[int, int]:
    """(chunked_prefill_size, decode graph max batch) SGLang picks for a GPU of ``total`` bytes."""
    gpu_mb = total / MiB
    _, chunk, small, large = next(t for t in _TIERS if gpu_mb < t[0])
    return chunk, small if tp < 4 else large


def default_mem_fraction(total: int, serving: ServingSetup) -> float:
    """SGLang's own default (arg_groups/memory_hook.py): reserve 512 MB + 1.5 MB per chunked-prefill token +
    1 GB per 8 TP x PP ranks + 2 MB per decode graph batch (its GPU tier's max batch), at least 10 GB on GPUs over 60 GB."""
    gpu_mb = total / MiB
    reserved = 512 + max(serving.max_num_batched_tokens, 2048) * 1.5 + serving.tensor_parallel_size * serving.pipeline_parallel_size / 8 * 1024
    reserved += 0 if serving.enforce_eager else _tier(total, serving.tensor_parallel_size)[1] * 2
    if gpu_mb > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((gpu_mb - reserved) / gpu_mb, 3)


class SGLang(ServerEngine):
    name: ClassVar[str] = "sglang"
    title: ClassVar[str] = "SGLang"
    order: ClassVar[int] = 20
    docs_source: ClassVar[str] = "SGLang 0.5.23 docs: advanced_features/server_arguments.md; python/sglang/srt/server_args.py"
    memory_setting: ClassVar[str] = "mem_fraction_static"
    flag_aliases: ClassVar[dict[str, str]] = {"--tensor-parallel-size": "--tp-size", "--data-parallel-size": "--dp-size",
                                                   "--pipeline-parallel-size": "--pp-size", "--model": "--model-path"}
    #: server_args.py --dtype choices ('auto', 'half', 'float16', 'bfloat16', 'float', 'float32'); QUANTIZATION_CHOICES
    #: (tests/data/engine_flags.json): 'awq' / 'gptq' are the non-Marlin kernels of the same checkpoints, 'w8a8_fp8' and
    #: 'modelopt_fp8' FP8 checkpoints (SGLang docs advanced_features/quantization.md)
    value_aliases: ClassVar[dict[str, dict[str, object]]] = {
        "dtype": {"half": "fp16"}, "weight_format": {"awq": "awq", "gptq": "gptq", "w8a8_fp8": "fp8", "modelopt_fp8": "fp8"}}
    expert_parallel: ClassVar[bool] = False   # its --ep-size splits a TP group's experts: the same bytes per GPU as TP
    expert_parallel_flags: ClassVar[tuple[str, ...]] = ("--ep-size", "--ep", "--expert-parallel-size")
    multinode_flags: ClassVar[tuple[str, str, str]] = ("--nnodes", "--node-rank", "--dist-init-addr")
    memory_source: ClassVar[str] = "sglang 0.5.23 python/sglang/srt/mem_cache/kv_cache_configurator.py _profile_available_bytes"

    def utilization(self, gpu: GPU, hardware: Hardware, serving: ServingSetup, headroom: float) -> float:
        """Its own default fraction, capped at 1 - headroom."""
        return min(1 - headroom, default_mem_fraction(gpu.memory_total, serving))

    def default_utilization(self, gpu: GPU, serving: ServingSetup) -> float:
        return default_mem_fraction(gpu.memory_total, serving)

    def batched_tokens(self, gpu: GPU, tp: int) -> int:
        """Its chunked_prefill_size for the GPU's memory tier (2k under 20 GB, 4k under 60 GB, 8k, 16k over 160 GB)."""
        return _tier(gpu.memory_total, tp)[0]

    def budget(self, total: int, context: int, serving: ServingSetup) -> int:
        return int((total - context) * serving.gpu_memory_utilization)

    def fraction_to_fit(self, memory: EngineMemory, serving: ServingSetup) -> float:
        """The smallest mem_fraction_static (to 0.01) whose pool holds the weights and one max_model_len request:
        below it SGLang stops at start-up ('Not enough memory. Please try to increase --mem-fraction-static')."""
        need = memory.weights + memory.kv_bytes_per_token * serving.max_model_len
        return math.ceil(need / (memory.total - memory.cuda_context) * 100) / 100

    def expert_parallel_note(self, size: int, serving: ServingSetup, experts: int) -> str:
        """--ep-size splits each TP group's ranks into expert groups (moe_tp_size = tp_size // ep_size, experts per rank
        = num_experts // ep_size: benchmark/kernels/fused_moe_triton, parallel_state), so a GPU holds the same expert
        bytes as under TP alone; a size that does not divide both is refused as SGLang refuses it."""
        tp = serving.tensor_parallel_size
        if size < 1 or tp % size or (experts > 1 and experts % size):
            raise PerfGuideError(f"SGLang --ep-size {size} must divide --tp-size {tp} and the {experts} experts "
                                 f"(SGLang asserts tp_size % ep_size == 0); use one of "
                                 f"{', '.join(str(e) for e in range(1, tp + 1) if tp % e == 0 and (experts <= 1 or experts % e == 0))}")
        return (f"--ep-size {size}: SGLang splits the experts of each TP group over {size} ranks, each TP-sharded {tp // size} ways, "
                f"so a GPU holds 1/{tp} of the expert weights as under TP alone (priced so)")

    def kv_bytes(self, budget: int, weights: int, activation: int, non_torch: int, graphs: int) -> int:
        return budget - weights

    def pool_layout(self, spec: ModelSpec, serving: ServingSetup) -> Pool:
        """A hybrid-SWA model (data/serving.json ``hybrid_swa``) gets two pools from the same bytes: one token of the
        full-attention pool spans ``full + ratio x sliding`` layers, so the log's max_total_num_tokens (the full pool)
        is the bytes over that; a request takes its length there and min(length, window) in the sliding pool, which
        holds ``ratio`` of the full pool's tokens."""
        hybrid = self.facts.hybrid_swa
        kinds = spec.cache_layer_types()
        slide = sum(1 for k in kinds if k == "sliding_attention")
        if (hybrid is None or spec.model_type not in hybrid.model_types or not slide or spec.sliding_window is None
                or serving.pipeline_parallel_size > 1):
            return super().pool_layout(spec, serving)
        ratio, length = hybrid.swa_full_tokens_ratio, serving.max_model_len
        whole = super().pool_layout(spec, serving)
        return whole._replace(group=len(kinds) - slide + ratio * slide,
                              per_request=max(length, math.ceil(min(length, spec.sliding_window) / ratio)))

    def loaded_weight_bytes(self, spec: ModelSpec, serving: ServingSetup, vendor: str = "nvidia") -> int:
        """'Load weight end ... mem usage': the fall in free device memory across the load (model_runner.load_model
        reads get_available_gpu_memory before and after), so what the caching allocator reserves beyond the tensors
        counts (allocator_rounding_bytes), and the rotary cos/sin table is fp32 on CUDA (bf16 elsewhere,
        srt/layers/rotary_embedding.py: 'cache needs to be in FP32 for numerical stability')."""
        rope = rope_cache_bytes(spec, 4 if vendor == "nvidia" else 2)
        return rank_weight_bytes(spec, serving) + rope + allocator_rounding_bytes([*rank_weight_tensors(spec, serving), rope])

    def args(self, model: str, serving: ServingSetup) -> dict[str, Any]:
        """Kwargs of ``sglang.Engine(**kw)`` (ServerArgs field names)."""
        return {flag[2:].replace("-", "_"): True if value is None else value for flag, value in self.flags(model, serving)}

    def launcher(self, model: str) -> list[str]:
        return ["python", "-m", "sglang.launch_server"]

    def flags(self, model: str, serving: ServingSetup) -> list[Flag]:
        s = serving
        flags: list[Flag] = [
            ("--model-path", model),
            ("--tp-size", str(s.tensor_parallel_size)),
            ("--dp-size", str(s.data_parallel_size)),
            *((("--pp-size", str(s.pipeline_parallel_size)),) if s.pipeline_parallel_size > 1 else ()),
            ("--context-length", str(s.max_model_len)),
            ("--mem-fraction-static", str(s.gpu_memory_utilization)),
            ("--max-running-requests", str(s.max_num_seqs)),
            ("--chunked-prefill-size", str(s.max_num_batched_tokens)),
            ("--kv-cache-dtype", _KV[s.kv_cache_dtype]),
            ("--dtype", "float16" if s.dtype == "fp16" else "bfloat16"),
        ]
        quant = self.quantization_choice(s)
        if quant:
            flags.append(("--quantization", quant))
        if s.enforce_eager:
            flags.append(("--cuda-graph-backend-decode", "disabled"))
        if not s.enable_prefix_caching:
            flags.append(("--disable-radix-cache", None))
        return flags


ENGINE = SGLang()
