"""An ArcticTraining recipe (``arctic_training run.yml``: snowflakedb/ArcticTraining, the Arctic Long Sequence
Training recipes of ``projects/sequence-parallelism``) <-> Setup fields, as its SFT and causal trainers run it
(``arctic_training/config/trainer.py``, ``model.py``, ``data.py``, ``optimizer.py``):

- ``type``: ``sft`` (the default) or ``causal``; its DPO trainer is refused (not priced).
- ``micro_batch_size`` (1), ``gradient_accumulation_steps`` (1), ``sequence_parallel_size`` (1: DeepSpeed's Ulysses,
  which ALST registers with transformers itself, so DeepSpeed reduces the gradients in
  ``seq_parallel_communication_data_type``), ``activation_checkpoint_cpu_offload`` (its own patch of the reentrant
  checkpoint function: each checkpointed layer input moved to the CPU, priced as activation offloading),
  ``tiled_mlp_compute`` (DeepSpeed's TiledMLP in ``ceil(s / hidden)`` shards: at most ``hidden_size`` tokens each).
- ``model``: ``name_or_path``; ``type`` ``liger`` (Liger's kernels and fused loss; its SwiGLU off under TiledMLP) or
  ``huggingface``; ``dtype`` (bf16); ``attn_implementation`` (sdpa); ``disable_activation_checkpoint`` (False:
  every run checkpoints); ``peft_config`` (a peft LoRA).
- ``data.max_length`` (a HumanInt: ``500k``, ``1.2M``; unset, the model's ``max_position_embeddings``): samples are
  packed up to it, read as that length.
- ``deepspeed``: the DeepSpeed config, read as DeepSpeed's; without ``zero_optimization`` ArcticTraining writes stage 2
  (``build_deepspeed_config``), and a bf16 model gets ``bfloat16.enabled`` unless the config says otherwise.
- ``optimizer.type``: ``fused_adam`` (the default) or ``cpu_adam``, both Adam with fp32 moments.

Launched by DeepSpeed's launcher on every GPU of the node unless told otherwise.
"""

from __future__ import annotations

import re
from typing import Any

from .base import DTYPE_WORDS, LENGTH_FROM_MODEL, TILED_BY_HIDDEN, Collector, ConfigReadError, as_bool, as_float, as_int, attention, choice, mapping

FORMAT = "arctic_training"
SYNTAX = "yaml"
#: TrainerConfig's fields (config/trainer.py at ArcticTraining's HEAD; BaseConfig forbids any other)
KNOWN = frozenset({
    "type", "code", "skip_validation", "model", "tokenizer", "data", "logger", "wandb", "scheduler", "optimizer", "deepspeed", "epochs",
    "loss_log_interval", "train_log_iter_interval", "train_log_metrics_path", "gradient_accumulation_steps", "micro_batch_size",
    "sequence_parallel_size", "expert_parallel_size", "arctic_moe", "enable_arctic_moe_custom_optimization", "enable_routing_replay",
    "activation_checkpoint_cpu_offload", "tiled_mlp_compute", "seed", "checkpoint", "train_iters", "eval_interval",
    "eval_log_iter_interval", "exit_iteration", "exit_iteration_this_run", "min_iterations", "overfit_first_batch", "mem_profiler",
    "mem_profiler_dir", "mem_profiler_max_entries", "kill_switch_path",
})
PRICED = frozenset({"type", "model", "data", "optimizer", "deepspeed", "gradient_accumulation_steps", "micro_batch_size",
                    "sequence_parallel_size", "expert_parallel_size", "activation_checkpoint_cpu_offload", "tiled_mlp_compute"})
MODEL_KEYS = frozenset({"type", "name_or_path", "dtype", "save_name", "attn_implementation", "disable_activation_checkpoint",
                        "peft_config", "hf_config_kwargs"})
