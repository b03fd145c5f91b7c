"""What a plan needs done to the model itself: checkpointing, LoRA/QLoRA adapters, bnb embedding state.

These cannot be TrainingArguments flags (or are flags only the Trainer honours), so users of a plain
accelerate loop would otherwise silently lose them. Each step is idempotent: calling ``prepare_model``
twice, or on a model the Trainer also prepares, changes nothing the second time.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ._plan import is_fsdp

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
    """Wrap the model with PEFT LoRA adapters from ``rec.setup.lora`` (QLoRA: after kbit preparation)."""
    from peft import LoraConfig, PeftModel, TaskType, get_peft_model, prepare_model_for_kbit_training

    if isinstance(model, PeftModel):
        return model
    spec = rec.setup.lora
    if rec.setup.weights_dtype in ("int8", "nf4"):
        # norms to fp32, base frozen; checkpointing is enabled above through the 5.x method instead,
        # because peft's own switch calls the deprecated gradient_checkpointing_enable
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    targets = spec.target_modules if isinstance(spec.target_modules, str) else list(spec.target_modules)
    config = LoraConfig(r=spec.r, lora_alpha=spec.alpha, target_modules=targets, task_type=TaskType.CAUSAL_LM)
    return get_peft_model(model, config)


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
    if s.lora is not None and s.task == "train":
        model = add_lora(rec, model)
    return model
