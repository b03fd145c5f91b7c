"""What FULL_SHARD FSDP holds unsharded on a rank, phase by phase: at the loss and through backward.

Traced live on two gloo ranks (scripts/trace_fsdp_live_peak.py: the CPU allocator's own events, FSDP's
unshard / reshard / reduce steps as marks; FSDP1 and FSDP2 as accelerate 1.15 builds them, full fine-tuning and LoRA,
with and without activation checkpointing):

* the root unit (embedding, final norm, LM head) is gathered at the loss and stays gathered through backward: FSDP1's
  ``_post_forward_reshard`` does not free the root's parameters ("with the intention that they are immediately used
  for backward computation", torch distributed/fsdp/_runtime_utils.py), and FSDP2's root group keeps them
  (``post_forward_mesh_info`` None for the root); each decoder unit is resharded after its own forward, so at the
  loss only the root is gathered;
* through backward: the root, the unit whose backward runs and the next one, prefetched (FSDP1 BACKWARD_PRE,
  FSDP2's default backward prefetch; at most two decoder units with limit_all_gathers), plus the running unit's
  unsharded gradient until its reduce-scatter;
* the unsharded gradient is in ``MixedPrecision.param_dtype`` (``reduce_dtype`` the same under accelerate's
  ``set_mixed_precision``: FSDP1 reduce-scatters ``flat_param.grad`` as autograd made it, FSDP2 the ``.grad`` of its
  unsharded parameters), so 2 B per element under bf16 / fp16 mixed precision or 16-bit weights, 4 B for fp32
  weights without autocast. Only the trainable elements get one: FSDP2 shards each parameter on its own (LoRA: the
  adapters), FSDP1 with ``use_orig_params=True`` LoRA the whole unit (analytic.frozen_params_get_grads).

The pending head gradient (the root's post-backward hook fires only once the embedding's gradient exists) is priced
by zero_runtime.early_head_grad_bytes at the width this module gives (``unit_grad_bytes``).

Not priced: accelerate 1.15's ``fsdp2_prepare_model`` carves an untied embedding and the [final norm, LM head] tail
into units of their own, and the tail reshards as soon as the head's backward is done (traced), so under that FSDP2
only the head is gathered at the loss and no root unit through backward: the root priced here is FSDP1's and that of
``fully_shard`` on the whole model (torchtune; accelerate without the carve), an over-count there.
"""

from __future__ import annotations

from typing import NamedTuple

from ..model.linears import linear_shapes
from ..model.types import ModelSpec
from ..setup import Setup
from . import overhead
from .loss_path import version_tuple

#: decoder units gathered at once in backward: the running unit and the one prefetched (FSDP1 ``BACKWARD_PRE``:
#: ``_prefetch_handle`` in ``_pre_backward_hook``; FSDP2 ``FSDPParamGroup.pre_backward(default_prefetch=True)``
#: unshards the next group; both traced in scripts/trace_fsdp_live_peak.py)
BACKWARD_UNITS = 2


#: the first torch release whose FSDP runs the traced runtime: ``_post_forward_reshard`` keeping the root unit
#: (pytorch/pytorch#87940, Nov 2022) and the ``limit_all_gathers`` rate limiter (#83917, after torch 1.12: "preventing
#: a fast CPU thread from over-allocating blocks to the all-gather stream"). Torch 1.12's FSDP1 (the 2022 PyTorch FSDP
#: blog's rows) bounded no window: those keep the former two-units-and-a-gradient charge
TRACED_RUNTIME_SINCE_TORCH = "2.0"


def traced_runtime() -> bool:
    """Whether the torch release a plan runs on (installed, or a bench row's) has the FSDP runtime traced here; a
    fresh install (none found) does."""
    release = overhead.installed_torch()
    return release is None or version_tuple(release)[:2] >= version_tuple(TRACED_RUNTIME_SINCE_TORCH)[:2]


def unit_grad_bytes(setup: Setup) -> int:
    """Bytes per element of the unsharded gradient FSDP reduce-scatters: the compute (param_dtype) width."""
    return 2 if setup.autocast in ("bf16", "fp16") or setup.weights_dtype in ("bf16", "fp16") else 4


class Window(NamedTuple):
    """Bytes a FULL_SHARD rank holds unsharded: ``at_loss`` (the root unit), ``backward`` (the root, two decoder units,
    the running unit's gradient) and ``idle_pool``: the decoder units' blocks the all-gather stream keeps reserved
    while the loss runs. FSDP allocates each unit's unsharded parameters on a stream of its own (FSDP1 ``_unshard``
    under ``unshard_stream``; FSDP2's all-gather streams) and the caching allocator keeps a freed block for the
    stream it was allocated on, so the blocks of the units resharded after their forward stay reserved, not
    allocated, at the loss: the reserved counterpart of the live trace, by the pool rule of
    sharding.idle_grad_pool_bytes and offload_staging_bytes (not traced: CPU ranks have no streams)."""

    at_loss: int
    backward: int
    idle_pool: int


def fsdp_window(spec: ModelSpec, setup: Setup, block_bytes_per_elem: float, root_bytes_per_elem: int,
                trainable_per_block: int, adapter_bytes_per_block: int = 0) -> Window:
    """What one FULL_SHARD rank holds unsharded at the loss and through backward (Window).

    ``block_bytes_per_elem``: a decoder unit's weights as gathered (the compute dtype, or packed nf4 under FSDP2);
    ``root_bytes_per_elem``: the root's (embedding and head, never quantized); ``trainable_per_block``: the elements
    of a unit that get an unsharded gradient; ``adapter_bytes_per_block``: LoRA's adapters, gathered with their unit.
    """
    per_block = sum(i * o * n for _, i, o, n in linear_shapes(spec)) // max(1, spec.total_layers)
    root = (spec.embedding_params + spec.lm_head_params) * root_bytes_per_elem
    units = BACKWARD_UNITS * (int(per_block * block_bytes_per_elem) + adapter_bytes_per_block)
    return Window(root, root + units + trainable_per_block * unit_grad_bytes(setup), units)
