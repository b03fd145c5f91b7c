"""``perfguide check FILE... [--model M] [--hardware H] [--seq-len N] [--json]`` and ``perfguide check [options] -- COMMAND``.

Reads the configs a user already has (TrainingArguments / SFTConfig JSON or YAML, accelerate YAML, DeepSpeed JSON)
and prices them as written. Exit status: 0 fits, 3 does not fit (the report says the smallest change that does),
2 bad input (one line).
"""

from __future__ import annotations

import argparse
from typing import Any

CHECK_EXAMPLES = """\
examples:
  perfguide check training_args.json --model meta-llama/Llama-3.1-8B --hardware a100-80gb --seq-len 2048
  perfguide check accelerate.yaml training_args.json --model llama-3-8b --hardware a100-80gb:8
  perfguide check sft.yaml --hardware h100-80gb --json        # the model is the YAML's model_name_or_path
  perfguide check --hardware h100-80gb:2 -- vllm serve meta-llama/Llama-3.1-8B --max-model-len 32768
  perfguide check --hardware a100-80gb:8 -- torchrun --nproc_per_node 8 train.py --model_name_or_path llama-3-8b --bf16
  perfguide check --hardware a100-80gb:8 -- trl sft --model_name_or_path Qwen/Qwen2.5-7B --num_processes 8 --accelerate_config zero3
  perfguide check --hardware rtx4090:2 -- tune run --nproc_per_node 2 lora_finetune_distributed --config my.yaml batch_size=4
"""
#: Setup fields with their own options above (or that a config always decides)
SKIPPED = ("task",)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from .cli_flags import add_model_flags
    from .setup import Setup

    p.add_argument("files", nargs="*", metavar="FILE", help="config files of one run (JSON / YAML), or `-- COMMAND ...`")
    p.add_argument("--model", metavar="M", help="the model, when no config names one (catalog name, hub id, local path)")
    p.add_argument("--hardware", metavar="NAME[:N]", help="check on a named target, e.g. a100-80gb:8 (default: probe this machine)")
    p.add_argument("--format", metavar="F", help="read the files as this format instead of guessing (training_args, accelerate, deepspeed)")
    p.add_argument("--task", metavar="T", help="the head the run trains, where not the model's own: seq-cls, token-cls, qa, ...")
    p.add_argument("--num-labels", type=int, metavar="N", help="the classifier's width for --task seq-cls / token-cls")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print the whole Check as JSON")
    out.add_argument("--markdown", action="store_true", help=argparse.SUPPRESS)
    add_model_flags(p, Setup, "overrides (perfguide.Setup fields the configs do not say, e.g. --seq-len 4096 --num-gpus 8)", skip=SKIPPED)


def config_from_args(args: argparse.Namespace) -> Any:
    from .integrations.readers import read_command, read_file
    from .integrations.readers.serve_command import is_serve_command
    from .preflight import is_command

    if not args.files:
        from .errors import PerfGuideError

        raise PerfGuideError("perfguide check needs config files (or `-- COMMAND ...`); see perfguide check --help")
    if is_serve_command(args.files):
        return list(args.files)   # perfguide.check reads a serve command itself
    if is_command(args.files):
        return read_command(args.files)
    return [read_file(f, args.format) for f in args.files]


def cmd_check(args: argparse.Namespace) -> int:
    from .cli import EXIT_NO_FIT, EXIT_OK, _emit, _hardware, _note
    from .cli_flags import values_from_args
    from .preflight import check
    from .setup import Setup

    overrides = values_from_args(args, Setup, skip=SKIPPED)
    result = check(args.model, config_from_args(args), hardware=_hardware(args.hardware), task=args.task, num_labels=args.num_labels,
                   **overrides)
    _emit(result.to_json() if args.json else result.report())
    if result.fits:
        return EXIT_OK
    _note(f"does not fit: exit status {EXIT_NO_FIT} (the report above names the smallest change that fits)")
    return EXIT_NO_FIT
