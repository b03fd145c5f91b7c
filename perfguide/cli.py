"""The ``perfguide`` command: probe, recommend, estimate, calibrate, env.

Every command prints something copy-pasteable on stdout (a report, or JSON with ``--json``) and keeps
messages, progress and errors on stderr, so ``perfguide recommend ... --json | jq`` always works.
A PerfGuideError becomes ``error: <one line>`` and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

from ._version import __version__
from .errors import PerfGuideError
from .scenarios.types import SCENARIOS

logger = logging.getLogger("perfguide")

MAIN_EXAMPLES = """\
examples:
  perfguide probe
  perfguide recommend meta-llama/Llama-3.1-8B --hardware a100-80gb --finetune lora
  perfguide recommend gpt2 --scenario train_gpu_many --hardware a100-80gb:8 --json
  perfguide estimate gpt2 --hardware a100-80gb --micro-batch-size 8 --seq-len 1024 --weights-dtype bf16
  perfguide env

Run `perfguide <command> --help` for the options of one command.
"""
RECOMMEND_EXAMPLES = """\
examples:
  perfguide recommend gpt2                                      # plan for this machine
  perfguide recommend llama-3-8b --hardware a100-80gb --finetune qlora --seq-len 4096
  perfguide recommend llama-3-8b --scenario train_gpu_many --hardware h100-80gb:8 \\
      --write-accelerate-config accelerate.yaml --plot memory.png
  perfguide recommend llama-3-8b --scenario infer_gpu_one --hardware l4 --max-new-tokens 512 --batch-size 8
  perfguide recommend gpt2 --hardware a100-80gb --training-args > args.json
"""
ESTIMATE_EXAMPLES = """\
examples:
  perfguide estimate gpt2 --micro-batch-size 8 --seq-len 1024
  perfguide estimate llama-3-8b --hardware a100-80gb --weights-dtype nf4 --lora-r 16 --gradient-checkpointing
  perfguide estimate gpt2 --method trace --json            # exact bytes from a fake-tensor trace (slower)
