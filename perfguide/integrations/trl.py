"""Setup -> ``trl.SFTConfig``: the TrainingArguments of the plan plus TRL's own keys, every one written out.

``SFTConfig`` is a TrainingArguments subclass with other defaults (trl 1.16, trainer/base_config.py and
sft_config.py): checkpointing on (``gradient_checkpointing=True``), ``bf16=True`` unless fp16 is set, and
``max_length=1024`` truncation. ``SFTConfig(**rec.training_args_dict())`` therefore trains another run than the
one priced whenever the plan says checkpointing off, fp32, or a sequence length other than 1024. Here every
setting that changes memory or speed is written both ways, so no default of either library decides it.
"""

from __future__ import annotations

import copy
import warnings
from typing import TYPE_CHECKING, Any

from ..errors import PerfGuideError
from .adapter_facts import emitted, require_training
from .transformers import check_machine, training_args_dict

if TYPE_CHECKING:
    import trl

    from ..recommendation import Recommendation
    from ..setup import Setup

TRL_HINT = "pip install 'perfguide[trl]' (trl>=1.0), or use rec.sft_config_dict() for the plain kwargs"


#: the TrainingArguments switches SFTConfig defaults differently (bf16, checkpointing on): written out both ways
EXPLICIT_KEYS = ("bf16", "fp16", "tf32", "activation_checkpointing", "torch_compile")


def explicit_training_keys(training_args: dict[str, Any]) -> dict[str, Any]:
    """The switches ``training_args_dict`` leaves out when off, spelled out for SFTConfig: read from those kwargs
    (what the plan's techniques emitted), never derived again. A second derivation from the Setup said bf16=False
    for an fp8 plan (whose Trainer switch stays bf16) and bf16=True for pure bf16 under FSDP2, where the switch is
    left off on purpose so accelerate does not upcast the shards to fp32 masters (techniques/precision.py)."""
    return {key: bool(training_args.get(key, False)) for key in EXPLICIT_KEYS}


def technique_keys(setup: Setup) -> dict[str, Any]:
    """The SFTConfig-only keys: the priced sequence length, then what each technique's ``trl_args`` says
    (perfguide.techniques: padding-free, activation offloading and Liger write theirs out both ways).

    ``packing`` stays off: packing fills every row to ``max_length``, more tokens per micro-batch than a plan
    prices. Without it TRL pads each batch to its longest row (at most ``max_length``), which the plan's
    ``seq_len``-per-sample pricing bounds.
    """
    keys: dict[str, Any] = {"max_length": setup.seq_len, "packing": False}
    from .. import techniques

    keys.update(techniques.emit("trl_args", techniques.EmitContext(setup=setup)))   # what the plan's techniques turn on
    keys.update({k: v for k, v in techniques.emit("training_args", techniques.EmitContext(setup=setup)).items() if k in keys})
    return keys


def trl_config_kwargs(rec: Recommendation, s: Setup) -> dict[str, Any]:
    """What every TRL trainer config of the plan shares: the TrainingArguments kwargs, the switches TRL defaults
    differently, the sequence length and what the techniques emit for TRL."""
    kw = training_args_dict(rec)
    kw.update(explicit_training_keys(kw))
    kw.update(technique_keys(s))
    kw.update(emitted(rec, "trl_args"))
    return kw


def build_trl_config(rec: Recommendation, class_name: str, kw: dict[str, Any]) -> Any:
    """A real TRL config class built from ``kw`` after the machine check; one line when TRL is missing."""
    check_machine(rec, kw)
    try:
        import trl
    except ImportError as exc:
        method = "sft_config" if class_name == "SFTConfig" else "dpo_config"
        raise PerfGuideError(f"rec.{method}() needs TRL, which is not installed here ({exc}): {TRL_HINT}") from None
    # TrainingArguments rewrites fsdp_config in place; keep the caller's data (and rec's) untouched
    return getattr(trl, class_name)(**copy.deepcopy(kw))


def sft_config_dict(rec: Recommendation, **overrides: Any) -> dict[str, Any]:
    """``SFTConfig`` kwargs as plain data (plan on a laptop, run on the target); ``overrides`` win."""
    s = require_training(rec, "sft_config_dict")
    if s.objective != "sft":
        raise PerfGuideError(f"this plan prices objective={s.objective!r} (TRL's DPOTrainer: chosen + rejected rows, a reference "
                             "model), which SFTConfig cannot run; use rec.dpo_config() / rec.dpo_config_dict()")
    kw = trl_config_kwargs(rec, s)
    if s.padding_free and "max_length" not in overrides:
        warnings.warn(f"padding-free plan: TRL enforces no max_length without packing, so truncate each sample to the planned "
                      f"seq_len={s.seq_len} tokens before training (rows longer than that were not priced)", stacklevel=3)
    kw.update(overrides)
    return kw


def sft_config(rec: Recommendation, **overrides: Any) -> trl.SFTConfig:
    """A real ``trl.SFTConfig`` for this plan; WrongMachineError when this machine cannot run it."""
    config: trl.SFTConfig = build_trl_config(rec, "SFTConfig", sft_config_dict(rec, **overrides))
    return config