TRAINERS = ("sft", "causal")
MODEL_TYPES = {"": False, "huggingface": False, "liger": True}
DTYPES = {**DTYPE_WORDS, "bfloat": "bf16"}
#: ModelConfig.validate_attn_implementation: flash_attention_3 needs a source build of flash-attn 3
ATTENTION = {"sdpa": "sdpa", "eager": "eager", "flash_attention_2": "flash_attention_2", "flash_attention_3": "flash_attention_3"}
OPTIMIZERS = {"": "adamw_torch", "fused_adam": "adamw_torch", "cpu_adam": "adamw_torch"}
_HUMAN = re.compile(r"^(-?\d+\.?\d?)(k|m|b|t|ki|mi|gi|ti)$")
_SUFFIX = {"k": 10**3, "m": 10**6, "b": 10**9, "t": 10**12, "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}


def human_int(value: Any, where: str) -> int:
    """ArcticTraining's HumanInt (``parse_human_val``): ``500k``, ``1.2M``, ``1_000``, ``2^20``, ``1e6``, or a number."""
    if not isinstance(value, str):
        return as_int(value, where)
    text = value.replace("_", "").lower().strip()
    if (m := _HUMAN.match(text)) is not None:
        return as_int(int(float(m.group(1)) * _SUFFIX[m.group(2)]), where)
    base, power, exp = text.partition("^")
    return as_int(int(as_float(base, where) ** (as_float(exp, where) if power else 1.0)), where)


def read(data: dict[str, Any], col: Collector, base_dir: str | None = None) -> None:
    col.reject(sorted(k for k in data if k not in KNOWN), KNOWN)
    col.ignore(*sorted(k for k in data if k in KNOWN and k not in PRICED))
    trainer = str(data.get("type", "sft"))
    if trainer not in TRAINERS:
        raise ConfigReadError(f"{col.where('type')}={trainer!r}: ArcticTraining's {trainer} trainer is not priced; accepted: "
                              f"{', '.join(TRAINERS)}")
    if as_int(data.get("expert_parallel_size", 1), col.where("expert_parallel_size")) > 1:
        raise ConfigReadError(f"{col.where('expert_parallel_size')} > 1: expert parallelism is not priced; use 1")
    for key, field in (("micro_batch_size", "micro_batch_size"), ("gradient_accumulation_steps", "gradient_accumulation_steps")):
        col.set(field, as_int(data.get(key, 1), col.where(key)), key)
    sp = as_int(data.get("sequence_parallel_size", 1), col.where("sequence_parallel_size"))
    col.set("sequence_parallel", sp, "sequence_parallel_size")
    if sp > 1:
        col.set("_deepspeed_split", True, "sequence_parallel_size (DeepSpeed's Ulysses, registered by ArcticTraining)")
    col.set("activation_offloading", as_bool(data.get("activation_checkpoint_cpu_offload", False), col.where("activation_checkpoint_cpu_offload")),
            "activation_checkpoint_cpu_offload")
    if as_bool(data.get("tiled_mlp_compute", False), col.where("tiled_mlp_compute")):
        col.set(TILED_BY_HIDDEN, True, "tiled_mlp_compute")
    dtype = _model(mapping(data["model"], col.where("model")), col)
    _data(mapping(data["data"], col.where("data")), col)
    _deepspeed(data.get("deepspeed") or {}, col, dtype, base_dir)
    opt = mapping(data.get("optimizer") or {}, col.where("optimizer"))
    col.set("optimizer", choice(str(opt.get("type", "")), col.where("optimizer.type"), OPTIMIZERS), "optimizer.type")
    col.spans_gpus = "ArcticTraining runs under DeepSpeed's launcher: every GPU of the node"


def _model(model: dict[str, Any], col: Collector) -> str:
    col.reject(sorted(f"model.{k}" for k in model if k not in MODEL_KEYS), MODEL_KEYS)
    col.set_model(model["name_or_path"], "model.name_or_path")
    liger = choice(str(model.get("type", "")), col.where("model.type"), MODEL_TYPES)
    col.set("liger_kernel", liger, "model.type")
    col.set("attn_implementation", attention(str(model.get("attn_implementation", "sdpa")), col.where("model.attn_implementation"), ATTENTION, col), "model.attn_implementation")
    off = as_bool(model.get("disable_activation_checkpoint", False), col.where("model.disable_activation_checkpoint"))
    col.set("gradient_checkpointing", not off, "model.disable_activation_checkpoint")
    if model.get("hf_config_kwargs"):
        col.note(f"{col.where('model.hf_config_kwargs')} is not applied to the model's shape here (priced as its config.json)")
    peft = model.get("peft_config")
    if peft:
        _lora(mapping(peft, col.where("model.peft_config")), col)
    return str(choice(str(model.get("dtype", "bf16")), col.where("model.dtype"), DTYPES))


def _lora(peft: dict[str, Any], col: Collector) -> None:
    kind = str(peft.get("peft_type", ""))
    if kind.upper() != "LORA":
        raise ConfigReadError(f"{col.where('model.peft_config.peft_type')}={kind!r}: only LORA is priced")
    targets = peft.get("target_modules") or ("q_proj", "v_proj")
    col.set("lora", {"r": as_int(peft.get("r", 8), col.where("model.peft_config.r")),
                     "alpha": as_int(peft.get("lora_alpha", 8), col.where("model.peft_config.lora_alpha")),
                     "dropout": as_float(peft.get("lora_dropout", 0.0), col.where("model.peft_config.lora_dropout")),
                     "target_modules": (targets,) if isinstance(targets, str) else tuple(targets)}, "model.peft_config")


def _data(block: dict[str, Any], col: Collector) -> None:
    if "max_length" in block:
        col.set("seq_len", human_int(block["max_length"], col.where("data.max_length")),
                "data.max_length (samples packed up to it: read as that length)")
    else:
        col.set(LENGTH_FROM_MODEL, True, "data.max_length")


def _deepspeed(block: Any, col: Collector, dtype: str, base_dir: str | None) -> None:
    """The recipe's DeepSpeed dict, with what ArcticTraining's build_deepspeed_config fills in when it is absent."""
    from . import deepspeed

    ds = dict(mapping(block, col.where("deepspeed")))
    for key in [k for k in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size") if k in ds]:
        ds.pop(key)   # build_deepspeed_config overwrites them from the recipe's own fields
        col.note(f"{col.where('deepspeed.' + key)} is overwritten by ArcticTraining from micro_batch_size / gradient_accumulation_steps")
    if "zero_optimization" not in ds:
        col.set("strategy", "zero2", "deepspeed (no zero_optimization: ArcticTraining's default, stage 2)")
        deepspeed.deepspeed_overlap_default(2, col, "deepspeed.zero_optimization.overlap_comm")
        ds["zero_optimization"] = {"stage": 2}
    if not ({"bf16", "bfloat16", "fp16"} & set(ds)) and dtype in ("bf16", "fp16"):
        ds["bf16" if dtype == "bf16" else "fp16"] = {"enabled": True}
        col.note(f"{col.where('model.dtype')}={dtype}: ArcticTraining enables DeepSpeed's {dtype} (fp32 master weights and Adam states)")
    deepspeed.read_nested(ds, col, base_dir)
    if any(s.field == "weights_dtype" for s in col.settings):
        return   # DeepSpeed's bf16 master weights (bf16_master_weights_and_grads with bf16_optimizer_states)
    mixed = any(s.field == "autocast" and s.value in ("bf16", "fp16") for s in col.settings)
    col.set("weights_dtype", "fp32" if mixed else dtype,
            "model.dtype" + (" (DeepSpeed's mixed precision keeps fp32 master weights)" if mixed else ""))


def write(changes: dict[str, Any], setup: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Setup changes as ArcticTraining keys (dotted for ``model``, ``data`` and ``deepspeed``)."""
    from . import deepspeed

    simple = {"micro_batch_size": "micro_batch_size", "gradient_accumulation_steps": "gradient_accumulation_steps",
              "sequence_parallel": "sequence_parallel_size", "activation_offloading": "activation_checkpoint_cpu_offload",
              "seq_len": "data.max_length", "attn_implementation": "model.attn_implementation"}
    keys: dict[str, Any] = {}
    rest: dict[str, Any] = {}
    for field, value in changes.items():
        if field in simple:
            keys[simple[field]] = value
        elif field == "gradient_checkpointing":
            keys["model.disable_activation_checkpoint"] = not value
        elif field == "liger_kernel":
            keys["model.type"] = "liger" if value else "huggingface"
        elif field == "tiled_mlp_shard_tokens":
            keys["tiled_mlp_compute"] = bool(value)
        else:
            rest[field] = value
    ds, rest = deepspeed.write(rest, setup)
    keys.update({f"deepspeed.{k}": v for k, v in ds.items() if k not in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps")})
    return keys, rest
