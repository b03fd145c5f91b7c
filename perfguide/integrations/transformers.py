"""Setup -> transformers objects: TrainingArguments kwargs, from_pretrained kwargs, generate kwargs.

Every name here was checked against transformers 5.24 (``activation_checkpointing``, ``dtype``,
``fsdp=True`` + ``fsdp_config`` version 2, ``use_cpu``); see the TrainingArguments reference,
https://huggingface.co/docs/transformers/main_classes/trainer#transformers.TrainingArguments. The plain-dict form exists
because a plan is often made on one machine (a laptop) and run on another (an A100 box), and
``TrainingArguments`` validates against the machine it is built on.
"""

from __future__ import annotations

import copy
import os
import warnings
from typing import TYPE_CHECKING, Any

from ..errors import InvalidSetupError, WrongMachineError
from ..model.quantized import TRAINING_DEQUANTIZE_CONFIG, checkpoint_format
from .adapter_facts import (
    check_cuda_machine,
    emitted,
    fsdp_settings,
    half_dtype_name,
    hsdp_sizes,
    is_multi_process,
    launched,
    require_training,
)

if TYPE_CHECKING:
    import transformers

    from ..recommendation import Recommendation

_TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def fsdp_config(rec: Recommendation) -> dict[str, Any]:
    """Trainer ``fsdp_config`` for FSDP2: sharding depth from the strategy, wrap class from the model."""
    cfg = fsdp_settings(rec)
    if "transformer_layer_cls_to_wrap" in cfg:
        cfg["transformer_layer_cls_to_wrap"] = [cfg["transformer_layer_cls_to_wrap"]]
    if not cfg["activation_checkpointing"]:
        del cfg["activation_checkpointing"]
    return cfg


def training_args_dict(rec: Recommendation, **overrides: Any) -> dict[str, Any]:
    """TrainingArguments kwargs as plain data; ``overrides`` (output_dir, learning_rate...) win."""
    s = require_training(rec, "training_args_dict")
    kw: dict[str, Any] = {
        "per_device_train_batch_size": s.micro_batch_size,
        # TrainingArguments' default is 8: an evaluation forward on 8 rows of full logits can OOM where the step fits
        "per_device_eval_batch_size": s.micro_batch_size,
        "gradient_accumulation_steps": s.gradient_accumulation_steps,
        "dataloader_num_workers": s.dataloader_num_workers,
        # use_cpu forces pin_memory off anyway; say so in the data instead of leaving a misleading True
        "dataloader_pin_memory": s.dataloader_pin_memory and s.device == "cuda",
    }
    kw.update(emitted(rec, "training_args"))  # precision, optim, checkpointing, torch_compile... (perfguide.techniques)
    if s.device == "cpu":
        kw["use_cpu"] = True
    if is_multi_process(s):
        # only valid inside a launched process (else "Default process group has not been initialized")
        kw["ddp_backend"] = "gloo" if s.device == "cpu" else "nccl"
        if s.strategy in ("ddp", "single"):
            # the Trainer's default (True for HF models without checkpointing, else False) walks the graph every step
            # or guesses; dense models and transformers 5's fused MoE experts give every parameter a gradient each
            # step. Only experts that are modules of their own (remote code) can miss one: DDP must look for them
            kw["ddp_find_unused_parameters"] = rec.model.separate_expert_modules
    if s.is_fsdp:
        kw["fsdp"] = True
        kw["fsdp_config"] = fsdp_config(rec)
    from .deepspeed import deepspeed_config

    ds = deepspeed_config(rec)
    if ds is not None:
        kw["deepspeed"] = ds
    kw.update(overrides)
    return kw


def check_machine(rec: Recommendation, kw: dict[str, Any]) -> None:
    """Refuse early, in one line, what TrainingArguments would refuse (or silently degrade) on this machine."""
    if not kw.get("use_cpu"):
        check_cuda_machine(rec, needs_ampere=bool(kw.get("bf16") or kw.get("tf32")))
    if kw.get("ddp_backend") and not launched():
        raise WrongMachineError(
            f"this plan trains on {rec.setup.world_size} processes and TrainingArguments(ddp_backend=...) only builds inside a launched process:"
            f" start your script with `{rec.launch_command('train.py')}`, or use rec.training_args_dict() for the plain kwargs"
        )


def training_args(rec: Recommendation, **overrides: Any) -> transformers.TrainingArguments:
    """A real TrainingArguments; WrongMachineError when this machine cannot run the plan. A plan priced for TRL's
    SFTTrainer (trainer='trl') is warned about: HF Trainer computes the model's loss on the full logits it left out."""
    if rec.setup.trainer == "trl" and rec.setup.objective == "sft":
        warnings.warn("this plan was priced for TRL's SFTTrainer (trainer='trl'), whose loss builds no full [b, s, V] logits; "
                      "HF Trainer's does and may not fit: train with trl.SFTTrainer and rec.sft_config(), or plan with "
                      "trainer='transformers'", stacklevel=3)
    kw = training_args_dict(rec, **overrides)
    check_machine(rec, kw)
    from transformers import TrainingArguments

    kw = copy.deepcopy(kw)  # TrainingArguments rewrites fsdp_config in place; keep the caller's data (and rec's) untouched
    if (sizes := hsdp_sizes(rec.setup)) is not None and "parallelism_config" not in kw:
        from accelerate import ParallelismConfig

        kw["parallelism_config"] = ParallelismConfig(**sizes)  # an object, so not in the plain-data dict
    return TrainingArguments(**kw)


