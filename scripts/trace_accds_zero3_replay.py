"""The 2022 HF blog 'Accelerate Large Model Training using DeepSpeed' ZeRO-3 + CPU offload row (bench row 1166: GPT-2 XL
pre-trained from its config on wikitext-2 in blocks of 128 tokens, published max batch 16, 2x TITAN RTX) as a sequence
of allocations and frees at the real shape, on fake tensors, replayed through the caching allocator
(scripts/caching_allocator.py) under the card's cap, one rank.

Why: perfguide prices batch 26 under the card (row 1166 reads 26 against 16); this replay runs transformers 4.22's own
GPT-2 and DeepSpeed 0.7.2's ZeRO-3 parameter coordinator as its code allocates, to see which bytes the step holds.

What runs (each read in the sdist of deepspeed 0.7.2: runtime/zero/stage3.py, parameter_offload.py,
partitioned_param_coordinator.py, partition_parameters.py, runtime/comm/coalesced_collectives.py; accelerate 0.12's
``_prepare_deepspeed`` fills the config's "auto" values: ``reduce_bucket_size`` hidden^2, ``stage3_prefetch_bucket_size``
0.9 hidden^2, ``stage3_param_persistence_threshold`` 10 hidden):

* ``zero.Init`` (zero3_init_flag true, ``offload_param`` cpu): every parameter's fp16 partition lives on the host; a
  parameter under the persistence threshold (GPT-2 XL's biases and LayerNorms) is gathered once and stays; the
  module's buffers (4.22's 1024 x 1024 uint8 causal mask per block) are moved to the GPU;
* the ZeRO-3 hooks on every submodule: before its forward (and, through an identity autograd Function on its outputs,
  before its backward) the coordinator gathers the submodule's own parameters (``all_gather_coalesced``: one
  parameter: a padded buffer and its partition copied to the GPU; several: a flat buffer of all their partitions,
  each parameter then ``torch.cat`` into its own buffer at ``wait()``; all on the all-gather stream); after its
  forward (and, through a Function on its inputs, after its backward) it releases them, except, once the first step
  has recorded the trace, a parameter used again within ``stage3_max_reuse_distance`` (1e9) elements of the trace or
  already passed by the prefetcher; from the second step it prefetches ``stage3_prefetch_bucket_size`` elements ahead
  (capped by ``stage3_max_live_parameters``, 1e9); the same lru-cached release sets as 0.7.2 (keyed by submodule and
  trace step, so the second step's sets are reused in the third);
* each gradient (autograd's, full size, fp16) at its AccumulateGrad hook into the ipg bucket (``reduce_bucket_size``
  elements, fp16, made once): copied into the flat buffer when it fits, else kept; a full bucket is reduce-scattered
  (``reduce_scatter_coalesced``: the interleaved padded ``torch.cat`` unless a single divisible gradient), and each
  partition of this rank copied to its pinned host slot, back to the GPU (``grad_buffer.to(device)``), checked for
  inf / nan, normed in fp64 and copied to the fp32 host gradient (an fp32 temporary on the GPU: a cross-device copy
  that changes dtype converts on the source device); the gradient dropped. All on the reduction stream;
* the loop of run_clm_no_trainer.py: ``outputs = model(**batch)`` (input_ids, attention_mask, labels; the loss inside
  GPT-2, fp16; ``use_cache`` on, so each block's key and value are returned), ``total_loss += loss.detach().float()``,
  ``engine.backward(loss)`` (``(loss.float() * scale).backward()``, the epilogue's last bucket, the coordinator's
  ``reset_step``), ``engine.step()`` (``_partition_all_parameters``, DeepSpeedCPUAdam on the host); ``outputs``
  rebound each step, so the previous step's logits and keys / values live through the next forward.

Not replayed: DeepSpeed's host-side work, NCCL's own buffers (the cap leaves perfguide's NCCL bytes out), the 0.7.2
``LinearFunctionForZeroStage3`` that ``zero.Init`` puts in place of ``F.linear`` (the tied head's matmul; it saves the
same input and weight), the epoch-end evaluation at batch 1 and checkpointing.

Usage: python scripts/trace_accds_zero3_replay.py [--release DIR] [--batch B] [--steps N] [--layers L] [--search]
"""

