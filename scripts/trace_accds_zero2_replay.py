"""The 2022 HF blog 'Accelerate Large Model Training using DeepSpeed' ZeRO-2 rows (bench rows 1160: DeBERTa-v2-xlarge-mnli
on MRPC, published max batch 40; 1163: BlenderBot-400M-distill on MuDoConv, source 128 / target 64 tokens, max batch
200; 2x TITAN RTX) as a sequence of allocations and frees at the real shape, on fake tensors, replayed through the
caching allocator (scripts/caching_allocator.py) under the card's cap, one rank at a time.

Why: perfguide prices row 1160's batch 40 0.6 GiB over the card (max batch 36) and row 1163's 276 against 200; the
DDP rows of the same blog are replayed by scripts/trace_accds_blog_replay.py (docs/validation.md 35), whose model
code, batches and Adam this module imports. Here DeepSpeed 0.7.2's engine runs the step instead of DDP and autocast.

What runs (each read in the sdist of deepspeed 0.7.2, runtime/engine.py and runtime/zero/stage_1_and_2.py, and in
accelerate 0.12.0's accelerator.py / utils/deepspeed.py):

* ``deepspeed.initialize`` from accelerate's ``_prepare_deepspeed`` (no autocast: ``prepare_model`` is not called on
  this path): the engine's ``module.half()`` and ``module.to(device)`` (one block per parameter and buffer);
* ``DeepSpeedZeroOptimizer.__init__`` for each param group (the scripts' two: weight decay / ``no_decay = ["bias",
  "LayerNorm.weight"]``): ``move_to_cpu`` of the group's parameters (their blocks freed), the group flattened on the
  host (padded to a multiple of 2 x world size elements) and moved to the GPU in one block, the parameters pointed at
  views of it, then this rank's fp32 partition ``partition.clone().float()``; ``initialize_optimizer_states``: a zero
  fp32 gradient per partition and one ``optimizer.step()`` (the moments made, and torch 1.12 single-tensor AdamW's
  temporaries), then the gradients dropped;
* per step, ``outputs = model(**batch)`` in fp16 (the loss inside the model), then accelerate's
  ``DeepSpeedEngineWrapper.backward``: ``engine.backward(loss)`` - the ipg buffer(s) (``reduce_bucket_size`` fp16
  elements; a second with ``overlap_comm``), ``(loss.float() * scale).backward()`` with the AccumulateGrad hook
  ``reduce_independent_p_g_buckets_and_remove_grads`` (each gradient copied into the ipg buffer and pointed at its
  slot; a full bucket is reduced in place, then the gradients of this rank's partition copied into
  ``grads_in_partition``, one fp16 buffer over all groups made at the first such copy, the others dropped), the
  epilogue (the last bucket, ``averaged_gradients`` as views, the ipg buffers released, ``zero_grad``) - and
  ``engine.step()``: the overflow check (``x.float().sum()`` per gradient), the norm (``g.double().norm(2)`` per
  gradient), per group the flat fp16 gradient and its fp32 copy, AdamW on the fp32 partition, the fp32 gradient
  dropped; the all-gather writes into views (no allocation).

The dynamic loss scale's skipped steps (overflow) are not replayed: every step here applies the optimizer, the
costlier path. Small tensors of DeepSpeed's bookkeeping (the overflow flag, the norm's 1-element tensor) are.

Usage: python scripts/trace_accds_zero2_replay.py [--release DIR] {deberta|blenderbot} [--batch B] [--rank R]
       [--len L] [--steps N] [--search]
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from allocation_log import AllocationLog
from caching_allocator import Allocator, replay_under
from trace_accds_blog_replay import _adam_loop, batch_of, config_of, fake_model, print_run, run_args, search

#: the op, shape, dtype and phase that made each event's storage (for reading a replay)
OPS: dict[int, tuple[str, tuple[int, ...], str, str]] = {}
PHASE = ["weights"]
#: the event count when each step's output is returned (its backward not yet begun)
AFTER_FORWARD: list[int] = []
#: events whose request is made on DeepSpeed's reduction stream (key -> 1; AllocationLog.streams)
STREAMS: dict[int, int] = {}
#: the ZeRO-2 rows: bench row, reduce_bucket_size, overlap_comm (1160: accelerate's DeepSpeedPlugin without a config
#: file, DeepSpeed 0.7.2's defaults 5e8 and overlap_comm = stage == 3; 1163: zero2_config_accelerate.json)
ZERO_ROWS = {"deberta": ("1160", int(5e8), False), "blenderbot": ("1163", int(2e8), True)}
WORLD = 2
#: both scripts' ``no_decay``: the second param group (weight decay 0)
NO_DECAY = ("bias", "LayerNorm.weight")
#: the engine's fp16 loss scale (dynamic; its value moves no byte)
LOSS_SCALE = 2.0**15


def param_groups(model: Any) -> list[list[Any]]:
    """The scripts' two AdamW param groups, in ``named_parameters`` order (tied weights once)."""
    named = list(model.named_parameters())
    return [[p for n, p in named if not any(nd in n for nd in NO_DECAY)],
            [p for n, p in named if any(nd in n for nd in NO_DECAY)]]


