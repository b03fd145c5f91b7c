"""``perfguide.check``: price the config a user already has, before the run, and say what to change in their own keys.

The configs are read by perfguide.integrations.readers (one module per format); the Setup they describe is priced
by the same cost model ``estimate`` uses, so the verdict on a config equals ``estimate`` of the Setup read from it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from .api import _calibration, _check_setup_fits_machine, _default_seq_len, recommend, resolve_hardware
from .errors import InvalidSetupError, PerfGuideError
from .hardware.types import Hardware
from .integrations.readers import module, read_file, read_object
from .integrations.readers.base import Reading, nest
from .integrations.readers.combine import Combined
from .integrations.readers.fitting import smallest_fit
from .integrations.readers.verdict import Change, Check, Edit
from .model.types import ModelSpec
from .scenarios import registry
from .setup import Setup

__all__ = ["Change", "Check", "Edit", "check", "readings"]


def readings(config: Any) -> list[Reading]:
    """One Reading per config: a path (or several), a TrainingArguments / SFTConfig, or a dict of their kwargs."""
    if isinstance(config, Reading):
        return [config]
    if isinstance(config, list) and config and all(isinstance(c, Reading) for c in config):
        return list(config)
    if isinstance(config, str | os.PathLike):
        return [read_file(os.fspath(config))]
    if isinstance(config, Sequence) and not isinstance(config, str) and config and all(isinstance(c, str | os.PathLike) for c in config):
        return [read_file(os.fspath(c)) for c in config]
    return [read_object(config)]


def check(model: Any = None, config: Any = None, *, hardware: Hardware | str | None = None, **overrides: Any) -> Check:
    """Will ``config`` (the user's own files / objects) fit ``model`` on ``hardware``, how fast, and what to change.

    ``model`` may be None when a config names one (``model_name_or_path``, ``base_model``, the serve command's model);
    ``overrides`` are Setup fields (``seq_len=4096``, ``num_gpus=8``) that the configs cannot say or should not decide.
    """
    if config is None:
        raise PerfGuideError("check needs a config: a file path (TrainingArguments JSON/YAML, accelerate YAML, DeepSpeed JSON), "
                             "a list of them, a TrainingArguments / SFTConfig, or a dict of their kwargs")
    bad = sorted(k for k in overrides if k not in Setup.model_fields)
    if bad:
        from .errors import did_you_mean

        raise InvalidSetupError(f"unknown check override {bad[0]!r}.{did_you_mean(bad[0], Setup.model_fields)} "
                                f"Accepted: the perfguide.Setup fields ({', '.join(Setup.model_fields)})")
    combined = Combined(readings(config), overrides)
    name = _model_name(model, combined)
    spec = ModelSpec.from_any(model if model is not None else name)
    hw = resolve_hardware(hardware)
    _assume_defaults(combined, spec, hw)
    setup = _setup(combined)
    _check_setup_fits_machine(setup, hw)
    price = _Pricer(spec, hw, setup)
    memory = price.memory(setup)
    throughput = price.speed(setup)
    changes = [c for c in (_fit_change(price, combined, memory.fits), _recommended_change(price, combined, throughput)) if c]
    return Check(model=spec.name, hardware=_label(hw, setup), setup=setup, fits=memory.fits, memory=memory, throughput=throughput,
                 read=combined.settings(), ignored=combined.ignored(), unknown=combined.unknown(), changes=tuple(changes),
                 notes=tuple(dict.fromkeys(combined.notes)))


def _model_name(model: Any, combined: Combined) -> str:
    named = combined.model
    if model is None and named is None:
        raise PerfGuideError("no model: the configs name none (model_name_or_path, base_model, the serve command's model); pass --model / model=")
    if model is not None and named is not None and isinstance(model, str) and model != named.value:
        combined.notes.append(f"model {model!r} given to check replaces {named.source}={named.value!r}")
    return str(model if model is not None else named.value)  # type: ignore[union-attr]


#: what the Trainer does with keys no config gave (they also fill DeepSpeed's "auto")
_TRAINER_DEFAULTS = (
    ("micro_batch_size", 8, "TrainingArguments default per_device_train_batch_size (also what fills DeepSpeed's \"auto\")"),
    ("gradient_accumulation_steps", 1, "TrainingArguments default gradient_accumulation_steps"),
    ("optimizer", "adamw_torch_fused", "TrainingArguments default optim"),
    ("gradient_checkpointing", False, "TrainingArguments default activation_checkpointing"),
    ("autocast", None, "no bf16 / fp16 / mixed_precision in the configs: fp32 compute"),
    ("attn_implementation", "sdpa", "transformers 5 default attention (sdpa)"),
)


def _assume_defaults(c: Combined, spec: ModelSpec, hw: Hardware) -> None:
    """What a config left to its library's defaults or to the launcher, said as an assumption in the report."""
    c.assume("device", "cuda" if hw.has_gpu else "cpu", "the hardware checked on" + ("" if hw.has_gpu else " has no GPU"))
    c.assume("num_gpus", 1, "one process (`python train.py`); pass --num-gpus N, or the accelerate config, for a launcher")
    for field, value, why in _TRAINER_DEFAULTS:
        c.assume(field, value, why)
    sharded = str(c.value("strategy", "")).startswith(("zero", "fsdp"))
    if sharded and c.value("autocast") in ("bf16", "fp16"):
        c.assume("weights_dtype", "fp32", "DeepSpeed / FSDP mixed precision keep fp32 master weights whatever dtype the model loads in")
    c.assume("weights_dtype", spec.native_dtype, "transformers 5 from_pretrained loads dtype='auto': the checkpoint's own dtype")
    info = registry.find("train", "cuda", False)
    if info is not None:
        c.assume("seq_len", _default_seq_len(spec, info, 0), "no sequence length in the configs: min(2048, the model's positions); pass --seq-len")


def _setup(c: Combined) -> Setup:
    fields = c.fields()
    try:
        return Setup.parse(fields)
    except InvalidSetupError as exc:
        raise InvalidSetupError(f"the configs describe a setup perfguide cannot run: {exc}") from None


def _label(hw: Hardware, s: Setup) -> str:
    base = hw.name or (hw.smallest_gpu.name if hw.smallest_gpu and s.device == "cuda" else "this machine")
    return f"{base} ({s.world_size} process{'es' if s.world_size > 1 else ''})"


class _Pricer:
    """Memory and speed of Setups on one model and machine, with the calibration read once."""

    def __init__(self, spec: ModelSpec, hw: Hardware, setup: Setup) -> None:
        self.spec, self.hw, self.setup = spec, hw, setup
        self.factors = _calibration(hw, spec) if setup.task == "train" else None

    def memory(self, s: Setup) -> Any:
        from .memory import estimate_memory

        return estimate_memory(self.spec, s, self.hw, self.factors)

    def speed(self, s: Setup) -> Any:
        from .speed import estimate_speed

        if s.device == "cuda" and not self.hw.has_gpu:
            return None
        return estimate_speed(self.spec, s, self.hw, self.factors)

    def rate(self, s: Setup) -> float:
        t = self.speed(s)
        return t.tokens_per_s if t is not None else 0.0

    @property
    def bf16_ok(self) -> bool:
        gpu = self.hw.smallest_gpu
        return self.setup.device == "cpu" or (gpu is not None and gpu.supports_bf16)


def edits_for(changes: dict[str, Any], new: Setup, c: Combined) -> tuple[Edit, ...]:
    """Setup changes as keys of the config that set each field (else the first config), in its own syntax."""
    primary = c.readings[0]
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for field, value in changes.items():
        owners = {(s.format, s.source.split(":")[0]) for r in c.readings for s in r.settings if s.field == field and not s.assumed}
        for owner in sorted(owners) or [(primary.format, primary.source)]:
            groups.setdefault(owner, {})[field] = value
    edits: list[Edit] = []
    leftover: dict[str, Any] = {}
    for (fmt, src), fields in groups.items():
        mod = module(fmt)
        keys, rest = mod.write(fields, new)
        if rest and fmt != primary.format:
            more, rest = module(primary.format).write(rest, new)
            if more:
                edits.append(Edit(format=primary.format, source=primary.source, syntax=module(primary.format).SYNTAX, keys=more))
        if keys:
            edits.append(Edit(format=fmt, source=src, syntax=mod.SYNTAX, keys=keys))
        leftover.update(rest)
    if leftover and primary.format != "training_args":  # the script's TrainingArguments say what the launcher's files cannot
        keys, leftover = module("training_args").write(leftover, new)
        if keys:
            edits.append(Edit(format="training_args", source="TrainingArguments (your script)", syntax="kwargs", keys=keys))
    if leftover:
        edits.append(Edit(format="setup", source="perfguide.Setup", syntax="setup", keys=nest({k: _plain(v) for k, v in leftover.items()})))
    return tuple(edits)


def _plain(value: Any) -> Any:
    return value.to_dict() if hasattr(value, "to_dict") else value


def _fit_change(price: _Pricer, c: Combined, fits: bool) -> Change | None:
    if fits:
        return None
    found = smallest_fit(price.setup, price.bf16_ok, lambda s: bool(price.memory(s).fits), price.rate)
    if found is None:
        return Change(kind="fit", setup={}, edits=(), fits=False, peak_gib=price.memory(price.setup).device_total / 2**30,
                      reason="no change of up to three settings fits: see the recommended plan (LoRA / QLoRA, more GPUs, a larger GPU)")
    changes, new = found
    rate = price.rate(new)
    return Change(kind="fit", setup={k: _plain(v) for k, v in changes.items()}, edits=edits_for(changes, new, c), fits=True,
                  peak_gib=price.memory(new).device_total / 2**30, tokens_per_s=rate or None)


def _recommended_change(price: _Pricer, c: Combined, current: Any) -> Change | None:
    """The plan ``recommend`` picks for the same model, machine, sequence length, global batch and way of training."""
    s = price.setup
    if s.task != "train":
        return None
    info = registry.find("train", s.device, s.world_size > 1 and s.device == "cuda")
    if info is None:
        return None
    finetune = None if s.lora is None else "qlora" if s.quantized else "lora"
    try:
        rec = recommend(price.spec, info.name, hardware=price.hw, seq_len=s.seq_len, global_batch_size=s.global_batch_size,
                        num_gpus=s.num_gpus if info.multi_gpu else None, nodes=s.nodes, finetune=finetune, lora=s.lora)
    except PerfGuideError as exc:
        c.notes.append(f"no recommended plan to compare with: {exc}")
        return None
    changes = {f: getattr(rec.setup, f) for f in Setup.model_fields if getattr(rec.setup, f) != getattr(s, f)}
    rate = rec.throughput.tokens_per_s if rec.fits else None
    speedup = rate / current.tokens_per_s if rate and current is not None and current.tokens_per_s and price.memory(s).fits else None
    reason = "already the plan perfguide recommends" if not changes else ""
    return Change(kind="recommended", setup={k: _plain(v) for k, v in changes.items()}, edits=edits_for(changes, rec.setup, c) if changes else (),
                  fits=rec.fits, peak_gib=rec.memory.device_total / 2**30, tokens_per_s=rate, speedup=speedup, reason=reason)