"""
#: recommend flags passed on as ``recommend(**constraints)`` when given
CONSTRAINT_FLAGS = ("precision", "optimizer", "finetune", "max_new_tokens", "batch_size", "nodes", "num_gpus", "headroom",
                    "engine", "quantization", "prefer", "prompt_len")
PROBE_WORD = "probe"


# --- small shared helpers ---------------------------------------------------------------------

def _note(message: str) -> None:
    from .render.safe import clean

    print(clean(message, keep_newlines=True), file=sys.stderr)


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int, file: Any = None,
                  line: str | None = None) -> None:
    """Warnings (a degraded probe, say) as one stderr line: the CLI user needs the message, not our source line."""
    _note(f"warning: {message}")


@contextmanager
def progress(message: str) -> Iterator[None]:
    """A spinner on a terminal (rich), else one line: long steps (tracing, real runs) should not look hung."""
    if sys.stderr.isatty() and importlib.util.find_spec("rich") is not None:
        from rich.console import Console

        with Console(stderr=True).status(message):
            yield
        return
    _note(f"{message} ...")
    yield


def _report_format(args: argparse.Namespace) -> str:
    """Markdown when asked; ANSI colours only when a person is looking at a terminal and rich is there."""
    if getattr(args, "markdown", False):
        return "markdown"
    return "rich" if sys.stdout.isatty() and importlib.util.find_spec("rich") is not None else "text"


def _emit(text: str) -> None:
    """stdout, ending in exactly one newline whether the renderer added one or not."""
    print(text, end="" if text.endswith("\n") else "\n")


def _print_json(data: Any) -> None:
    _emit(json.dumps(data, indent=2, default=str))


def _hardware(value: str | None) -> Any:
    """``--hardware`` passes a name ("a100-80gb:8") straight to the API; the word "probe" means this machine."""
    if value == PROBE_WORD:
        from .hardware.types import Hardware

        return Hardware.probe()
    return value


# --- commands ---------------------------------------------------------------------------------

def cmd_probe(args: argparse.Namespace) -> int:
    from .hardware.types import Hardware
    from .render.hardware import render_hardware

    hw = Hardware.probe()
    _emit(hw.to_json() if args.json else render_hardware(hw, _report_format(args)))
    return 0


def cmd_recommend(args: argparse.Namespace) -> int:
    from .api import recommend

    constraints = {name: getattr(args, name) for name in CONSTRAINT_FLAGS if getattr(args, name) is not None}
    rec = recommend(args.model, args.scenario, hardware=_hardware(args.hardware), host_ram=args.host_ram,
                    seq_len=args.seq_len, global_batch_size=args.global_batch_size, **constraints)
    if args.plot:
        with progress("drawing the memory plot"):
            path = rec.plot(args.plot)
        _note(f"wrote the memory plot to {path}")
    if args.write_accelerate_config:
        _note(f"wrote the accelerate config to {rec.write_accelerate_config(args.write_accelerate_config)}")
    if args.json:
        _emit(rec.to_json())
    elif args.training_args:
        _print_json(rec.training_args_dict())
    elif args.serve_command:
        _emit(rec.serve_command())
    else:
        _emit(rec.report(_report_format(args)))
    return 0


def cmd_estimate(args: argparse.Namespace) -> int:
    from .api import estimate, estimate_speed
    from .cli_setup import setup_from_args
    from .render.report import render_estimate
    from .setup import Setup

    setup = Setup.parse(setup_from_args(args))
    hardware = _hardware(args.hardware)
    if hardware is not None and args.host_ram is not None:
        from .api import resolve_hardware

        hardware = resolve_hardware(hardware, args.host_ram)
    busy = progress(f"tracing {args.model} on fake tensors") if args.method == "trace" else nullcontext()
    with busy:
        memory = estimate(args.model, setup, hardware=hardware, method=args.method)
    if args.json:   # the JSON stays a MemoryEstimate; perfguide.estimate_speed gives the Throughput object
        _emit(memory.to_json())
        return 0
    speed = estimate_speed(args.model, setup, hardware=hardware) if hardware is not None else None
    _emit(render_estimate(args.model, setup, memory, _report_format(args), speed))
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from . import cli_calibrate

    with progress("calibrating: running a few real training steps on this machine"):
        return cli_calibrate.main(args)


def cmd_env(args: argparse.Namespace) -> int:
    from .hardware.types import Hardware
    from .render.env import env_report, render_env

    info = env_report(Hardware.probe())
    _emit(json.dumps(info, indent=2) if args.json else render_env(info))
    return 0


# --- parser -----------------------------------------------------------------------------------

def _subparser(subs: Any, name: str, func: Callable[[argparse.Namespace], int], help_text: str, epilog: str | None = None,
               parents: Sequence[argparse.ArgumentParser] = ()) -> argparse.ArgumentParser:
    sub = subs.add_parser(name, help=help_text, description=help_text, epilog=epilog, parents=list(parents),
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    sub.set_defaults(func=func)
    return sub


def _common() -> argparse.ArgumentParser:
    """Options every subcommand accepts after its name too (``perfguide recommend gpt2 -vv``)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS, help="more logging (-vv: debug)")
    return common


def _add_recommend(subs: Any, common: argparse.ArgumentParser) -> None:
    p = _subparser(subs, "recommend", cmd_recommend, "Pick the fastest setup that fits, and say why.", RECOMMEND_EXAMPLES, [common])
    p.add_argument("model", help="catalog name (llama-3-8b), size (7b), local config path or hub id")
    p.add_argument("--scenario", default="train_gpu_one", metavar="NAME", help=f"one of {', '.join(SCENARIOS)} (default train_gpu_one)")
    p.add_argument("--hardware", metavar="NAME[:N]", help="plan for a named target, e.g. a100-80gb:8 or dgx-h100 (default: probe this machine)")
    p.add_argument("--host-ram", metavar="SIZE", help="the target's host RAM, e.g. 2TB or 768GiB (default: what the named node ships with)")
    p.add_argument("--seq-len", type=int, metavar="N", help="tokens per sample (default: min(2048, model limit) for training)")
    p.add_argument("--global-batch-size", type=int, metavar="N", help="samples per optimizer step, kept fixed (default 32)")
    p.add_argument("--nodes", type=int, metavar="N", help="identical machines (default 1)")
    p.add_argument("--num-gpus", type=int, metavar="N", help="GPUs per node to use (default: all)")
    p.add_argument("--precision", metavar="P", help="bf16, fp16 or fp32 (default: best the GPU supports)")
    p.add_argument("--optimizer", metavar="NAME", help="a TrainingArguments optim value (default: perfguide decides)")
    p.add_argument("--finetune", metavar="KIND", help="full, lora or qlora (default full)")
    p.add_argument("--headroom", type=float, metavar="F", help="fraction of device memory kept free (default 0.10)")
    p.add_argument("--max-new-tokens", type=int, metavar="N", help="inference: tokens generated per request (default 256)")
    p.add_argument("--batch-size", type=int, metavar="N", help="inference: concurrent sequences")
    p.add_argument("--prompt-len", type=int, metavar="N", help="inference: prompt tokens per request (default: --seq-len)")
    p.add_argument("--prefer", metavar="P", help="inference: throughput (default) or latency")
    p.add_argument("--engine", metavar="E", help="inference: transformers (default), vllm or sglang")
    p.add_argument("--quantization", metavar="Q", help="inference: int8 or nf4 (transformers); fp8, awq, gptq or nf4 (vllm/sglang)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print the whole Recommendation as JSON")
    out.add_argument("--markdown", action="store_true", help="print the report as Markdown")
    out.add_argument("--training-args", action="store_true", help="print the TrainingArguments kwargs as JSON")
    out.add_argument("--serve-command", action="store_true", help="print the vllm serve / sglang.launch_server command (with --engine)")
    p.add_argument("--plot", metavar="PNG", help="also draw peak memory vs micro-batch and sequence length (needs matplotlib)")
    p.add_argument("--write-accelerate-config", metavar="PATH", help="also write the accelerate launch config (YAML)")