class Zero2Engine:
    """DeepSpeed 0.7.2's ZeRO stage 2 (``DeepSpeedZeroOptimizer``, contiguous_gradients, reduce_scatter, no offload) on
    rank ``rank`` of ``world``: what it allocates on the GPU, in its order. ``host`` maps each parameter's id to the
    host tensor ``move_to_cpu`` leaves it on (made outside the log: host memory). ``side_stream()`` is the context
    the engine's requests on its reduction stream are made in (``AllocationLog.on_stream``): with overlap_comm,
    ``reduce_ipg_grads`` runs ``copy_grads_in_partition`` under ``torch.cuda.stream(self.reduction_stream)``, so
    ``grads_in_partition`` is that stream's block."""

    def __init__(self, groups: list[list[Any]], host: dict[int, Any], rank: int, bucket: int, overlap: bool,
                 phase: list[str], world: int = WORLD, side_stream: Any = None) -> None:
        import torch

        self.groups, self.rank, self.bucket, self.overlap, self.phase = groups, rank, bucket, overlap, phase
        self.side_stream = side_stream if side_stream is not None else contextlib.nullcontext
        self.flats: list[Any] = []
        self.fp32: list[Any] = []
        self.partition_size: list[int] = []
        self.in_partition: list[list[Any]] = []
        self.first_offset: list[int] = []
        phase[0] = "zero init"
        for group in groups:
            for p in group:   # move_to_cpu: the GPU blocks freed
                p.data = host[id(p)]
            total = sum(p.numel() for p in group)
            total += -total % (2 * world)   # flatten_dense_tensors_aligned(..., nccl_start_alignment_factor * world)
            flat = torch.empty(total, dtype=torch.float16)   # flattened on the host, then .cuda(): one block
            offset = 0
            for p in group:   # _update_model_bit16_weights: the parameters become views of the flat
                p.data = flat.narrow(0, offset, p.numel()).view_as(p)
                offset += p.numel()
            size = total // world
            self.flats.append(flat)
            self.partition_size.append(size)
            self.fp32.append(flat.narrow(0, rank * size, size).clone().float().detach())
            inside, first = self._partition_info(group, size)
            self.in_partition.append(inside)
            self.first_offset.append(first)
        self.in_mine = {id(p) for ps in self.in_partition for p in ps}
        self.grads_in_partition: Any = None
        self.grads_offset = 0
        self.ipg: list[Any] = []
        self.ipg_index = 0
        self.bucket_params: list[Any] = []
        self.elements = 0
        self.averaged: dict[int, Any] = {}
        self.state: dict[int, dict[str, Any]] = {}
        for group in groups:   # create_reduce_and_remove_grad_hooks (the AccumulateGrad hook, after .grad is set)
            for p in group:
                p.register_post_accumulate_grad_hook(self._hook)
        phase[0] = "zero optimizer states"
        for fp32 in self.fp32:   # initialize_optimizer_states: a zero gradient each, one optimizer.step()
            fp32.grad = torch.zeros(fp32.numel(), dtype=torch.float32)
        for fp32 in self.fp32:   # torch 1.12 AdamW.step: one _single_tensor_adamw call per param group
            _adam_loop([fp32], self.state, 2e-5)
        for fp32 in self.fp32:
            fp32.grad = None

    def _partition_info(self, group: list[Any], size: int) -> tuple[list[Any], int]:
        """``get_partition_info``: the parameters that start in this rank's range, and the one that straddles its start."""
        start, end = size * self.rank, size * (self.rank + 1)
        inside, first, current = [], 0, 0
        for p in group:
            if start <= current < end:
                inside.append(p)
            elif current < start < current + p.numel():
                inside.append(p)
                first = start - current
            current += p.numel()
        return inside, first

    def _hook(self, p: Any) -> None:
        """``reduce_independent_p_g_buckets_and_remove_grads`` (contiguous_gradients)."""
        if self.elements + p.numel() > self.bucket:
            self._reduce_ipg_grads()
            if self.overlap:
                self.ipg_index = 1 - self.ipg_index
        assert p.numel() <= self.bucket, "an extra-large parameter (reduced from its own .grad) is not replayed"
        slot = self.ipg[self.ipg_index].narrow(0, self.elements, p.numel())
        slot.copy_(p.grad.view(-1))
        p.grad.data = slot.data.view_as(p.grad)
        self.elements += p.numel()
        self.bucket_params.append(p)

    def _reduce_ipg_grads(self) -> None:
        """The bucket reduced in place (``average_tensor``: ``div_`` and ``dist.reduce`` of slices), then each gradient
        dropped, or copied into ``grads_in_partition`` when this rank owns it (``copy_grads_in_partition``)."""
        import torch

        for p in self.bucket_params:
            if id(p) not in self.in_mine:
                p.grad = None
                continue
            if self.grads_in_partition is None:
                total = sum(q.numel() for ps in self.in_partition for q in ps)
                with self.side_stream() if self.overlap else contextlib.nullcontext():
                    self.grads_in_partition = torch.empty(total, dtype=torch.float16)
                self.grads_offset = 0
            slot = self.grads_in_partition.narrow(0, self.grads_offset, p.numel())
            slot.copy_(p.grad.view(-1))
            p.grad.data = slot.data.view_as(p.grad)
            self.grads_offset += p.numel()
        self.bucket_params, self.elements = [], 0

    def backward(self, loss: Any, emulation: Any) -> None:
        """``engine.backward(loss)`` then ``allreduce_gradients`` (ZeRO-2: the epilogue)."""
        import torch

        self.ipg = [torch.empty(self.bucket, dtype=torch.float16) for _ in range(2 if self.overlap else 1)]
        self.ipg_index = 0
        with emulation:
            emulation.backward(loss.float() * LOSS_SCALE)   # LossScaler.backward(loss.float())
        self._epilogue()

    def _epilogue(self) -> None:
        """``independent_gradient_partition_epilogue``: the last bucket, ``averaged_gradients`` as views of this rank's
        gradients (``get_flat_partition(..., return_tensor_list=True)``), the ipg buffers released, ``zero_grad``."""
        import torch

        self._reduce_ipg_grads()
        for i, params in enumerate(self.in_partition):
            views, current, size = [], 0, self.partition_size[i]
            for j, p in enumerate(params):
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                offset = self.first_offset[i] if j == 0 else 0
                n = min(p.numel() - offset, size - current)
                g = p.grad
                views.append(g.contiguous().view(-1).narrow(0, offset, n) if offset or n < g.numel() else g)
                current += n
            if current < size:
                views.append(torch.zeros(size - current, dtype=torch.float16))
            self.averaged[i] = views
        self.ipg = []
        self.grads_in_partition = None
        for group in self.groups:
            for p in group:
                p.grad = None

    def _has_overflow(self) -> None:
        """``has_overflow_partitioned_grads_serial``: an fp32 copy of each averaged gradient, summed; the flag."""
        import torch

        for views in self.averaged.values():
            for g in views:
                float(g.float().sum())
        torch.zeros(1, dtype=torch.uint8)   # overflow_gpu

    def _grad_norm(self, i: int) -> None:
        """``get_grad_norm_direct``: an fp64 copy of each averaged gradient of group ``i``, its norm; the total. It
        zips the gradients with the owned parameters, so the last partition's zero padding is not normed."""
        import torch

        for g in self.averaged[i][:len(self.in_partition[i])]:
            float(g.double().norm(2))
        torch.zeros(1)   # total_norm_cuda

    def step(self) -> None:
        """``engine.step()`` -> ``DeepSpeedZeroOptimizer.step`` without overflow, then the optimizer's ``zero_grad``."""
        import torch

        with torch.no_grad():
            self._has_overflow()
            for i in self.averaged:   # scaled_global_norm: get_grad_norm_direct per group
                self._grad_norm(i)
            for i, fp32 in enumerate(self.fp32):
                flat = torch.cat([g.reshape(-1) for g in self.averaged[i]])   # flatten(averaged_gradients[i])
                grad = flat.to(torch.float32)
                del flat
                fp32.grad = grad
                self.averaged[i] = None
                grad.mul_(1.0 / LOSS_SCALE)   # unscale_and_clip_grads: in place
                _adam_loop([fp32], self.state, 2e-5)
                fp32.grad = None
                del grad
                part = self.flats[i].narrow(0, self.rank * self.partition_size[i], self.partition_size[i])
                part.copy_(fp32)   # the fp16 copy-back; the all-gather then writes into the flat's views
        self.averaged = {}