from __future__ import annotations

import collections
import contextlib
import math
import os
import sys
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from allocation_log import AllocationLog
from caching_allocator import Allocator, replay_under
from trace_accds_blog_replay import print_run, search
from trace_gpt2_fsdp_blog_replay import SEQ, gpt2_config
from trace_t5_blog_replay import scalar_fallback, use_release

OPS: dict[int, tuple[str, tuple[int, ...], str, str]] = {}
PHASE = ["weights"]
AFTER_FORWARD: list[int] = []
STREAMS: dict[int, int] = {}
WORLD = 2
#: the engine's fp16 loss scale (dynamic; its value moves no byte)
LOSS_SCALE = 2.0**16
#: zero3_offload_config_accelerate.json: stage3_max_live_parameters, stage3_max_reuse_distance
MAX_LIVE, MAX_REUSE = int(1e9), int(1e9)
#: the streams of the replay: DeepSpeed's all-gather stream and its reduce-and-partition stream
GATHER_STREAM, REDUCE_STREAM = 1, 2


def auto_knobs(hidden: int) -> tuple[int, int, int]:
    """accelerate 0.12's "auto" values from the model config's hidden size: reduce_bucket_size, prefetch bucket,
    persistence threshold."""
    return hidden * hidden, int(0.9 * hidden * hidden), 10 * hidden


def own_params(module: Any) -> list[Any]:
    """``iter_params(module)``: the module's own parameters (not its children's), a tied one under every module holding it."""
    return [p for p in module._parameters.values() if p is not None]


