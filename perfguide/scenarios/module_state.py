"""Constraints for a model that arrives adapted or quantized: it is planned as it is.

A PeftModel trains the adapter it carries (its rank, targets and options), so the plan is a LoRA plan with that
adapter; a bitsandbytes 4-bit module is a QLoRA base. Asking for something else (a full fine-tune, another
adapter) describes a run this object cannot do, so it is refused in one line instead of quietly replaced.
"""

from __future__ import annotations

from .. import sources
from ..decisions import Decision
from ..errors import ConflictingConstraintsError
from ..model.quantized import TRAINING_DEQUANTIZE_CONFIG, checkpoint_format
from ..model.types import ModelSpec
from .types import Constraints


def as_the_module_is(task: str, spec: ModelSpec, cons: Constraints) -> Constraints:
    """``cons`` with the module's own adapter / weight format filled in; conflicts raise."""
    if task != "train":
        if spec.quantization is not None and cons.quantization is None:
            return cons.model_copy(update={"quantization": spec.quantization})
        if cons.quantization is None and checkpoint_format(spec.config) is not None:  # "none": served as saved, never
            return cons.model_copy(update={"quantization": "none"})               # swapped for offloaded 16-bit weights
        return cons
    quantization = spec.quantization or _checkpoint_format(spec)
    if spec.adapter is None and quantization is None:
        return cons
    if quantization == "int8":
        raise ConflictingConstraintsError(
            "the model arrives 8-bit quantized (bitsandbytes LLM.int8); perfguide plans adapter training on 4-bit (QLoRA) "
            "bases: load it with BitsAndBytesConfig(load_in_4bit=True), pass the unquantized model, or price this one with "
            "perfguide.estimate(model, {'weights_dtype': 'int8', 'lora': {...}})")
    finetune = "qlora" if quantization == "nf4" else "lora"
    what = "with a LoRA adapter (a PeftModel)" if spec.adapter is not None else "4-bit quantized (bitsandbytes)"
    if cons.finetune not in (None, finetune):
        raise ConflictingConstraintsError(f"finetune={cons.finetune!r} but the model arrives {what}, which trains as "
                                          f"finetune={finetune!r}; drop finetune, or pass the base model (model.get_base_model())")
    if spec.adapter is not None and cons.lora is not None and cons.lora != spec.adapter:
        have = spec.adapter
        raise ConflictingConstraintsError(
            f"lora={cons.lora.model_dump()} differs from the adapter the model has (r={have.r}, alpha={have.alpha}, "
            f"targets {list(have.target_modules)}); drop lora= to plan the adapter it has, or pass the base model "
            "(model.get_base_model()) for a new one")
    return cons.model_copy(update={"finetune": finetune, "lora": spec.adapter or cons.lora})


def dequantized_checkpoint_decision(task: str, spec: ModelSpec) -> list[Decision]:
    """A training plan of an MXFP4 checkpoint (gpt-oss) trains the bf16 weights transformers dequantizes it to, as the
    published gpt-oss fine-tuning recipes do; say so, with the memory it costs, since the checkpoint is 4-bit."""
    fmt = checkpoint_format(spec.config) if task == "train" else None
    if fmt not in TRAINING_DEQUANTIZE_CONFIG:
        return []
    return [Decision(setting="checkpoint_dequantize", value=f"{fmt} -> bf16",
                     reason=f"the checkpoint is saved {fmt}; transformers dequantizes it to bf16 at load "
                            f"(model_kwargs() passes {TRAINING_DEQUANTIZE_CONFIG[fmt]}(dequantize=True)) and the fine-tune trains bf16 weights, "
                            "as published gpt-oss fine-tunes do (no stable training in MXFP4 itself)",
                     number=float(spec.total_params * 2), unit="bytes", source=sources.GPT_OSS_BF16_SFT)]


def _checkpoint_format(spec: ModelSpec) -> str | None:
    """The checkpoint's own quantized format ("nf4", "int8"), or a refusal for one perfguide cannot train on."""
    fmt = checkpoint_format(spec.config)
    if fmt in (None, "nf4", "int8"):
        return fmt
    if fmt in TRAINING_DEQUANTIZE_CONFIG:
        return None
    raise ConflictingConstraintsError(
        f"the checkpoint is saved {fmt}-quantized (its config's quantization_config); a quantized checkpoint trains only "
        "through adapters, and perfguide plans those on unquantized or bitsandbytes 4-bit (QLoRA) bases: pass the "
        "unquantized checkpoint, or price LoRA on this one with perfguide.estimate(model, {'lora': {...}, ...})")
