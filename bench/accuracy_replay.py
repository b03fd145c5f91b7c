"""Measured rows whose reserved bytes come from a replay of the caching allocator over their own step.

perfguide prices reserved as allocated times one training ratio (calibration.json reserved_over_allocated_training,
1.116: the median of published pairs). What the allocator keeps cached depends on the order and sizes of the
step's requests, and for LLaMA-Factory's long-context QLoRA step (rows 1000-1005) scripts/trace_allocator_replay.py
traces that order at the model's real shape and length and scripts/caching_allocator.py replays PyTorch's allocator
rules over it (docs/validation.md section 25). The replay's allocated peak is perfguide's own step bytes to the MiB
from 4,096 tokens on, so the row keeps perfguide's allocated peak and adds the bytes the replay leaves cached at its
reserved peak (reserved - allocated of the step's own tensors) in place of the ratio. The weights and optimizer
states are taken as packed (no load-time cache: not replayed), and only measured rows below the card read it: an
OOM verdict is decided by what the allocator keeps after it frees its cache and retries.
"""

from __future__ import annotations

import csv
from functools import cache
from pathlib import Path

from perfguide.memory.types import MemoryEstimate
from perfguide.setup import Setup

TABLE = Path(__file__).resolve().parent / "data" / "allocator_replays.csv"
#: max-context rows whose longest length comes from the capped allocator replayed over their own step (TRL's
#: gemma-3-1b SFT rows, scripts/trace_trl_gemma_replay.py, docs/validation.md section 28; its DPO rows,
#: scripts/trace_trl_dpo_replay.py, section 33)
MAX_CONTEXT = Path(__file__).resolve().parent / "data" / "allocator_max_context.csv"
#: max-batch rows whose largest batch comes from the capped allocator replayed over their own step (the 2021 ZeRO
#: blog's t5-large DDP rows, scripts/trace_t5_blog_replay.py; the 2022 FSDP blog's gpt2-large DDP rows,
#: scripts/trace_gpt2_fsdp_blog_replay.py; docs/validation.md section 32; its FSDP rows under torch 1.12's FSDP1, the
#: same script's --fsdp mode, section 36; the 2022 accelerate + DeepSpeed blog's DDP rows,
#: scripts/trace_accds_blog_replay.py, section 35, its ZeRO-2 rows through DeepSpeed 0.7.2's engine,
#: scripts/trace_accds_zero2_replay.py, section 37, and its ZeRO-3 + CPU offload row through 0.7.2's parameter
#: coordinator, scripts/trace_accds_zero3_replay.py, section 49)
MAX_BATCH = Path(__file__).resolve().parent / "data" / "allocator_max_batch.csv"


@cache
def _replays() -> dict[tuple[str, int], tuple[int, int]]:
    """(source group, length) -> (allocated, reserved) peaks of the step's own tensors in the replay."""
    with TABLE.open(newline="") as f:
        return {(r["source_group"], int(r["seq_len"])): (int(r["step_allocated_bytes"]), int(r["step_reserved_bytes"]))
                for r in csv.DictReader(f)}


def replayed_cache(row: dict[str, str], setup: Setup) -> int | None:
    """Bytes the replay leaves cached above the step's allocated peak, or None when the row's step was not replayed."""
    if row["value_kind"] != "measured" or setup.micro_batch_size != 1:
        return None
    hit = _replays().get((row["source_group"], setup.seq_len))
    return None if hit is None else hit[1] - hit[0]


def with_replayed_reserve(row: dict[str, str], setup: Setup, est: MemoryEstimate) -> MemoryEstimate:
    """The estimate with reserved = perfguide's allocated peak + the replay's cached bytes (device total follows)."""
    cached = replayed_cache(row, setup)
    if cached is None:
        return est
    reserved = est.peak_allocated + cached
    return est.model_copy(update={"peak_reserved": reserved, "device_total": est.device_total - est.peak_reserved + reserved})


@cache
def _max_contexts() -> dict[str, int]:
    with MAX_CONTEXT.open(newline="") as f:
        return {r["row_id"]: int(r["max_seq_len"]) for r in csv.DictReader(f)}


def replayed_max_context(row: dict[str, str]) -> int | None:
    """The longest length (a multiple of 1,024, the release's step) that survives the capped allocator replayed over
    the row's own step, or None when the row's step was not replayed. perfguide's plan is not changed by it."""
    return _max_contexts().get(row["row_id"]) if row["value_kind"] == "max_seq_fit" else None


@cache
def _max_batches() -> dict[str, int]:
    with MAX_BATCH.open(newline="") as f:
        return {r["row_id"]: int(r["max_batch"]) for r in csv.DictReader(f)}


def replayed_max_batch(row: dict[str, str]) -> int | None:
    """The largest micro-batch whose step survives the capped allocator replayed over the row's own step (the card's
    allocatable bytes less perfguide's CUDA context and NCCL buffers for the row), or None when it was not replayed.
    The replay runs the row's own releases' model code, so it reads what perfguide's one footprint ratio cannot: the
    free space each request order leaves inside split segments. perfguide's plan is not changed by it."""
    return _max_batches().get(row["row_id"]) if row["value_kind"] == "max_batch_fit" else None
