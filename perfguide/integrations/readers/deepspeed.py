"""A DeepSpeed JSON (the file accelerate's ``deepspeed_config_file`` or TrainingArguments' ``deepspeed`` names) <-> Setup.

Stages and offload are read as DeepSpeed 0.19's ``DeepSpeedZeroConfig`` spells them (``offload_optimizer.device``,
``offload_param.device``; stage 0 is plain data parallelism). A value left ``"auto"`` is filled as its launcher fills
it: the Trainer from TrainingArguments (transformers ``HfTrainerDeepSpeedConfig.trainer_config_process``), accelerate
from its own config (``DeepSpeedPlugin.set_mixed_precision``: bf16 / fp16 from ``mixed_precision``, also when the
block is missing); the combining step does that, with the other files of the same check.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .base import Collector, ConfigReadError, as_bool, as_int, choice, mapping

FORMAT = "deepspeed"
SYNTAX = "json"
ZERO_KEYS = (
    "allgather_bucket_size", "allgather_partitions", "allgather_sequential", "compute_grad_norm", "contiguous_gradients",
    "cpu_offload", "cpu_offload_param", "cpu_offload_use_pin_memory", "elastic_checkpoint", "enable_sanity_checks",
    "gather_16bit_weights_on_model_save", "ignore_unused_parameters", "leaf_module", "legacy_stage1", "load_from_fp32_weights",
    "log_trace_cache_warnings", "max_live_parameters", "max_reuse_distance", "memory_efficient_linear", "model_persistence_threshold",
    "module_granularity_threshold", "offload_optimizer", "offload_param", "overlap_comm", "override_module_apply",
    "param_persistence_threshold", "parameter_alignment", "pipeline_loading_checkpoint", "prefetch_bucket_size", "reduce_bucket_size",
    "reduce_scatter", "round_robin_gradients", "save_muon_momentum_buffer_in_memory", "stage", "stage3_allgather_sequential",
    "stage3_gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save", "stage3_max_live_parameters",
    "stage3_max_reuse_distance", "stage3_model_persistence_threshold", "stage3_module_granularity_threshold",
    "stage3_param_persistence_threshold", "stage3_prefetch_bucket_size", "stage3_use_all_reduce_for_fetch_params", "sub_group_size",
    "use_all_reduce_for_fetch_params", "use_multi_rank_bucket_allreduce", "zenflow", "zero_hpz_partition_size",
    "zero_quantized_gradients", "zero_quantized_nontrainable_weights", "zero_quantized_weights",
)
#: the dtype DeepSpeed reduces gradients in when sequences are split (runtime/engine.py; fp32 when unset, runtime/constants.py):
#: read as ``_split_reduce_dtype``, which the combined reading judges once the split is known (combine.split_reduce_note)
SPLIT_REDUCE = "seq_parallel_communication_data_type"
PRICED_TOP = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "zero_optimization", "bf16",
              "bfloat16", "fp16", "optimizer", SPLIT_REDUCE)
#: top-level keys DeepSpeed 0.19 reads (runtime/config.py and its subsystems) that do not change memory or speed here
UNPRICED_TOP = (
    "gradient_clipping", "scheduler", "steps_per_print", "wall_clock_breakdown", "zero_allow_untested_optimizer",
    "zero_force_ds_cpu_optimizer", "activation_checkpointing", "flops_profiler", "tensorboard", "wandb", "csv_monitor", "comet",
    "comms_logger", "aio", "amp", "communication_data_type", "prescale_gradients", "gradient_predivide_factor", "sparse_gradients",
    "dump_state", "memory_breakdown", "checkpoint", "data_types", "autotuning", "elasticity", "pipeline", "compression_training",
    "data_efficiency", "curriculum_learning", "torch_autocast", "dataloader_drop_last",
    "disable_allgather", "sparse_attention", "tensor_parallel", "nebula", "eigenvalue", "progressive_layer_drop", "quantize_training",
    "timers", "graph_harvesting", "use_data_before_expert_parallelism", "compile", "gradient_allreduce_op", "vocabulary_size",
    "disable_python_gc", "zero_optimization_stage", "fp16_master_weights_and_grads", "use_node_local_storage", "load_universal",
)
#: DeepSpeed's optimizer types keep two fp32 moments per parameter, as torch AdamW does (ops/adam, ops/lamb)
ADAM_LIKE = {k: "adamw_torch_fused" for k in ("adam", "adamw", "cpuadam", "deepspeedcpuadam", "fusedadam", "onebitadam", "zerooneadam",
                                          "lamb", "onebitlamb", "fusedlamb")}
_OFFLOAD = {"cpu": True, "nvme": True, "none": False}


def load(path: str, base_dir: str | None = None) -> tuple[dict[str, Any], str]:
    """The JSON a ``deepspeed`` / ``deepspeed_config_file`` value names, relative to the working folder, else to the
    file that named it (where such configs usually sit together)."""
    try:
        p = Path(path).expanduser()
        if not p.is_file() and base_dir is not None and (Path(base_dir) / p).is_file():
            p = Path(base_dir) / p
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError, RuntimeError) as exc:  # ValueError: a NUL in the path; RuntimeError: ~user unknown
        if isinstance(exc, json.JSONDecodeError):
            raise ConfigReadError(f"{Path(path).name[:80]} is not valid JSON (line {exc.lineno}: {exc.msg})") from None
        why = getattr(exc, "strerror", None) or exc
        raise ConfigReadError(f"cannot read the DeepSpeed config {path[:200]!r} ({why}); pass an existing JSON file") from None
    if not isinstance(data, dict):
        raise ConfigReadError(f"{p.name} must hold a JSON object of DeepSpeed keys, got {type(data).__name__}")
    return data, p.name


def read_nested(value: Any, col: Collector, base_dir: str | None) -> None:
    """A ``deepspeed`` value inside another config: a dict, or the path of a JSON file."""
    if isinstance(value, dict):
        data, inner = value, Collector(FORMAT, col.source, prefix="deepspeed.")
    elif not isinstance(value, str):
        raise ConfigReadError(f"{col.where('deepspeed')} must be a DeepSpeed config (a mapping) or a JSON file's path, "
                              f"got {type(value).__name__}")
    else:
        data, name = load(str(value), base_dir)
        inner = Collector(FORMAT, name)
    read(data, inner)
    merge_into(col, inner)


def merge_into(outer: Collector, inner: Collector) -> None:
    """Fold a DeepSpeed file's reading into the config that named it (its keys keep the DeepSpeed file as source)."""
    outer.settings += inner.settings
    outer.auto.update(inner.auto)
    outer.ignored += inner.ignored
    outer.unknown += inner.unknown
    outer.notes += inner.notes


