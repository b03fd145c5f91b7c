"""What an engine is: the program that runs the model at serving time, described once.

An engine declares its memory rule (how its own source turns the GPU's memory into a KV-cache budget), its
speed traits, the weight formats it runs and where (vendor, compute capability), which of them it converts
at load and which need a pre-quantized checkpoint, and the names its parser registers for the settings a
plan emits; it turns a ServingSetup into its arguments and its command line. The planning layer asks these
questions of whichever engine the user named and never branches on a name.

Two kinds: a *server* (continuous batching over a paged KV cache, started by its own command) and a
*library* engine whose model runs inside the user's script (transformers ``generate``: its plan and memory
are the inference rules', and its outputs are ``model_kwargs()`` / ``generation_kwargs()``).
"""

from __future__ import annotations

import math
import shlex
from typing import Any, ClassVar, NamedTuple

from .._serving_data import EngineFacts, EngineFormat, serving_facts
from ..errors import PerfGuideError
from ..hardware.types import GPU, Hardware
from ..memory.overhead import cuda_context_bytes
from ..memory.serving import (
    EngineMemory,
    activation_peak_bytes,
    attention_kv_bytes_per_token,
    cuda_graph_sizes,
    kv_bytes_per_token,
    mla_dims,
    non_torch_bytes,
    rank_weight_bytes,
)
from ..model.types import ModelSpec
from ..setup import ServingSetup
from ..speed.serving import ServingSpeed, estimate_serving_speed

#: a flag with no value (a switch); Flags are emitted in order
Flag = tuple[str, str | None]


class Pool(NamedTuple):
    """An engine's KV pool cut: tokens per block, bytes of one layer's page, layers one block spans (fractional for a
    ratio-sized pool), and the blocks one max_model_len request takes."""

    block_size: int
    page_bytes: int
    group: float
    per_request: int
    states: bool = False   # each block is also one sequence's recurrent-state page


