"""``perfguide.check``: price the config a user already has, before the run, and say what to change in their own keys.

The configs are read by perfguide.integrations.readers (one module per format); the Setup they describe is priced
by the same cost model ``estimate`` uses, so the verdict on a config equals ``estimate`` of the Setup read from it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from .api import _check_setup_fits_machine, recommend, resolve_hardware
from .errors import InvalidSetupError, PerfGuideError
from .hardware.types import Hardware
from .integrations.readers import environment, read_command, read_file, read_object
from .integrations.readers.base import Reading
from .integrations.readers.combine import Combined
from .integrations.readers.pricing import Pricer, edits_for, plain, verdict
from .integrations.readers.serve_command import is_serve_command
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
    if is_command(config):
        return read_command(config)
    if isinstance(config, str | os.PathLike):
        return [read_file(os.fspath(config))]
    if isinstance(config, Sequence) and not isinstance(config, str) and config and all(isinstance(c, str | os.PathLike) for c in config):
        return [read_file(os.fspath(c)) for c in config]
    return [read_object(config)]


LAUNCHERS = ("accelerate", "torchrun", "deepspeed", "python", "python3", "vllm", "trl", "tune", "llamafactory-cli", "axolotl", "swift", "litgpt")


def is_command(config: Any) -> bool:
    """A launch command (a string or argv list starting with a launcher), not a config file path."""
    import shlex

    # a directory of the launcher's name is no config (`trl sft ...` run inside TRL's own checkout, which has trl/)
    if isinstance(config, str) and not os.path.isfile(config):
        words = shlex.split(config) if config.strip() else []
    elif isinstance(config, list) and config and all(isinstance(c, str) for c in config) and not os.path.isfile(config[0]):
        words = config
    else:
        return False
    _, words = environment(words)   # `CUDA_VISIBLE_DEVICES=0,1 NPROC_PER_NODE=2 swift sft ...`
    return bool(words) and words[0].rsplit("/", 1)[-1] in LAUNCHERS


def check(model: Any = None, config: Any = None, *, hardware: Hardware | str | None = None, task: str | None = None,
          num_labels: int | None = None, **overrides: Any) -> Check:
    """Will ``config`` (the user's own files / objects) fit ``model`` on ``hardware``, how fast, and what to change.

    ``model`` may be None when a config names one (``model_name_or_path``, ``base_model``, the serve command's model);
    ``overrides`` are Setup fields (``seq_len=4096``, ``num_gpus=8``) that the configs cannot say or should not decide.
    ``task`` / ``num_labels``: the head the run trains (``"seq-cls"``, 3 labels), as ``recommend`` takes them, where the
    model's own head is not it and the configs do not say (ms-swift's ``--task_type seq_cls`` does).
    """
    if config is None:
        raise PerfGuideError("check needs a config: a file path (TrainingArguments JSON/YAML, accelerate YAML, DeepSpeed JSON), "
                             "a list of them, a TrainingArguments / SFTConfig, or a dict of their kwargs")
    bad = sorted(k for k in overrides if k not in Setup.model_fields)
    if bad:
        from .errors import did_you_mean

        raise InvalidSetupError(f"unknown check override {bad[0]!r}.{did_you_mean(bad[0], Setup.model_fields)} "
                                f"Accepted: the perfguide.Setup fields ({', '.join(Setup.model_fields)})")
    if is_serve_command(config):
        return _check_serve(model, config, hardware, overrides)
    combined = Combined(readings(config), overrides)
    name = _model_name(model, combined)
    spec = _headed(ModelSpec.from_any(model if model is not None else name), combined, task, num_labels)
    hw = resolve_hardware(hardware)
    result, price = verdict(spec, hw, combined)
    _check_setup_fits_machine(result.setup, hw)
    recommended = _recommended_change(price, combined, result.throughput)
    changes = (*result.changes, recommended) if recommended else result.changes
    return result.model_copy(update={"changes": changes, "notes": tuple(dict.fromkeys(combined.notes))})


def _check_serve(model: Any, config: Any, hardware: Hardware | str | None, overrides: dict[str, Any]) -> Check:
    """A ``vllm serve`` / ``sglang.launch_server`` command: its flags decide every setting, so Setup overrides are refused."""
    from .integrations.readers import serve_command

    if overrides:
        raise InvalidSetupError(f"a serve command takes its settings from its own flags; drop {', '.join(sorted(overrides))} "
                                "and write them as the engine's flags")
    hw = resolve_hardware(hardware)
    result = serve_command.check(config, lambda name: ModelSpec.from_any(model if model is not None else name), hw)
    _check_setup_fits_machine(result.setup, hw)
    return result


def _headed(spec: ModelSpec, combined: Combined, task: str | None, num_labels: int | None) -> ModelSpec:
    """The model with the head the run trains: the caller's, else the configs', else its own."""
    from .errors import InvalidModelError
    from .model.tasks import TASKS, normalize_task, with_task

    given = normalize_task(task) if task is not None else combined.task
    if given is not None and given not in TASKS:
        raise InvalidModelError(f"task {task!r} is not a head perfguide prices; accepted: {', '.join(TASKS)}")
    labels = num_labels if num_labels is not None else combined.num_labels if task is None else None
    if given is None and labels is None:
        return spec
    headed = with_task(spec, str(given) if given is not None else None, labels)
    count = f" ({headed.num_labels} label{'s' * (headed.num_labels != 1)})" if headed.num_labels else ""
    combined.notes.append(f"priced with the {given or spec.head} head{count}"
                          + (" given to perfguide check" if task is not None or num_labels is not None else " the command trains")
                          + ("; its width is transformers' default: pass --num-labels N" if count and labels is None else ""))
    return headed


def _model_name(model: Any, combined: Combined) -> str:
    named = combined.model
    if model is None and named is None:
        raise PerfGuideError("no model: the configs name none (model_name_or_path, base_model, checkpoint_dir, swift's --model, the serve "
                             "command's model); pass --model / model=")
    if model is not None and named is not None and isinstance(model, str) and model != named.value:
        combined.notes.append(f"model {model!r} given to check replaces {named.source}={named.value!r}")
    return str(model if model is not None else named.value)  # type: ignore[union-attr]


#: the least speed-up a recommended plan is offered for, over a config that fits: a gain under it is inside the spread of
#: the speed model's out-of-sample errors (median of per-source medians 7.0%, bench/results/throughput.md), so a working
#: config is not told to change several settings for it
MIN_SPEEDUP = 1.05


def _recommended_change(price: Pricer, c: Combined, current: Any) -> Change | None:
    """The plan ``recommend`` picks for the same model, machine, sequence length, global batch and way of training."""
    s = price.setup
    if s.task != "train":
        return None
    if s.model_code != "transformers":
        c.notes.append(f"no recommended plan to compare with: perfguide's plans run transformers' model code, not {s.model_code}'s")
        return None
    info = registry.find("train", s.device, s.world_size > 1 and s.device == "cuda")
    if info is None:
        return None
    finetune = None if s.lora is None else "qlora" if s.quantized else "lora"
    # the way of training and the data the config states are the run's, not choices: a DPO config's plan is DPO's, a
    # TRL script's runs under TRL's trainer, and a
    # config that packs keeps packing (with no avg_seq_len perfguide prices full rows, where packing gains nothing, and
    # would otherwise tell a user with short samples to stop packing); a config on Cut Cross-Entropy keeps it (never
    # searched, and its gradient filtering is not priced, so a plan without it would be compared on a slow reading); a
    # config on a flash-attention kernel has its package installed, which a plan cannot assume (its rule picks SDPA)
    same = {"objective": s.objective, "trainer": s.trainer, "avg_seq_len": s.avg_seq_len, "target_len": s.target_len,
            "padding_free": True if s.padding_free else None, "cut_cross_entropy": True if s.cut_cross_entropy else None,
            "attn_implementation": s.attn_implementation if str(s.attn_implementation).startswith("flash_attention") else None}
    try:
        rec = recommend(price.spec, info.name, hardware=price.hw, seq_len=s.seq_len, global_batch_size=s.global_batch_size,
                        num_gpus=s.num_gpus if info.multi_gpu else None, nodes=s.nodes, finetune=finetune, lora=s.lora,
                        **{k: v for k, v in same.items() if v is not None})
    except PerfGuideError as exc:
        c.notes.append(f"no recommended plan to compare with: {exc}")
        return None
    changes = {f: getattr(rec.setup, f) for f in Setup.model_fields if getattr(rec.setup, f) != getattr(s, f)}
    rate = rec.throughput.tokens_per_s if rec.fits else None
    config_fits = price.memory(s).fits
    speedup = rate / current.tokens_per_s if rate and current is not None and current.tokens_per_s and config_fits else None
    reason = "already the plan perfguide recommends" if not changes else ""
    if changes and not rec.fits:   # a change toward a plan that does not fit is no change to make
        reason = (f"perfguide's own search finds no setup of this run that fits {price.hw.name or 'this machine'} as launched "
                  f"({s.world_size} process{'es' if s.world_size > 1 else ''}; its best, {rec.setup.label}, needs "
                  f"{rec.memory.device_total / 2**30:.1f} GiB per device)" + ("; this config fits: keep it" if config_fits else ""))
        changes = {}
    elif changes and speedup is not None and speedup < MIN_SPEEDUP:   # slower, or faster by less than the model resolves
        how = "slower" if speedup < 1 else f"faster by under {MIN_SPEEDUP - 1:.0%}, which is less than the speed model resolves"
        reason = (f"no speed to gain: by the same cost model, perfguide's own plan for this run ({rec.setup.label}) is {how} "
                  f"(x{speedup:.2f} tokens/s); it differs in {', '.join(changes)}, which this config sets its own way")
        changes = {}
    return Change(kind="recommended", setup={k: plain(v) for k, v in changes.items()}, edits=edits_for(changes, rec.setup, c) if changes else (),
                  fits=rec.fits, peak_gib=rec.memory.device_total / 2**30, tokens_per_s=rate, speedup=speedup, reason=reason)
