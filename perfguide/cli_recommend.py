"""``perfguide recommend MODEL [--scenario S] [--hardware H] [constraints] [--json | --training-args | ...]``.

Picks the fastest setup that fits and prints it (a report, JSON, TrainingArguments / SFTConfig kwargs or a serve
command), writing the --write-* config files and the --plot as one all-or-nothing write. Exit status: 0 fits,
3 nothing fits (the report says what would), 2 bad input (one line).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from .errors import PerfGuideError
from .scenarios.types import SCENARIOS

RECOMMEND_EXAMPLES = """\
examples:
  perfguide recommend gpt2                                      # plan for this machine
  perfguide recommend llama-3-8b --hardware a100-80gb --brief   # only the headline: what to run and why it fits
  perfguide recommend llama-3-8b --hardware a100-80gb --finetune qlora --seq-len 4096
  perfguide recommend llama-3-8b --scenario train_gpu_many --hardware h100-80gb:8 \\
      --write-accelerate-config accelerate.yaml --plot memory.png
  perfguide recommend llama-3-8b --scenario infer_gpu_one --hardware l4 --max-new-tokens 512 --batch-size 8
  perfguide recommend gpt2 --hardware a100-80gb --training-args > args.json
"""
#: help for Constraints fields whose pydantic description is missing or too terse for a --help line
CONSTRAINT_HELP = {
    "precision": "(default: the best the GPU supports)",
    "nodes": "identical machines (default 1)",
    "headroom": "fraction of device memory (and of host RAM for offload) kept free (default 0.10)",
    "optimizer": "a TrainingArguments optim value (default: perfguide decides)",
    "finetune": "(default: full, with LoRA/QLoRA suggested when it does not fit)",
    "gradient_checkpointing": "force activation checkpointing on or off (default: perfguide decides)",
    "micro_batch_size": "force the per-device micro-batch (default: the largest that fits)",
    "strategy": "force a multi-GPU strategy: ddp, fsdp, fsdp_shard_grad_op, zero1, zero2, zero3 (default: perfguide decides)",
    "attn_implementation": "force an attention kernel (default: perfguide decides)",
    "num_gpus": "GPUs (or CPU processes) per node to use (default: all)",
    "batch_size": "inference: concurrent sequences (default 1)",
    "allow_offload": "allow CPU offload when nothing else fits",
    "from_scratch": "training from random weights (8-bit optimizers then use bnb StableEmbedding)",
    "max_new_tokens": "inference: tokens generated per request",
    "prompt_len": "inference: prompt tokens (default: the sequence length)",
    "quantization": "inference: quantized weights (each engine's own formats: perfguide.engines)",
    "prefer": "inference: optimise for latency or throughput",
    "trust_remote_code": "allow a hub config's own code when reading the model",
    "engine": "inference: the engine that runs the model, one of perfguide.engines.names() (default: generate in your script)",
}


def _constraints_from_args(args: argparse.Namespace) -> dict[str, Any]:
    from .cli_flags import values_from_args
    from .scenarios.types import Constraints

    return values_from_args(args, Constraints)


def _outputs(rec: Any, args: argparse.Namespace) -> dict[Any, str | bytes]:
    """Every config file the --write-* flags ask for (the plot is drawn later, once every path is checked)."""
    import os
    from pathlib import Path

    from .integrations.accelerate import accelerate_files

    asked: list[dict[Any, str]] = []
    if args.write_accelerate_config:
        asked.append(accelerate_files(rec, Path(args.write_accelerate_config)))
    if args.write_configs:
        root = Path(args.write_configs)
        asked.append({**accelerate_files(rec, root / "accelerate.yaml"),
                      root / "training_args.json": json.dumps(rec.training_args_dict(), indent=2, default=str) + "\n",
                      root / "sft_config.json": json.dumps(rec.sft_config_dict(), indent=2, default=str) + "\n"})
    if args.plot:
        asked.append({Path(args.plot): ""})
    files: dict[Any, str | bytes] = {}
    for group in asked:
        for path, text in group.items():
            if any(os.path.abspath(path) == os.path.abspath(p) for p in files):
                raise PerfGuideError(f"{str(path)!r} was asked for twice; nothing was written: give each output its own path")
            files[path] = text
    return files


def _write_outputs(rec: Any, args: argparse.Namespace) -> None:
    """--plot, --write-accelerate-config and --write-configs as one write: every path checked first, then all
    files or none (a refused path, a full disk or Ctrl-C leaves every folder as it was)."""
    from pathlib import Path

    from ._files import check_all
    from .cli import _note, progress
    from .integrations.files import write_files

    files = _outputs(rec, args)
    plot = [Path(args.plot)] if args.plot else []
    if not files:
        return
    check_all(files, "output", overwrite=args.force, replace=plot, make_folders=True)
    if plot:
        from .render.plot import memory_png

        with progress("drawing the memory plot"):
            files[plot[0]] = memory_png(rec)
    written = write_files(files, args.force, "output", plot)
    _note(f"wrote {', '.join(str(p) for p in written)}")
    if args.write_configs:
        _note(f"launch with: {rec.launch_command('train.py', config_file=str(Path(args.write_configs) / 'accelerate.yaml'))}")


def cmd_recommend(args: argparse.Namespace) -> int:
    from .api import recommend
    from .cli import EXIT_NO_FIT, EXIT_OK, _emit, _hardware, _note, _print_json, _report_format

    rec = recommend(args.model, args.scenario, hardware=_hardware(args.hardware), host_ram=args.host_ram,
                    seq_len=args.seq_len, global_batch_size=args.global_batch_size, **_constraints_from_args(args))
    _write_outputs(rec, args)
    if args.json:
        _emit(rec.summary().to_json() if args.brief else rec.to_json())
    elif args.training_args:
        _print_json(rec.training_args_dict())
    elif args.serve_command:
        _emit(rec.serve_command())
    elif args.sft_config:
        _print_json(rec.sft_config_dict())
    else:
        _emit(rec.report(_report_format(args), brief=args.brief))
    if not rec.fits:
        _note(f"nothing fits: exit status {EXIT_NO_FIT} (the report above says what would)")
        return EXIT_NO_FIT
    return EXIT_OK


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The recommend options: the target, the constraints (generated from Constraints) and the outputs."""
    p.add_argument("model", help="catalog name (llama-3-8b), size (7b), local config path or hub id")
    p.add_argument("--scenario", default="train_gpu_one", metavar="NAME", help=f"one of {', '.join(SCENARIOS)} (default train_gpu_one)")
    p.add_argument("--hardware", metavar="NAME[:N]", help="plan for a named target, e.g. a100-80gb:8 or dgx-h100 (default: probe this machine)")
    p.add_argument("--host-ram", metavar="SIZE", help="the target's host RAM, e.g. 2TB or 768GiB (default: what the named node ships with)")
    p.add_argument("--seq-len", type=int, metavar="N", help="tokens per sample (default: min(2048, model limit) for training)")
    p.add_argument("--global-batch-size", type=int, metavar="N", help="samples per optimizer step, kept fixed (default 32)")
    from .cli_flags import add_model_flags
    from .scenarios.types import Constraints

    add_model_flags(p, Constraints, "constraints (perfguide recommend(**constraints); unset ones: perfguide decides)",
                    help_text=CONSTRAINT_HELP)
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print the whole Recommendation as JSON")
    out.add_argument("--markdown", action="store_true", help="print the report as Markdown")
    out.add_argument("--training-args", action="store_true", help="print the TrainingArguments kwargs as JSON")
    out.add_argument("--serve-command", action="store_true", help="print the serving engine's start command (with --engine NAME)")
    out.add_argument("--sft-config", action="store_true", help="print the trl.SFTConfig kwargs as JSON")
    p.add_argument("--brief", action="store_true", help="print only the headline: the plan, its verdict and binding limit, "
                   "memory, speed and the command or code to run it (with --json: only the summary object)")
    p.add_argument("--plot", metavar="PNG", help="also draw peak memory vs micro-batch and sequence length (needs matplotlib)")
    p.add_argument("--write-accelerate-config", metavar="PATH", help="also write the accelerate launch config (YAML)")
    p.add_argument("--write-configs", metavar="DIR", help="also write accelerate.yaml (+ accelerate_deepspeed.json for ZeRO), "
                   "training_args.json and sft_config.json into DIR, and print the launch command that uses them")
    p.add_argument("--force", action="store_true", help="replace files --write-* would write that already exist (default: refuse)")