def read(data: dict[str, Any], col: Collector) -> None:
    """Fill ``col`` from a DeepSpeed config dict."""
    col.reject([k for k in data if k not in PRICED_TOP and k not in UNPRICED_TOP], (*PRICED_TOP, *UNPRICED_TOP))
    col.ignore(*(k for k in data if k in UNPRICED_TOP))
    for key, field in (("train_micro_batch_size_per_gpu", "micro_batch_size"), ("gradient_accumulation_steps", "gradient_accumulation_steps")):
        if key in data:
            if data[key] == "auto":
                col.mark_auto(field, key)
            else:
                col.set(field, as_int(data[key], col.where(key)), key)
    if "train_batch_size" in data and data["train_batch_size"] != "auto":
        col.set("_train_batch_size", as_int(data["train_batch_size"], col.where("train_batch_size")), "train_batch_size")
    if SPLIT_REDUCE in data:
        col.set("_split_reduce_dtype", str(data[SPLIT_REDUCE]).lower(), SPLIT_REDUCE)
    _precision(data, col)
    _zero(mapping(data.get("zero_optimization"), col.where("zero_optimization")), col)
    opt = data.get("optimizer")
    if isinstance(opt, dict) and opt.get("type"):
        name = choice(str(opt["type"]).replace("_", ""), col.where("optimizer.type"), ADAM_LIKE)
        col.set("optimizer", name, "optimizer.type")
        col.note(f"{col.where('optimizer.type')}={opt['type']!r}: the Trainer runs DeepSpeed's optimizer, not TrainingArguments' optim; "
                 "priced as adamw_torch_fused (two fp32 moments per parameter)")


def _enabled(block: Any, where: str) -> bool | str | None:
    if not isinstance(block, dict) or "enabled" not in block:
        return None
    value = block["enabled"]
    return "auto" if value == "auto" else as_bool(value, where)