def _add_estimate(subs: Any, common: argparse.ArgumentParser) -> None:
    from .cli_setup import add_setup_flags

    p = _subparser(subs, "estimate", cmd_estimate, "Price one setup you wrote: memory per device.", ESTIMATE_EXAMPLES, [common])
    p.add_argument("model", help="catalog name (llama-3-8b), size (7b), local config path or hub id")
    p.add_argument("--hardware", metavar="NAME[:N]", help=f"judge the fit on a named target, or '{PROBE_WORD}' for this machine (default: none)")
    p.add_argument("--host-ram", metavar="SIZE", help="the target's host RAM, e.g. 2TB or 768GiB (default: what the named node ships with)")
    p.add_argument("--method", default="analytic", metavar="M", help="analytic (fast, default) or trace (exact, fake tensors)")
    p.add_argument("--json", action="store_true", help="print the MemoryEstimate as JSON")
    p.add_argument("--markdown", action="store_true", help="print the estimate as Markdown")
    add_setup_flags(p)


def _add_calibrate(subs: Any, common: argparse.ArgumentParser) -> None:
    p = _subparser(subs, "calibrate", cmd_calibrate, "Run a few real steps here and refine later estimates for this machine.",
                   parents=[common])
    from .cli_calibrate import add_arguments

    add_arguments(p)


def build_parser() -> argparse.ArgumentParser:
    common = _common()
    parser = argparse.ArgumentParser(
        prog="perfguide", description="Train or serve a transformer fast on your hardware without running out of memory, and know why.",
        epilog=MAIN_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"perfguide {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv: debug)")
    subs = parser.add_subparsers(title="commands", metavar="<command>")
    probe = _subparser(subs, "probe", cmd_probe, "Show this machine as perfguide sees it (GPUs, memory, CPU).", parents=[common])
    probe_out = probe.add_mutually_exclusive_group()
    probe_out.add_argument("--json", action="store_true", help="print the Hardware as JSON")
    probe_out.add_argument("--markdown", action="store_true", help="print as Markdown")
    _add_recommend(subs, common)
    _add_estimate(subs, common)
    _add_calibrate(subs, common)
    env = _subparser(subs, "env", cmd_env, "Versions and machine summary to paste into a bug report.", parents=[common])
    env.add_argument("--json", action="store_true", help="print the report as JSON")
    return parser


class _CurrentStderr(logging.StreamHandler):
    """Writes to whatever sys.stderr is now (tests and notebooks swap it), not the one seen at setup."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass


def configure_logging(verbosity: int) -> None:
    level = logging.WARNING if verbosity <= 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    logger.setLevel(level)
    if verbosity > 0 and not any(isinstance(h, _CurrentStderr) for h in logger.handlers):
        handler = _CurrentStderr()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``perfguide`` and ``python -m perfguide``; returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, usage errors: argparse already printed
        return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 2
    configure_logging(getattr(args, "verbose", 0))
    if not hasattr(args, "func"):
        parser.print_help(sys.stderr)
        return 2
    return run_command(args)


def run_command(args: argparse.Namespace) -> int:
    """Run the chosen command: PerfGuideError -> ``error: ...`` and 2, warnings -> ``warning: ...``, no tracebacks."""
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning
            return args.func(args)
    except PerfGuideError as exc:
        _note(f"error: {exc}")
        return 2
    except KeyboardInterrupt:
        _note("interrupted")
        return 130