def _torch_dtype(name: str) -> Any:
    import torch

    return getattr(torch, _TORCH_DTYPES[name])


def quantization_config(rec: Recommendation) -> Any:
    """BitsAndBytesConfig for int8/nf4 weights, None otherwise (perfguide.techniques.qlora)."""
    from ..techniques.qlora import bnb_config

    s = rec.setup
    if s.quantized and s.kbit_quantizer != "transformers":
        raise InvalidSetupError(f"kbit_quantizer={s.kbit_quantizer!r} prices {s.kbit_quantizer}'s layout (its lm_head quantized too); "
                                "transformers' BitsAndBytesConfig keeps the head 16-bit: plan with kbit_quantizer='transformers'")
    compute = half_dtype_name(rec)
    # sharding flattens/shards the packed 4-bit storage: it must share the dtype of the other params
    storage = compute if s.shards_params else None
    return bnb_config(s.weights_dtype, compute, storage, s.nf4_double_quant, s.bnb_4bit_quant_type)


def _device_map(rec: Recommendation) -> Any:
    """Only where the rules call for one: big-model inference, and quantized bases on one GPU per rank."""
    s = rec.setup
    if s.task == "infer" and (s.strategy == "device_map" or s.offload_params):
        return "auto"
    if s.quantized and s.device == "cuda" and not s.shards_params and s.strategy != "tp":
        # bnb weights are quantized while loading, on the GPU this rank owns (not "auto": that is for inference)
        return {"": local_rank()}
    return None


def local_rank() -> int:
    """This process's GPU under a launcher; unset or empty (as ``launched()`` reads it) means not launched: 0."""
    raw = os.environ.get("LOCAL_RANK", "").strip()
    if not raw:
        return 0
    if not raw.isdigit():
        from ..errors import PerfGuideError

        raise PerfGuideError(f"LOCAL_RANK={raw[:40]!r} is not a GPU index; accepted: unset, or the 0-based index "
                             "torchrun / accelerate launch set")
    return int(raw[:9])


def model_kwargs(rec: Recommendation) -> dict[str, Any]:
    """from_pretrained kwargs: dtype (torch dtype), attn_implementation, quantization_config, device_map/tp_plan."""
    s = rec.setup
    if s.quantized:
        dtype_name = half_dtype_name(rec)  # the non-quantized modules (norms, embeddings, head)
    else:
        dtype_name = s.weights_dtype  # fp32 for AMP full fine-tunes, bf16 for pure bf16 / LoRA / inference
    kw: dict[str, Any] = {"dtype": _torch_dtype(dtype_name), "attn_implementation": s.attn_implementation}
    # a checkpoint saved quantized loads as it is: transformers refuses a second config of another class and ignores one of its own
    saved = checkpoint_format(rec.request.model.config)
    qc = None if s.checkpoint_format or saved else quantization_config(rec)
    if s.task == "train" and saved in TRAINING_DEQUANTIZE_CONFIG:  # trained as the bf16 weights it dequantizes to
        import transformers

        qc = getattr(transformers, TRAINING_DEQUANTIZE_CONFIG[saved])(dequantize=True)
    if qc is not None:
        kw["quantization_config"] = qc
    device_map = _device_map(rec)
    if device_map is not None:
        kw["device_map"] = device_map
    budget = next((d.value for d in rec.decisions if d.setting == "max_memory"), None)
    if device_map == "auto" and budget:  # per-GPU weight budgets the inference rules sized (KV cache kept free)
        # JSON turns the GPU indices into "0", "1"; accelerate wants ints for GPUs and the words "cpu"/"disk"
        kw["max_memory"] = {int(k) if str(k).isdigit() else k: v for k, v in budget.items()}
    if s.task == "infer" and s.strategy == "tp":
        kw["tp_plan"] = "auto"
    if rec.request.constraints.trust_remote_code:
        kw["trust_remote_code"] = True
    if s.task == "train":
        kw.update(emitted(rec, "model_kwargs"))  # e.g. padding-free turns the KV cache off (perfguide.techniques)
    return kw


def generation_kwargs(rec: Recommendation) -> dict[str, Any]:
    """generate() kwargs: how many tokens the plan was sized for, and which KV cache.

    Empty for a model that does not generate (an encoder or a task head): it is served by one forward pass.
    """
    s = rec.setup
    if not rec.model.generates:
        return {}
    return {
        "max_new_tokens": s.new_tokens or rec.request.constraints.max_new_tokens,
        "cache_implementation": s.cache_implementation,
    }
