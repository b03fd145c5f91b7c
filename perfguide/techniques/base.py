"""What a technique declares, in one place: the Setup fields it owns, when it applies, its place in the fit
ladder, what it emits to each adapter, and the public source its decision cites.

Adapters (integrations/) and the search (scenarios/) read these declarations instead of hard-coding each
technique, and the cost model (memory/analytic.py, speed/training.py) asks every technique how it changes the
step's terms through the hooks below (contexts in effects.py), so adding one is a module here plus its Setup
field. This layer sits above the memory and speed primitives (memory/ledger, sharding, activations; speed/rates,
traffic) and below the cost-model fold that calls these hooks (tests/test_layering.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from .effects import KernelFactors, MemoryContext, MemoryTerms, SpeedContext, StepSeconds, StepShape

if TYPE_CHECKING:
    from ..hardware.types import Hardware
    from ..memory.sharding import PerDevice
    from ..model.types import ModelSpec
    from ..setup import LoraSpec, Setup


#: the Hugging Face training loops (HF Trainer, TRL's trainers), which patch and collate for transformers' models
HF_TRAINERS = ("transformers", "trl")


@dataclass(frozen=True)
class Requires:
    """When a technique can run at all; ``why_not`` turns a miss into one line."""

    devices: tuple[str, ...] = ("cuda", "cpu")
    tasks: tuple[str, ...] = ("train", "infer")
    packages: tuple[str, ...] = ()            # pip names the *target* machine needs (not perfguide)
    gpu_capability: str | None = None         # a GPU property that must be true, e.g. "supports_bf16"
    conflicts: tuple[str, ...] = ()           # techniques it cannot be combined with
    finetune: tuple[str, ...] = ("full", "lora", "qlora")
    strategies: tuple[str, ...] | None = None  # the strategies it runs under (None: any)
    #: the training loops it runs in (``Setup.trainer``): Liger, Cut Cross-Entropy and padding-free batches patch or
    #: collate for Hugging Face's models and trainers, which a torchtune recipe does not run
    trainers: tuple[str, ...] = ("transformers", "trl", "torchtune")
    #: the model code it patches (``Setup.model_code``): the same three patch transformers' modeling classes, not litgpt's GPT
    model_codes: tuple[str, ...] = ("transformers", "litgpt")
    #: True: a Setup that turns the technique on where the devices, tasks, fine-tuning or strategies above refuse
    #: it is invalid (Setup validation asks ``Technique.conflict``); False: they only say where the planner offers it
    binding: bool = False


def finetune_of(setup: Setup) -> str:
    """'full', 'lora' or 'qlora' (LoRA on a quantized base): the fine-tuning kind ``Requires.finetune`` names."""
    if setup.lora is None:
        return "full"
    return "qlora" if setup.quantized else "lora"


@dataclass(frozen=True)
class Rung:
    """Setup templates with the same training semantics; the search tries rungs in ladder order."""

    name: str
    tradeoff: str
    templates: tuple[Setup, ...]
    #: its place in the ladder when it is not its technique's ``ladder_order`` (a technique with rungs of both kinds)
    order: float | None = None


@dataclass(frozen=True)
class LadderContext:
    """What the fit ladder is built from: the base Setup, the precision plan and the user's constraints."""

    base: Setup
    autocast: str | None
    half: str | None
    pure_half_allowed: bool
    finetune: str
    lora: LoraSpec
    optimizer: str | None            # the requested optimizer, None: perfguide picks
    checkpointing: bool | None       # the requested checkpointing, None: searched
    model: ModelSpec | None = None   # what techniques gated on the model family read (Liger's model types)
    hardware: Hardware | None = None  # what techniques gated on the GPU read (fp8)
    #: the user's constraint per technique field (liger_kernel, optimizer_in_backward, padding_free,
    #: activation_offloading, fp8, master_weights); absent or None: perfguide decides
    wants: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class EmitContext:
    """What an adapter knows when it asks a technique for its keys: the Setup and the target it runs on."""

    setup: Setup
    hardware: Hardware | None = None
    model: ModelSpec | None = None
    from_scratch: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def target_supports_tf32(self) -> bool:
        gpu = self.hardware.smallest_gpu if self.hardware is not None else None
        return self.setup.device == "cuda" and gpu is not None and gpu.supports_tf32


