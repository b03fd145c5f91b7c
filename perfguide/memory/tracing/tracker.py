"""Live-bytes accounting of fake tensors, by category and by phase of the training step.

A storage is charged when an op first returns it and released when Python frees it (weakref finalizer), which
is what the CUDA caching allocator reports as ``allocated`` once every request is rounded to its 512-byte block.
Categories are decided by *when* a storage is born (forward -> activation, backward -> temporary, optimizer
step -> optimizer temporary) and relabelled when we learn more (a gradient lands in ``.grad``), the accounting
that ``torch.distributed._tools.MemTracker`` uses, at a fraction of its cost.

The same pass counts **traffic**: the bytes each memory-bound op reads and writes (its tensor inputs and outputs),
by phase. GEMMs and fused attention kernels are left out (they are compute-bound and priced by FLOPs), and so are
views and allocations, which move nothing. The speed model prices those bytes at memory bandwidth
(perfguide.speed.terms.elementwise_bytes), so the count is of what the real modules dispatch, not a guess.
"""

from __future__ import annotations

import math
import weakref
from typing import Any

#: Categories of live bytes. ``logits`` collects the output head and loss path (forward and its gradients).
CATEGORIES: tuple[str, ...] = ("weights", "gradients", "optimizer_states", "activations", "logits", "temporaries", "optimizer_temporaries")

#: Phases of a step, in order; each keeps its own peak so that 1- and 2-layer traces extrapolate phase by phase.
PHASES: tuple[str, ...] = ("forward", "head", "backward_head", "backward", "optimizer")

_BORN_AS = {
    "forward": "activations", "head": "logits", "backward_head": "logits",
    "backward": "temporaries", "optimizer": "optimizer_temporaries",
}


#: aten ops (overload packet names) that are not memory-bound: GEMMs and the fused attention kernels
COMPUTE_BOUND: frozenset[str] = frozenset({
    "mm", "addmm", "bmm", "baddbmm", "addbmm", "addmv", "mv", "dot", "_scaled_mm", "convolution", "convolution_backward",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_efficient_attention_backward",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_cudnn_attention_backward",
    "_flash_attention_forward", "_flash_attention_backward", "_efficient_attention_forward", "_efficient_attention_backward",
})
#: ops that allocate or describe without reading their inputs' data
NO_TRAFFIC: frozenset[str] = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
                                        "detach", "alias", "lift_fresh", "_local_scalar_dense", "_unsafe_view"})
_NOT_COUNTED = COMPUTE_BOUND | NO_TRAFFIC


def moves_memory(func: Any) -> bool:
    """True for an aten op that reads/writes tensor data at memory bandwidth (not a GEMM, view or allocation;
    ``prim`` queries such as ``prim.device`` take a tensor but read none of it)."""
    if getattr(func, "namespace", "") != "aten" or getattr(func, "is_view", False):
        return False
    return func.overloadpacket.__name__ not in _NOT_COUNTED


def make_tracker(round_to: int) -> Any:
    """Build the dispatch-mode tracker; a factory so that torch is imported only when tracing."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class LiveBytes(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.records: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()
            self.current = dict.fromkeys(CATEGORIES, 0)
            self.total = 0
            self.phase = "forward"
            self.peaks: dict[str, tuple[int, dict[str, int]]] = {}
            self.traffic: dict[str, int] = {}

        def charge(self, tensor: Any, category: str | None = None) -> None:
            if not isinstance(tensor, torch.Tensor) or tensor.device.type == "meta":
                return
            storage = tensor.untyped_storage()
            rec = self.records.get(storage)
            if rec is not None:
                if category is not None and rec[1] != category:
                    self.current[rec[1]] -= rec[0]
                    rec[1] = category
                    self.current[category] += rec[0]
                return
            nbytes = math.ceil(storage.nbytes() / round_to) * round_to if round_to > 1 else storage.nbytes()
            rec = [nbytes, category or _BORN_AS[self.phase]]
            self.records[storage] = rec
            self.current[rec[1]] += nbytes
            self.total += nbytes
            weakref.finalize(storage, self._release, rec)
            self._note_peak()

        def _release(self, rec: list[Any]) -> None:
            self.current[rec[1]] -= rec[0]
            self.total -= rec[0]

        def _note_peak(self) -> None:
            best = self.peaks.get(self.phase)
            if best is None or self.total > best[0]:
                self.peaks[self.phase] = (self.total, dict(self.current))

        def set_phase(self, phase: str) -> None:
            self.phase = phase
            self._note_peak()

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            # never raise a deferred Ctrl-C here: C++ calls this hook from inside the op (torch.embedding's kernel),
            # and a Python exception crossing it ends in std::terminate (SIGABRT); step.py checks at Python-only points
            out = func(*args, **(kwargs or {}))
            outs = tree_flatten(out)[0]
            for t in outs:
                self.charge(t)
            if moves_memory(func):
                moved = sum(t.numel() * t.element_size() for t in (*tree_flatten((args, kwargs))[0], *outs)
                            if isinstance(t, torch.Tensor) and t.device.type != "meta")
                self.traffic[self.phase] = self.traffic.get(self.phase, 0) + moved
            return out

    return LiveBytes()