class Engine:
    """The traits every engine has; a subclass sets the class attributes and, for a server, the rules below."""

    name: ClassVar[str]
    title: ClassVar[str]                  # as its users write it, for reports
    server: ClassVar[bool] = True         # runs its own server (False: runs in the user's script)
    default: ClassVar[bool] = False       # the engine a plan uses when none is named
    order: ClassVar[int] = 100            # registry order: the first server is the alternative a library plan names
    docs_source: ClassVar[str]            # public source of its settings and layouts
    summary: ClassVar[str] = "continuous batching over a paged KV cache"   # what it does, for the engine decision
    #: layouts (the ``strategy`` constraint) the engine accepts across several GPUs
    strategies: ClassVar[tuple[str, ...]] = ("single", "tp")

    def quantizations(self) -> tuple[str, ...]:
        """The ``quantization`` constraint values it plans for."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<engine {self.name}>"


class ServerEngine(Engine):
    """A serving engine with its own memory rule, speed traits, formats and command line."""

    memory_setting: ClassVar[str]         # the knob that sizes its memory budget (e.g. gpu_memory_utilization)
    memory_source: ClassVar[str]          # where its memory rule is read in its source
    expert_parallel: ClassVar[bool] = True   # divides MoE experts over every GPU of TP x DP (a switch of its parser)
    #: other spellings its parser registers for flags ``flags()`` emits (alias -> the emitted name), for reading commands
    flag_aliases: ClassVar[dict[str, str]] = {}
    #: (node count, this node's rank, head address) flags its parser registers for one engine over several nodes
    multinode_flags: ClassVar[tuple[str, str, str]] = ("--nnodes", "--node-rank", "--master-addr")
    #: flags that size expert parallelism as a number (SGLang --ep-size) rather than a switch of ServingSetup
    expert_parallel_flags: ClassVar[tuple[str, ...]] = ()
    #: other words its parser accepts for a field ``flags()`` emits (ServingSetup field -> word -> the field's value),
    #: e.g. vLLM's ``--dtype half`` or ``--quantization awq``: read by ``perfguide check`` and priced, never emitted
    value_aliases: ClassVar[dict[str, dict[str, object]]] = {}
    #: words its parser accepts that perfguide does not price (ServingSetup field -> words, why), refused by name;
    #: both pinned parsers take --dtype float / float32 (vllm/config/model.py ModelDType, SGLang server_args)
    unpriced_values: ClassVar[dict[str, tuple[tuple[str, ...], str]]] = {
        "dtype": (("float", "float32"), "fp32 serving (twice bf16's weight and KV bytes) is not priced; --dtype bfloat16 or float16 serves "
                  "the same checkpoint")}

    @property
    def facts(self) -> EngineFacts:
        """Its row of data/serving.json; an engine defined outside the package may return its own facts."""
        return serving_facts().engines[self.name]

    @property
    def version(self) -> str:
        return self.facts.version

    @property
    def formats(self) -> dict[str, EngineFormat]:
        return self.facts.formats

    def quantizations(self) -> tuple[str, ...]:
        """Every format of its own that quantizes (has a value for its quantization option)."""
        return tuple(f for f, row in self.formats.items() if row.choice is not None)

    def runs(self, fmt: str, gpu: GPU) -> bool:
        """Whether its ``fmt`` kernels run on ``gpu``: by vendor, then by compute capability (NVIDIA) or the
        GPU's own precision flags (other vendors, whose capability is (0, 0))."""
        row = self.formats.get(fmt)
        if row is None or gpu.vendor not in row.vendors:
            return False
        if gpu.vendor == "nvidia":
            return gpu.compute_capability >= row.min_cc
        compute = serving_facts().formats[fmt].compute
        return (compute != "fp8" or gpu.supports_fp8) and (fmt != "bf16" or gpu.supports_bf16)

    # --- memory rule ----------------------------------------------------------------------------
    def utilization(self, gpu: GPU, hardware: Hardware, serving: ServingSetup, headroom: float) -> float:
        """The value of its memory knob a plan sets, keeping ``headroom`` of the GPU free."""
        raise NotImplementedError

    def default_utilization(self, gpu: GPU, serving: ServingSetup) -> float:
        """The value of its memory knob when a command does not set it (vLLM's parser default, 0.9)."""
        return float(ServingSetup.model_fields["gpu_memory_utilization"].default)

    def budget(self, total: int, context: int, serving: ServingSetup) -> int:
        """Bytes its rule lets weights + KV cache (+ whatever it subtracts) use, from CUDA's total."""
        raise NotImplementedError

    def batched_tokens(self, gpu: GPU, tp: int) -> int:
        """Tokens one prefill chunk takes (its max_num_batched_tokens / chunked-prefill setting) that a plan emits."""
        return 8192

    def server_defaults(self, gpu: GPU, tp: int) -> dict[str, int]:
        """The batching its server command takes when a command sets none (ServingSetup field names); a field left
        out is perfguide's ServingSetup default, said so where a command is read."""
        return {"max_num_batched_tokens": self.batched_tokens(gpu, tp)}

    def prefix_caching_default(self, spec: ModelSpec) -> bool:
        """Whether the engine caches prefixes when a command does not say (a plan always says)."""
        return True

    def fraction_to_fit(self, memory: EngineMemory, serving: ServingSetup) -> float | None:
        """The memory knob that would hold the weights and one max_model_len request when its default does not (None:
        the default already takes all the GPU the headroom allows, as vLLM's does)."""
        return None

    def expert_parallel_note(self, size: int, serving: ServingSetup, experts: int) -> str:
        """What an expert-parallel size flag (``expert_parallel_flags``) does to the priced setup, or a one-line refusal."""
        raise PerfGuideError(f"{self.title} has no expert-parallel size flag")

    def kv_bytes(self, budget: int, weights: int, activation: int, non_torch: int, graphs: int) -> int:
        """What its rule leaves for KV blocks (negative: the weights do not leave room)."""
        raise NotImplementedError

    def cache_tokens(self, blocks: int, concurrency: float, serving: ServingSetup) -> int:
        """The KV-cache size in tokens as its start-up log prints it."""
        return blocks * self.facts.block_size

    def pool_layout(self, spec: ModelSpec, serving: ServingSetup) -> Pool:
        """How the KV bytes are cut: every layer in one block of the engine's block size, and as many blocks as a
        max_model_len request has tokens. An engine with a hybrid allocator overrides it (a pool sized by a ratio spans
        a fractional number of layers; recurrent layers' state pages share the pool)."""
        layers = math.ceil((spec.num_decoder_layers or spec.num_layers) / serving.pipeline_parallel_size)
        block = self.facts.block_size
        return Pool(block, block * kv_bytes_per_token(spec, serving) // layers, layers, math.ceil(serving.max_model_len / block))

    def loaded_weight_bytes(self, spec: ModelSpec, serving: ServingSetup, vendor: str = "nvidia") -> int:
        """One rank's weights as the engine's load figure counts them (each engine module says how)."""
        return rank_weight_bytes(spec, serving)

    def memory(self, spec: ModelSpec, serving: ServingSetup, hardware: Hardware) -> EngineMemory:
        """Its start-up memory account on the smallest GPU of the layout."""
        gpu = hardware.smallest_gpu
        if gpu is None:
            raise PerfGuideError(f"engine {self.name!r} serves on GPUs; use a GPU target such as hardware='a100-80gb'")
        facts = self.facts
        # the engines budget from the total CUDA reports: the card's own (gpus.json cuda_total_gib, or NVML's reserve on
        # a probe); a hand-built GPU without one takes the typical driver reserve
        total = gpu.allocatable if gpu.memory_reserved else gpu.memory_total - int(serving_facts().driver_reserved_bytes.value)
        context = cuda_context_bytes(hardware)
        weights, per_token = self.loaded_weight_bytes(spec, serving, gpu.vendor), kv_bytes_per_token(spec, serving)
        graphs = len(cuda_graph_sizes(serving, facts)) * facts.cuda_graph_bytes_per_size
        act, other = activation_peak_bytes(spec, serving, facts), non_torch_bytes(serving, facts)
        budget = self.budget(total, context, serving)
        kv = self.kv_bytes(budget, weights, act, other, graphs)
        pool = self.pool_layout(spec, serving)
        if pool.states:   # the attention layers' K/V only: the recurrent layers keep their state in the same pages
            per_token = attention_kv_bytes_per_token(spec, serving)
        blocks = int(max(0, kv) // (pool.page_bytes * pool.group))
        concurrency = blocks / pool.per_request
        block = pool.block_size
        return EngineMemory(
            engine=self.name, total=total, budget=budget, weights=weights, activation_peak=act, non_torch=other,
            cuda_graphs=graphs, cuda_context=context, kv_cache_bytes=kv, kv_bytes_per_token=per_token, block_size=block,
            num_blocks=blocks, kv_cache_tokens=self.cache_tokens(blocks, concurrency, serving), max_model_len=serving.max_model_len,
            max_concurrency=concurrency, latent_cache=mla_dims(spec) is not None,
            state_slots=blocks if pool.states else None, state_slots_needed=0 if serving.enforce_eager else serving.max_num_seqs,
        )

    # --- speed ----------------------------------------------------------------------------------
    def speed(self, spec: ModelSpec, serving: ServingSetup, hardware: Hardware, prompt: int, output: int, batch: int) -> ServingSpeed:
        """Steady-state speed of ``batch`` concurrent requests per replica, with its own per-step overhead."""
        return estimate_serving_speed(spec, serving, hardware, prompt, output, batch, self.facts.step_overhead_s)

    # --- arguments and command ------------------------------------------------------------------
    def quantization_choice(self, serving: ServingSetup) -> str | None:
        """The value of its quantization option: set only to convert a 16-bit checkpoint at load. A checkpoint
        served in its own format needs none (the engines read its quantization_config), so a printed command
        never asks a 16-bit repository for AWQ kernels."""
        fmt = serving.weight_format
        if fmt == serving.checkpoint_format or serving_facts().formats[fmt].bits == 16:
            return None
        return self.formats[fmt].choice

    def args(self, model: str, serving: ServingSetup) -> dict[str, Any]:
        """Keyword arguments of its Python entry point."""
        raise NotImplementedError

    def flags(self, model: str, serving: ServingSetup) -> list[Flag]:
        """(flag, value) pairs of its command line, by the names its parser registers; a None value is a switch."""
        raise NotImplementedError

    def launcher(self, model: str) -> list[str]:
        """The words before the flags (the program, and the model where it is positional)."""
        raise NotImplementedError

    def command(self, model: str, serving: ServingSetup) -> str:
        """The shell command that starts it with the plan's settings, every word quoted."""
        parts = [shlex.quote(w) for w in self.launcher(model)]
        for flag, value in self.flags(model, serving):
            parts += [flag] if value is None else [flag, shlex.quote(value)]
        return " ".join(parts)


class LibraryEngine(Engine):
    """An engine that runs inside the user's script: its plan is the inference rules', its outputs the
    adapters' (``model_kwargs()``, ``generation_kwargs()``); it has no server command."""

    server: ClassVar[bool] = False
    strategies: ClassVar[tuple[str, ...]] = ("single", "tp", "device_map")
    formats_in_script: ClassVar[tuple[str, ...]] = ()   # weight formats it loads in-flight

    def quantizations(self) -> tuple[str, ...]:
        return self.formats_in_script

    def command(self, model: str, serving: ServingSetup | None) -> str:
        raise PerfGuideError(f"engine={self.name!r} runs generate() in your own script and has no server command; "
                             "use rec.model_kwargs() and rec.generation_kwargs(), or plan with a serving engine (see perfguide.engines.names())")