class Technique:
    """Base class: every method has the do-nothing default, so a technique overrides only what it changes."""

    name: ClassVar[str] = ""
    #: Setup fields this technique owns (no other technique writes them).
    fields: ClassVar[tuple[str, ...]] = ()
    #: switches it adds to Setup, ``{name: (type, default, description)}``, when the registry finds it (a technique
    #: outside this package is one module); the bundled techniques' fields are written in setup.py
    setup_fields: ClassVar[dict[str, tuple[Any, Any, str]]] = {}
    summary: ClassVar[str] = ""
    #: public references (docs URLs, papers, code paths in public repositories) its decisions cite
    sources: ClassVar[tuple[str, ...]] = ()
    requires: ClassVar[Requires] = Requires()
    #: emission and listing order (adapters merge technique keys in this order)
    order: ClassVar[int] = 100
    #: where its word sits in ``Setup.label`` (None: at ``order``); the search breaks exact ties on the label, so
    #: the words keep the places they had before the techniques wrote them
    label_order: ClassVar[int | None] = None
    #: position of its rung(s) in the fit ladder; None: contributes no rung
    ladder_order: ClassVar[float | None] = None
    #: True: searched inside every rung (both values tried) instead of forming a rung of its own
    axis: ClassVar[bool] = False
    #: the ``recommend(...)`` keyword (a scenarios Constraints field) that forces it; the ladder reads it in ``ctx.wants``
    switch: ClassVar[str | None] = None
    #: True: the planner states this technique's decision itself (a layout it lays out with the ranks and the batch, which
    #: turning the technique off alone would misprice: scenarios/sequence_split.py), not the generic with/without one
    own_decision: ClassVar[bool] = False

    @property
    def source(self) -> str:
        return "; ".join(self.sources)

    # --- state and applicability -----------------------------------------------------------------
    def active(self, setup: Setup) -> bool:
        """Whether ``setup`` uses this technique."""
        return False

    def _device_or_task(self, setup: Setup) -> str | None:
        req = self.requires
        if setup.device not in req.devices:
            return f"{self.name} needs a {' or '.join(req.devices)} device, not {setup.device!r}"
        if setup.task not in req.tasks:
            return f"{self.name} applies to {' and '.join(req.tasks)}, not {setup.task!r}"
        if setup.task == "train" and setup.trainer not in req.trainers:
            return f"{self.name} runs under the {' / '.join(req.trainers)} training loop, not trainer={setup.trainer!r}"
        if setup.model_code not in req.model_codes:
            return f"{self.name} patches {' / '.join(req.model_codes)}'s model code, not model_code={setup.model_code!r}"
        return None

    def why_not(self, setup: Setup, hardware: Hardware | None = None, model: ModelSpec | None = None) -> str | None:
        """Why the technique cannot run for ``setup`` on ``hardware`` (None: it can)."""
        problem = self._device_or_task(setup)
        if problem:
            return problem
        return self.missing_capability(setup, hardware.smallest_gpu if hardware is not None else None)

    def missing_capability(self, setup: Setup, gpu: Any) -> str | None:
        """The GPU property the technique needs and ``gpu`` lacks (fp8 matmuls on an A100): such a setup does not run
        there at all, so estimate and check both refuse it (None: the card has it, or no card is named)."""
        need = self.requires.gpu_capability
        if need and setup.device == "cuda" and gpu is not None and not getattr(gpu, need):
            return f"{self.name} needs {need.replace('supports_', '')} on the GPU and {gpu.name} lacks it"
        return None

    def implied(self, fields: dict[str, Any]) -> dict[str, Any]:
        """Fields the user left out that this technique's switch decides, from the Setup's raw input ``fields`` (a
        DPO step runs in TRL's DPOTrainer: ``trainer='trl'``). Only fields absent from ``fields``; none by default."""
        return {}

    def conflict(self, setup: Setup) -> str | None:
        """Why ``setup`` cannot run with this technique as it sets it (None: it can), for Setup's own validation:
        with a binding ``requires``, the device, task, fine-tuning and strategy it names; a technique adds the
        rules ``Requires`` cannot say. One sentence, ending with the Setup change that turns it off."""
        if not (self.requires.binding and self.active(setup)):
            return None
        req = self.requires
        problem = self._device_or_task(setup)
        if problem is None and finetune_of(setup) not in req.finetune:
            problem = f"{self.name} is for {' and '.join(req.finetune)} fine-tuning, not {finetune_of(setup)}"
        if problem is None and req.strategies is not None and setup.strategy not in req.strategies:
            problem = f"{self.name} runs under strategy {', '.join(req.strategies)}, not {setup.strategy!r}"
        return self._refused(problem)

    def _refused(self, problem: str | None) -> str | None:
        off = ", ".join(f"{k}={v!r}" for k, v in self.off().items())
        return f"{problem}; or turn it off ({off})" if problem and off else problem

    def label_word(self, setup: Setup) -> str | None:
        """Its word in ``Setup.label`` when ``setup`` uses it (None: it adds none), placed by ``label_order``."""
        return None

    def per_rank(self, setup: Setup) -> Setup:
        """The Setup one rank computes, where the technique splits the step's data over ranks (sequence parallelism:
        each rank's slice of the sequence); the memory and speed models price that one. ``setup`` by default."""
        return setup

    def sequence_ranks(self, setup: Setup) -> int:
        """The ranks that share each sequence under this technique (what the speed model's exchange and attention
        share are counted over); 1 by default."""
        return 1

    # --- the fit ladder ----------------------------------------------------------------------------
    def rungs(self, ctx: LadderContext) -> list[Rung]:
        """The rung(s) this technique adds to the ladder for ``ctx`` (none by default)."""
        return []

    def axis_values(self, ctx: LadderContext) -> list[dict[str, Any]]:
        """Field updates tried inside every rung (axis techniques only)."""
        return [{}]

    def off(self) -> dict[str, Any]:
        """The Setup change that turns it off, so a Decision can price what it bought ({}: not priced on its own)."""
        return {}

    # --- adapters ------------------------------------------------------------------------------------
    def training_args(self, ctx: EmitContext) -> dict[str, Any]:
        """``transformers.TrainingArguments`` keys."""
        return {}

    def trl_args(self, ctx: EmitContext) -> dict[str, Any]:
        """Keys only TRL's ``SFTConfig`` has (on top of the TrainingArguments keys)."""
        return {}

    def model_kwargs(self, ctx: EmitContext) -> dict[str, Any]:
        """``from_pretrained`` kwargs."""
        return {}

    def fsdp_config(self, ctx: EmitContext) -> dict[str, Any]:
        """FSDP2 settings in the Trainer's ``fsdp_config`` words (accelerate's YAML and plugin derive from them)."""
        return {}

    def accelerate_config(self, ctx: EmitContext) -> dict[str, Any]:
        """Keys of the ``accelerate launch`` config file (accelerate's ``ClusterConfig`` fields)."""
        return {}

    def deepspeed_zero(self, ctx: EmitContext) -> dict[str, Any]:
        """Keys of DeepSpeed's ``zero_optimization`` block."""
        return {}

    def deepspeed_top(self, ctx: EmitContext) -> dict[str, Any]:
        """Top-level DeepSpeed config keys."""
        return {}

    def prepare(self, ctx: EmitContext, model: Any) -> Any:
        """The ``prepare_model`` step: what must be done to the model object itself (idempotent)."""
        return model

    def trace_model(self, setup: Setup, model: Any) -> Any:
        """What the memory tracer's meta model (memory/tracing/build.py) must carry for a traced step to see this
        technique (checkpointing wraps the blocks). A technique that overrides it has its fields in the trace
        cache's key."""
        return model

    # --- the cost model ------------------------------------------------------------------------------
    def place(self, setup: Setup, dev: PerDevice) -> PerDevice:
        """Where the per-device model states live (CPU offload moves parts to host RAM); runs before ``memory``,
        so the memory hooks see the states as placed."""
        return dev

    def shape(self, setup: Setup) -> Setup:
        """The (batch, sequence) Setup the memory model counts activations on (padding-free flattens the batch)."""
        return setup

    def step_shape(self, setup: Setup, shape: StepShape) -> StepShape:
        """What the speed model counts per micro-step: matmul tokens, attention shape, real tokens."""
        return shape

    def memory(self, ctx: MemoryContext, terms: MemoryTerms) -> MemoryTerms:
        """The step's memory terms with this technique's effect (called for every technique, active or not)."""
        return terms

    def kernel_factors(self, setup: Setup) -> KernelFactors:
        """Multipliers on kernel launches and memory-bound passes (fused or compiled kernels)."""
        return KernelFactors()

    def speed(self, ctx: SpeedContext) -> StepSeconds:
        """Seconds this technique adds or saves on a GPU training step."""
        return StepSeconds()
