"""What a plan needs done to the model itself: the techniques' prepare steps (checkpointing, bnb embedding
state) and LoRA/QLoRA adapters.

These cannot be TrainingArguments flags (or are flags only the Trainer honours), so users of a plain
accelerate loop would otherwise silently lose them. Each step is idempotent: calling ``prepare_model``
twice, or on a model the Trainer also prepares, changes nothing the second time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import techniques
from ..errors import InvalidSetupError
from .adapter_facts import emit_context
from .lora import lora_config

if TYPE_CHECKING:
    from ..recommendation import Recommendation


def add_lora(rec: Recommendation, model: Any) -> Any:
    """Wrap the model with the plan's ``LoraConfig`` (QLoRA: after kbit preparation).

    A model that already carries adapters is kept only when they are the plan's (a plan made from that
    PeftModel); other adapters would train a run the plan did not price, so they are refused in one line.
    """
    from peft import PeftModel, get_peft_model, prepare_model_for_kbit_training

    config = lora_config(rec)
    if isinstance(model, PeftModel):
        check_same_adapter(model, config)
        return model
    if rec.setup.quantized and rec.setup.kbit_upcast:
        # norms to fp32, base frozen; checkpointing is enabled by its technique through the 5.x method instead,
        # because peft's own switch calls the deprecated gradient_checkpointing_enable
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    # kbit_upcast=False: the plan priced the non-quantized parameters in 16 bits; get_peft_model freezes the base
    lora = rec.setup.lora
    # peft >= 0.12's switch; False keeps the adapters in a 16-bit base's dtype, as every peft before 0.12 did
    upcast = (lora is None or lora.autocast_adapter_dtype) and not zero3_needs_base_dtype(rec.setup)
    model = get_peft_model(model, config, autocast_adapter_dtype=upcast)
    if rec.setup.kbit_recast_bf16:
        recast_bf16(model, adapters=rec.setup.kbit_recast_adapters)
    if lora is not None and lora.adapter_dtype is not None:
        cast_adapters(model, lora.adapter_dtype)
    return model


def zero3_needs_base_dtype(setup: Any) -> bool:
    """ZeRO-3 over a 16-bit base: adapters left fp32 beside it break DeepSpeed from 0.19.2, which no longer casts a
    zero.Init model to its 16-bit dtype, at the first optimizer step ("output tensor must have the same type as input
    tensor" in ``_allgather_params_coalesced``: deepspeedai/DeepSpeed#8072, fixed in its coalesced gather by #8073).
    TRL (1.7 on, huggingface/trl#6091) passes ``autocast_adapter_dtype=False`` there, and so does ``prepare_model``.
    The memory model already prices ZeRO's adapters as the engine's 16-bit parameters with fp32 masters
    (memory/analytic.py ``deepspeed_half``), so nothing it priced changes."""
    return setup.strategy == "zero3" and setup.weights_dtype in ("bf16", "fp16")


def cast_adapters(model: Any, dtype: str) -> None:
    """The adapters in the dtype ``LoraSpec.adapter_dtype`` priced (what torchtune creates under its run dtype):
    every LoRA tuner layer's ``lora_A`` / ``lora_B`` (and DoRA's magnitude) cast, the base layer left as it is."""
    import torch

    target = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    for module in model.modules():
        for name in ("lora_A", "lora_B", "lora_magnitude_vector"):
            part = getattr(module, name, None)
            if isinstance(part, torch.nn.Module):
                part.to(target)


def recast_bf16(model: Any, *, adapters: bool) -> None:
    """The dtypes ``Setup.kbit_recast_bf16`` priced, as TRL's SFTTrainer (0.7.5-0.25.1, bf16, 4-bit base, peft_config)
    leaves them after peft's upcast: the norms fp32, fp32 token / position embeddings and head in bf16, and with
    ``adapters`` (``kbit_recast_adapters``: TRL 0.7.5-0.8.6's first branch) every PEFT tuner layer in bf16 too; without
    it a tuner layer meets the later releases' name checks like any module. Quantized storage (uint8 / int8) is not
    floating point, so ``.to`` leaves it."""
    import torch
    from peft.tuners.tuners_utils import BaseTunerLayer

    embedding_words = ("lm_head", "embed_tokens", "wte", "wpe")
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if adapters and isinstance(module, BaseTunerLayer):
            target = torch.bfloat16
        elif "norm" in name or isinstance(module, torch.nn.LayerNorm):
            target = torch.float32
        elif any(w in name for w in embedding_words) and weight is not None and weight.dtype == torch.float32:
            target = torch.bfloat16
        else:
            continue
        module.to(target)


def check_same_adapter(model: Any, config: Any) -> None:
    """The PeftModel's active LoRA adapts the same modules with the same rank and options as ``config``."""
    have = model.peft_config[model.active_adapter]
    fields = ("r", "lora_alpha", "lora_dropout", "use_dora", "use_rslora")
    differs = [f"{f} {getattr(have, f, None)} vs {getattr(config, f)}" for f in fields if getattr(have, f, None) != getattr(config, f)]
    adapted, planned = _adapted_and_planned(model.get_base_model(), config)
    if adapted != planned:
        differs.append(f"adapts {len(adapted)} modules, the plan {len(planned)}")
    if differs:
        raise InvalidSetupError(
            f"this model already has a LoRA adapter that differs from the plan's ({'; '.join(differs)}): plan from this model "
            "(recommend(peft_model, ...) prices the adapter it has), or pass the base model (model.get_base_model(), or "
            "merge_and_unload() to keep the trained weights) to get the plan's adapter")


def _adapted_and_planned(base: Any, config: Any) -> tuple[set[str], set[str]]:
    """Names of the modules holding adapters now, and of those ``config`` would adapt (PEFT's own name matching)."""
    import torch
    from peft.tuners.lora import LoraLayer
    from peft.tuners.tuners_utils import check_target_module_exists

    tuner_parts: list[str] = []
    outer: dict[str, Any] = {}
    for name, module in base.named_modules():
        if not name or any(name.startswith(p + ".") for p in tuner_parts):
            continue  # base_layer / lora_A inside an adapted module
        outer[name] = module
        if isinstance(module, LoraLayer):
            tuner_parts.append(name)
    adapted = set(tuner_parts)
    if config.target_modules == "all-linear":
        head = base.get_output_embeddings() if callable(getattr(base, "get_output_embeddings", None)) else None
        linear = (torch.nn.Linear, LoraLayer)
        planned = {n for n, m in outer.items() if (isinstance(m, linear) or type(m).__name__ == "Conv1D") and m is not head}
    else:
        planned = {n for n in outer if bool(check_target_module_exists(config, n))}
    return adapted, planned


def prepare_model(rec: Recommendation, model: Any) -> Any:
    """Apply each technique's ``prepare`` step (checkpointing, 8-bit-optimizer embedding rules) in emission
    order, then the plan's LoRA adapter (built by the PEFT adapter, lora.py); returns the (maybe wrapped) model."""
    s = rec.setup
    if s.task != "train":
        return model
    ctx = emit_context(rec)
    for technique in techniques.registry():
        model = technique.prepare(ctx, model)
    if s.lora is not None:
        model = add_lora(rec, model)
    return model
