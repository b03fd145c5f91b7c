"""The ``perfguide`` command: probe, recommend, estimate, check, calibrate, env.

Every command prints something copy-pasteable on stdout (a report, or JSON with ``--json``) and keeps
messages, progress and errors on stderr, so ``perfguide recommend ... --json | jq`` always works.
A PerfGuideError (or a usage error) becomes ``error: <one line>`` and exit status 2, never a traceback; with
``--json`` stdout also gets ``{"error": {"type": ..., "message": ...}}``. ``recommend`` exits 3 when nothing fits
(the report, with what would fit, is still printed).
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
ESTIMATE_EXAMPLES = """\
examples:
  perfguide estimate gpt2 --micro-batch-size 8 --seq-len 1024
  perfguide estimate llama-3-8b --hardware a100-80gb --weights-dtype nf4 --lora-r 16 --gradient-checkpointing
  perfguide estimate gpt2 --method trace --json            # exact bytes from a fake-tensor trace (slower)
"""
PROBE_WORD = "probe"
#: exit statuses: 0 done, 1 unexpected failure (a bug: the traceback is shown), 2 bad input or usage, 3 nothing fits
EXIT_OK, EXIT_ERROR, EXIT_NO_FIT = 0, 2, 3
EXIT_PIPE = 128 + 13  # a shell's status for a writer killed by SIGPIPE (`set -o pipefail` sees it like `yes | head`'s)


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
    from ._text import clean_data

    _emit(json.dumps(clean_data(data), indent=2, default=str))


def _error_json(kind: str, message: str, code: int) -> None:
    """What ``--json`` users read on stdout when a command fails: the same one line, as data."""
    _print_json({"error": {"type": kind, "message": message, "exit_code": code}})


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


def cmd_estimate(args: argparse.Namespace) -> int:
    from .api import estimate, estimate_speed
    from .cli_flags import setup_from_args
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
    speed = estimate_speed(args.model, setup, hardware=hardware) if hardware is not None else None
    if args.json:
        from .speed.types import SetupEstimate

        _emit(SetupEstimate(memory=memory, speed=speed).to_json())
        return 0
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
    common = _Parser(add_help=False)
    common.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS, help="more logging (-vv: debug)")
    return common


def _add_recommend(subs: Any, common: argparse.ArgumentParser) -> None:
    from .cli_recommend import RECOMMEND_EXAMPLES, add_arguments, cmd_recommend

    add_arguments(_subparser(subs, "recommend", cmd_recommend, "Pick the fastest setup that fits, and say why.",
                             RECOMMEND_EXAMPLES, [common]))


def _add_estimate(subs: Any, common: argparse.ArgumentParser) -> None:
    from .cli_flags import add_setup_flags

    p = _subparser(subs, "estimate", cmd_estimate, "Price one setup you wrote: memory per device.", ESTIMATE_EXAMPLES, [common])
    p.add_argument("model", help="catalog name (llama-3-8b), size (7b), local config path or hub id")
    p.add_argument("--hardware", metavar="NAME[:N]", help=f"judge the fit on a named target, or '{PROBE_WORD}' for this machine (default: none)")
    p.add_argument("--host-ram", metavar="SIZE", help="the target's host RAM, e.g. 2TB or 768GiB (default: what the named node ships with)")
    p.add_argument("--method", default="analytic", metavar="M", help="analytic (fast, default) or trace (exact, fake tensors)")
    p.add_argument("--json", action="store_true", help="print the memory and (with --hardware) the speed as JSON: {\"memory\": MemoryEstimate, \"speed\": Throughput or null}")
    p.add_argument("--markdown", action="store_true", help="print the estimate as Markdown")
    add_setup_flags(p)


def _add_check(subs: Any, common: argparse.ArgumentParser) -> None:
    from .cli_check import CHECK_EXAMPLES, add_arguments, cmd_check

    add_arguments(_subparser(subs, "check", cmd_check, "Price the config you already have (files or a launch command) before the run.",
                             CHECK_EXAMPLES, [common]))


def _add_calibrate(subs: Any, common: argparse.ArgumentParser) -> None:
    p = _subparser(subs, "calibrate", cmd_calibrate, "Run a few real steps here and refine later estimates for this machine.",
                   parents=[common])
    from .cli_calibrate import add_arguments

    add_arguments(p)


def build_parser() -> argparse.ArgumentParser:
    common = _common()
    parser = _Parser(
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
    _add_check(subs, common)
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


class UsageError(Exception):
    """A command line argparse refused; raised instead of argparse's exit so ``--json`` can report it too."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:
        self.print_usage(sys.stderr)
        raise UsageError(f"{self.prog}: {message}")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``perfguide`` and ``python -m perfguide``; returns the exit status (130 after Ctrl-C, at any
    point: while parsing and importing too, not only inside the command)."""
    try:
        code = _main(argv)
    except KeyboardInterrupt:
        _note("interrupted")
        code = 130
    except BrokenPipeError:  # the reader stopped early (`| head`, a closed pager): end quietly, as a SIGPIPE'd writer would
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the interpreter's final flush must not raise again
        code = EXIT_PIPE
    if argv is None:  # the process's own command (not a caller's main([...])): its answer is out, so a Ctrl-C
        import signal  # during interpreter teardown (torch's takes ~1 s) must not kill it with SIGINT after the fact

        signal.signal(signal.SIGINT, signal.SIG_IGN)
    return code


def _main(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except UsageError as exc:
        _note(f"error: {exc}")
        if "--json" in argv:
            _error_json("UsageError", str(exc), EXIT_ERROR)
        return EXIT_ERROR
    except SystemExit as exc:  # --help, --version: argparse already printed
        return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else EXIT_ERROR
    configure_logging(getattr(args, "verbose", 0))
    if not hasattr(args, "func"):
        parser.print_help(sys.stderr)
        return EXIT_ERROR
    return run_command(args)


def run_command(args: argparse.Namespace) -> int:
    """Run the chosen command: PerfGuideError -> ``error: ...`` and 2 (plus a JSON error object on stdout with
    ``--json``), warnings -> ``warning: ...``, no tracebacks."""
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning
            return args.func(args)
    except PerfGuideError as exc:
        _note(f"error: {exc}")
        if getattr(args, "json", False):
            _error_json(type(exc).__name__, str(exc), EXIT_ERROR)
        return EXIT_ERROR
    except KeyboardInterrupt:
        _note("interrupted")
        return 130
