"""Constraints a scenario cannot honour are refused in one line, never silently dropped.

Each scenario's rules read only the constraints that mean something to them; without this check a user who
asks ``train_gpu_one`` for ``num_gpus=8``, or an inference plan for ``optimizer='sgd'``, would get a plan that
quietly ignores the request. train_gpu_many checks its own world size and strategy (strategies.py).
"""

from __future__ import annotations

from typing import Any

from .. import techniques
from ..errors import ConflictingConstraintsError, unknown_value
from ..hardware.types import Hardware
from .bnb_gate import check_bnb_constraints
from .registry import ScenarioInfo, find
from .strategies import ONE_GPU_STRATEGIES
from .types import SERVING_KNOBS, Constraints

#: training constraints, with the switch of every training-only technique
TRAINING_ONLY = ("finetune", "lora", "optimizer", "gradient_checkpointing", "micro_batch_size", "from_scratch", "avg_seq_len", "target_len",
                 "torch_compile", "max_steps", "sequence_parallel",
                 *(t.switch for t in techniques.registry() if t.switch and t.requires.tasks == ("train",)))
INFERENCE_ONLY = ("prompt_len", "max_new_tokens", "batch_size", "quantization", "prefer", "engine", *SERVING_KNOBS)
INFER_STRATEGIES = ("single", "tp", "device_map")
_HINTS = {
    "quantization": "to train on a 4-bit base use finetune='qlora'",
    "micro_batch_size": "use batch_size for inference",
    "batch_size": "use global_batch_size (and micro_batch_size) for training",
    "prompt_len": "use seq_len for training",
}


def _given(cons: Constraints, field: str) -> Any:
    """The value the user set, or None when the field is absent or left at its default."""
    value = getattr(cons, field)
    return None if value == Constraints.model_fields[field].default else value


def check_applicable(info: ScenarioInfo, cons: Constraints, hardware: Hardware) -> None:
    """Raise ConflictingConstraintsError for the first constraint the scenario ``info`` would ignore."""
    scenario, training = info.name, info.training
    kind, other = ("training", "inference") if training else ("inference", "training")
    for field in INFERENCE_ONLY if training else TRAINING_ONLY:
        value = _given(cons, field)
        if value is not None:
            hint = _HINTS.get(field, f"drop it, or use one of the {other} scenarios")
            raise ConflictingConstraintsError(f"{field}={value!r} only applies to {other} but scenario {scenario!r} is {kind}; {hint}")
    if training and cons.lora is not None and cons.finetune == "full":
        raise ConflictingConstraintsError("lora=... describes adapters but finetune='full' trains every weight; "
                                          "use finetune='lora' or 'qlora', or drop lora")
    if training and cons.finetune == "qlora" and cons.precision == "fp32":
        raise ConflictingConstraintsError("precision='fp32' with finetune='qlora': the 4-bit base dequantizes into a 16-bit compute "
                                          "dtype (its norms and embeddings stay 16-bit), so it cannot be fp32; use precision='bf16' "
                                          "or 'fp16' with QLoRA, or finetune='lora' for an fp32 base")
    if training and info.device == "cpu" and cons.finetune == "qlora":
        raise ConflictingConstraintsError("finetune='qlora' needs a CUDA GPU (bitsandbytes 4-bit training); "
                                          "use finetune='lora' on the CPU, or scenario='train_gpu_one'")
    if info.device == "cuda":
        check_bnb_constraints(cons.finetune, cons.optimizer, cons.quantization, hardware)
    if not training:
        from .serving_plan import check_engine

        check_engine(scenario, cons)
    if info.multi_gpu:
        _check_many(info, cons, hardware)
    else:
        _check_one_device(info, cons)


def _many_gpu_names(info: ScenarioInfo) -> str:
    """The multi-GPU scenario(s) to point at: the same task's from a GPU scenario, every multi-GPU one from the CPU."""
    tasks = (info.task,) if info.device == "cuda" else ("train", "infer")
    return "' or '".join(s.name for s in (find(t, "cuda", True) for t in tasks) if s is not None)


def _check_one_device(info: ScenarioInfo, cons: Constraints) -> None:
    scenario, many = info.name, _many_gpu_names(info)
    # train_cpu reads num_gpus as the number of CPU processes (one per socket by default)
    for field in ("nodes",) if info.processes else ("num_gpus", "nodes"):
        value = getattr(cons, field)
        if value is not None and value > 1:
            raise ConflictingConstraintsError(f"{field}={value} asks for several devices but scenario {scenario!r} plans one; "
                                              f"use scenario='{many}'")
    if (cons.sequence_parallel or 1) > 1:
        raise ConflictingConstraintsError(f"sequence_parallel={cons.sequence_parallel} splits each sequence over several GPUs but "
                                          f"scenario {scenario!r} plans one; use scenario='{many}'")
    one_gpu = ONE_GPU_STRATEGIES if info.training and info.device == "cuda" else ("single",)
    if cons.strategy not in (None, *one_gpu):
        raise ConflictingConstraintsError(f"strategy={cons.strategy!r} needs several devices but scenario {scenario!r} plans one; "
                                          f"accepted here: {', '.join(repr(s) for s in one_gpu)}, or use scenario='{many}'")


def _check_many(info: ScenarioInfo, cons: Constraints, hardware: Hardware) -> None:
    if hardware.gpu_count > 1 and any(g.mig for g in hardware.gpus):
        _check_mig(info, cons)
    if info.training:
        return  # train_gpu_many validates its own layout (strategies.check_forced, world_of)
    if cons.strategy is not None and cons.strategy not in INFER_STRATEGIES:
        raise unknown_value("inference strategy", cons.strategy, INFER_STRATEGIES, ConflictingConstraintsError)
    if cons.nodes > 1:
        raise ConflictingConstraintsError(f"nodes={cons.nodes}: {info.name} plans the GPUs of one node; "
                                          "use nodes=1 and run one server per node")
    if cons.num_gpus is not None and cons.num_gpus > hardware.gpu_count:
        raise ConflictingConstraintsError(f"num_gpus={cons.num_gpus} but the hardware has {hardware.gpu_count} GPU(s); "
                                          f"use num_gpus <= {hardware.gpu_count}, or a bigger target such as "
                                          f"hardware='{(hardware.name or 'a100-80gb').split(':')[0]}:{cons.num_gpus}'")


def _check_mig(info: ScenarioInfo, cons: Constraints) -> None:
    """MIG slices only work side by side as independent processes.

    CUDA enumerates a single MIG instance per process and slices have no peer-to-peer path, so one job cannot
    shard, tensor-parallelise or data-parallelise across them; independent serving replicas (one process per
    slice, CUDA_VISIBLE_DEVICES=MIG-<uuid>) are the one multi-slice layout.
    """
    if info.training:
        one = find(info.task, "cuda", False)
        raise ConflictingConstraintsError("the visible GPUs are MIG slices, which one training job cannot use together (CUDA sees "
                                          f"one slice per process; no NCCL peer path between slices); use scenario='{one.name if one else ''}' "
                                          "and CUDA_VISIBLE_DEVICES=MIG-<uuid> of one slice")
    if cons.strategy in ("tp", "device_map"):
        raise ConflictingConstraintsError(f"strategy={cons.strategy!r} cannot span MIG slices (CUDA sees one slice per process); "
                                          "use strategy='single' (one replica per slice)")
