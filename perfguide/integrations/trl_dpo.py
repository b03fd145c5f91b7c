"""Setup -> ``trl.DPOConfig``: the plan's TrainingArguments, TRL's shared keys and DPO's own, every one written out.

``DPOConfig`` (trl 1.16, trainer/dpo_config.py) shares SFTConfig's base defaults (checkpointing on, ``bf16=True``
unless fp16) and truncates prompt + completion at ``max_length=1024``; ``per_device_train_batch_size`` counts
preference *pairs*, each one a chosen and a rejected row in the same forward, which is how the plan priced
``micro_batch_size``. A DPO plan's config comes from here only: an SFT plan priced one row per sample and no
reference model, so it is refused, and ``rec.sft_config()`` refuses a DPO plan the same way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import PerfGuideError
from .adapter_facts import require_training
from .trl import build_trl_config, trl_config_kwargs

if TYPE_CHECKING:
    import trl

    from ..recommendation import Recommendation

#: SFTConfig keys DPOConfig does not have (trl 1.16): packing is SFT's alone
SFT_ONLY_KEYS = ("packing",)


def dpo_config_dict(rec: Recommendation, **overrides: Any) -> dict[str, Any]:
    """``DPOConfig`` kwargs as plain data (plan on a laptop, run on the target); ``overrides`` win."""
    s = require_training(rec, "dpo_config_dict")
    if s.objective != "dpo":
        raise PerfGuideError(f"this plan prices objective={s.objective!r} (one row per sample, no reference model), not DPO; "
                             "plan with objective='dpo' (recommend(..., objective='dpo'), --objective dpo) for rec.dpo_config()")
    kw = {k: v for k, v in trl_config_kwargs(rec, s).items() if k not in SFT_ONLY_KEYS}   # + DPO's precompute_ref_log_probs
    kw.update(overrides)
    return kw


def dpo_config(rec: Recommendation, **overrides: Any) -> trl.DPOConfig:
    """A real ``trl.DPOConfig`` for this plan; WrongMachineError when this machine cannot run it."""
    config: trl.DPOConfig = build_trl_config(rec, "DPOConfig", dpo_config_dict(rec, **overrides))
    return config
