"""TrainingArguments / SFTConfig (objects, and the JSON / YAML that ``HfArgumentParser`` reads) <-> Setup fields.

Names are transformers 5.24's ``TrainingArguments`` and TRL 1.16's ``SFTConfig`` / ``ModelConfig`` (the dataclasses
TRL's ``sft.py`` parses, so one script YAML may hold all three); transformers 4 names and the deprecated aliases
(``gradient_checkpointing``) are read as the names they became, with a note. A key none of them has is listed as
unknown; a key they have that does not change memory or speed (``learning_rate``) is listed as not priced.
"""

from __future__ import annotations

from typing import Any

from ...optimizer_facts import names as optimizer_names
from ...optimizer_facts import steps_in_backward
from .base import DTYPE_WORDS, Collector, ConfigReadError, as_bool, as_float, as_int, attention, choice, set_kbit_dtypes, switched_on
from .hf_keys import DPO_CONFIG, GONE_IN, MODEL_CONFIG, REMOVED, RENAMED, SCRIPT_ARGUMENTS, SFT_CONFIG, TRAINING_ARGUMENTS

FORMAT = "training_args"
SYNTAX = "kwargs"
KNOWN = frozenset(TRAINING_ARGUMENTS + SFT_CONFIG + DPO_CONFIG + MODEL_CONFIG + SCRIPT_ARGUMENTS)
#: keys whose default differs between TrainingArguments and SFTConfig (TRL: bf16 unless fp16, checkpointing on)
TA_DEFAULTS = {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 1, "optim": "adamw_torch_fused",
               "activation_checkpointing": False, "bf16": False}
SFT_DEFAULTS = {**TA_DEFAULTS, "activation_checkpointing": True, "bf16": True, "max_length": 1024}
#: keys read into Setup fields here (everything else known is named as not priced)
PRICED = frozenset({
    "per_device_train_batch_size", "gradient_accumulation_steps", "bf16", "fp16", "tf32", "optim", "activation_checkpointing",
    "use_liger_kernel", "torch_compile", "use_cpu", "dataloader_num_workers", "dataloader_pin_memory", "fsdp", "fsdp_config",
    "deepspeed", "max_length", "packing", "packing_strategy", "padding_free", "activation_offloading", "model_init_kwargs",
    "model_name_or_path", "dtype", "attn_implementation", "use_peft", "lora_r", "lora_alpha", "lora_dropout",
    "lora_target_modules", "lora_target_parameters", "use_dora", "use_rslora", "load_in_4bit", "load_in_8bit", "bnb_4bit_quant_type",
    "use_bnb_nested_quant", "precompute_ref_log_probs",
})
_ATTN = {"eager": "eager", "sdpa": "sdpa", "flash_attention_2": "flash_attention_2"}
#: BitsAndBytesConfig / TRL ModelConfig bnb_4bit_quant_type words (TRL's default nf4; transformers' own default fp4)
_QUANT_TYPES = {"nf4": "nf4", "fp4": "fp4"}


def is_sft(data: dict[str, Any]) -> bool:
    """An SFTConfig's JSON has a key only TRL's SFTConfig has; without one the TrainingArguments defaults apply."""
    return any(k in data for k in SFT_CONFIG)


def is_dpo(data: dict[str, Any]) -> bool:
    """A DPOConfig's JSON has a key only TRL's DPOConfig has (beta, precompute_ref_log_probs...)."""
    return any(k in data for k in DPO_CONFIG)


