"""Ctrl-C during ``perfguide estimate --method trace`` exits 130 with one line, never SIGABRT.

The bug (issue 26): a SIGINT during the trace's forward pass was deferred (perfguide._interrupt) and then raised from
the tracker's ``__torch_dispatch__``, which C++ calls from inside the op; the Python exception crossing
``torch.embedding``'s kernel ended in ``terminate called after throwing an instance of 'python_error'`` (exit -6).
Here a real process gets a real SIGINT at a fixed point, the start of the traced model's embedding forward, so the
test does not depend on timing (test_issue16_regressions.py keeps a slow one that sends it after fixed delays).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TINY = dict(model_type="llama", architectures=["LlamaForCausalLM"], vocab_size=1000, hidden_size=64, intermediate_size=128,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)

DRIVER = """
import os, signal, sys
import torch

def interrupt_once(module, args):  # the user's Ctrl-C, landing as the traced model's embedding starts
    if type(module).__name__ == "Embedding" and not getattr(interrupt_once, "sent", False):
        interrupt_once.sent = True
        os.kill(os.getpid(), signal.SIGINT)

torch.nn.modules.module.register_module_forward_pre_hook(interrupt_once)
from perfguide.cli import main

sys.argv = ["perfguide", "estimate", sys.argv[1], "--method", "trace", "--seq-len", "64"]
raise SystemExit(main())
"""


def _run(tmp_path: Path, driver: str) -> subprocess.CompletedProcess[str]:
    model = tmp_path / "tiny"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(TINY))
    script = tmp_path / "driver.py"
    script.write_text(driver)
    env = dict(os.environ, PERFGUIDE_CACHE_DIR=str(tmp_path / "cache"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return subprocess.run([sys.executable, str(script), str(model)], env=env, capture_output=True, text=True, timeout=300)


def _said(stderr: str) -> list[str]:
    """stderr lines perfguide wrote (torch/torchao import chatter aside)."""
    return [line for line in stderr.splitlines() if line.strip() and not line.startswith(("W1", "Failed to load", "[transformers]"))]


def test_ctrl_c_inside_the_traced_forward_exits_130_with_one_line(tmp_path: Path) -> None:
    done = _run(tmp_path, DRIVER)
    assert done.returncode == 130, done.stderr[-800:]
    assert "terminate called" not in done.stderr and "Traceback" not in done.stderr
    assert _said(done.stderr)[-1] == "interrupted" and done.stdout == ""
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file() and p.suffix == ".tmp"]   # no half-written trace


def test_without_the_interrupt_the_same_trace_prints_its_estimate(tmp_path: Path) -> None:
    """The driver itself is not what stops the run: with the hook sending nothing, the estimate comes out."""
    done = _run(tmp_path, DRIVER.replace("os.kill(os.getpid(), signal.SIGINT)", "pass"))
    assert done.returncode == 0, done.stderr[-800:]
    assert "method: trace" in done.stdout


@pytest.mark.parametrize("argv_given", [True, False])
def test_only_the_process_entry_point_ignores_a_late_ctrl_c(argv_given: bool) -> None:
    """After the command's answer is out, the process's own main ignores SIGINT (torch's teardown takes ~1 s and a
    Ctrl-C there killed it with -2 after printing); a caller's ``main([...])`` leaves the caller's handler alone."""
    # a job started in the background by a non-interactive shell inherits SIGINT ignored: start from Python's default
    code = ("import signal, sys\nsignal.signal(signal.SIGINT, signal.default_int_handler)\nfrom perfguide.cli import main\n"
            + ("main(['--version'])\n" if argv_given else "sys.argv[1:] = ['--version']\nmain()\n")
            + "print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip().splitlines()[-1] == str(not argv_given)