class Coordinator:
    """DeepSpeed 0.7.2's ``PartitionedParameterCoordinator`` with the ``all_gather_coalesced`` it calls, on rank
    ``rank``: which parameters are gathered on the GPU, and when. ``gathered`` maps a parameter's id to the buffer its
    full fp16 data lives in (charged by the log); the parameters' own fake data stays full size and uncharged."""

    def __init__(self, params: list[Any], persistent: set[int], prefetch: int, log: AllocationLog,
                 world: int = WORLD) -> None:
        self.ds_id = {id(p): i for i, p in enumerate(params)}
        self.persistent, self.prefetch, self.log, self.world = persistent, prefetch, log, world
        self.gathered: dict[int, Any] = {}
        self.inflight: dict[int, dict[str, Any]] = {}
        self.active: dict[int, set[int]] = collections.defaultdict(set)
        self.complete = False
        self.recorded: list[Any] = []
        self.order: tuple[Any, ...] = ()
        self.param_order: list[tuple[Any, int]] = []
        self.fetched_at: dict[int, list[int]] = collections.defaultdict(list)
        self.release_cache: dict[tuple[int, int], set[int]] = {}
        self.snapshots: list[set[int]] = []
        self.reset_step()

    def reset_step(self) -> None:
        """After each backward: the first completes the trace (the parameters in module order, each with the trace
        step it is used at); the fetch queue refilled, the step count and available count zeroed."""
        if not self.complete:
            self.order = tuple(self.recorded)
            steps: dict[int, collections.deque[int]] = {k: collections.deque(v) for k, v in self.fetched_at.items()}
            self.param_order = []
            for m in self.order:
                step = steps[id(m)].popleft()
                for p in sorted(set(own_params(m)), key=lambda q: self.ds_id[id(q)]):
                    self.param_order.append((p, step))
            self.complete = bool(self.recorded)
        self.queue = collections.deque(self.param_order)
        self.most_recent: dict[int, int] = collections.defaultdict(lambda: -10**10)
        self.step_id = 0
        self.n_available = 0

    def _gather(self, params: list[Any]) -> None:
        """``__all_gather_params`` -> ``all_gather_coalesced`` on the all-gather stream."""
        import torch

        todo = [p for p in params if id(p) not in self.gathered and id(p) not in self.inflight]
        if not todo:
            return
        self.n_available += sum(p.numel() for p in todo)
        todo.sort(key=lambda p: self.ds_id[id(p)])
        with self.log.on_stream(GATHER_STREAM):
            if len(todo) == 1:   # the padded buffer, the partition copied to the GPU for the all-gather
                p = todo[0]
                part = math.ceil(p.numel() / self.world)
                buf = torch.empty(part * self.world, dtype=torch.float16)
                torch.empty(part, dtype=torch.float16)   # ds_tensor.to(device), dropped after the call
                self.gathered[id(p)] = buf
                return
            parts = [math.ceil(p.numel() / self.world) for p in todo]
            flat = torch.empty(sum(parts) * self.world, dtype=torch.float16)
            copies = [torch.empty(n, dtype=torch.float16) for n in parts]   # each ds_tensor.to(device), then cat(out=)
            del copies
            handle = {"flat": flat, "params": todo, "done": False, "pending": {id(p) for p in todo}}
            for p in todo:
                self.inflight[id(p)] = handle

    def _wait(self, p: Any) -> None:
        """``AllGatherCoalescedHandle.wait`` (the first wait splits every parameter of the call into its own buffer);
        the flat buffer goes with the handle's last registry entry."""
        import torch

        handle = self.inflight.pop(id(p), None)
        if handle is None:
            return
        if not handle["done"]:
            with self.log.on_stream(GATHER_STREAM):
                for q in handle["params"]:
                    self.gathered[id(q)] = torch.empty(q.numel(), dtype=torch.float16)
            handle["done"] = True
        handle["pending"].discard(id(p))
        if not handle["pending"]:
            handle["flat"] = None

    def fetch(self, module: Any) -> None:
        """``fetch_sub_module``: gather the module's parameters, wait for them, then (trace complete) pop them off the
        queue and prefetch ahead."""
        if not self.complete:
            self.recorded.append(module)
            self.fetched_at[id(module)].append(self.step_id)
        elif self.order[self.step_id] is not module:
            raise RuntimeError(f"trace diverged at step {self.step_id}")
        params = [p for p in own_params(module) if id(p) not in self.persistent]
        self._gather(params)
        for p in params:
            self.active[id(p)].add(id(module))
            self._wait(p)
        if self.complete:
            need = {id(p) for p in own_params(module) if self.most_recent[id(p)] < self.step_id}
            popped: set[int] = set()
            while self.queue and len(popped) < len(need):
                q, step = self.queue.popleft()
                self.most_recent[id(q)] = step
                popped.add(id(q))
            if popped != need:
                raise RuntimeError(f"parameter trace diverged at step {self.step_id}")
            budget = min(MAX_LIVE - self.n_available, self.prefetch)
            ahead: list[Any] = []
            numel = 0
            while self.queue and numel < budget:
                q, step = self.queue.popleft()
                do = id(q) not in self.gathered and id(q) not in self.inflight and id(q) not in self.persistent
                if any(q is r for r in ahead):
                    do = False
                self.most_recent[id(q)] = max(self.most_recent[id(q)], step)
                if do:
                    ahead.append(q)
                    numel += q.numel()
            self._gather(ahead)
        self.step_id += 1

    def _to_release(self, module: Any) -> set[int]:
        """``__params_to_release`` (lru-cached on the submodule and the step): not those the prefetcher passed at a
        later use, nor those used again within the reuse distance."""
        key = (id(module), self.step_id)
        if key in self.release_cache:
            return self.release_cache[key]
        out = {id(p) for p in own_params(module) if id(p) not in self.persistent}
        for p in own_params(module):
            if self.most_recent[id(p)] > self.step_id:
                out.discard(id(p))
        traversed = 0
        for m in self.order[self.step_id:]:
            if traversed >= MAX_REUSE:
                break
            for p in own_params(m):
                out.discard(id(p))
                traversed += p.numel()
        self.release_cache[key] = out
        return out

    def release(self, module: Any) -> None:
        """``release_sub_module``."""
        names = self._to_release(module) if self.complete else {id(p) for p in own_params(module)}
        for p in own_params(module):
            self.active[id(p)].discard(id(module))
            if id(p) in names and id(p) not in self.persistent:
                self._free(p)

    def _free(self, p: Any) -> None:
        if id(p) in self.gathered and not self.active[id(p)]:
            del self.gathered[id(p)]
            self.n_available -= p.numel()

    def release_all(self, params: list[Any]) -> None:
        """``_partition_all_parameters`` at the optimizer step (``release_and_reset_all``)."""
        for p in params:
            self.active[id(p)].clear()
            if id(p) not in self.persistent:
                self._free(p)


