"""The 2022 PyTorch FSDP blog's GPT-2 large DDP rows (bench rows 640 fp32, 641 fp16 AMP; published max batch 7 for
both, 2x TITAN RTX, 128 tokens) as a sequence of allocations and frees at the real shape, on fake tensors, replayed
through the caching allocator (scripts/caching_allocator.py) under the card's cap.

Why: perfguide prices row 641's batch 8 0.03 GiB under the card (fits: max batch 8 against 7 published), with the
allocator as one footprint ratio; the replay reads the reserved bytes the step's own order of requests leaves. The
blocks of 128 tokens are full (wikitext-2 grouped into ``block_size`` chunks): no padding question here.

What runs: GPT2LMHeadModel from gpt2-large's config (perfguide/data/architectures.json), fp32 weights, eager
attention, dropout 0.1, and the blog's loop (blog assets/62_pytorch_fsdp/run_clm_no_trainer.py) on transformers
4.18 (``--release DIR``: ``pip install --no-deps --target DIR transformers==4.18.0 requests==2.31.0 urllib3==1.26.18
idna certifi charset_normalizer``), accelerate 0.7 and PyTorch ~1.12:

* ``model.to(device)``: one block per parameter and buffer (4.18's ``attn.bias``: a 1024 x 1024 uint8 causal mask per block);
* DistributedDataParallel (accelerate 0.7 ``prepare_model``, no kwargs): the construction's broadcast of the
  parameters and buffers (``_sync_params_and_buffers``: ``named_parameters`` and ``named_buffers``, 250 MB flat
  buckets per dtype, two in flight), the Reducer's flat fp32 buckets (1 MB first, then
  25 MB; ``gradient_as_bucket_view`` False), their rebuild before the second forward, and each forward's buffer
  broadcast (``broadcast_buffers`` True: the uint8 masks flattened);
* ``outputs = model(**batch)`` with the forward wrapped as accelerate 0.7 does under ``--mixed_precision fp16``
  (``convert_outputs_to_fp32(autocast()(forward))``: ``.float()`` of every fp16 output, the logits and each
  returned key/value), the loss inside GPT2LMHeadModel.forward (labels); the name rebound each step, so the previous
  output lives through the next forward;
* ``accelerator.backward(loss)`` (``scaler.scale(loss).backward()`` under fp16), transformers 4.18 ``AdamW``
  (weight decay 0) stepped through the scaler (unscale in place), ``optimizer.zero_grad()`` (grads zeroed in place:
  set_to_none False before 2.0).

With ``--fsdp ROW`` (the blog's FSDP rows, fp32: ``FSDP_ROWS``) the same loop runs under torch 1.12's FSDP1
as scripts/fsdp1_emulation.py allocates it (accelerate 0.7 wraps the CPU model, then ``model.to(device)`` unless
parameters are offloaded; the optimizer is made on the wrapped model's shards), the requests on FSDP's
``all_gather`` and ``post_backward`` streams kept to their streams' blocks in the replay.

Usage: python scripts/trace_gpt2_fsdp_blog_replay.py [--release DIR] [--amp | --fsdp ROW] [--batch B] [--steps N]
[--search]
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from allocation_log import AllocationLog, live_at, live_peak
from caching_allocator import Allocator, largest_fitting, replay_under
from fsdp1_emulation import run as fsdp1_run
from fsdp1_emulation import wrap as fsdp1_wrap
from trace_t5_blog_replay import GiB, adamw_42, broadcast_coalesced, ddp_rebuild, ddp_start, scalar_fallback, use_release

#: the op, shape, dtype and phase that made each event's storage (for reading a replay)
OPS: dict[int, tuple[str, tuple[int, ...], str, str]] = {}
PHASE = ["weights"]
#: the event count when each step's output is returned (its backward not yet begun)
AFTER_FORWARD: list[int] = []
SEQ = 128
#: the streams of the last run's requests (tensor id -> stream), for the replay
STREAMS: dict[int, int] = {}
#: the blog's FSDP rows (bench/data/published_measurements.csv): model, FULL_SHARD (else SHARD_GRAD_OP),
#: min_num_params (642 states none: the blog's sample config's 2000, validation.md 13), CPU offload, GPUs
FSDP_ROWS: dict[str, tuple[str, bool, int, bool, int]] = {
    "642": ("openai-community/gpt2-large", False, 2000, False, 2),
    "643": ("openai-community/gpt2-large", True, 1_000_000, False, 2),
    "644": ("openai-community/gpt2-large", True, 2000, False, 2),
    "645": ("openai-community/gpt2-large", True, 1_000_000, True, 2),
    "646": ("openai-community/gpt2-large", True, 2000, True, 2),
    "650": ("openai-community/gpt2-xl", True, 2000, False, 2),
    "651": ("openai-community/gpt2-xl", True, 2000, True, 1),
    "652": ("openai-community/gpt2-xl", True, 2000, True, 2),
}


def gpt2_config(model: str = "openai-community/gpt2-large", layers: int | None = None, **over: Any) -> Any:
    from transformers import GPT2Config

    from perfguide.model.catalog import config_of

    cfg = config_of(model)   # the catalog's config.json values, its ``extends`` followed
    for k in ("model_type", "architectures", "torch_dtype"):
        cfg.pop(k, None)
    if layers is not None:
        cfg["n_layer"] = layers
    cfg.update(over)
    config = GPT2Config(**cfg)
    config._attn_implementation = "eager"   # 4.18 GPT-2 has only eager attention; 5.x would pick SDPA
    return config


def to_fp32(out: Any) -> Any:
    """accelerate 0.7 ``convert_to_fp32``: every fp16 tensor of the output (nested tuples, ModelOutput) as ``.float()``."""
    import torch

    if isinstance(out, torch.Tensor):
        return out.float() if out.dtype == torch.float16 else out
    if isinstance(out, tuple):
        return type(out)(to_fp32(t) for t in out)
    if isinstance(out, dict):
        return type(out)({k: to_fp32(v) for k, v in out.items()})
    return out


def events_of_run(batch: int, steps: int = 3, config: Any = None, amp: bool = True,
                  seq: int = SEQ) -> list[tuple[str, int, int]]:
    """The run's allocation events in order: weights and buffers, DDP's construction, then ``steps`` steps."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from transformers import GPT2LMHeadModel

    from perfguide.memory.tracing.cuda_emulation import make_cuda_emulation

    AFTER_FORWARD.clear()
    OPS.clear()
    PHASE[0] = "weights"
    config = config if config is not None else gpt2_config()
    log = AllocationLog.noting(OPS, PHASE)
    emulation = make_cuda_emulation(torch.float16 if amp else None, emulate_sdpa=True)
    with contextlib.ExitStack() as stack:
        stack.enter_context(FakeTensorMode(allow_non_fake_inputs=True))
        stack.enter_context(scalar_fallback())
        model = GPT2LMHeadModel(config)   # built on fake tensors; the head tied to wte
        model.train()
        assert model.lm_head.weight is model.transformer.wte.weight
        def batch_of_step() -> dict[str, Any]:
            ids = torch.randint(0, config.vocab_size, (batch, seq))
            return {"input_ids": ids, "attention_mask": torch.ones(batch, seq, dtype=torch.long), "labels": ids.clone()}

        ddp_amp_run(model, stack, log, emulation, steps, amp, batch_of_step, adamw_42, PHASE, AFTER_FORWARD)
    return log.events


