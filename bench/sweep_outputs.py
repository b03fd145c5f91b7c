"""The sweep's bookkeeping and its output checks: each writer's output handed to the library that reads it
(TrainingArguments / SFTConfig / LoraConfig construction, DeepSpeed's config parser, accelerate's config loader and
launch parser, torchrun's) for bench/sweep.py."""

from __future__ import annotations

import contextlib
import io
import traceback
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import perfguide
from perfguide.errors import PerfGuideError


@dataclass
class Finding:
    kind: str
    case: str
    detail: str


@dataclass
class Tally:
    outcomes: Counter[str] = field(default_factory=Counter)
    writers: Counter[str] = field(default_factory=Counter)
    findings: list[Finding] = field(default_factory=list)
    numberless: Counter[str] = field(default_factory=Counter)   # decisions without their deciding number, by setting

    def flag(self, kind: str, case: str, detail: str) -> None:
        self.findings.append(Finding(kind, case, " ".join(str(detail).split())[:300]))


def _classify(exc: BaseException) -> tuple[str, str | None]:
    """'PerfGuideError' for a one-line error of the family; else the exception's name and its first frames."""
    if isinstance(exc, PerfGuideError) and "\n" not in str(exc) and str(exc).strip():
        return "PerfGuideError", None
    tb = traceback.extract_tb(exc.__traceback__)
    where = "; ".join(f"{Path(f.filename).name}:{f.lineno}" for f in tb[-3:])
    return type(exc).__name__, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''} at {where}"


# --- the outputs, handed to the libraries that read them ----------------------------------------------------------

def _cpu_standin(kw: dict[str, Any]) -> dict[str, Any]:
    """TrainingArguments checks the local device (tf32 / fp16 need CUDA); this machine has none, so the flags the
    library gates on the device are dropped for the parse and the run is marked CPU. Every other key is parsed as
    written (optim, fsdp, deepspeed, checkpointing, liger, ...)."""
    kw = {k: v for k, v in kw.items() if k not in ("tf32", "fp16", "ddp_backend")}
    return {**kw, "use_cpu": True}


def _writer(t: Tally, case: str, name: str, fn: Callable[[], Any]) -> Any:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = fn()
        t.writers[f"{name}: ok"] += 1
        return got
    except Exception as exc:  # noqa: BLE001 - any escape is a finding
        kind, detail = _classify(exc)
        t.writers[f"{name}: {kind}"] += 1
        if detail is not None:
            t.flag(f"writer {name} raised", case, detail)
        return None


def check_training_outputs(rec: Any, case: str, tmp: Path, t: Tally) -> None:
    import copy

    from transformers import TrainingArguments

    kw = _writer(t, case, "training_args_dict", lambda: rec.training_args_dict(output_dir=str(tmp / "out")))
    if kw is not None:
        check_runs_on_target(rec, case, kw, t)
    ta = _writer(t, case, "TrainingArguments", lambda: TrainingArguments(**_cpu_standin(copy.deepcopy(kw or {}))))
    sft = _writer(t, case, "sft_config_dict", lambda: rec.sft_config_dict(output_dir=str(tmp / "sft")))
    if kw is not None and sft is not None:
        def said(d: dict[str, Any]) -> tuple[Any, ...]:   # unset and False read the same; checkpointing under either name
            ckpt = bool(d.get("gradient_checkpointing") or d.get("activation_checkpointing"))
            return (d.get("per_device_train_batch_size"), d.get("gradient_accumulation_steps"), bool(d.get("bf16")), bool(d.get("fp16")),
                    d.get("optim"), ckpt, bool(d.get("use_liger_kernel")))
        if said(kw) != said(sft):
            t.flag("SFTConfig vs TrainingArguments", case, f"(mb, ga, bf16, fp16, optim, ckpt, liger): training_args {said(kw)}, sft_config {said(sft)}")
    _writer(t, case, "trl.SFTConfig", lambda: _sft(rec, tmp))
    if rec.setup.lora is not None:
        _writer(t, case, "peft.LoraConfig", rec.lora_config)
    _writer(t, case, "model_kwargs", rec.model_kwargs)
    ds = _writer(t, case, "deepspeed_config", rec.deepspeed_config)
    if ds is not None and ta is not None:
        _writer(t, case, "DeepSpeedConfig", lambda: _deepspeed_parses(ds, ta))
    path = _writer(t, case, "write_accelerate_config", lambda: rec.write_accelerate_config(tmp / "accelerate.yaml", overwrite=True))
    if path is not None:
        _writer(t, case, "accelerate load_config_from_file", lambda: _accelerate_loads(path))
    cmd = _writer(t, case, "launch_command", lambda: rec.launch_command("train.py", config_file=str(path) if path else None))
    if cmd:
        _writer(t, case, "launcher parser", lambda: _launcher_parses(cmd))


