"""Small facts about a Recommendation that every adapter needs, derived in one place.

The adapters must agree with each other (the YAML, the TrainingArguments and the DeepSpeed JSON of one
plan describe the same run), so the readings of the Setup they share live here, not in each adapter.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from .. import techniques
from ..errors import InvalidSetupError, WrongMachineError
from ..model.catalog import block_class
from ..techniques import EmitContext

if TYPE_CHECKING:
    from ..recommendation import Recommendation
    from ..setup import Setup

logger = logging.getLogger("perfguide.integrations")

#: How the Trainer docs (fsdp.md) list the fsdp_config keys; the YAML spells them with an ``fsdp_`` prefix.
FSDP_KEY_ORDER = ("version", "reshard_after_forward", "auto_wrap_policy", "cpu_offload", "state_dict_type",
                  "cpu_ram_efficient_loading", "activation_checkpointing")
#: Launcher environment variables: any of them set means we run inside torchrun / accelerate launch / mpirun.
LAUNCHED_ENV = ("LOCAL_RANK", "WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")


def emit_context(rec: Recommendation) -> EmitContext:
    """What the techniques need to write their adapter keys: the Setup and the target it runs on."""
    require_transformers_code(rec)
    return EmitContext(setup=rec.setup, hardware=rec.hardware, model=rec.model, from_scratch=rec.request.constraints.from_scratch)


def require_transformers_code(rec: Recommendation) -> None:
    """A plan priced for litgpt's own GPT (Setup.model_code) has no transformers / PEFT / TRL / accelerate config to
    write: those drive transformers' classes, whose layout (a tied head held once) differs from the one priced."""
    if rec.setup.model_code != "transformers":
        raise InvalidSetupError(f"model_code={rec.setup.model_code!r} prices {rec.setup.model_code}'s own model code; these "
                                "configs drive transformers' classes: plan with model_code='transformers'")


def in_order(values: dict[str, Any], order: tuple[str, ...]) -> dict[str, Any]:
    """``values`` with the keys of ``order`` first, in that order (the shown configs keep a stable, readable
    layout whichever technique wrote a key); keys not listed follow in their own order."""
    return {**{k: values[k] for k in order if k in values}, **{k: v for k, v in values.items() if k not in order}}


def emitted(rec: Recommendation, kind: str) -> dict[str, Any]:
    """One adapter's keys from every technique the plan uses (perfguide.techniques.emit)."""
    return techniques.emit(kind, emit_context(rec))


def hsdp_sizes(setup: Setup) -> dict[str, int] | None:
    """accelerate ParallelismConfig sizes of an HSDP plan (replicas across nodes x shards within a node), else None."""
    return {"dp_replicate_size": setup.nodes, "dp_shard_size": setup.num_gpus} if setup.hybrid_shard else None


def is_multi_process(setup: Setup) -> bool:
    """Data-parallel training plans with more than one rank need a launcher; inference 'device_map' is one process."""
    return setup.task == "train" and setup.world_size > 1


def require_training(rec: Recommendation, what: str) -> Setup:
    if rec.setup.task != "train":
        raise InvalidSetupError(
            f"{what} needs a training plan, but this plan is for inference (task='infer'); use rec.model_kwargs() and rec.generation_kwargs()"
        )
    return rec.setup


def target_label(rec: Recommendation) -> str:
    """How to name the machine a plan targets in one-line errors, e.g. '8x NVIDIA A100-SXM4-80GB'."""
    hw = rec.hardware
    if rec.setup.device == "cpu" or not hw.has_gpu:
        return f"CPU ({hw.cpu.model_name})"
    gpu = hw.smallest_gpu
    count = f"{hw.gpu_count}x " if hw.gpu_count > 1 else ""
    nodes = f" on {hw.nodes} nodes" if hw.nodes > 1 else ""
    return hw.name or f"{count}{gpu.name if gpu else 'GPU'}{nodes}"


