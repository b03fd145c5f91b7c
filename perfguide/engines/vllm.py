"""vLLM 0.33: its profiler budget, its ``EngineArgs`` and ``vllm serve`` command.

Memory (vllm/v1/worker/gpu_worker.py ``determine_available_memory``)::

    KV = ceil(total x gpu_memory_utilization) - weights - non-torch memory - activation peak - CUDA graphs

cut into blocks of 16 tokens (every layer's K and V for 16 positions; a hybrid model's blocks grow to hold one
recurrent-state page each: ``_state_pool``); vllm/v1/core/kv_cache_utils.py logs
``GPU KV cache size: N tokens`` = blocks / ceil(max_model_len / 16) x max_model_len, with the concurrency at
max_model_len beside it. Argument names are those of vllm/engine/arg_utils.py; tests check every emitted one
against the names that version's parser registers (tests/data/engine_flags.json, scripts/engine_flags.py),
because vLLM pins a CUDA torch and cannot be installed beside this project's test environment.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from ..hardware.types import GPU, Hardware
from ..memory.overhead import cuda_context_bytes
from ..memory.serving import HALF, has_state_pages, rank_weight_bytes, rope_cache_bytes, state_page_bytes
from ..model.layer_widths import kv_elements, uniform
from ..model.types import ModelSpec
from ..setup import ServingSetup
from .base import Flag, Pool, ServerEngine

_DTYPES = {"fp16": "float16", "bf16": "bfloat16"}


class VLLM(ServerEngine):
    name: ClassVar[str] = "vllm"
    title: ClassVar[str] = "vLLM"
    order: ClassVar[int] = 10
    docs_source: ClassVar[str] = "vLLM 0.33 docs: configuration/optimization.md, serving/parallelism_scaling.md; vllm/engine/arg_utils.py"
    memory_setting: ClassVar[str] = "gpu_memory_utilization"
    flag_aliases: ClassVar[dict[str, str]] = {"-tp": "--tensor-parallel-size", "-pp": "--pipeline-parallel-size", "-dp": "--data-parallel-size"}
    #: vllm/config/model.py ModelDType ('auto', 'half', 'float16', 'bfloat16', 'float', 'float32': fp32 serving is not priced);
    #: QuantizationMethods (tests/data/engine_flags.json): 'awq' / 'gptq' run the same 4-bit group-128 checkpoints on the
    #: older kernels, 'fbgemm_fp8' and 'modelopt' are FP8 checkpoints (vLLM docs features/quantization/)
    value_aliases: ClassVar[dict[str, dict[str, object]]] = {
        "dtype": {"half": "fp16"}, "weight_format": {"awq": "awq", "gptq": "gptq", "fbgemm_fp8": "fp8", "modelopt": "fp8"}}
    memory_source: ClassVar[str] = "vllm 0.33 vllm/v1/worker/gpu_worker.py determine_available_memory"

    def utilization(self, gpu: GPU, hardware: Hardware, serving: ServingSetup, headroom: float) -> float:
        """1 - headroom, below what the CUDA context leaves free (vLLM refuses a budget above the free memory)."""
        free = (gpu.memory_total - cuda_context_bytes(hardware)) / gpu.memory_total
        return round(min(1 - headroom, int(free * 100) / 100), 2)

    def budget(self, total: int, context: int, serving: ServingSetup) -> int:
        return math.ceil(total * serving.gpu_memory_utilization)

    def server_defaults(self, gpu: GPU, tp: int) -> dict[str, int]:
        """``vllm serve``'s batching when the command sets none (vllm/engine/arg_utils.py ``get_batch_defaults``,
        UsageContext.OPENAI_API_SERVER): 1024 sequences and 8192 batched tokens on a GPU of 70 GiB or more that is not
        an A100 ("Setting large max_num_batched_tokens for A100 reduces throughput", vllm#17885), else 256 and 2048."""
        if gpu.memory_total >= 70 * 2**30 and "a100" not in gpu.name:
            return {"max_num_seqs": 1024, "max_num_batched_tokens": 8192}
        return {"max_num_seqs": 256, "max_num_batched_tokens": 2048}

    def batched_tokens(self, gpu: GPU, tp: int) -> int:
        """The prefill chunk ``vllm serve`` takes by default on this GPU: a plan emits it explicitly."""
        return self.server_defaults(gpu, tp)["max_num_batched_tokens"]

    def loaded_weight_bytes(self, spec: ModelSpec, serving: ServingSetup, vendor: str = "nvidia") -> int:
        """'Model loading took': the allocated bytes of the model's tensors (vllm/utils DeviceMemoryProfiler reads
        torch's allocated counter, so the caching allocator's rounding is not in it): the weights and the rotary
        cos/sin buffer, kept in the model dtype (model_executor/layers/rotary_embedding)."""
        return rank_weight_bytes(spec, serving) + rope_cache_bytes(spec, HALF)

    def kv_bytes(self, budget: int, weights: int, activation: int, non_torch: int, graphs: int) -> int:
        return budget - weights - non_torch - activation - graphs

    def cache_tokens(self, blocks: int, concurrency: float, serving: ServingSetup) -> int:
        """'GPU KV cache size' = max concurrency x max_model_len (kv_cache_utils.get_kv_cache_capacity)."""
        return int(concurrency * serving.max_model_len)

    def prefix_caching_default(self, spec: ModelSpec) -> bool:
        """Off for a model with recurrent layers (their "align" caching mode comes with the flag): Qwen3.5-27B's start-up
        log under 0.19.0 without it (github.com/vllm-project/vllm/issues/40691: 290,864 tokens, 33.04x at 32,768) sizes
        one state page per recurrent group, which only the "none" mode does (``_state_pool``)."""
        return not has_state_pages(spec)

    def pool_layout(self, spec: ModelSpec, serving: ServingSetup) -> Pool:
        """The hybrid allocator (vllm/v1/core/kv_cache_utils.py): full-attention and sliding-window layers fall in
        groups of the smaller count; one pool block holds a page of one layer of every group, and a request takes
        cdiv(max_model_len, 16) blocks per full group and cdiv(min(window - 1 + max_num_batched_tokens,
        max_model_len), 16) + 1 per sliding group (SlidingWindowSpec.max_memory_usage_bytes). Recurrent layers:
        ``_state_pool``."""
        whole = super().pool_layout(spec, serving)
        if serving.pipeline_parallel_size > 1:
            return whole
        if has_state_pages(spec):
            return _state_pool(spec, serving, whole.page_bytes // whole.block_size, whole.block_size)
        kinds = spec.cache_layer_types()
        slide = sum(1 for k in kinds if k == "sliding_attention")
        if not slide or spec.sliding_window is None:
            return whole
        full, block = sum(1 for k in kinds if k not in ("sliding_attention", "dummy")), whole.block_size
        group = min(c for c in (full, slide) if c)
        page, full_block, slide_block = whole.page_bytes, block, block
        if not uniform(spec):
            # kinds of their own widths (Gemma 4's full layers: 2 K/V heads of 512 beside 8 of 256) get pages of one
            # size (kv_cache_utils.unify_kv_cache_spec_page_size): the narrower kind's blocks hold more tokens; a layer
            # that reuses another's K/V ("dummy") has none
            dtype = 1 if serving.kv_cache_dtype == "fp8" else HALF
            heads = max(1, spec.num_key_value_heads // serving.tensor_parallel_size)
            widths = {k: n * dtype for k, n in zip(kinds, kv_elements(spec, heads)) if k != "dummy"}
            page = block * max(widths.values())
            full_block = page // max((v for k, v in widths.items() if k != "sliding_attention"), default=page // block)
            slide_block = page // widths["sliding_attention"]
        window = min(spec.sliding_window - 1 + serving.max_num_batched_tokens, serving.max_model_len)
        per_request = (math.ceil(full / group) * math.ceil(serving.max_model_len / full_block)
                       + math.ceil(slide / group) * (math.ceil(window / slide_block) + 1))
        return whole._replace(page_bytes=page, group=group, per_request=per_request)


    def args(self, model: str, serving: ServingSetup) -> dict[str, Any]:
        """Kwargs for ``vllm.LLM(**kw)`` / ``EngineArgs(**kw)``; data_parallel_size > 1 is for ``vllm serve``."""
        s = serving
        return {
            "model": model,
            "dtype": _DTYPES[s.dtype],
            "tensor_parallel_size": s.tensor_parallel_size,
            "pipeline_parallel_size": s.pipeline_parallel_size,
            "data_parallel_size": s.data_parallel_size,
            "enable_expert_parallel": s.enable_expert_parallel,
            "max_model_len": s.max_model_len,
            "gpu_memory_utilization": s.gpu_memory_utilization,
            "max_num_seqs": s.max_num_seqs,
            "max_num_batched_tokens": s.max_num_batched_tokens,
            "quantization": self.quantization_choice(s),
            "kv_cache_dtype": s.kv_cache_dtype,
            "enable_prefix_caching": s.enable_prefix_caching,
            "enforce_eager": s.enforce_eager,
        }

    def launcher(self, model: str) -> list[str]:
        return ["vllm", "serve", model]

    def flags(self, model: str, serving: ServingSetup) -> list[Flag]:
        """``vllm serve MODEL --flag value ...``: the args as the CLI spells them (the model is positional)."""
        kw = self.args(model, serving)
        out: list[Flag] = []
        for key, value in kw.items():
            if key == "model" or value is None or value is False:  # False is the default of every switch a plan can turn off
                continue
            out.append(("--" + key.replace("_", "-"), None if value is True else str(value)))
        return out


def _state_pool(spec: ModelSpec, serving: ServingSetup, token_bytes: int, default_block: int) -> Pool:
    """A hybrid of attention and recurrent layers (vllm/model_executor/models/config.py
    HybridAttentionMambaModelConfig, kv_cache_utils ``_get_kv_cache_groups_uniform_page_size``): the attention block
    grows to 16 x cdiv(state page, 16 x one layer's bytes per token) tokens so one attention page holds a state page
    (padded up to it); layers fall in groups of the smaller kind's count (the larger's where it is under 1.25x), and
    a request takes cdiv(max_model_len, block) pages per attention group and one state page per recurrent group, two
    with prefix caching ("align" mode: MambaSpec.max_memory_usage_bytes). Every pool block is a decode sequence's
    state slot too: vLLM refuses to start when max_num_seqs exceeds the blocks (``max_num_seqs (N) exceeds available
    Mamba cache blocks``, vllm/config/compilation.py)."""
    state, pages = state_page_bytes(spec, serving), 2 if serving.enable_prefix_caching else 1
    attention, recurrent = spec.kv_layers, spec.stateful_layers
    if not attention:   # a pure recurrent model: one group of state pages, a block per max_model_len (MambaSpec.block_size)
        return Pool(serving.max_model_len, state, recurrent, pages, states=True)
    block = max(default_block, 16 * math.ceil(state / (16 * token_bytes)))
    low, high = sorted((attention, recurrent))
    group = high if high < 1.25 * low else low
    per_request = math.ceil(attention / group) * math.ceil(serving.max_model_len / block) + math.ceil(recurrent / group) * pages
    return Pool(block, block * token_bytes, group, per_request, states=True)


ENGINE = VLLM()
