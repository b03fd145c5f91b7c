"""Answer.AI's ``fsdp_qlora`` ``train.py`` (https://github.com/AnswerDotAI/fsdp_qlora), the recipe that first trained a
70B model with QLoRA on two 24 GB cards, launched as ``python train.py --train_type qlora ...``. Its flags are
fastcore ``call_parse`` arguments of its own, read as ``train.py`` builds the run (at 05ed9f2a):

- ``--train_type``: ``full``; ``lora`` / ``custom_lora`` (a 16-bit base); ``qlora`` / ``custom_qlora`` (its own
  bitsandbytes 4-bit Linears, no peft k-bit preparation); ``bnb_dora`` (DoRA on the 4-bit base). HQQ and LLaMA Pro
  types are refused (not priced);
- ``--precision``: ``bf16`` (the model in bf16, no autocast), ``fp32``, ``bf16_autocast`` / ``fp16_autocast``
  (fp32 weights under autocast), ``bf16_buffers_autocast`` (bf16 weights under bf16 autocast);
- ``--batch_size`` (1), ``--context_length`` (512), ``--gradient_accumulation_steps`` (1), ``--lora_rank`` (64),
  ``--lora_alpha`` (16), ``--lora_dropout`` (0.1), ``--lora_target_modules`` (``all``: q, k, v, up, down, gate);
- ``--sharding_strategy`` (``full_shard``; ``shard_grad_op``; ``ddp`` is FSDP NO_SHARD), ``--use_cpu_offload``
  (on by default: parameters and optimizer states on the CPU), ``--use_gradient_checkpointing`` (on),
  ``--use_activation_cpu_offload``, ``--optimizer`` (adamw / adam / sgd), ``--world_size`` (-1: every GPU).

Its FSDP1 wraps every leaf whose weight trains in a unit of its own (``lambda_policy_fn``) with
``use_orig_params=False``, so frozen weights sit in FlatParameters that need no gradient and a 4-bit unit is
gathered as stored: priced per parameter (FSDP2), as bench/accuracy_parallelism.py prices the recipe's published
rows. Its model runs SDPA and the model's own loss (full logits).
"""

from __future__ import annotations

from typing import Any

from .base import Collector, ConfigReadError, as_bool, as_float, as_int, choice

FORMAT = "fsdp_qlora"
SYNTAX = "flags"
#: train.py's ``main`` arguments (at 05ed9f2a)
KNOWN = frozenset({
    "world_size", "train_type", "llama_pro_path", "batch_size", "context_length", "gradient_accumulation_steps", "num_epochs",
    "dataset", "dataset_samples", "sharding_strategy", "use_gradient_checkpointing", "reentrant_checkpointing", "use_cpu_offload",
    "use_activation_cpu_offload", "low_memory", "no_sync", "precision", "model_name", "save_model", "output_dir", "lora_rank",
    "lora_alpha", "lora_dropout", "lora_target_modules", "verbose", "lr", "apply_gradient_clipping", "grad_norm", "wd",
    "profile_memory", "optimizer", "lr_scheduler", "loading_workers", "log_to", "master_addr", "master_port", "seed",
    "project_name", "name", "group", "entity", "n_bits", "profile", "profiling_output", "with_stack", "with_shapes",
    "export_trace", "export_memory_timeline", "wait_steps", "warmup_steps", "active_steps", "repeat", "profiling_frequency",
    "max_steps",
})
PRICED = frozenset({"world_size", "train_type", "batch_size", "context_length", "gradient_accumulation_steps", "sharding_strategy",
                    "use_gradient_checkpointing", "use_cpu_offload", "use_activation_cpu_offload", "precision", "model_name",
                    "lora_rank", "lora_alpha", "lora_dropout", "lora_target_modules", "optimizer"})
DEFAULT_MODEL = "meta-llama/Llama-2-7b-hf"
#: ``lora_target_modules='all'`` (train.py: "sensible defaults for llama + mistral type modules")
ALL_TARGETS = ("k_proj", "q_proj", "v_proj", "up_proj", "down_proj", "gate_proj")
#: peft's default for Llama (``'default'``: target_modules=None)
PEFT_DEFAULT_TARGETS = ("q_proj", "v_proj")
_TYPES = {"full": None, "lora": "bf16", "custom_lora": "bf16", "qlora": "nf4", "custom_qlora": "nf4", "bnb_dora": "nf4"}
_PRECISION = {"bf16": ("bf16", None), "fp32": ("fp32", None), "bf16_autocast": ("fp32", "bf16"), "fp16_autocast": ("fp32", "fp16"),
              "bf16_buffers_autocast": ("bf16", "bf16")}
_SHARDING = {"full_shard": "fsdp", "shard_grad_op": "fsdp_shard_grad_op", "ddp": "ddp"}
_OPTIMIZERS = {"adamw": "adamw_torch", "adam": "adamw_torch", "sgd": "sgd"}


def is_fsdp_qlora(source: str) -> bool:
    """The script (or a copy) is fsdp_qlora's train.py: its ``main`` lists these train types and runs ``fsdp_main``."""
    return "def fsdp_main(" in source and '"custom_qlora"' in source and "use_cpu_offload" in source


def its_flags(flags: dict[str, Any]) -> bool:
    """A command copied from fsdp_qlora's README without the script here: ``--train_type`` beside a flag only its
    ``main`` has (no TrainingArguments / TRL field has these names)."""
    return "train_type" in flags and any(k in flags for k in ("context_length", "use_cpu_offload", "lora_rank", "sharding_strategy",
                                                                 "use_gradient_checkpointing", "precision"))


