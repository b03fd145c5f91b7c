"""What a plan needs done to the model itself: checkpointing, LoRA/QLoRA adapters, bnb embedding state.

These cannot be TrainingArguments flags (or are flags only the Trainer honours), so users of a plain
accelerate loop would otherwise silently lose them. Each step is idempotent: calling ``prepare_model``
twice, or on a model the Trainer also prepares, changes nothing the second time.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ..errors import InvalidSetupError
from ._plan import is_fsdp
from .lora import lora_config

if TYPE_CHECKING:
    from ..recommendation import Recommendation

logger = logging.getLogger("perfguide.integrations")

#: Optimizers whose state bnb keeps in 8 bits (Trainer registers embeddings for 32-bit state for these).
BNB_8BIT_OPTIMIZERS = ("adamw_bnb_8bit", "adamw_8bit", "paged_adamw_8bit", "lion_8bit", "paged_lion_8bit", "ademamix_8bit")


def enable_checkpointing(model: Any) -> None:
    """The 5.x method (``gradient_checkpointing_enable`` is a deprecated alias); no-op when already on."""
    if getattr(model, "is_activation_checkpointing", False):
        return
    model.activation_checkpointing_enable()


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
    if rec.setup.weights_dtype in ("int8", "nf4"):
        # norms to fp32, base frozen; checkpointing is enabled above through the 5.x method instead,
        # because peft's own switch calls the deprecated gradient_checkpointing_enable
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    return get_peft_model(model, config)


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


def register_bnb_embedding_overrides(model: Any) -> int:
    """Give every nn.Embedding weight 32-bit optimizer state, as Trainer.create_optimizer does.

    bnb reads the overrides lazily at the first ``step()``, so this must run before it; an 8-bit state
    for embeddings makes training unstable (Dettmers, transformers#14819). Returns how many were added.
    """
    import bitsandbytes as bnb
    import torch

    manager = bnb.optim.GlobalOptimManager.get_instance()
    known = {(id(m), name) for m, name, _ in manager.module_weight_config_triple}
    added = 0
    for module in model.modules():
        if isinstance(module, torch.nn.Embedding) and (id(module), "weight") not in known:
            manager.register_module_override(module, "weight", {"optim_bits": 32})
            added += 1
    return added


def use_stable_embedding(model: Any) -> None:
    """From-scratch models only: bnb StableEmbedding (Xavier init + LayerNorm, 32-bit state by itself).

    Never for pretrained weights: the extra LayerNorm made fine-tuning worse (transformers#14819).
    """
    import bitsandbytes as bnb

    old = model.get_input_embeddings()
    if isinstance(old, bnb.nn.StableEmbedding):
        return
    # no device=/dtype= here: bnb 0.50 passes them positionally into torch 2.13's nn.Embedding, one slot off
    new = bnb.nn.StableEmbedding(old.num_embeddings, old.embedding_dim, padding_idx=old.padding_idx)
    new = new.to(device=old.weight.device, dtype=old.weight.dtype)
    model.set_input_embeddings(new)
    if getattr(model.config, "tie_word_embeddings", False):
        model.tie_weights()
    logger.info("replaced %s with bnb.nn.StableEmbedding (training from scratch)", type(old).__name__)


def prepare_model(rec: Recommendation, model: Any) -> Any:
    """Apply checkpointing, adapters and 8-bit-optimizer embedding rules; returns the (maybe wrapped) model."""
    s = rec.setup
    if s.task == "train" and s.gradient_checkpointing and not is_fsdp(s):
        enable_checkpointing(model)  # under FSDP the plugin checkpoints; both at once raises in the Trainer
    if s.optimizer in BNB_8BIT_OPTIMIZERS and s.task == "train":
        if rec.request.constraints.from_scratch:
            use_stable_embedding(model)
        else:
            register_bnb_embedding_overrides(model)
    if s.padding_free and s.task == "train" and getattr(model.config, "use_cache", False):
        model.config.use_cache = False  # with a KV cache transformers skips the packed mask (integrations/collate.py)
    if s.lora is not None and s.task == "train":
        model = add_lora(rec, model)
    return model
