"""Shared ending of the scripts tests/test_launch.py starts with `accelerate launch` (one per rank)."""

import json
import os
import sys
from pathlib import Path

import torch


def finish(out: Path, rank: int, report: dict) -> None:
    """Write this rank's report, tear the process group down, and exit.

    The exit skips C++ static destructors: on this torch CPU build a gloo process can abort at interpreter exit
    ("terminate called without an active exception") after all the work is done.
    """
    (out / f"rank{rank}.json").write_text(json.dumps(report))
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