def events_of_fsdp_run(row: str, batch: int, steps: int = 3, config: Any = None,
                       seq: int = SEQ) -> list[tuple[str, int, int]]:
    """Row ``row``'s run under FSDP1 (fp32), its events in order; the requests' streams in ``STREAMS``. GPT-2's head
    is untied first: 1.12 flattens the tied weight once in wte's unit and again where lm_head is wrapped."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from transformers import GPT2LMHeadModel

    from perfguide.memory.tracing.cuda_emulation import make_cuda_emulation

    model_id, full_shard, min_num_params, offload, world = FSDP_ROWS[row]
    AFTER_FORWARD.clear()
    OPS.clear()
    STREAMS.clear()
    PHASE[0] = "weights"
    config = config if config is not None else gpt2_config(model_id)
    log = AllocationLog.noting(OPS, PHASE)
    emulation = make_cuda_emulation(None, emulate_sdpa=True)
    with contextlib.ExitStack() as stack:
        stack.enter_context(FakeTensorMode(allow_non_fake_inputs=True))
        stack.enter_context(scalar_fallback())
        model = GPT2LMHeadModel(config)
        model.train()
        model.lm_head.weight = torch.nn.Parameter(torch.empty_like(model.lm_head.weight))
        units = fsdp1_wrap(log, model, min_num_params, world, full_shard, offload)

        def batch_of_step() -> dict[str, Any]:
            ids = torch.randint(0, config.vocab_size, (batch, seq))
            return {"input_ids": ids, "attention_mask": torch.ones(batch, seq, dtype=torch.long), "labels": ids.clone()}

        fsdp1_run(model, units, stack, log, emulation, steps, offload, batch_of_step, adamw_42, PHASE, AFTER_FORWARD)
    STREAMS.update(log.streams)
    return log.events


def ddp_amp_run(model: Any, stack: contextlib.ExitStack, log: AllocationLog, emulation: Any, steps: int, amp: bool,
                batch_of_step: Callable[[], dict[str, Any]],
                optimizer: Callable[[list[Any], dict[int, dict[str, Any]]], None], phase: list[str],
                after_forward: list[int], hold_batch: bool = True) -> None:
    """The blogs' accelerate loops under torch 1.x DDP, step by step: the weights and buffers moved to the GPU, DDP's
    construction, then each step's batch, the buffers' broadcast (``broadcast_buffers=True``), the forward (under
    autocast with ``amp``, its output converted to fp32 by accelerate), the scaled backward, the optimizer and an
    in-place ``zero_grad``. The output is rebound, so the previous step's dies only at the next forward's end;
    ``hold_batch`` False drops the batch once the forward has run."""
    params, buffers = list(model.parameters()), list(model.buffers())
    for t in params + buffers:   # model.to("cuda")
        log.charge(t, "to(cuda)")
    stack.enter_context(log.mode())
    buckets = ddp_start(phase, params + buffers, params)
    state: dict[int, dict[str, Any]] = {}
    outputs = batch_in = None
    for step in range(steps):
        if step == 1:
            buckets = ddp_rebuild(phase, params, buckets)
        phase[0] = f"step {step + 1} forward"
        batch_in = batch_of_step()
        broadcast_coalesced(buffers)   # broadcast_buffers=True: every forward
        emulation.cache_enabled = True
        with emulation:
            out = model(**batch_in)
            emulation.end_region()
        outputs = to_fp32(out) if amp else out   # rebinds: the previous step's output dies only here
        del out
        if not hold_batch:
            batch_in = None
        after_forward.append(len(log.events))
        loss = outputs.loss
        phase[0] = f"step {step + 1} backward"
        with emulation:
            emulation.backward(loss * 65536.0 if amp else loss)   # GradScaler.scale under fp16
        del loss
        phase[0] = f"step {step + 1} optimizer"
        optimizer(params, state)
        for p in params:
            p.grad.detach_().zero_()
    del outputs, batch_in, buckets


def fits(batch: int, cap: int, amp: bool, steps: int = 3, fsdp: str | None = None) -> tuple[bool, Allocator]:
    if fsdp is not None:
        return replay_under(events_of_fsdp_run(fsdp, batch, steps), cap, OPS.get, STREAMS)
    return replay_under(events_of_run(batch, steps, amp=amp), cap, OPS.get)


def card_cap(row_id: str) -> int:
    """The bytes the allocator may reserve: perfguide's TITAN RTX (CUDA's allocatable bytes) less the CUDA context
    and NCCL's buffers it prices for the row (bench/accuracy.py)."""
    from trace_t5_blog_replay import card_cap as cap

    return cap(row_id)


