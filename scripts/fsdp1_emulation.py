"""torch 1.12's FullyShardedDataParallel (FSDP1, one FlatParameter per unit) as its GPU allocations, on fake tensors.

Why: the replays (scripts/caching_allocator.py) read a step's reserved bytes from its own order of requests, and the
2022 PyTorch FSDP blog's rows ran this FSDP (PyTorch nightly ~1.12, accelerate 0.7). Real FSDP needs a process group
and real storage; this module does what its code allocates, in its order, around a module built on fake tensors.

Read in torch 1.12.0's torch/distributed/fsdp (fully_sharded_data_parallel.py, flatten_params_wrapper.py, wrap.py):

* units: ``_recursive_wrap`` with the size policy (``size_based_auto_wrap_policy``, accelerate 0.7's
  ``default_auto_wrap_policy``): a module is recursed into when its not-yet-wrapped parameters reach
  ``min_num_params``, wrapped when what its children left does (not a ModuleList / ModuleDict), children first; the
  root (``only_wrap_children``) takes what is left. Each unit flattens its parameters into one FlatParameter (a
  tied parameter flattened by one unit is still a Parameter of the other module, flattened again there: the caller
  unties it first);
* the shard: ``_shard_parameters`` keeps chunk ``rank`` of the flat parameter, padded to ceil(numel / world); after
  ``model.to(device)`` (accelerate 0.7 ``prepare_model``, when parameters are not offloaded) it is one block per unit;
* ``_lazy_init`` (each unit's first forward, on the default stream): ``_full_param_padded = torch.zeros(shard x
  world)`` and its storage freed at once;
* ``_rebuild_full_params`` (each forward, and each pre-backward hook of a unit resharded after its forward) on the
  ``all_gather`` stream: with CPU offload a GPU copy of the shard (``p.data.to(device)``, dropped when the gather is
  done), then ``_alloc_storage`` of the padded full parameter; the forward and backward use views of it;
* after the forward: FULL_SHARD frees it (``_free_full_params``: ``storage().resize_(0)``, so views saved for
  backward do not keep it), SHARD_GRAD_OP and the root (``_lazy_init``: root ``reshard_after_forward = False``) keep it
  to their post-backward hook;
* the post-backward hook (on the FlatParameter's AccumulateGrad: its full unsharded gradient is made by autograd,
  the ``cat`` of the views' gradients): frees the full parameter, then on the ``post_backward`` stream
  ``F.pad(grad_flatten, [0, num_pad])`` (a padded copy; a clone when no padding) and ``torch.zeros_like(chunk)`` for
  the reduce-scatter output; the output is added into ``_saved_grad_shard`` (the previous step's gradient shard,
  ``_prep_grads_for_backward``) or becomes it; the full gradient, the padded copy and the output die at the hook's
  return;
* CPU offload: the gradient shard is copied to the pinned ``_cpu_grad`` and the GPU shard is dropped only at the end
  of the backward (``_finalize_params``: ``delattr(p, "_saved_grad_shard")``); the optimizer steps on the CPU;
  without offload ``p.grad = _saved_grad_shard`` stays (zeroed in place by ``zero_grad``) and the optimizer's states
  are made on the GPU shard.

Streams: requests on the ``all_gather`` and ``post_backward`` streams are tagged (``AllocationLog.on_stream``), and the
replay keeps each stream's free blocks for its own requests. ``record_stream`` timing is not replayed: a freed block
is free at once, an optimistic reading where the real allocator waits for the other stream's events.
One rank (``world`` 1) keeps each flat parameter whole: nothing is gathered or reduce-scattered, and under offload
each forward and pre-backward hook copies the whole flat parameter to the GPU (``p.data.to(device)``), the views the
forward made (module attributes until the next forward, tensors saved for backward) keeping the forward's copy, and the
unsharded gradient stays ``p.grad`` until ``_finalize_params`` swaps in ``_cpu_grad``.
No ``backward_prefetch`` (accelerate 0.7 passes None unless configured), no mixed precision, no NO_SHARD.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from allocation_log import AllocationLog

ALL_GATHER, POST_BACKWARD = 1, 2


def size_wrap_units(model: Any, min_num_params: int) -> list[tuple[Any, list[tuple[Any, str]]]]:
    """torch 1.12 ``_recursive_wrap`` under the size policy: (wrapped module, its (module, name) parameters in
    ``named_modules`` order) per unit, in wrapping order (children first), the root last (possibly with none)."""
    import torch

    taken: set[int] = set()
    units: list[tuple[Any, list[tuple[Any, str]]]] = []

    def own(m: Any) -> list[tuple[Any, str]]:
        out = []
        for sub in m.modules():
            for name, p in sub.named_parameters(recurse=False):
                if id(p) not in taken:
                    taken.add(id(p))
                    out.append((sub, name))
        return out

    def wrap(m: Any, only_children: bool = False) -> int:
        n = sum(p.numel() for p in m.parameters() if id(p) not in taken)
        if n < min_num_params:
            return 0
        wrapped = sum(wrap(child) for child in m.children())
        if not only_children and n - wrapped >= min_num_params and not isinstance(m, (torch.nn.ModuleList, torch.nn.ModuleDict)):
            units.append((m, own(m)))
            return n
        return wrapped

    wrap(model, only_children=True)
    units.append((model, own(model)))
    return units


def _tensors(out: Any) -> Iterator[Any]:
    import torch

    if isinstance(out, torch.Tensor):
        yield out
    elif isinstance(out, dict):
        for v in out.values():
            yield from _tensors(v)
    elif isinstance(out, (list, tuple)):
        for v in out:
            yield from _tensors(v)


class Unit:
    """One FSDP1 instance: its FlatParameter (full size, never charged: the views' base), its GPU shard, the gathered
    padded full parameter while it exists, and the saved gradient shard."""

    def __init__(self, log: AllocationLog, owner: Any, places: list[tuple[Any, str]], world: int, reshard: bool,
                 offload: bool) -> None:
        import torch

        self.log, self.owner, self.world, self.reshard, self.offload = log, owner, world, reshard, offload
        self.places = [(m, n, tuple(getattr(m, n).shape)) for m, n in places]
        self.numels = [getattr(m, n).numel() for m, n in places]
        self.numel = sum(self.numels)
        self.sharded = world > 1   # _shard_parameters: one rank (or NO_SHARD) keeps the flat parameter whole
        self.shard = -(-self.numel // world)
        self.flat = torch.nn.Parameter(torch.empty(self.numel)) if places else None
        self.host = self.flat.data if self.flat is not None else None   # p._local_shard, never charged
        for m, n in places:
            del m._parameters[n]
        if self.flat is not None:   # a parameter of the module, as FlattenParamsWrapper registers it (``dtype`` reads it)
            owner.register_parameter("flat_param", self.flat)
            log.existing([self.flat])
            self.flat.register_post_accumulate_grad_hook(self._post_backward)
        self.local: Any = None   # the GPU shard (None while offloaded)
        self.full: Any = None
        self.saved_grad: Any = None
        self.initialized = False
        self.pre_backward_ran = False
        owner.register_forward_pre_hook(lambda m, args: self._pre_forward())
        owner.register_forward_hook(lambda m, args, out: self._post_forward(out))

    def to_device(self) -> None:
        """``model.to(device)`` after the wrap: the shard as one block (``_shard_parameters``' padded chunk)."""
        import torch

        if self.flat is not None:
            self.local = torch.nn.Parameter(torch.empty(self.shard))

    def _gather(self) -> None:
        """``_rebuild_full_params`` on the all_gather stream (nothing when the full parameter is still there). Unsharded
        under offload: ``p.data = p.data.to(device)``, the whole flat parameter copied and used as it is, so the views
        made from it (the module's attributes, the tensors saved for backward) keep the copy alive."""
        import torch

        if self.flat is None or self.full is not None:
            return
        if not self.sharded:
            if self.offload:
                with self.log.on_stream(ALL_GATHER):
                    self.flat.data = torch.empty(self.numel)
            return
        with self.log.on_stream(ALL_GATHER):
            copy = torch.empty(self.shard) if self.offload else None   # p.data.to(compute_device)
            self.full = torch.empty(self.shard * self.world)   # _alloc_storage(p._full_param_padded)
            del copy

    def _pre_forward(self) -> None:
        import torch

        if self.flat is None:
            return
        if not self.initialized:   # _lazy_init -> _init_param_attributes, default stream
            self.initialized = True
            if self.sharded:
                torch.zeros(self.shard * self.world)
        self._gather()
        for (m, n, shape), view in zip(self.places, self.flat.split(self.numels)):
            setattr(m, n, view.view(shape))   # FlattenParamsWrapper._unflatten_params_as_views
        self.pre_backward_ran = False

    def _post_forward(self, out: Any) -> None:
        if self.flat is None:
            return
        if self.reshard:
            self.full = None   # _free_full_params
        self._use_local_shard()
        for t in _tensors(out):
            if t.requires_grad:
                t.register_hook(lambda grad: self._pre_backward())

    def _pre_backward(self) -> None:
        if not self.pre_backward_ran:
            self.pre_backward_ran = True
            self._gather()

    def _use_local_shard(self) -> None:
        """``_use_param_local_shard``: ``p.data = p._local_shard`` (what else holds the old data keeps it)."""
        if self.flat is not None and not self.sharded and self.offload:
            self.flat.data = self.host

    def _post_backward(self, flat: Any) -> None:
        import torch

        self.full = None
        self._use_local_shard()
        if not self.sharded:   # no reduce-scatter; the gradient stays p.grad (copied to _cpu_grad) to _finalize_params
            return
        grad, flat.grad = flat.grad, None
        with self.log.on_stream(POST_BACKWARD):
            padded = torch.empty(self.shard * self.world)   # F.pad(grad_flatten, [0, num_pad])
            output = torch.zeros(self.shard)   # torch.zeros_like(chunks[0]), the reduce-scatter's output
            if self.saved_grad is None:
                self.saved_grad = output
            else:
                self.saved_grad += output
        del grad, padded, output

    def finish_backward(self) -> None:
        """``_finalize_params``: under offload the GPU gradient shard is dropped (``p.grad = p._cpu_grad``)."""
        if self.offload:
            self.saved_grad = None
            if self.flat is not None and not self.sharded:
                self.flat.grad = None   # p.grad = p._cpu_grad


def wrap(log: AllocationLog, model: Any, min_num_params: int, world: int, full_shard: bool,
         offload: bool) -> list[Unit]:
    """FSDP1 over ``model`` (its parameters removed, forwards hooked), the units in module order (the root first), as
    ``_finalize_params`` walks them."""
    units = [Unit(log, m, places, world, reshard=full_shard and m is not model, offload=offload)
             for m, places in size_wrap_units(model, min_num_params)]
    order = {id(m): i for i, m in enumerate(model.modules())}
    return sorted(units, key=lambda u: order[id(u.owner)])


def run(model: Any, units: list[Unit], stack: Any, log: AllocationLog, emulation: Any, steps: int, offload: bool,
        batch_of_step: Callable[[], dict[str, Any]],
        optimizer: Callable[[list[Any], dict[int, dict[str, Any]]], None], phase: list[str],
        after_forward: list[int]) -> None:
    """The 2022 blog's accelerate 0.7 loop under FSDP1: ``model.to(device)`` of the shards and buffers (offload: the
    buffers only, moved by the root's ``_lazy_init``), then per step the batch, ``outputs = model(**batch)`` (rebound:
    the previous output dies after the next forward), the backward with its hooks, ``_finalize_params``, the optimizer
    on the shards (offload: on the CPU) and ``zero_grad`` in place."""
    stack.enter_context(log.mode())
    import torch

    phase[0] = "weights"
    if not offload:
        for u in units:
            u.to_device()
    for b in model.buffers():
        log.charge(b, "to(cuda)")
    state: dict[int, dict[str, Any]] = {}
    outputs = batch_in = None
    for step in range(steps):
        phase[0] = f"step {step + 1} forward"
        batch_in = batch_of_step()
        with emulation:
            out = model(**batch_in)
            emulation.end_region()
        outputs = out
        del out
        after_forward.append(len(log.events))
        loss = outputs.loss
        phase[0] = f"step {step + 1} backward"
        with emulation:
            emulation.backward(loss)
        del loss
        for u in units:
            u.finish_backward()
        phase[0] = f"step {step + 1} optimizer"
        if not offload:
            shards = [u.local for u in units if u.local is not None]
            for u in units:
                if u.local is not None:
                    u.local.grad = u.saved_grad
            optimizer(shards, state)
            for p in shards:
                p.grad.detach_().zero_()
                p.grad = None   # the unit keeps it as saved_grad (1.12: _saved_grad_shard = p.grad.data)
    del torch, outputs, batch_in