def _precision(data: dict[str, Any], col: Collector) -> None:
    bf16 = _enabled(data.get("bf16", data.get("bfloat16")), col.where("bf16.enabled"))
    fp16 = _enabled(data.get("fp16"), col.where("fp16.enabled"))
    if bf16 is True and fp16 is True:
        raise ConfigReadError(f"{col.source} enables both bf16 and fp16; DeepSpeed accepts one")
    if bf16 is True or fp16 is True:
        col.set("autocast", "bf16" if bf16 is True else "fp16", ("bf16.enabled" if bf16 is True else "fp16.enabled"))
    elif bf16 is False and fp16 is False:
        col.set("autocast", None, "bf16.enabled")
    else:  # "auto" or missing: accelerate / the Trainer fill it from their own precision
        col.mark_auto("autocast", ("bf16.enabled" if bf16 == "auto" or bf16 is None else "fp16.enabled"))
    block = data.get("bf16")
    block = block if isinstance(block, dict) else {}
    if bf16 is not False and block.get("bf16_master_weights_and_grads") and block.get("bf16_optimizer_states"):
        col.set("weights_dtype", "bf16", "bf16.bf16_master_weights_and_grads")


def deepspeed_overlap_default(stage: int, col: Collector, key: str) -> None:
    """A ZeRO config without ``overlap_comm`` runs DeepSpeed's default, ``stage == 3`` (zero/config.py
    ``overlap_comm_valid``): one ipg buffer at stages 1-2, where Setup's default is perfguide's own true."""
    if stage in (1, 2):
        col.set("overlap_comm", False, key + " (absent: DeepSpeed's default, stage == 3)")


def _zero(zero: Any, col: Collector) -> None:
    if not isinstance(zero, dict):
        raise ConfigReadError(f"{col.where('zero_optimization')} must be an object, got {zero!r}")
    where = "zero_optimization."
    col.reject([where + k for k in zero if k not in ZERO_KEYS], ZERO_KEYS)
    col.ignore(*(where + k for k in zero if k in ZERO_KEYS and k not in ("stage", "offload_optimizer", "offload_param", "overlap_comm")))
    stage = as_int(zero.get("stage", 0), col.where(where + "stage"), 0)
    if stage > 3:
        raise ConfigReadError(f"{col.where(where + 'stage')}={stage}: DeepSpeed ZeRO has stages 0, 1, 2 and 3")
    if stage:
        col.set("strategy", f"zero{stage}", where + "stage")
    else:
        col.set("_zero0", True, where + "stage")
    if "overlap_comm" in zero:
        col.set("overlap_comm", as_bool(zero["overlap_comm"], col.where(where + "overlap_comm")), where + "overlap_comm")
    else:
        deepspeed_overlap_default(stage, col, where + "overlap_comm")
    for key, field in (("offload_optimizer", "offload_optimizer"), ("offload_param", "offload_params")):
        block = zero.get(key)
        if isinstance(block, dict) and block.get("device") is not None:
            device = str(block["device"]).lower()
            on = choice(device, col.where(f"{where}{key}.device"), _OFFLOAD)
            if device == "nvme":
                col.note(f"{col.where(where + key)}.device=nvme is priced like CPU offload (host RAM, PCIe); NVMe bandwidth is lower")
            col.set(field, on, f"{where}{key}.device")


def write(changes: dict[str, Any], setup: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Setup changes as DeepSpeed JSON keys (dotted for nested ones); the rest for the other configs."""
    keys: dict[str, Any] = {}
    rest: dict[str, Any] = {}
    for field, value in changes.items():
        if field == "micro_batch_size":
            keys["train_micro_batch_size_per_gpu"] = value
        elif field == "gradient_accumulation_steps":
            keys["gradient_accumulation_steps"] = value
        elif field == "strategy" and setup.is_deepspeed:
            keys["zero_optimization.stage"] = setup.zero_stage
        elif field == "offload_optimizer":
            keys["zero_optimization.offload_optimizer.device"] = "cpu" if value else "none"
        elif field == "overlap_comm":
            keys["zero_optimization.overlap_comm"] = value
        elif field == "offload_params":
            keys["zero_optimization.offload_param.device"] = "cpu" if value else "none"
        elif field == "autocast" and value in ("bf16", "fp16", None):
            keys.update({"bf16.enabled": value == "bf16", "fp16.enabled": value == "fp16"})
        else:
            rest[field] = value
    return keys, rest
