"""A LLaMA-Factory YAML (``llamafactory-cli train x.yaml``) <-> Setup fields, as LLaMA-Factory (commit ff6d4d12) parses it.

The file is TrainingArguments keys (read by perfguide.integrations.readers.training_args) plus LLaMA-Factory's own:
``finetuning_type`` (lora, full), ``lora_rank`` (default 8) / ``lora_alpha`` (default 2 x rank) / ``lora_target``
("all": every linear layer), ``quantization_bit`` (bitsandbytes 4 / 8), ``cutoff_len`` (default 2048),
``flash_attn``, ``enable_liger_kernel`` and ``disable_gradient_checkpointing`` (checkpointing is on unless disabled).
The model loads in the compute dtype (bf16 with ``bf16: true`` or ``pure_bf16: true``: hparams/parser.py); a full
fine-tune upcasts its trainable parameters to fp32 unless ``pure_bf16`` (model/adapter.py
``cast_trainable_params_to_fp32``), which is AMP on fp32 weights. ``use_galore`` / ``use_apollo`` build GaLore's or
APOLLO's optimizer from ``optim`` (train/trainer_utils.py ``_create_galore_optimizer``), per layer in backward with
``galore_layerwise`` / ``apollo_layerwise``: transformers' optim of the same name, which perfguide prices.
"""

from __future__ import annotations

from typing import Any

from .base import Collector, ConfigReadError, as_bool, as_float, as_int, choice, refuse_unpriced, set_kbit_dtypes, switched_on
from .foreign_keys import LLAMAFACTORY
from .hf_keys import REMOVED, SEQ2SEQ
from .training_args import KNOWN as TA_KNOWN
from .training_args import read as read_training_args
from .training_args import write as write_training_args

FORMAT = "llamafactory"
SYNTAX = "yaml"
KNOWN = LLAMAFACTORY | TA_KNOWN | frozenset(SEQ2SEQ) | frozenset(REMOVED)
PRICED = frozenset({"finetuning_type", "lora_rank", "lora_alpha", "lora_dropout", "lora_target", "use_dora", "use_rslora", "quantization_bit",
                    "quantization_method", "cutoff_len", "flash_attn", "enable_liger_kernel", "disable_gradient_checkpointing", "pure_bf16",
                    "model_name_or_path", "upcast_layernorm", "upcast_lmhead_output", "fp8", "use_galore", "galore_layerwise",
                    "galore_rank", "galore_target", "use_apollo", "apollo_layerwise", "apollo_rank", "apollo_target",
                    "use_v1_kernels"})
ATTENTION = {"auto": None, "fa2": "flash_attention_2", "sdpa": "sdpa", "disabled": "eager"}


#: the only command that runs this format starts a process per visible GPU when it names no count
LAUNCH = ("llamafactory-cli train starts torchrun over every visible GPU when there is more than one "
          "(NPROC_PER_NODE / CUDA_VISIBLE_DEVICES change it; --num-gpus N here)")


