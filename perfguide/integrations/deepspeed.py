"""Setup -> DeepSpeed ZeRO config (the JSON ``TrainingArguments(deepspeed=...)`` and accelerate read).

Values shared with the Trainer are ``"auto"`` so the Trainer fills them from its own arguments: two
sources of truth for batch size or precision fail in ways that are hard to debug (DeepSpeed docs).
Blocks follow the ZeRO-2/ZeRO-3 templates of https://huggingface.co/docs/transformers/deepspeed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import InvalidSetupError
from .adapter_facts import emitted, in_order

_ZERO_KEY_ORDER = ("stage", "overlap_comm", "contiguous_gradients", "allgather_partitions", "reduce_scatter", "allgather_bucket_size",
                   "reduce_bucket_size", "offload_optimizer", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold",
                   "sub_group_size", "stage3_max_live_parameters", "stage3_max_reuse_distance",
                   "stage3_gather_16bit_weights_on_model_save", "offload_param")

if TYPE_CHECKING:
    from ..recommendation import Recommendation


def _zero_block(rec: Recommendation, stage: int) -> dict[str, Any]:
    s = rec.setup
    if s.offload_params and stage < 3:
        raise InvalidSetupError(f"offload_params needs ZeRO stage 3 (strategy 'zero3'), got {s.strategy!r}")
    zo: dict[str, Any] = {"stage": stage, "overlap_comm": s.overlap_comm, "contiguous_gradients": True}   # Setup.overlap_comm: what is priced
    if stage >= 2:
        zo.update(allgather_partitions=True, reduce_scatter=True, allgather_bucket_size=5e8, reduce_bucket_size=5e8)
    if stage == 3:
        zo.update(
            reduce_bucket_size="auto",  # hidden^2, filled by the Trainer from the model config
            stage3_prefetch_bucket_size="auto",
            stage3_param_persistence_threshold="auto",
            sub_group_size=1e9,
            stage3_max_live_parameters=1e9,
            # keep parameters resident until activation checkpointing recomputes them
            stage3_max_reuse_distance=1e9,
            stage3_gather_16bit_weights_on_model_save=True,
        )
    # offload_optimizer / offload_param (perfguide.techniques.cpu_offload), placed as deepspeed.md's templates do
    return in_order({**zo, **emitted(rec, "deepspeed_zero")}, _ZERO_KEY_ORDER)


def deepspeed_config(rec: Recommendation) -> dict[str, Any] | None:
    """The ZeRO config for zero1/zero2/zero3 plans, None for every other strategy."""
    stage = rec.setup.zero_stage
    if stage is None:
        return None
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "train_batch_size": "auto",
        "gradient_clipping": "auto",
        "bf16": {"enabled": "auto"},
        "fp16": {"enabled": "auto"},
        "zero_optimization": _zero_block(rec, stage),
    }
    cfg.update(emitted(rec, "deepspeed_top"))  # the CPU optimizer of an offloaded plan (cpu_offload)
    return cfg


def resolved_deepspeed_config(rec: Recommendation) -> dict[str, Any] | None:
    """The config with every ``"auto"`` replaced by the plan's number, for loops without the Trainer."""
    cfg = deepspeed_config(rec)
    if cfg is None:
        return None
    s, spec = rec.setup, rec.model
    cfg.update(
        train_micro_batch_size_per_gpu=s.micro_batch_size,
        gradient_accumulation_steps=s.gradient_accumulation_steps,
        train_batch_size=s.global_batch_size,
        gradient_clipping=1.0,  # the Trainer's max_grad_norm default
        bf16={**cfg["bf16"], "enabled": s.autocast == "bf16"},   # pure bf16 keeps its master-weights switches
        fp16={"enabled": s.autocast == "fp16"},
    )
    zo = cfg["zero_optimization"]
    hidden = spec.hidden_size
    for key, value in (
        ("reduce_bucket_size", hidden * hidden),
        ("stage3_prefetch_bucket_size", int(0.9 * hidden * hidden)),
        ("stage3_param_persistence_threshold", 10 * hidden),
    ):
        if zo.get(key) == "auto":
            zo[key] = value
    # an "optimizer" block (offload plans) keeps its "auto" params: accelerate fills them from the
    # accelerate.utils.DummyOptim(params, lr=...) the loop passes to prepare()
    return cfg