def check_runs_on_target(rec: Any, case: str, kw: dict[str, Any], t: Tally) -> None:
    """What the target GPU cannot run must not be in its kwargs: bf16 before Ampere, tf32, FlashAttention 2,
    bitsandbytes kernels (the GPU table's capability columns)."""
    if rec.setup.device != "cuda" or not rec.hardware.gpus:
        return
    g = rec.hardware.gpus[0]
    bad = []
    if kw.get("bf16") and not g.supports_bf16:
        bad.append("bf16=True")
    if kw.get("tf32") and not g.supports_tf32:
        bad.append("tf32=True")
    if rec.setup.attn_implementation == "flash_attention_2" and not g.supports_flash_attention:
        bad.append("flash_attention_2")
    if (rec.setup.quantized or "bnb" in str(kw.get("optim", "")) or "8bit" in str(kw.get("optim", ""))) and not g.supports_bitsandbytes:
        bad.append(f"bitsandbytes ({rec.setup.weights_dtype}, optim={kw.get('optim')})")
    if bad:
        t.flag("runs not on the target", case, f"{g.name} cannot run: {', '.join(bad)}")


def _sft(rec: Any, tmp: Path) -> Any:
    import copy

    from trl import SFTConfig

    return SFTConfig(**_cpu_standin(copy.deepcopy(rec.sft_config_dict(output_dir=str(tmp / "sft")))))


def _deepspeed_parses(ds: dict[str, Any], ta: Any) -> Any:
    """transformers fills the "auto" values from the TrainingArguments, then DeepSpeed's own config class reads it."""
    from deepspeed.runtime.config import DeepSpeedConfig
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    hf = HfTrainerDeepSpeedConfig(json_roundtrip(ds))
    hf.trainer_config_process(ta)
    cfg = hf.config
    z = cfg.get("zero_optimization", {})
    for key in ("reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold"):
        if z.get(key) == "auto":
            z[key] = 4096 * 4096   # model-size values the Trainer fills from model.config.hidden_size at finalize
    cfg["train_batch_size"] = cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"]   # one rank here
    return DeepSpeedConfig(cfg)


def json_roundtrip(x: Any) -> Any:
    import json

    return json.loads(json.dumps(x))


def _accelerate_loads(path: Path) -> Any:
    from accelerate.commands.config.config_args import load_config_from_file

    return load_config_from_file(str(path))


def _launcher_parses(cmd: str) -> Any:
    import shlex

    # what the shell substitutes on each node of a multi-node run (the command names them as variables)
    cmd = cmd.replace('"$MACHINE_RANK"', "0").replace('"$MAIN_PROCESS_IP"', "10.0.0.1")
    words = shlex.split(cmd)
    while words and "=" in words[0] and not words[0].startswith("-"):
        words.pop(0)   # VAR=value env prefixes
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            return _parse_launcher(words)
    except SystemExit as exc:   # argparse exits on what it rejects
        raise ValueError(f"the launcher's parser rejects {' '.join(words)[:200]!r}") from exc


def _parse_launcher(words: list[str]) -> Any:
    if words[:2] == ["accelerate", "launch"]:
        from accelerate.commands.launch import launch_command_parser

        return launch_command_parser().parse_args(words[2:])
    if words and words[0] == "torchrun":
        from torch.distributed.run import get_args_parser

        return get_args_parser().parse_args(words[1:])
    if words and words[0] in ("python", "python3"):
        return words
    raise ValueError(f"unknown launcher {words[:2]}")


def check_serving_outputs(rec: Any, case: str, t: Tally) -> None:
    if rec.setup.serving is None:
        _writer(t, case, "generation_kwargs", rec.generation_kwargs)
        mk = _writer(t, case, "model_kwargs", rec.model_kwargs)
        g = rec.hardware.gpus[0] if rec.hardware.gpus and rec.setup.device == "cuda" else None
        if g is not None and mk is not None and "bfloat16" in str(mk.get("dtype", mk.get("torch_dtype"))) and not g.supports_bf16:
            t.flag("runs not on the target", case, f"{g.name} cannot run: dtype {mk.get('dtype', mk.get('torch_dtype'))}")
        cmd = _writer(t, case, "launch_command", lambda: rec.launch_command("generate.py"))
        if cmd:
            _writer(t, case, "launcher parser", lambda: _launcher_parses(cmd))
        return
    g = rec.hardware.gpus[0] if rec.hardware.gpus else None
    if g is not None and rec.setup.serving.dtype == "bf16" and not g.supports_bf16:
        t.flag("runs not on the target", case, f"{g.name} cannot run: --dtype bfloat16")
    _writer(t, case, "engine_args", rec.engine_args)
    cmd = _writer(t, case, "serve_command", rec.serve_command)
    if cmd:
        c = _writer(t, case, "perfguide check (serve command read back)", lambda: perfguide.check(rec.request.model_id, cmd, hardware=rec.hardware))
        if c is not None and rec.fits and not c.fits:
            t.flag("serve command read back does not fit", case, f"recommend fits, check of its own command: {str(c.summary if hasattr(c, 'summary') else c)[:200]}")