def target_supports_tf32(rec: Recommendation) -> bool:
    gpu = rec.hardware.smallest_gpu
    return rec.setup.device == "cuda" and gpu is not None and gpu.supports_tf32


def half_dtype_name(rec: Recommendation) -> str:
    """The dtype quantized bases compute in and keep their other modules in: the plan's autocast (fp8 plans keep
    bf16 outside the fp8 GEMMs), else bf16 where native; on a GPU without bf16 a plan without autocast trains
    in fp32, and so does its compute (serving keeps fp16): one precision per plan (decision, setup, model_kwargs, bnb compute dtype)."""
    if rec.setup.autocast:
        return "bf16" if rec.setup.autocast == "fp8" else rec.setup.autocast
    if rec.setup.device == "cpu" and rec.setup.task == "infer":
        from ..scenarios.inference_rules import cpu_dtype

        return cpu_dtype(rec.request)[0]  # the plan's dtype Decision: fp32 unless the CPU computes bf16 natively
    gpu = rec.hardware.smallest_gpu
    if rec.setup.device == "cuda" and gpu is not None and not gpu.supports_bf16:
        return "fp32" if rec.setup.task == "train" else "fp16"
    return "bf16"


def fsdp_settings(rec: Recommendation) -> dict[str, Any]:
    """The FSDP2 plan, once, in the Trainer's ``fsdp_config`` words; accelerate's YAML spells the same keys with
    an ``fsdp_`` prefix. Both adapters build from this so the TrainingArguments and the YAML of one plan agree."""
    s = rec.setup
    cfg: dict[str, Any] = {
        "version": 2,
        # FULL_SHARD (ZeRO-3-like) reshards after forward; SHARD_GRAD_OP (ZeRO-2-like) keeps params gathered
        "reshard_after_forward": s.gathers_params,
        "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "state_dict_type": "FULL_STATE_DICT",
        # rank 0 loads the checkpoint, the others start on meta: N ranks x full model would not fit host RAM
        "cpu_ram_efficient_loading": True,
    }
    # technique keys: cpu_offload (all-or-nothing under FSDP), activation_checkpointing (FSDP's own: the
    # TrainingArguments flag would add a redundant all-gather, and both at once raise)
    cfg = in_order({**cfg, **emitted(rec, "fsdp_config")}, FSDP_KEY_ORDER)
    layer = decoder_layer_class(rec)
    if layer:
        cfg["transformer_layer_cls_to_wrap"] = layer
    return cfg


def decoder_layer_class(rec: Recommendation) -> str | None:
    """The block class FSDP should wrap: transformers' ``_no_split_modules[0]`` of the model's class, as
    data/architectures.json ``block_classes`` records it (so printing a plan imports no transformers). An
    architecture it lacks gives None: accelerate then wraps the live model's own ``_no_split_modules``."""
    return block_class(rec.model.architecture)


def launched() -> bool:
    """True inside a process started by torchrun / accelerate launch / mpirun."""
    return any(os.environ.get(k) for k in LAUNCHED_ENV)


def check_cuda_machine(rec: Recommendation, needs_ampere: bool) -> None:
    """One-line refusal when a CUDA plan is built where it cannot run (no GPU, or no bf16/tf32 on it).

    Cheap (no CUDA kernels), and done before the libraries' own checks, whose messages do not say which
    plan or machine is meant, and some of which pass silently (fp16 on CPU trains in fp32).
    """
    if rec.setup.device != "cuda":
        return
    import torch

    label = target_label(rec)
    here = "use rec.training_args_dict() / rec.accelerator_kwargs() for plain data, and build the object on the target"
    if not torch.cuda.is_available():
        raise WrongMachineError(f"this plan targets {label} (CUDA) but this machine has no CUDA GPU: {here}")
    if needs_ampere and torch.cuda.get_device_capability() < (8, 0):
        name = torch.cuda.get_device_name()
        raise WrongMachineError(f"this plan targets {label} (bf16/tf32 need compute capability >= 8.0) but this machine's GPU is {name}: {here}")
