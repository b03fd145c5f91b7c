"""What a scenario's rules receive (Request) and return (Plan)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, Strict, StrictBool, StrictInt, model_validator

from .. import engines
from .._base import Model
from ..decisions import Decision
from ..hardware.types import Hardware
from ..memory.factors import Factors
from ..memory.serving import EngineMemory
from ..memory.types import MemoryEstimate
from ..model.tasks import normalize_task
from ..model.types import ModelSpec
from ..setup import AttnImpl, LoraSpec, Setup, TrainerLoop
from ..speed.types import Throughput
from . import registry

SCENARIOS: tuple[str, ...] = registry.names()


def _known_scenario(name: str) -> str:
    registry.get(name)
    return name


Scenario = Annotated[str, AfterValidator(_known_scenario)]


def _known_engine(name: str) -> str:
    engines.get(name)
    return name


#: int accepted, bool and strings refused
StrictFloat = Annotated[float, Strict()]


#: the serving engines' own settings among the constraints (a library engine refuses them)
SERVING_KNOBS: tuple[str, ...] = ("quantized_model", "gpu_memory_utilization", "max_model_len", "max_num_seqs", "kv_cache_dtype",
                                  "tensor_parallel_size", "pipeline_parallel_size", "enable_expert_parallel")


class Constraints(Model):
    """Optional user constraints (``recommend(..., **constraints)``); None means 'perfguide decides'.

    Upper bounds match Setup's, so any accepted constraint can become a Setup field without a late crash.
    Numbers and switches are strict: ``micro_batch_size=True`` or ``"8"`` is refused like ``seq_len="8"``, not
    quietly read as 1 or 8.
    """

    precision: Literal["bf16", "fp16", "fp32"] | None = None
    optimizer: str | None = None
    finetune: Literal["full", "lora", "qlora"] | None = None   # None: full, LoRA/QLoRA offered only as alternatives
    lora: LoraSpec | None = None
    gradient_checkpointing: StrictBool | None = None
    attn_implementation: AttnImpl | None = None
    linear_attention_kernels: Literal["torch", "fla", "mamba_ssm"] | None = Field(default=None, description="a hybrid model's recurrent layers: the packages' kernels installed on the target ('fla': flash-linear-attention + causal-conv1d, for gated-DeltaNet layers; 'mamba_ssm': mamba-ssm + causal-conv1d, for Mamba-2 layers) or 'torch' (transformers' reference code); None: perfguide decides (the kernels only where this machine is the target and has them)")
    micro_batch_size: StrictInt | None = Field(default=None, ge=1, le=1_000_000)
    headroom: StrictFloat = Field(default=0.10, ge=0, lt=1, description="fraction of device memory (and of host RAM for offload) kept free")
    nodes: StrictInt = Field(default=1, ge=1, le=100_000)
    num_gpus: StrictInt | None = Field(default=None, ge=1, le=100_000, description="GPUs (or CPU processes) per node to use")
    strategy: str | None = None
    allow_offload: StrictBool = True
    from_scratch: StrictBool = False
    # the technique stack (perfguide.techniques): None lets the search decide, True/False forces
    liger_kernel: StrictBool | None = None
    cut_cross_entropy: StrictBool | None = None
    optimizer_in_backward: StrictBool | None = None
    activation_offloading: StrictBool | None = None
    padding_free: StrictBool | None = None
    fp8: StrictBool | None = None
    sequence_parallel: StrictInt | None = Field(default=None, ge=1, le=100_000, description="train_gpu_many: GPUs that split each "
                                                "sequence (DeepSpeed Ulysses through accelerate's sp_size); None: split only "
                                                "when no unsplit layout fits, 1: never")
    avg_seq_len: StrictInt | None = Field(default=None, ge=1, le=10_000_000, description="mean real tokens per sample; None: samples fill seq_len")
    target_len: StrictInt | None = Field(default=None, ge=1, le=10_000_000, description="encoder-decoder training: tokens the decoder runs "
                                         "(max_target_length); seq_len is then the source length. None: seq_len")
    torch_compile: StrictBool | None = Field(default=None, description="training: compile the model (None: decided on max_steps)")
    max_steps: StrictInt | None = Field(default=None, ge=1, le=1_000_000_000, description="optimizer steps of the training run: weighs torch.compile's one-off compile time")
    objective: Literal["sft", "dpo"] = Field(default="sft", description="training: sft (next-token loss) or dpo (TRL DPOTrainer: "
                                             "chosen + rejected per pair, a frozen reference model)")
    precompute_ref_log_probs: StrictBool = Field(default=False, description="DPO: reference log-probs computed once before training "
                                                 "(no reference model or reference forward in the step)")
    trainer: TrainerLoop | None = Field(default=None, description="training: the loop that runs the step, "
                                                  "transformers (HF Trainer, full logits) or trl (SFTTrainer / DPOTrainer: "
                                                  "TRL's loss, no full logits since TRL 1.7) or torchtune (its recipes' "
                                                  "LinearCrossEntropyLoss; plans then write torchtune keys only through "
                                                  "perfguide check); None: transformers, trl for dpo")
    master_weights: Literal["fp32", "bf16"] | None = None   # None: the plan picks (fp32 masters first) and says what it traded
    # inference
    prompt_len: StrictInt | None = Field(default=None, ge=1, le=10_000_000)
    max_new_tokens: StrictInt = Field(default=256, ge=1, le=10_000_000)
    batch_size: StrictInt | None = Field(default=None, ge=1, le=1_000_000, description="inference concurrency target")
    # weights: None serves the checkpoint as given, quantizing only when nothing lossless fits; 'none' never quantizes;
    # 'auto' lets a lossy format win on speed; a format name asks for that format (each engine plans its own)
    quantization: Literal["int8", "nf4", "fp8", "fp8_block", "awq", "gptq", "w4a16", "mxfp4", "nvfp4", "none", "auto"] | None = None
    quantized_model: str | None = Field(default=None, min_length=1, max_length=512,
                                        description="serving: a pre-quantized checkpoint of the model (repo id or local path) to serve")
    engine: Annotated[str, AfterValidator(_known_engine)] | None = None   # a name of perfguide.engines; None: the default
    prefer: Literal["latency", "throughput"] = "throughput"
    # serving engine knobs: honoured as given, or refused in one line
    gpu_memory_utilization: StrictFloat | None = Field(default=None, gt=0, le=1, description="serving: the engine's memory fraction")
    max_model_len: StrictInt | None = Field(default=None, ge=1, le=10_000_000, description="serving: longest request (prompt + output)")
    max_num_seqs: StrictInt | None = Field(default=None, ge=1, le=1_000_000, description="serving: sequences batched at once per replica")
    kv_cache_dtype: Literal["auto", "fp8"] | None = None
    tensor_parallel_size: StrictInt | None = Field(default=None, ge=1, le=1024)
    pipeline_parallel_size: StrictInt | None = Field(default=None, ge=1, le=1024)
    enable_expert_parallel: StrictBool | None = None
    trust_remote_code: StrictBool = False
    # the model's head (model/tasks.py): PEFT's task types, spelled as transformers' pipelines or PEFT name them
    task: Annotated[Literal["causal-lm", "seq-cls", "token-cls", "qa", "seq2seq", "feature-extraction"] | None,
                    BeforeValidator(normalize_task)] = Field(
        default=None, description="the model's head: causal-lm, seq-cls, token-cls, qa, seq2seq, feature-extraction "
                                  "(PEFT's task types, or as PEFT / transformers' pipelines spell them); default: the config's head")
    num_labels: StrictInt | None = Field(default=None, ge=1, le=1_000_000, description="classifier width for task seq-cls / token-cls (default 2)")


class Request(Model):
    """Everything the rules need: the model, the machine, the workload and the constraints."""

    scenario: Scenario
    model: ModelSpec
    hardware: Hardware
    seq_len: int = Field(ge=1)
    global_batch_size: int = Field(ge=1)
    constraints: Constraints = Constraints()
    model_id: str | None = None   # the model as the user named it (a repo id or path), for the commands that load it
    calibration: Factors | None = None   # this machine's measured ratios for this model's family / size band

    @property
    def info(self) -> registry.ScenarioInfo:
        """The scenario's registry entry (task, device, one or many GPUs)."""
        return registry.get(self.scenario)


class Candidate(Model):
    """A priced Setup the search considered, with its verdict."""

    setup: Setup
    memory: MemoryEstimate
    throughput: Throughput
    verdict: Literal["chosen", "fits", "does-not-fit", "incompatible"]
    why: str = ""


class Plan(Model):
    """What a scenario's rules return; the Recommendation wraps it with the API's conveniences.

    One verdict: the plan's ``memory.fits`` is set to the plan's ``fits`` (device memory less the headroom the plan
    keeps, and host RAM), so the memory section, the headline and every Decision say the same thing.
    """

    @model_validator(mode="before")
    @classmethod
    def _one_verdict(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("memory"), MemoryEstimate):
            data = {**data, "memory": data["memory"].model_copy(update={"fits": bool(data.get("fits", True))})}
        return data

    setup: Setup
    memory: MemoryEstimate
    throughput: Throughput
    decisions: tuple[Decision, ...]
    candidates: tuple[Candidate, ...] = ()
    warnings: tuple[str, ...] = ()
    fits: bool = True
    suggestions: tuple[str, ...] = ()   # when nothing fits: what would (bigger GPU, more GPUs, QLoRA...)
    engine_memory: EngineMemory | None = None   # a serving engine's start-up account