def main() -> int:
    args = sys.argv[1:]
    if "--release" in args:
        use_release(args[args.index("--release") + 1])
    amp = "--amp" in args
    fsdp = args[args.index("--fsdp") + 1] if "--fsdp" in args else None
    batch = int(args[args.index("--batch") + 1]) if "--batch" in args else 7
    steps = int(args[args.index("--steps") + 1]) if "--steps" in args else 3
    import transformers

    print(f"transformers {transformers.__version__}")
    if "--search" in args:
        cap = card_cap(fsdp or ("641" if amp else "640"))
        print(f"cap on reserved bytes: {cap / GiB:.3f} GiB")
        largest_fitting(lambda b: fits(b, cap, amp, steps, fsdp), max(1, batch - 2),
                        lambda b: f"b={b} {f'fsdp row {fsdp}' if fsdp else f'amp={amp}'}")
        return 0
    events = events_of_fsdp_run(fsdp, batch, steps) if fsdp else events_of_run(batch, steps, amp=amp)
    a = Allocator()
    a.replay(events, STREAMS)
    peak, at = live_peak(events)
    print(f"b={batch} amp={amp}: live peak {peak / GiB:.3f} GiB, allocator allocated {a.peak_allocated / GiB:.3f}, "
          f"reserved {a.peak_reserved / GiB:.3f}, segments {a.segments}")
    by: dict[str, int] = {}
    for k, v in at.items():
        key = OPS[k][3]
        by[key] = by.get(key, 0) + v
    for k, v in sorted(by.items(), key=lambda kv: -kv[1]):
        print(f"  {v / GiB:8.4f} GiB  {k}")
    print(f"after the last forward: {sum(live_at(events, AFTER_FORWARD[-1]).values()) / GiB:.3f} GiB alive")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