def canonical(data: dict[str, Any], col: Collector, noted: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Old and deprecated names read as what they mean now (the new name wins when both are given, as transformers does);
    ``noted``: keys already named (gone_here), read without a second note."""
    out = dict(data)
    for old, new in RENAMED.items():
        if old in out:
            value = out.pop(old)
            if old not in noted:
                col.note(f"{col.where(old)} is the transformers 4 / deprecated name of {new!r}; read as {new}")
            out.setdefault(new, value)
    return out


def gone_here(keys: Any, col: Collector, trl: bool = True) -> frozenset[str]:
    """Legacy keys the installed transformers / TRL no longer has: read as what they meant, and named, because the
    script's parser stops on them here before training starts. A package that is not installed says nothing; TRL's
    keys count only where TRL's classes parse (``trl``): a plain TrainingArguments script's own dataclasses may have
    a ``max_seq_length`` or ``torch_dtype`` of their own (transformers' run_glue.py, run_clm.py)."""
    from ..._packages import installed_release
    from ...memory.loss_path import version_tuple

    named = set()
    for key in sorted(k for k in keys if k in GONE_IN and (trl or GONE_IN[k][0] != "trl")):
        package, gone = GONE_IN[key]
        release = installed_release(package)
        if release is not None and version_tuple(release) >= version_tuple(gone):
            now = f"; write {RENAMED[key]} (read as {RENAMED[key]} here)" if key in RENAMED else "; drop it"
            col.note(f"{col.where(key)}: the installed {package} {release} has no {key} (gone since {gone}), so the script's "
                     f"argument parser stops on it and this config does not start here{now}, or pin {package} below {gone}")
            named.add(key)
    return frozenset(named)


def _eval_batch_note(data: dict[str, Any], micro_batch: int, col: Collector) -> bool:
    """An evaluation that runs at more rows than the priced step (TrainingArguments' per_device_eval_batch_size defaults
    to 8) holds that many rows of full logits, which can exceed the step: said, since only the step is priced. True when
    said, so that the key is not also listed as having no effect."""
    if str(data.get("eval_strategy") or "no").lower() in ("no", "intervalstrategy.no"):
        return False
    given = data.get("per_device_eval_batch_size")
    rows = as_int(given, col.where("per_device_eval_batch_size")) if given is not None else 8
    if rows > micro_batch:
        where = col.where("per_device_eval_batch_size") if given is not None else "per_device_eval_batch_size (default 8)"
        col.note(f"{where}: evaluation runs {rows} rows per device where the step runs {micro_batch}; the evaluation "
                 f"forward is not priced, and its full logits can exceed the step: set per_device_eval_batch_size={micro_batch}")
        return True
    return False


def read(data: dict[str, Any], col: Collector, *, sft: bool | None = None, dpo: bool | None = None, base_dir: str | None = None,
         model_config: bool | None = None) -> None:
    """Fill ``col`` from TrainingArguments / SFTConfig / DPOConfig kwargs (plus TRL ModelConfig keys, as one script YAML
    holds them). A DPOConfig shares SFTConfig's TRL defaults (trl 1.16 base_config.py: checkpointing on, bf16,
    max_length 1024) and prices TRL's DPOTrainer (objective='dpo')."""
    dpo = is_dpo(data) if dpo is None else dpo
    sft = (dpo or is_sft(data)) if sft is None else sft or dpo
    # parsed by HfArgumentParser / TrlParser here (not under LLaMA-Factory's own pins)
    trl = sft or bool(model_config)
    gone = gone_here(data, col, trl) if col.format in ("training_args", "script_flags") else frozenset()
    data = canonical(data, col, gone)
    col.reject(sorted(k for k in data if k not in KNOWN and k not in REMOVED), KNOWN)
    defaults = SFT_DEFAULTS if sft else TA_DEFAULTS
    kind = "DPOConfig" if dpo else "SFTConfig" if sft else "TrainingArguments"

    def get(key: str) -> tuple[Any, str | None]:
        """(value, key it came from) or (default, None) for a key the config leaves out."""
        return (data[key], key) if key in data and data[key] is not None else (defaults.get(key), None)

    mb, mb_key = get("per_device_train_batch_size")
    micro = as_int(mb, col.where("per_device_train_batch_size"))
    said = {"per_device_eval_batch_size"} if _eval_batch_note(data, micro, col) else set()
    sync_each_batch = _sync_each_batch(data.get("accelerator_config"), col)
    priced = PRICED | said | ({"accelerator_config"} if sync_each_batch is not None else set())
    col.ignore(*sorted(k for k in data if (k in KNOWN or k in REMOVED) and k not in priced))
    if sync_each_batch is not None:
        col.set("sync_grads_each_micro_step", sync_each_batch, "accelerator_config.gradient_accumulation_kwargs.sync_each_batch")
    if dpo:
        marker = next((k for k in DPO_CONFIG if k in data), None)
        col.set("objective", "dpo", marker or kind)
        precompute = data.get("precompute_ref_log_probs")
        if precompute is not None:
            col.set("precompute_ref_log_probs", as_bool(precompute, col.where("precompute_ref_log_probs")), "precompute_ref_log_probs")

    def put(field: str, value: Any, key: str | None, why: str = "") -> None:
        if key is not None:
            col.set(field, value, key)
        elif value is not None:
            col.assume(field, value, why or f"{kind} default")

    put("micro_batch_size", micro, mb_key)
    ga, key = get("gradient_accumulation_steps")
    put("gradient_accumulation_steps", as_int(ga, col.where("gradient_accumulation_steps")), key)
    _precision(data, defaults, col, kind)
    _optimizer(data, col, kind)
    ckpt, key = get("activation_checkpointing")
    put("gradient_checkpointing", as_bool(ckpt, col.where("activation_checkpointing")), key)
    for src, field in (("use_liger_kernel", "liger_kernel"), ("torch_compile", "torch_compile"), ("padding_free", "padding_free"),
                       ("activation_offloading", "activation_offloading"), ("dataloader_pin_memory", "dataloader_pin_memory")):
        if data.get(src) is not None:
            col.set(field, as_bool(data[src], col.where(src)), src)
    if data.get("dataloader_num_workers") is not None:
        col.set("dataloader_num_workers", as_int(data["dataloader_num_workers"], col.where("dataloader_num_workers"), 0), "dataloader_num_workers")
    if switched_on(data, "use_cpu", col):
        col.set("device", "cpu", "use_cpu")
    if sft:
        _sft(data, defaults, col)
    _model_config(data, col, dpo, trl_script=sft if model_config is None else model_config)
    read_fsdp(data.get("fsdp"), data.get("fsdp_config"), col)
    if data.get("deepspeed"):
        from . import deepspeed

        deepspeed.read_nested(data["deepspeed"], col, base_dir)


def _precision(data: dict[str, Any], defaults: dict[str, Any], col: Collector, kind: str) -> None:
    fp16 = as_bool(data["fp16"], col.where("fp16")) if data.get("fp16") is not None else False
    if data.get("bf16") is not None:
        bf16, key = as_bool(data["bf16"], col.where("bf16")), "bf16"
    else:  # TRL: bf16 unless fp16 (trl/trainer/base_config.py)
        bf16, key = bool(defaults["bf16"]) and not fp16, None
    if bf16 and fp16:
        raise ConfigReadError(f"{col.source} sets both bf16 and fp16; TrainingArguments accepts one of them")
    autocast = "bf16" if bf16 else "fp16" if fp16 else None
    if data.get("fp16") is not None and fp16:
        col.set("autocast", autocast, "fp16")
    elif key is not None:
        col.set("autocast", autocast, key)
    else:
        col.assume("autocast", autocast, f"{kind} default (bf16={bool(defaults['bf16'])}, fp16=False)")
    if data.get("tf32") is not None:
        col.set("tf32", as_bool(data["tf32"], col.where("tf32")), "tf32")


def _optimizer(data: dict[str, Any], col: Collector, kind: str) -> None:
    raw = data.get("optim")
    if raw is None:
        col.assume("optimizer", "adamw_torch_fused", f"{kind} default optim")
        return
    name = str(getattr(raw, "value", raw)).strip().lower()
    accepted = optimizer_names()
    if name not in accepted:
        choice(name, col.where("optim"), dict.fromkeys(accepted))
    col.set("optimizer", name, "optim")
    if steps_in_backward(name):  # LOMO / *_layerwise step inside backward through the Trainer itself
        col.set("optimizer_in_backward", True, "optim")


def _sft(data: dict[str, Any], defaults: dict[str, Any], col: Collector) -> None:
    # an SFTConfig (or DPOConfig) is what TRL's trainers read: their loss path is TRL's, by release (memory/fused_head.py)
    col.assume("trainer", "trl", "SFTConfig / DPOConfig: run by TRL's SFTTrainer / DPOTrainer")
    if "max_length" in data:
        if data["max_length"] is not None:
            col.set("seq_len", as_int(data["max_length"], col.where("max_length")), "max_length")
        else:
            col.note(f"{col.where('max_length')} is null (no truncation): the sequence length comes from --seq-len")
    else:
        col.assume("seq_len", defaults["max_length"], "TRL default max_length (SFTConfig, DPOConfig)")
    packing = as_bool(data["packing"], col.where("packing")) if data.get("packing") is not None else False
    strategy = str(data.get("packing_strategy") or "bfd")
    if packing and strategy in ("bfd", "bfd_split"):
        # TRL sft_trainer.py: padding_free = args.padding_free or (packing and packing_strategy in {"bfd", "bfd_split"})
        col.set("padding_free", True, "packing")
    kwargs = data.get("model_init_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise ConfigReadError(f"{col.where('model_init_kwargs')} must be a mapping of from_pretrained kwargs, got {kwargs!r}")
    if kwargs.get("dtype", kwargs.get("torch_dtype")) not in (None, "auto"):
        col.set("weights_dtype", choice(kwargs.get("dtype", kwargs.get("torch_dtype")), col.where("model_init_kwargs.dtype"), DTYPE_WORDS),
                "model_init_kwargs.dtype")
    if kwargs.get("attn_implementation"):
        col.set("attn_implementation", attention(kwargs["attn_implementation"], col.where("model_init_kwargs.attn_implementation"), _ATTN, col),
                "model_init_kwargs.attn_implementation")


def _sync_each_batch(accelerator_config: Any, col: Collector) -> bool | None:
    """``accelerator_config={"gradient_accumulation_kwargs": {"sync_each_batch": ...}}`` (accelerate's
    GradientAccumulationPlugin, which the Trainer reads before it enters ``no_sync``); None where the config does not
    say (a JSON path, or no such key: the rest of accelerator_config is not priced)."""
    if not isinstance(accelerator_config, dict):
        return None
    kwargs = accelerator_config.get("gradient_accumulation_kwargs") or {}
    if not isinstance(kwargs, dict) or kwargs.get("sync_each_batch") is None:
        return None
    return as_bool(kwargs["sync_each_batch"], col.where("accelerator_config.gradient_accumulation_kwargs.sync_each_batch"))


#: the first TRL release whose ModelConfig loads in float32 unless told (trl/trainer/model_config.py, huggingface/trl
#: PR #4778: dtype default "float32"; before, None left it to from_pretrained)
TRL_FP32_LOAD = (0, 27)


def _model_config(data: dict[str, Any], col: Collector, dpo: bool, trl_script: bool = False) -> None:
    """TRL ModelConfig keys: the model, its load dtype, attention, LoRA and bitsandbytes loading."""
    if data.get("model_name_or_path"):
        col.set_model(data["model_name_or_path"], "model_name_or_path")
    fp32_load = trl_script and bool(data.get("model_name_or_path")) and data.get("dtype") is None and _trl_loads_fp32()
    if fp32_load:   # TRL's scripts pass ModelConfig.dtype to from_pretrained (and as a 4-bit base's compute dtype)
        col.assume("weights_dtype", "fp32", "TRL's ModelConfig dtype default 'float32' (trl >= 0.27, PR #4778), which "
                                            "its sft / dpo scripts load the model in; pass --dtype bfloat16 for 16-bit weights")
    if data.get("dtype") not in (None, "auto"):
        col.set("weights_dtype", choice(data["dtype"], col.where("dtype"), DTYPE_WORDS), "dtype")
    if data.get("attn_implementation"):
        col.set("attn_implementation", attention(data["attn_implementation"], col.where("attn_implementation"), _ATTN, col), "attn_implementation")
    if data.get("load_in_4bit") and as_bool(data["load_in_4bit"], col.where("load_in_4bit")):
        col.set("weights_dtype", "nf4", "load_in_4bit")   # Setup's word for any bitsandbytes 4-bit base
        if data.get("use_bnb_nested_quant") is not None:
            col.set("nf4_double_quant", as_bool(data["use_bnb_nested_quant"], col.where("use_bnb_nested_quant")), "use_bnb_nested_quant")
        else:
            col.assume("nf4_double_quant", False, "TRL ModelConfig default use_bnb_nested_quant=False (one fp32 absmax per 64 weights)")
        if data.get("bnb_4bit_quant_type") is not None:   # the same bytes; the two codes decode at different speeds
            col.set("bnb_4bit_quant_type", choice(data["bnb_4bit_quant_type"], col.where("bnb_4bit_quant_type"), _QUANT_TYPES),
                    "bnb_4bit_quant_type")
    elif data.get("load_in_8bit") and as_bool(data["load_in_8bit"], col.where("load_in_8bit")):
        col.set("weights_dtype", "int8", "load_in_8bit")
    if data.get("use_peft") and as_bool(data["use_peft"], col.where("use_peft")):
        lora: dict[str, Any] = {"r": as_int(data.get("lora_r", 16), col.where("lora_r")), "alpha": as_int(data.get("lora_alpha", 32), col.where("lora_alpha")),
                                "dropout": as_float(data.get("lora_dropout", 0.05), col.where("lora_dropout"))}
        if data.get("lora_target_modules"):
            targets = data["lora_target_modules"]
            lora["target_modules"] = targets if targets == "all-linear" else tuple(targets if isinstance(targets, list) else [targets])
        if data.get("lora_target_parameters"):   # TRL ModelConfig: passed to LoraConfig(target_parameters=...)
            params = data["lora_target_parameters"]
            lora["target_parameters"] = tuple(params if isinstance(params, list) else [params])
        for flag in ("use_dora", "use_rslora"):
            if data.get(flag) is not None:
                lora[flag] = as_bool(data[flag], col.where(flag))
        kbit = any(data.get(k) and as_bool(data[k], col.where(k)) for k in ("load_in_4bit", "load_in_8bit"))
        cast = _trl_adapter_cast(dpo, use_dora=bool(lora.get("use_dora"))) if kbit else None
        if cast:
            lora["adapter_dtype"] = "bf16"
        col.set("lora", lora, f"use_peft ({cast})" if cast else "use_peft")
        if kbit and fp32_load:   # the float32 load leaves the embedding, head and norms fp32, as peft's upcast would
            col.note(f"{col.where('load_in_4bit')}: the base's embedding, head and norms load in TRL's default float32 "
                     "(no --dtype): priced fp32")
        elif kbit:
            _trl_kbit_dtypes(data, col)


#: the first TRL release whose trainers run no peft k-bit preparation and no bf16 recast (Setup.kbit_recast_bf16:
#: 0.26.0's SFTTrainer calls neither; read again in the 1.16 wheel: only trl.experimental's ORPO / CPO still do)
TRL_NO_KBIT_PREP = (0, 26)


def _trl_adapter_cast(dpo: bool, use_dora: bool = False) -> str | None:
    """Why the installed TRL trains a quantized model's LoRA adapters in bf16, or None where it keeps PEFT's fp32."""
    from ...memory.fused_head import installed_trl
    from ...techniques.qlora import trl_casts_adapters

    release = installed_trl()
    if not trl_casts_adapters(release, dpo=dpo, use_dora=use_dora):
        return None
    return f"TRL {release or '(newest)'} casts a quantized model's trainable adapters to bf16"


def _trl_at_least(version: tuple[int, int]) -> tuple[str | None, bool]:
    """(the installed TRL release, whether it is ``version`` or later; None counts as the newest)."""
    from ...memory.fused_head import installed_trl
    from ...memory.loss_path import version_tuple

    release = installed_trl()
    return release, release is None or version_tuple(release)[:2] >= version


def _trl_loads_fp32() -> bool:
    return _trl_at_least(TRL_FP32_LOAD)[1]


def _trl_kbit_dtypes(data: dict[str, Any], col: Collector) -> None:
    """A TRL ModelConfig's k-bit base trained by the installed TRL (the one ``trl sft`` runs): from 0.26 its embedding,
    head and norms stay in the load dtype; before, TRL ran peft's upcast and, on an unsharded bf16 run, cast the
    embedding and head back to bf16 (``peft_module_casting_to_bf16``)."""
    release, no_prep = _trl_at_least(TRL_NO_KBIT_PREP)
    if no_prep:
        set_kbit_dtypes(col, "load_in_4bit / use_peft", f"TRL {release or '(newest)'}: its trainers run no peft k-bit "
                        "preparation, so the embedding, head and norms stay in the load dtype")
    elif data.get("bf16") and not (data.get("fsdp") or data.get("deepspeed")):
        set_kbit_dtypes(col, "bf16", f"TRL {release}: peft's k-bit upcast, then the embedding and head back to bf16", recast=True)


def read_fsdp(fsdp: Any, config: Any, col: Collector, default_version: int = 2) -> None:
    """``fsdp=True`` (or the "full_shard auto_wrap" words, as a string or a list) plus ``fsdp_config`` (keys with or
    without the ``fsdp_`` prefix) -> FSDP fields; TrainingArguments and axolotl share this spelling."""
    words = fsdp.split() if isinstance(fsdp, str) else [str(getattr(w, "value", w)) for w in fsdp] if isinstance(fsdp, list) else []
    if not (fsdp is True or words):
        return
    cfg = {k.removeprefix("fsdp_"): v for k, v in (config or {}).items()} if isinstance(config, dict) else {}
    version = as_int(cfg.get("version", default_version), col.where("fsdp_config.version"))
    reshard = cfg.get("reshard_after_forward", cfg.get("sharding_strategy", "shard_grad_op" not in words))
    if isinstance(reshard, str):  # FSDP1 sharding-strategy words
        reshard = reshard.upper() not in ("SHARD_GRAD_OP", "2", "NO_SHARD")
    col.set("strategy", "fsdp" if as_bool(reshard, col.where("fsdp_config.reshard_after_forward")) else "fsdp_shard_grad_op", "fsdp")
    col.set("fsdp_version", version, "fsdp_config.version" if "version" in cfg else "fsdp")
    offload = cfg.get("cpu_offload", cfg.get("offload_params", "offload" in words))
    if as_bool(offload, col.where("fsdp_config.cpu_offload")):
        col.set("offload_params", True, "fsdp_config.cpu_offload")
        col.set("offload_optimizer", True, "fsdp_config.cpu_offload")
    if cfg.get("activation_checkpointing") is not None:
        col.set("gradient_checkpointing", as_bool(cfg["activation_checkpointing"], col.where("fsdp_config.activation_checkpointing")),
                "fsdp_config.activation_checkpointing")


def write(changes: dict[str, Any], setup: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Setup field changes as TrainingArguments / SFTConfig keys; the second dict holds what these keys cannot say.

    Checkpointing under FSDP is written as the training argument, with FSDP's own switched off: ``fsdp_config`` is
    read only where the arguments' own ``fsdp`` is set (transformers 5.24 ``_process_fsdp_args``), not under an
    accelerate config's FSDP, and the Trainer refuses the two on together. The argument takes effect on either route
    (at one more all-gather per block in backward, which transformers warns of)."""
    keys: dict[str, Any] = {}
    rest: dict[str, Any] = {}
    simple = {"micro_batch_size": "per_device_train_batch_size", "gradient_accumulation_steps": "gradient_accumulation_steps",
              "optimizer": "optim", "liger_kernel": "use_liger_kernel", "torch_compile": "torch_compile", "tf32": "tf32",
              "padding_free": "padding_free", "activation_offloading": "activation_offloading", "seq_len": "max_length",
              "dataloader_num_workers": "dataloader_num_workers", "dataloader_pin_memory": "dataloader_pin_memory",
              "attn_implementation": "attn_implementation", "precompute_ref_log_probs": "precompute_ref_log_probs",
              "nf4_double_quant": "use_bnb_nested_quant"}
    for field, value in changes.items():
        if field in simple:
            keys[simple[field]] = value
        elif field == "gradient_checkpointing":   # under FSDP, see _fsdp_checkpointing
            keys.update({"activation_checkpointing": value, "fsdp_config.activation_checkpointing": False} if setup.is_fsdp
                        else {"activation_checkpointing": value})
        elif field == "autocast" and value != "fp8":
            keys.update(bf16=value == "bf16", fp16=value == "fp16")
        elif field == "weights_dtype":
            keys.update({"load_in_4bit": True} if value == "nf4" else {"load_in_8bit": True} if value == "int8" else
                        {"dtype": {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[value]})
        elif field == "strategy" and setup.is_deepspeed:
            keys.update({"fsdp": False, "deepspeed.zero_optimization.stage": setup.zero_stage})
        elif field == "strategy" and setup.is_fsdp:
            keys.update({"deepspeed": None, "fsdp": True, "fsdp_config.version": setup.fsdp_version,
                         "fsdp_config.reshard_after_forward": setup.gathers_params})
        elif field == "strategy":
            keys.update({"deepspeed": None, "fsdp": False})
        elif field in ("offload_optimizer", "offload_params") and setup.is_fsdp:
            keys["fsdp_config.cpu_offload"] = value
        elif field in ("offload_optimizer", "offload_params") and setup.is_deepspeed:
            keys[f"deepspeed.zero_optimization.{field.replace('params', 'param')}.device"] = "cpu" if value else "none"
        elif field == "lora" and value is not None:
            keys.update(use_peft=True, lora_r=value["r"], lora_alpha=value["alpha"])
        elif field == "sync_grads_each_micro_step":
            keys["accelerator_config.gradient_accumulation_kwargs.sync_each_batch"] = value
        else:
            rest[field] = value
    return keys, rest
