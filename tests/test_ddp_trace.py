"""DDP traced on two real gloo ranks (scripts/trace_ddp_phases.py): what the Reducer holds beyond the unwrapped model
through every phase of a DeBERTa-v2 classifier step, against what sharding.py prices for DDP.

Hand count of the traced DeBERTa-v2 (h 128, 2 blocks, 4 heads, FFN 512, vocab 1000, 32 position buckets, shared
attention keys, no absolute positions, 2 labels): word embeddings 1000 x 128 = 128,000 and their LayerNorm 256; a
block is query / key / value / attention-output 4 x (128 x 128 + 128) = 66,048, two LayerNorms 512, intermediate
128 x 512 + 512 = 66,048, output 512 x 128 + 128 = 65,664: 198,272; the relative embeddings 2 x 32 x 128 = 8,192 and
their LayerNorm 256; the pooler 128 x 128 + 128 = 16,512 and the classifier 128 x 2 + 2 = 258. Total 550,018, so one
fp32 copy of every gradient is 2,200,072 B.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from perfguide.memory.sharding import bucket_bytes
from perfguide.setup import Setup

ROOT = Path(__file__).resolve().parents[1]
PARAMS = 128_000 + 256 + 2 * (66_048 + 512 + 66_048 + 65_664) + 8_192 + 256 + 16_512 + 258
PHASES = ("start", "forward", "backward", "step")
#: the Reducer's bookkeeping (per-tensor flags and counters; seen 0 to 928 B) stays below this; a second copy of the gradients or of a
#: block's activations would be over 100 KB here (one 4 x 64 x 128 fp32 hidden state is 131,072 B)
BOOKKEEPING = 4096
#: traces run before the profiler's missed free (``_missed_bucket_free``) is taken for a result
TRIES = 3


@pytest.fixture(scope="module")
def traced() -> dict[str, Any]:
    """The trace in a fresh interpreter: its two spawned ranks then see only the environment a standalone run gives
    them, not what the test process has built up (inside a full suite run the ranks once saw one more bucket-sized
    buffer alive at the third step's start, never in a standalone run)."""
    code = "import json, sys; sys.path.insert(0, 'scripts'); import trace_ddp_phases as t; print(json.dumps(t.trace()))"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MASTER_", "RANK", "WORLD_", "LOCAL_", "PYTORCH_"))}
    for _ in range(TRIES):
        run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-2000:]
        result: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
        if not _missed_bucket_free(result):
            break
    return result


def _missed_bucket_free(result: dict[str, Any]) -> bool:
    """The profiler's known blind spot (scripts/trace_ddp_phases.py ``trace``): when gloo's worker thread, not the
    profiled one, frees the bucket set DDP replaces at its rebuild, that set never leaves the books, and the copying
    run reads exactly one more whole set (4 x PARAMS bytes) from the step's start on. The worker's pause makes it rare
    (on a loaded 2-core machine it still came back once in CI); a rerun in a fresh interpreter is read instead. A
    real second copy would show in every run, so the test still fails on one."""
    over = result["ddp"]["start"] - result["plain"]["start"] - 2 * 4 * PARAMS
    return 0 <= over < BOOKKEEPING


def test_hand_count() -> None:
    assert PARAMS == 550_018
    ddp = Setup(task="train", micro_batch_size=4, seq_len=64, weights_dtype="fp32", strategy="ddp", num_gpus=2)
    assert bucket_bytes(ddp, PARAMS, 4) == 4 * PARAMS == 2_200_072


@pytest.mark.slow
def test_ddp_holds_one_fp32_gradient_copy_in_every_phase_and_nothing_else(traced: dict[str, Any]) -> None:
    """accelerate 0.12 wraps with no DDP kwargs (gradient_as_bucket_view=False): the Reducer's flat buckets, allocated
    at construction, are the only bytes the wrapped step holds beyond the unwrapped one, from the step's start through
    forward, backward and the optimizer step."""
    assert traced["params"] == PARAMS
    ddp = Setup(task="train", micro_batch_size=4, seq_len=64, weights_dtype="fp32", strategy="ddp", num_gpus=2)
    priced = bucket_bytes(ddp, PARAMS, 4)
    for phase in PHASES:   # beyond that, a few hundred bytes of the Reducer's bookkeeping, nothing
        assert 0 <= traced["ddp"][phase] - traced["plain"][phase] - priced < BOOKKEEPING, phase


@pytest.mark.slow
def test_bucket_views_make_the_gradients_the_buckets(traced: dict[str, Any]) -> None:
    """With gradient_as_bucket_view=True the .grad tensors are views of the Reducer's flat buckets, so DDP adds no
    copy. Read from where the gradients live, not from the profiled bytes, which miss a free made on gloo's worker
    thread in some runs (scripts/trace_ddp_phases.py ``trace``); the profiled run never holds more than the one
    without views."""
    plain, viewed, copied = (traced["grads"][run] for run in ("plain", "ddp_bucket_view", "ddp"))
    assert plain[1] == viewed[1] == copied[1] == 4 * PARAMS     # one fp32 gradient per parameter in every run
    assert plain[0] == copied[0] == plain[2]                    # one storage per parameter tensor
    assert viewed[0] < plain[2] // 10                           # a few flat buckets hold all of them
    for phase in PHASES:
        assert traced["ddp_bucket_view"][phase] <= traced["ddp"][phase] + BOOKKEEPING, phase
