"""What a technique's cost hooks see and return: small typed contexts handed down by the cost model.

The memory and speed models (memory/analytic.py, speed/training.py) compute the core terms of a step, then let every
technique adjust the terms it changes (``Technique.memory``, ``Technique.speed``, ``Technique.shape``,
``Technique.step_shape``, ``Technique.kernel_factors``). The contexts carry numbers and callables, never the cost
model's modules, so a technique module imports nothing above the lower layers and the cost model names no technique.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..hardware.types import GPU, Hardware
    from ..memory.types import MemoryEstimate
    from ..model.types import ModelSpec
    from ..setup import Setup


@dataclass(frozen=True)
class MemoryContext:
    """Facts of one training step a memory hook reads; byte counts are per device unless named otherwise."""

    spec: ModelSpec
    setup: Setup                 # the Setup as planned
    shape: Setup                 # the (batch, sequence) the model really computes on (after every ``shape`` hook)
    largest_trainable: int       # elements of the largest trainable tensor
    grad_elem_bytes: int         # bytes per element of the largest trainable tensor's gradient
    trainable_params: int
    state_bytes: int             # optimizer state of the whole model, before sharding
    optimizer_bytes: int         # optimizer state on this device (after sharding and offload)
    layer_activations: int = 0   # bytes one block keeps for backward when nothing is recomputed
    #: (the FFN-wide share of it, its whole MLP half's), read on first use (a tiled MLP's hook; memory/activations.py)
    mlp_shares: Callable[[], tuple[int, int]] = field(repr=False, default=lambda: (0, 0))


@dataclass(frozen=True)
class MemoryTerms:
    """The terms of the step's phases a technique may change; the cost model takes the phase maximum after."""

    activations: int             # saved activations held on the device between forward and backward
    extra_activations: int       # device bytes that live beside them (a packed-sequence mask...)
    logits: int                  # loss-path buffers
    grads: int                   # gradients alive at the end of backward
    step_temp: int               # the optimizer step's temporaries
    optimizer_on_device: int     # optimizer state inside torch's allocator
    cpu_ram: int                 # host RAM the step needs
    recompute: int = 0           # bytes a recomputed block brings back during backward (on top of ``activations``)
    attention_saved_less: int = 0  # what a recomputed block's attention half keeps less than its table (Liger's input norm)
    weight_casts: int = 0        # 16-bit copies of fp32 weights autocast saves for backward
    extra_weights: int = 0       # frozen weights of a second model held on the device in every phase (DPO's reference copy)
    head_cast_saved: bool = True  # the loss path's head matmul saves autocast's 16-bit copy of an fp32 head for backward
                                  # (HF's loss); a fused head that saves the fp32 weight itself sets False (TRL's DPO)
    grads_synced_each_micro_step: bool = False   # FSDP reduce-scatters on every accumulation micro-step (no no_sync):
                                                 # only the 1/N gradient shard is held between micro-steps
    fused_swiglu: bool = False   # a fused gate x up kernel writes its factors' gradients in place (Liger's SwiGLU):
                                 # fewer FFN-wide gradients in flight in a recomputed block (memory/block_backward.py)
    mlp_tokens: int = 0          # tokens a tiled MLP runs at once (one shard; 0: the whole sequence): the FFN-wide
                                 # gradients in flight in a recomputed block are one shard's (memory/block_backward.py)
    notes: tuple[str, ...] = ()

    def changed(self, note: str | None = None, **changes: Any) -> MemoryTerms:
        """A copy with ``changes`` applied and ``note`` appended (techniques return this)."""
        notes = (*self.notes, note) if note else self.notes
        return replace(self, notes=notes, **changes)


@dataclass(frozen=True)
class StepShape:
    """What the speed model counts per micro-step: tokens through the Linear layers, the shape attention runs
    over, and the tokens that carry training signal (what tokens/s reports)."""

    matmul_tokens: int
    attention: tuple[int, int]   # (sequences, length)
    real_tokens: int


@dataclass(frozen=True)
class KernelFactors:
    """Multipliers on the step's kernel counts: training launches per layer, passes of the memory-bound kernels,
    and the per-token launch overhead of a decode loop; plus the forward passes a micro-step re-runs in backward
    (``recompute``, added up), which the speed model prices like a forward: its GEMM FLOPs, weight reads,
    memory-bound passes, launches and dequantization; and the share of the optimizer step the GPU streams
    (``device_optimizer``: 0 where the CPU steps the optimizer); ``fused_blocks``: a compiler fused each block's
    memory-bound chain, so the bytes no longer depend on how a stack spelled its eager block code;
    ``step_per_tensor``: the optimizer's ``step()`` runs once per parameter tensor (stepped from its gradient hook),
    so whatever a step() call pays once is paid per tensor."""

    launches: float = 1.0
    elementwise: float = 1.0
    decode_overhead: float = 1.0
    recompute: float = 0.0
    device_optimizer: float = 1.0
    fused_blocks: bool = False
    step_per_tensor: bool = False


@dataclass(frozen=True)
class SpeedContext:
    """What a GPU training step's speed hook reads: the rates and bandwidths the core model already derived."""

    spec: ModelSpec
    setup: Setup
    hardware: Hardware
    gpu: GPU
    tokens: int                  # matmul tokens per micro-step
    peak_tflops: float           # dense peak of the compute dtype
    asymptote: float             # fraction of peak large GEMMs reach here
    rate: float                  # achievable FLOP/s of the step's GEMMs
    bandwidth: float             # achieved device memory bytes/s (0: unknown)
    pcie: float                  # host<->device bytes/s
    #: achievable FLOP/s of a GEMM with ``tokens`` rows at ``peak_tflops`` and ``asymptote`` (the core's efficiency curve)
    gemm_rate: Callable[[float, float, int], float]
    #: the step's memory estimate, computed on first use (paged state needs what is free on the device)
    memory: Callable[[], MemoryEstimate] = field(repr=False, default=lambda: _no_memory())


def _no_memory() -> MemoryEstimate:
    raise LookupError("this SpeedContext was built without a memory estimate")


@dataclass(frozen=True)
class StepSeconds:
    """Seconds a technique adds (+) or saves (-): per micro-step on the GPU, per micro-step over PCIe (hidden behind
    compute up to the overlap fraction), and per optimizer step. ``fetch`` is the part of ``transfer`` that copies
    back what a layer's backward waits on, issued when autograd reaches the layer: hidden only while the host runs
    ahead of the GPU (speed/terms.py drains_in_backward says when it cannot)."""

    compute: float = 0.0
    transfer: float = 0.0
    per_step: float = 0.0
    fetch: float = 0.0
    comm: float = 0.0            # collectives per micro-step, hidden behind compute like the strategy's own (comm_overlap)
    #: the loop reduce-scatters FSDP gradients on every accumulation micro-step, so no_sync defers nothing
    #: (memory/sharding.defers_grad_sync says when it would)
    grads_synced_each_micro_step: bool = False