def install_hooks(model: Any, coord: Coordinator) -> list[Any]:
    """ZeRO-3's four hooks on every submodule, in 0.7.2's order: fetch before forward, release after it, an identity
    Function on the outputs whose backward fetches (pre-backward), one on the inputs whose backward releases once
    every input's gradient has come (post-backward)."""
    import torch

    class BeforeBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, module: Any, t: Any) -> Any:   # type: ignore[override]
            ctx.module = module
            module.zero_pending += 1
            return t.detach()

        @staticmethod
        def backward(ctx: Any, g: Any) -> Any:   # type: ignore[override]
            if ctx.module.zero_pending > 0:
                coord.fetch(ctx.module)
                ctx.module.zero_pending -= 1
            return None, g

    class AfterBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, module: Any, t: Any) -> Any:   # type: ignore[override]
            ctx.module = module
            if t.requires_grad:
                module.zero_remaining += 1
            return t.detach()

        @staticmethod
        def backward(ctx: Any, g: Any) -> Any:   # type: ignore[override]
            ctx.module.zero_remaining -= 1
            if ctx.module.zero_remaining == 0:
                coord.release(ctx.module)
            return None, g

    def wrap(module: Any, fn: Any, out: Any) -> Any:
        if isinstance(out, (tuple, list)):
            return out.__class__(wrap(module, fn, o) for o in out)
        if isinstance(out, dict):
            for k in list(out.keys()):
                out[k] = wrap(module, fn, out[k])
            return out
        if type(out) is torch.Tensor or isinstance(out, torch.Tensor):
            return fn.apply(module, out)
        return out

    def walk(module: Any) -> Any:   # _register_hooks_recursively: children first, a shared child once per parent
        for child in module.children():
            yield from walk(child)
        yield module

    handles = []
    for module in walk(model):   # 4.22's ACT2FN holds one NewGELUActivation that every block's MLP shares
        module.zero_pending = 0
        module.zero_remaining = 0

        def pre(m: Any, args: Any) -> None:
            coord.fetch(m)

        def post(m: Any, args: Any, out: Any) -> None:
            coord.release(m)

        def pre_backward(m: Any, args: Any, out: Any) -> Any:
            return wrap(m, BeforeBackward, out)

        def post_backward(m: Any, args: Any) -> Any:
            m.zero_remaining = 0
            return wrap(m, AfterBackward, args)

        handles += [module.register_forward_pre_hook(pre), module.register_forward_hook(post),
                    module.register_forward_hook(pre_backward), module.register_forward_pre_hook(post_backward)]
    return handles


