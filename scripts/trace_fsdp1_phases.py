"""Trace what torch's FSDP1 (FlatParameter) holds during a GPT-2 step under a size-based auto-wrap, on real CPU tensors.

Run: ``HF_HUB_OFFLINE=1 .venv/bin/python scripts/trace_fsdp1_phases.py``. Two CPU ranks on gloo wrap a tiny tied GPT-2
(h 256, 4 blocks, vocab 8000, eager, no dropout) with ``FullyShardedDataParallel(auto_wrap_policy=
size_based_auto_wrap_policy(min_num_params=2000))`` (accelerate 0.7's ``default_auto_wrap_policy`` under its later
name), once per sharding strategy, and run the 2022 blog's loop (``outputs = model(**batch)`` rebound each step, AdamW,
``zero_grad(set_to_none=False)``) for three steps at b 4 x s 64. Live bytes come from the profiler's allocator events
(``profile_memory=True``: every CPU allocation and free, storage resizes included) on rank 0 over the third step,
measured from the live bytes at its start. "plain" runs the same loop on the unwrapped model in the same processes.

Prints, per run, the highest live bytes above those at the step's start through forward + loss and through backward. Why: sharding.py prices FSDP1 SHARD_GRAD_OP as holding every unit's unsharded parameters from its
forward to its backward, of the model as the wrap trains it (``size_wrapped_spec``: the tied head flattened a second
time), and this is the check of both on a real FSDP1; it also shows what FULL_SHARD holds at the loss peak.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

#: the traced model: GPT-2 in miniature, tied like the real one (config.json of openai-community/gpt2 ties by default)
CONFIG: dict[str, Any] = dict(n_embd=256, n_layer=4, n_head=4, vocab_size=8000, n_positions=128, use_cache=False,
                              attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)
B, S, MIN_NUM_PARAMS, WORLD = 4, 64, 2000, 2
RUNS = ("plain", "FULL_SHARD", "SHARD_GRAD_OP")


def live_peaks(events: list[tuple[int, int, str]]) -> dict[str, int]:
    """(time, bytes, mark) events -> the highest live bytes above the live bytes at mark ``start``, from there to mark
    ``forward`` (forward + loss) and from there to mark ``backward``."""
    live, base, peak, phase, out = 0, 0, 0, "", {}
    for _, nbytes, mark in sorted(events):
        if mark:
            if phase:
                out[phase] = peak - base
            else:
                base = live
            phase, peak = {"start": "forward", "forward": "backward"}.get(mark, ""), live
            continue
        live += nbytes
        peak = max(peak, live)
    return out


def allocator_events(prof: Any) -> list[tuple[int, int, str]]:
    """A finished ``torch.profiler.profile(profile_memory=True)`` -> (time, bytes, mark) events: every allocation
    (+bytes) and free (-bytes), and each ``record_function("MARK_<name>")`` as (time, 0, name)."""
    events = []
    for e in prof.profiler.kineto_results.events():
        if e.name() == "[memory]":
            events.append((e.start_ns(), e.nbytes(), ""))
        elif e.name().startswith("MARK_"):
            events.append((e.start_ns(), 0, e.name()[5:]))
    return events


def _worker(rank: int, port: int, out_dir: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
    from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy
    from torch.profiler import ProfilerActivity, profile, record_function
    from transformers import GPT2Config, GPT2LMHeadModel

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    report: dict[str, dict[str, int]] = {}
    for run in RUNS:
        torch.manual_seed(0)
        model: torch.nn.Module = GPT2LMHeadModel(GPT2Config(**CONFIG))
        if run != "plain":
            policy = functools.partial(size_based_auto_wrap_policy, min_num_params=MIN_NUM_PARAMS)
            model = FullyShardedDataParallel(model, sharding_strategy=ShardingStrategy[run], auto_wrap_policy=policy,
                                             device_id=torch.device("cpu"))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        ids = torch.randint(0, CONFIG["vocab_size"], (B, S))
        outputs = None
        prof = None
        for step in range(3):
            if step == 2:
                prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
                prof.__enter__()
            with record_function("MARK_start"):
                pass
            outputs = model(input_ids=ids, labels=ids)   # the loop rebinds: the previous output lives until here
            with record_function("MARK_forward"):
                pass
            outputs.loss.backward()
            with record_function("MARK_backward"):
                pass
            opt.step()
            opt.zero_grad(set_to_none=False)
        assert prof is not None
        prof.__exit__(None, None, None)
        report[run] = live_peaks(allocator_events(prof))
        del outputs, opt, model
    finish_rank(rank, out_dir, report)


def finish_rank(rank: int, out_dir: str, report: Any) -> None:
    """Write this rank's ``report`` as ``out_dir/rank<rank>.json`` (run_ranks returns rank 0's), then leave the group
    together with the other ranks."""
    import torch.distributed as dist

    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(report))
    dist.barrier()
    dist.destroy_process_group()


def run_ranks(worker: Any, world: int = WORLD) -> Any:
    """Spawn ``world`` gloo ranks running ``worker(rank, port, out_dir)`` and return what rank 0 wrote as JSON to
    ``out_dir/rank0.json``."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(worker, args=(port, tmp), nprocs=world, join=True)
        return json.loads(Path(tmp, "rank0.json").read_text())


def trace() -> dict[str, dict[str, int]]:
    """Rank 0's peak live bytes per run above those at the third step's start: ``forward`` (forward + loss) and
    ``backward``."""
    report: dict[str, dict[str, int]] = run_ranks(_worker)
    return report


def main() -> None:
    report = trace()
    print(f"tiny GPT-2 {CONFIG}, b {B} x s {S}, fp32, 2 gloo ranks, size-based wrap at {MIN_NUM_PARAMS}; rank 0, bytes")
    for run, phases in report.items():
        print(f"{run:>14}: " + ", ".join(f"{k} {v:,}" for k, v in phases.items()))
    sgo, fs, plain = report["SHARD_GRAD_OP"], report["FULL_SHARD"], report["plain"]
    print(f"SHARD_GRAD_OP - FULL_SHARD at the forward/loss peak: {sgo['forward'] - fs['forward']:,}")
    print(f"FULL_SHARD - plain at the forward/loss peak: {fs['forward'] - plain['forward']:,}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