def read(data: dict[str, Any], col: Collector, base_dir: str | None = None) -> None:
    col.spans_gpus = LAUNCH
    col.reject(sorted(k for k in data if k not in KNOWN), KNOWN)
    if not switched_on(data, "do_train", col):
        stage = next((k for k in ("do_predict", "do_eval") if switched_on(data, k, col)), None)
        what = f"{col.where(stage)} without do_train" if stage else f"{col.where('do_train')} is not true"
        raise ConfigReadError(f"{what}: this LLaMA-Factory config does not train (an evaluation, or a chat / export / API config; "
                              "its workflows call trainer.train() only with do_train); perfguide check prices training configs "
                              "and serve commands: for generation, perfguide recommend MODEL --scenario infer_gpu_one")
    hf = TA_KNOWN | frozenset(REMOVED)
    ours = {k: v for k, v in data.items() if (k in KNOWN and k not in hf) or k == "model_name_or_path"}
    col.ignore(*sorted(k for k in ours if k not in PRICED))
    read_training_args({k: v for k, v in data.items() if k in hf}, col, sft=False, base_dir=base_dir)
    col.settings = [s for s in col.settings if not (s.assumed and s.field == "gradient_checkpointing")]
    ckpt_off = switched_on(data, "disable_gradient_checkpointing", col)
    if "disable_gradient_checkpointing" in data:
        col.set("gradient_checkpointing", not ckpt_off, "disable_gradient_checkpointing")
    else:
        col.assume("gradient_checkpointing", True, "LLaMA-Factory default: gradient checkpointing on (disable_gradient_checkpointing=false)")
    cutoff = data.get("cutoff_len")
    if cutoff is not None:
        col.set("seq_len", as_int(cutoff, col.where("cutoff_len")), "cutoff_len")
    else:
        col.assume("seq_len", 2048, "LLaMA-Factory default cutoff_len")
    _refuse_unpriced(data, col)
    if switched_on(data, "use_v1_kernels", col):   # model/loader.py: apply_v1_kernels(model, ...) -> its "auto" kernels
        col.note(f"{col.where('use_v1_kernels')}: LLaMA-Factory's v1 kernel plugins (its automatic fused kernels, chosen by "
                 "device) are not priced: the run is priced with transformers' own modules in their place")
    kind = str(data.get("finetuning_type", "lora")).lower()
    if kind not in ("lora", "full"):
        raise ConfigReadError(f"{col.where('finetuning_type')}={kind!r} is not priced; accepted: lora, full")
    _weights(data, col, kind)
    _low_rank_optimizer(data, col)
    if switched_on(data, "fp8", col):   # train/fp8_utils.py: accelerate's fp8
        col.set("autocast", "fp8", "fp8")   # (torchao Float8Linear by default, Transformer Engine with fp8_backend te)
    if kind == "lora":
        rank = as_int(data.get("lora_rank", 8), col.where("lora_rank"))
        target = str(data.get("lora_target", "all"))
        lora: dict[str, Any] = {"r": rank, "alpha": as_int(data.get("lora_alpha") or 2 * rank, col.where("lora_alpha")),
                                "dropout": as_float(data.get("lora_dropout", 0.0), col.where("lora_dropout")),
                                "target_modules": "all-linear" if target == "all" else tuple(t.strip() for t in target.split(",") if t.strip())}
        for flag in ("use_dora", "use_rslora"):
            if data.get(flag) is not None:
                lora[flag] = as_bool(data[flag], col.where(flag))
        key = "finetuning_type" if "finetuning_type" in data else "finetuning_type (LLaMA-Factory default: lora)"
        if data.get("quantization_bit") is not None and not data.get("pure_bf16"):
            # model/adapter.py cast_trainable_params_to_fp32: a QLoRA run's adapters are fp32 unless pure_bf16
            lora["adapter_dtype"] = "fp32"
            key += " (LLaMA-Factory casts a quantized model's trainable parameters to fp32: model/adapter.py)"
        col.set("lora", lora, key)
    attn = choice(data.get("flash_attn", "auto"), col.where("flash_attn"), ATTENTION)
    if attn is not None:
        col.set("attn_implementation", attn, "flash_attn")
    if data.get("enable_liger_kernel") is not None:
        col.set("liger_kernel", as_bool(data["enable_liger_kernel"], col.where("enable_liger_kernel")), "enable_liger_kernel")


def _weights(data: dict[str, Any], col: Collector, kind: str) -> None:
    bits = data.get("quantization_bit")
    if bits is not None:
        method = str(data.get("quantization_method", "bnb")).lower()
        dtype = choice(bits, col.where("quantization_bit"), {"4": "nf4", "8": "int8"})
        if method != "bnb":
            col.note(f"{col.where('quantization_method')}={method!r} is priced like bitsandbytes {dtype} (the same bits per weight)")
        col.set("weights_dtype", dtype, "quantization_bit")
        _kbit_dtypes(data, col)
        return
    half = "bf16" if data.get("bf16") or data.get("pure_bf16") else "fp16" if data.get("fp16") else None
    if half is None:
        col.set("weights_dtype", "fp32", "bf16 / fp16 not set: the model loads in fp32")
    elif kind == "full" and not data.get("pure_bf16"):
        col.set("weights_dtype", "fp32", "finetuning_type (full: trainable parameters upcast to fp32 unless pure_bf16)")
    else:
        col.set("weights_dtype", half, "pure_bf16" if kind == "full" else "bf16")


#: LLaMA-Factory's optim -> the GaLore / APOLLO optimizer class it builds (train/trainer_utils.py), as transformers names it
_LOW_RANK = {"galore": {"adamw_torch": "galore_adamw", "adamw_bnb_8bit": "galore_adamw_8bit", "adamw_8bit": "galore_adamw_8bit",
                        "paged_adamw_8bit": "galore_adamw_8bit"},
             "apollo": {"adamw_torch": "apollo_adamw"}}
#: the projection rank perfguide's optimizers.json rows price (transformers' default optim_args rank=128)
_PRICED_RANK = 128


def _low_rank_optimizer(data: dict[str, Any], col: Collector) -> None:
    """``use_galore`` / ``use_apollo``: the optimizer LLaMA-Factory builds in place of ``optim``'s, in backward per
    layer when ``*_layerwise``; a rank other than the priced one is said in the notes."""
    for family in _LOW_RANK:
        flag = f"use_{family}"
        if not switched_on(data, flag, col):
            continue
        optim = str(data.get("optim", "adamw_torch"))
        base = _LOW_RANK[family].get(optim)
        if base is None:
            raise ConfigReadError(f"{col.where(flag)} with optim={optim!r}: LLaMA-Factory builds {family} only over "
                                  f"{', '.join(_LOW_RANK[family])} (train/trainer_utils.py raises NotImplementedError)")
        layerwise = switched_on(data, f"{family}_layerwise", col)
        col.set("optimizer", base + ("_layerwise" if layerwise else ""), flag)
        if layerwise:
            col.set("optimizer_in_backward", True, f"{family}_layerwise (a post-accumulate-grad hook steps each parameter)")
        rank = as_int(data.get(f"{family}_rank", 16), col.where(f"{family}_rank"))   # LLaMA-Factory's default rank 16
        if rank != _PRICED_RANK:
            col.note(f"{col.where(f'{family}_rank')}={rank}: {family}'s projected states are priced at rank {_PRICED_RANK} "
                     f"(optimizers.json); they are a few percent of the weights either way")