class GradReducer:
    """Stage 3's ``reduce_independent_p_g_buckets_and_remove_grads`` with ``offload_optimizer`` (contiguous
    gradients): what each gradient's reduction allocates on the GPU, on the reduction stream."""

    def __init__(self, params: list[Any], ds_id: dict[int, int], bucket: int, log: AllocationLog, rank: int = 0,
                 world: int = WORLD) -> None:
        import torch

        self.bucket, self.log, self.rank, self.world, self.ds_id = bucket, log, rank, world, ds_id
        self.flat = torch.empty(bucket, dtype=torch.float16)   # __ipg_bucket_flat_buffer, made at init
        self.params: list[Any] = []
        self.elements = 0
        for p in params:
            p.register_post_accumulate_grad_hook(self.hook)

    def hook(self, p: Any) -> None:
        n = p.numel()
        if self.elements > 0 and self.elements + n > self.bucket:
            self.reduce()
        if self.elements + n < self.bucket:   # __add_grad_to_ipg_bucket: into the flat buffer
            with self.log.on_stream(REDUCE_STREAM):
                slot = self.flat.narrow(0, self.elements, n).view_as(p.grad)
                slot.copy_(p.grad)
                p.grad.data = slot.data
        self.params.append(p)
        self.elements += n

    def reduce(self) -> None:
        """``__reduce_and_partition_ipg_grads``: ``reduce_scatter_coalesced``, then ``__partition_grads``."""
        import torch

        if not self.params:
            return
        params = sorted(self.params, key=lambda q: self.ds_id[id(q)])
        with self.log.on_stream(REDUCE_STREAM), torch.no_grad():
            grads = [q.grad.view(-1) for q in params]
            chunks = [math.ceil(g.numel() / self.world) for g in grads]
            if len(grads) == 1 and grads[0].numel() % self.world == 0:
                flat = grads[0]
            else:
                pieces = []
                for r in range(self.world):
                    for g, c in zip(grads, chunks, strict=True):
                        piece = g[r * c:r * c + c]
                        pieces.append(piece)
                        if c - piece.numel() > 0:
                            pieces.append(torch.empty(c - piece.numel(), dtype=g.dtype))
                flat = torch.cat(pieces)
                del pieces
            flat.div_(self.world)
            mine = torch.chunk(flat, self.world)[self.rank]
            offset = 0
            for q, g, c in zip(params, grads, chunks, strict=True):
                part = mine.narrow(0, offset, min(c, max(0, g.numel() - self.rank * c)))
                offset += c
                if part.numel():
                    buf = torch.empty(part.numel(), dtype=torch.float16)   # the host slot's copy back to the GPU
                    bool(torch.isinf(buf).any())
                    bool(torch.isnan(buf).any())
                    float(buf.double().norm(2))   # _constant_buffered_norm2 (one 250M-element split)
                    buf.float()   # fp32_grad_tensor.copy_(grad_buffer): the dtype change on the source device
                    del buf
                q.grad = None
            del flat, mine, grads
        self.params, self.elements = [], 0


def run_zero3(model: Any, batch_of_step: Any, loss_of: Any, steps: int, log: AllocationLog, phase: list[str],
              knobs: tuple[int, int, int], emulation: Any, after_forward: list[int], rank: int = 0) -> Coordinator:
    """``steps`` steps of the blog's loop under ZeRO-3 on rank ``rank`` of ``model`` (fp16 parameters, built before the
    log's mode): the buffers and persistent parameters moved to the GPU, the ipg buffer, then per step the forward
    (``outputs`` rebound), ``loss_of(outputs)`` scaled and backward, the last bucket, ``reset_step``, the step's
    release of every gathered parameter. ``knobs``: reduce_bucket_size, prefetch bucket, persistence threshold. The
    coordinator is returned, with the parameters gathered after each forward in ``snapshots``."""
    import torch

    bucket, prefetch, persist = knobs
    params = list(model.parameters())
    persistent = {id(p) for p in params if p.numel() < persist}
    # the partitioned parameters' own data stands for their host partitions: views of it are not requests
    log.existing([p for p in params if id(p) not in persistent])
    for t in list(model.buffers()) + [p for p in params if id(p) in persistent]:
        log.charge(t, "to(cuda)")
    with log.mode():
        phase[0] = "zero init"
        coord = Coordinator(params, persistent, prefetch, log)
        reducer = GradReducer(params, coord.ds_id, bucket, log, rank)
        handles = install_hooks(model, coord)
        try:
            outputs = None
            total = torch.zeros((), dtype=torch.float32)
            for step in range(steps):
                phase[0] = f"step {step + 1} forward"
                batch_in = batch_of_step()
                with emulation:
                    out = model(**batch_in)
                outputs = out   # rebinds: the previous step's output dies only here
                del out, batch_in
                after_forward.append(len(log.events))
                coord.snapshots.append(set(coord.gathered))
                loss = loss_of(outputs)
                total = total + loss.detach().float()   # the loop's total_loss
                phase[0] = f"step {step + 1} backward"
                with emulation:
                    emulation.backward(loss.float() * LOSS_SCALE)
                del loss
                reducer.reduce()   # the epilogue's last bucket
                coord.reset_step()
                phase[0] = f"step {step + 1} optimizer"
                coord.release_all(params)   # step(): _partition_all_parameters; CPU Adam on the host
            del outputs
        finally:
            for h in handles:   # 4.22's shared activation module outlives the run
                h.remove()
    return coord