def read(data: dict[str, Any], col: Collector, base_dir: str | None = None) -> None:
    col.reject(sorted(k for k in data if k not in KNOWN), KNOWN)
    col.ignore(*sorted(k for k in data if k in KNOWN and k not in PRICED))
    train_type = str(data.get("train_type", "qlora"))
    if train_type.startswith("hqq") or train_type.endswith("llama_pro"):
        raise ConfigReadError(f"{col.where('train_type')}={train_type!r}: HQQ and LLaMA Pro runs are not priced; accepted: "
                              f"{', '.join(_TYPES)}")
    base = choice(train_type, col.where("train_type"), {k: k for k in _TYPES})
    col.set_model(data.get("model_name", DEFAULT_MODEL), "model_name")
    if "model_name" not in data:
        col.note(f"{col.where('model_name')} not given: train.py's default {DEFAULT_MODEL}")
    weights, autocast = choice(str(data.get("precision", "bf16")), col.where("precision"), _PRECISION)
    _ints(data, col)
    sharding = choice(str(data.get("sharding_strategy", "full_shard")), col.where("sharding_strategy"), _SHARDING)
    col.set("strategy", sharding, "sharding_strategy")
    if sharding != "ddp":
        col.set("fsdp_version", 2, "sharding_strategy (train.py's FSDP1 wraps each trained leaf apart: priced per parameter)")
        if as_bool(data.get("use_cpu_offload", True), col.where("use_cpu_offload")):
            col.set("offload_params", True, "use_cpu_offload")
            col.set("offload_optimizer", True, "use_cpu_offload")
    col.set("gradient_checkpointing", as_bool(data.get("use_gradient_checkpointing", True), col.where("use_gradient_checkpointing")),
            "use_gradient_checkpointing")
    col.set("activation_offloading", as_bool(data.get("use_activation_cpu_offload", False), col.where("use_activation_cpu_offload")),
            "use_activation_cpu_offload")
    col.set("optimizer", choice(str(data.get("optimizer", "adamw")), col.where("optimizer"), _OPTIMIZERS), "optimizer")
    col.set("attn_implementation", "sdpa", "train_type (train.py loads every model with attn_implementation 'sdpa')")
    if _TYPES[base] == "nf4":
        col.set("weights_dtype", "nf4", "train_type")
        col.set("kbit_upcast", False, "train_type (train.py's own 4-bit Linears: no peft k-bit preparation)")
    else:
        col.set("weights_dtype", weights, "precision")
    col.set("autocast", autocast, "precision")
    if _TYPES[base] is not None:
        _lora(data, col, dora=base == "bnb_dora")


def _ints(data: dict[str, Any], col: Collector) -> None:
    for key, field, default in (("batch_size", "micro_batch_size", 1), ("context_length", "seq_len", 512),
                                ("gradient_accumulation_steps", "gradient_accumulation_steps", 1)):
        col.set(field, as_int(data.get(key, default), col.where(key)), key)
    world = as_int(data.get("world_size", -1), col.where("world_size"), -1)
    if world == 0:
        raise ConfigReadError(f"{col.where('world_size')} must be -1 (every GPU) or a GPU count >= 1, got 0")
    if world == -1:
        col.spans_gpus = "train.py --world_size -1: every GPU of the machine"
    else:
        col.set("num_gpus", world, "world_size")


def _lora(data: dict[str, Any], col: Collector, dora: bool) -> None:
    targets = choice(str(data.get("lora_target_modules", "all")), col.where("lora_target_modules"),
                     {"all": ALL_TARGETS, "default": PEFT_DEFAULT_TARGETS})
    col.set("lora", {"r": as_int(data.get("lora_rank", 64), col.where("lora_rank")), "alpha": as_int(data.get("lora_alpha", 16), col.where("lora_alpha")),
                     "dropout": as_float(data.get("lora_dropout", 0.1), col.where("lora_dropout")), "target_modules": targets,
                     "use_dora": dora}, "train_type")


def write(changes: dict[str, Any], setup: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Setup changes as train.py's flags; what it has no flag for is handed back."""
    simple = {"micro_batch_size": "--batch_size", "seq_len": "--context_length", "gradient_accumulation_steps": "--gradient_accumulation_steps",
              "gradient_checkpointing": "--use_gradient_checkpointing", "activation_offloading": "--use_activation_cpu_offload",
              "offload_params": "--use_cpu_offload", "offload_optimizer": "--use_cpu_offload", "num_gpus": "--world_size"}
    strategies = {v: k for k, v in _SHARDING.items()}
    keys: dict[str, Any] = {}
    rest: dict[str, Any] = {}
    for field, value in changes.items():
        if field in simple:
            keys[simple[field]] = value
        elif field == "strategy" and value in strategies:
            keys["--sharding_strategy"] = strategies[value]
        elif field == "optimizer" and value in ("adamw_torch", "sgd"):
            keys["--optimizer"] = "adamw" if value == "adamw_torch" else "sgd"
        elif field == "lora" and value is not None:
            keys.update({"--lora_rank": value["r"], "--lora_alpha": value["alpha"]})
        elif field == "weights_dtype" and value == "nf4":
            keys["--train_type"] = "qlora"
        elif field in ("weights_dtype", "autocast") and _precision_word(setup) is not None:
            keys["--precision"] = _precision_word(setup)
        else:
            rest[field] = value
    return keys, rest


def _precision_word(setup: Any) -> str | None:
    """``--precision`` for the Setup's weights and autocast (a 4-bit base: its compute), None where no word says it."""
    weights = "bf16" if setup.weights_dtype == "nf4" else setup.weights_dtype
    return next((word for word, pair in _PRECISION.items() if pair == (weights, setup.autocast)), None)