def events_of_run(kind: str, batch: int, src: int, tgt: int = 0, steps: int = 3, config: Any = None,
                  rank: int = 0, bucket: int | None = None, overlap: bool | None = None) -> list[tuple[str, int, int]]:
    """The run's allocation events on rank ``rank`` in order: the engine's fp16 model, ZeRO-2's flats, fp32 partition
    and moments, then ``steps`` steps."""
    import torch

    from perfguide.memory.tracing.cuda_emulation import make_cuda_emulation

    AFTER_FORWARD.clear()
    OPS.clear()
    STREAMS.clear()
    PHASE[0] = "weights"
    config = config if config is not None else config_of(kind)
    _, row_bucket, row_overlap = ZERO_ROWS[kind]
    bucket = row_bucket if bucket is None else bucket
    overlap = row_overlap if overlap is None else overlap
    log = AllocationLog.noting(OPS, PHASE)
    emulation = make_cuda_emulation(None, emulate_sdpa=True)   # no autocast: the engine runs the fp16 module
    with contextlib.ExitStack() as stack:
        model = fake_model(stack, kind, config)
        groups = param_groups(model)
        for t in list(model.parameters()) + list(model.buffers()):   # module.half() on the host (torch 1.12's _apply)
            if t.is_floating_point():
                t.data = t.data.half()
        host = {id(p): torch.empty_like(p) for group in groups for p in group}
        for t in list(model.parameters()) + list(model.buffers()):   # module.to(device)
            log.charge(t, "to(cuda)")
        stack.enter_context(log.mode())
        engine = Zero2Engine(groups, host, rank, bucket, overlap, PHASE, side_stream=lambda: log.on_stream(1))
        outputs = None
        for step in range(steps):
            PHASE[0] = f"step {step + 1} forward"
            batch_in = batch_of(kind, config, batch, src, tgt)
            with emulation:
                out = model(**batch_in)
            outputs = out   # rebinds: the previous step's output dies only here
            del out, batch_in
            AFTER_FORWARD.append(len(log.events))
            loss = outputs.loss
            PHASE[0] = f"step {step + 1} backward"
            engine.backward(loss, emulation)
            del loss
            PHASE[0] = f"step {step + 1} optimizer"
            engine.step()
        del outputs, engine
    STREAMS.update(log.streams)
    return log.events


def fits(kind: str, batch: int, src: int, tgt: int, cap: int, steps: int = 3, rank: int = 0) -> tuple[bool, Allocator]:
    return replay_under(events_of_run(kind, batch, src, tgt, steps, rank=rank), cap, OPS.get, STREAMS)


def main() -> int:
    args = sys.argv[1:]
    kind, src, tgt, batch, steps = run_args(args)
    rank = int(args[args.index("--rank") + 1]) if "--rank" in args else 0
    import transformers

    print(f"transformers {transformers.__version__}, rank {rank}")
    if "--search" in args:
        search(ZERO_ROWS[kind][0], lambda b, cap: fits(kind, b, src, tgt, cap, steps, rank), batch, f"{src}/{tgt}")
        return 0
    events = events_of_run(kind, batch, src, tgt, steps, rank=rank)
    print_run(events, f"b={batch} {src}/{tgt}", OPS, AFTER_FORWARD[-1], STREAMS)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