def events_of_run(batch: int, steps: int = 3, config: Any = None, rank: int = 0,
                  seq: int = SEQ) -> list[tuple[str, int, int]]:
    """The run's allocation events on rank ``rank`` in order: GPT-2 XL (or ``config``) from its config, fp16, the
    blog's batches of ``seq``-token blocks (input_ids, attention_mask, labels)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from transformers import GPT2LMHeadModel

    from perfguide.memory.tracing.cuda_emulation import make_cuda_emulation

    AFTER_FORWARD.clear()
    OPS.clear()
    STREAMS.clear()
    PHASE[0] = "weights"
    config = config if config is not None else gpt2_config("openai-community/gpt2-xl")
    log = AllocationLog.noting(OPS, PHASE)
    emulation = make_cuda_emulation(None, emulate_sdpa=True)   # no autocast: the engine runs the fp16 module
    with contextlib.ExitStack() as stack:
        stack.enter_context(FakeTensorMode(allow_non_fake_inputs=True))
        stack.enter_context(scalar_fallback())
        model = GPT2LMHeadModel(config)
        model.train()
        assert model.lm_head.weight is model.transformer.wte.weight
        for t in list(model.parameters()) + list(model.buffers()):   # zero.Init's fp16; the engine's half()
            if t.is_floating_point():
                t.data = t.data.half()

        def batch_of_step() -> dict[str, Any]:
            ids = torch.randint(0, config.vocab_size, (batch, seq))
            return {"input_ids": ids, "attention_mask": torch.ones(batch, seq, dtype=torch.long), "labels": ids.clone()}

        run_zero3(model, batch_of_step, lambda o: o.loss, steps, log, PHASE, auto_knobs(config.n_embd), emulation,
                  AFTER_FORWARD, rank)
    STREAMS.update(log.streams)
    return log.events


def fits(batch: int, cap: int, steps: int = 3, config: Any = None) -> tuple[bool, Allocator]:
    return replay_under(events_of_run(batch, steps, config), cap, OPS.get, STREAMS)


def main() -> int:
    args = sys.argv[1:]
    if "--release" in args:
        use_release(args[args.index("--release") + 1])
    batch = int(args[args.index("--batch") + 1]) if "--batch" in args else 16
    steps = int(args[args.index("--steps") + 1]) if "--steps" in args else 3
    config = None
    if "--layers" in args:
        config = gpt2_config("openai-community/gpt2-xl", layers=int(args[args.index("--layers") + 1]))
    import transformers

    print(f"transformers {transformers.__version__}")
    if "--search" in args:
        search("1166", lambda b, cap: fits(b, cap, steps, config), batch, f"{SEQ}")
        return 0
    events = events_of_run(batch, steps, config)
    print_run(events, f"b={batch} {SEQ}", OPS, AFTER_FORWARD[-1], STREAMS)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