#: LLaMA-Factory never runs peft's prepare_model_for_kbit_training (absent from src/ at ff6d4d12): a k-bit base keeps
#: its embedding, head and norms in the load dtype; ``upcast_layernorm`` (default False) turns the norm weights fp32
#: (model/model_utils/checkpointing.py ``prepare_model_for_training``)
KBIT_DTYPES = "LLaMA-Factory runs no peft k-bit preparation (model/model_utils/checkpointing.py prepare_model_for_training)"


def _kbit_dtypes(data: dict[str, Any], col: Collector) -> None:
    upcast = bool(data.get("upcast_layernorm")) and as_bool(data["upcast_layernorm"], col.where("upcast_layernorm"))
    recast = upcast and bool(data.get("bf16")) and not (data.get("deepspeed") or data.get("fsdp"))
    set_kbit_dtypes(col, "upcast_layernorm" if recast else "quantization_bit",
                    KBIT_DTYPES + ("; only the norm weights turn fp32" if recast else ": embedding, head and norms stay in the load dtype"),
                    recast=recast, fp32_norms_key="upcast_layernorm" if upcast else None)
    if data.get("upcast_lmhead_output") and as_bool(data["upcast_lmhead_output"], col.where("upcast_lmhead_output")):
        col.note(f"{col.where('upcast_lmhead_output')}: the head's fp32 output copy is not priced (a forward hook "
                 "returning output.to(float32))")


def write(changes: dict[str, Any], setup: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Setup changes as LLaMA-Factory keys (its own where it has one, else the TrainingArguments key it accepts)."""
    keys: dict[str, Any] = {}
    rest: dict[str, Any] = {}
    for field, value in changes.items():
        if field == "gradient_checkpointing" and not setup.is_fsdp:
            keys["disable_gradient_checkpointing"] = not value
        elif field == "seq_len":
            keys["cutoff_len"] = value
        elif field == "liger_kernel":
            keys["enable_liger_kernel"] = value
        elif field == "autocast":   # fp8 is its own switch beside bf16 / fp16 (the compute dtype the TrainingArguments keep)
            keys["fp8"] = value == "fp8"
            if value != "fp8":
                rest[field] = value
        elif field == "attn_implementation":
            keys["flash_attn"] = {"flash_attention_2": "fa2", "sdpa": "sdpa", "eager": "disabled"}[value]
        elif field == "weights_dtype" and value in ("nf4", "int8"):
            keys["quantization_bit"] = 4 if value == "nf4" else 8
        elif field == "weights_dtype" and setup.lora is None:
            keys["pure_bf16"] = value == "bf16"
        elif field == "lora" and value is not None:
            keys.update(finetuning_type="lora", lora_rank=value["r"], lora_alpha=value["alpha"])
        elif field == "lora":
            keys["finetuning_type"] = "full"
        else:
            rest[field] = value
    more, rest = write_training_args(rest, setup)
    return {**keys, **more}, rest


#: LLaMA-Factory switches that change what the step holds or runs in ways perfguide does not price: a config with one
#: on is refused in one line (they were listed as "read, not priced", as if they changed nothing)
UNPRICED = {"use_badam": "BAdam (block-coordinate Adam: one block's gradients and optimizer states at a time)",
            "use_adam_mini": "Adam-mini (one second-moment value per parameter block)", "use_muon": "the Muon optimizer",
            "use_llama_pro": "LLaMA Pro (expanded blocks, the others frozen)", "use_unsloth": "Unsloth's model and kernels",
            "use_unsloth_gc": "Unsloth's offloaded gradient checkpointing", "use_mca": "Megatron-core training (mcore_adapter)",
            "use_megatron_bridge": "Megatron Bridge training", "use_kt": "KTransformers' CPU/GPU expert offload",
            "use_hyper_parallel": "hyper-parallel training"}
#: the Megatron-core parallel sizes of LLaMA-Factory's megatron examples (run with USE_MCA=1), which its hparams lack
MCORE_KEYS = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "expert_model_parallel_size")


def _refuse_unpriced(data: dict[str, Any], col: Collector) -> None:
    mcore = next((k for k in MCORE_KEYS if k in data), None)
    table = {**UNPRICED, "mixture_of_depths": "mixture-of-depths",
             **({mcore: "Megatron-core parallelism (LLaMA-Factory's USE_MCA=1 trainer)"} if mcore else {})}
    refuse_unpriced(data, col, table, "LLaMA-Factory's Hugging Face trainer with LoRA, QLoRA, full fine-tuning, GaLore and APOLLO")
