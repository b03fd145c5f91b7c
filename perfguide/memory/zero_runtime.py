"""What DeepSpeed ZeRO's runtime holds on a rank phase by phase, beyond the model states sharding.py divides.

DeepSpeed's estimator (``estimate_zero2_model_states_mem_needs``) counts every state the optimizer ever holds as
resident; the runtime builds some of them only inside ``step()`` (read in deepspeed/runtime/zero/stage2.py v0.3.10 and
stage_1_and_2.py v0.14.4), so the forward and backward peaks hold less than the estimator's bytes.
"""

from __future__ import annotations

from .._packages import installed_release
from ..model.types import ModelSpec
from ..setup import QUANTIZED, Setup
from .loss_path import version_tuple
from .optimizers import TensorGroup
from .sharding import DEEPSPEED, bucket_bytes, deepspeed_bucket_elements, ipg_buffers

#: first DeepSpeed release whose ZeRO-1/2 ipg buffer holds ``reduce_bucket_size`` elements; before it (v0.3.x, read in
#: zero/stage2.py v0.3.10, v0.3.13, v0.3.16) ``backward()`` allocated ``torch.empty(int(reduce_bucket_size * 4.5),
#: dtype=torch.half)`` ("TODO: we need to revist this and remove the magic 4.5x multiplier here"); v0.4.0 sizes it
#: ``int(reduce_bucket_size)``
IPG_SIZED_BY_BUCKET_SINCE = (0, 4, 0)
OLD_IPG_FACTOR = 4.5


def step_only_fp32_grads(setup: Setup, trainable: int) -> int:
    """Bytes of DeepSpeed's fp32 gradient partition on a rank, which exists only inside ``step()`` (0 elsewhere).

    ZeRO-1/2 build it from the averaged 16-bit partition (``flatten(averaged_gradients).to(fp32)``, a flat 16-bit copy
    first) and drop it after the update: "get rid of the fp32 gradients. Not needed anymore" (deepspeed zero/stage2.py
    v0.3.10, stage_1_and_2.py v0.14.4); ZeRO-3 builds and releases it per sub-group. ``deepspeed_half`` counts it with
    the optimizer state, as DeepSpeed's estimator does; with the optimizer offloaded it is pinned host memory for good.
    """
    if setup.strategy not in DEEPSPEED or (setup.lora is None and setup.weights_dtype == "bf16"):
        return 0   # not DeepSpeed, or pure bf16 with bf16 master gradients (deepspeed_bf16_master)
    qlora = setup.weights_dtype in QUANTIZED and setup.lora is not None
    if not (qlora or setup.autocast or setup.weights_dtype in ("bf16", "fp16")):
        return 0   # fp32 without mixed precision: the optimizer steps the fp32 weights' own gradients (as _states)
    return 4 * trainable // setup.shard_degree


#: ZeRO-3 ``sub_group_size`` in elements: DeepSpeed's default (runtime/zero/config.py 0.16.5, ``sub_group_size: int =
#: Field(pp_int(1e9))``), the value perfguide's own config emits (integrations/deepspeed.py) and ms-swift's zero3.json sets
SUB_GROUP_ELEMENTS = 10**9


def sub_group_step_bytes(setup: Setup, trainable_params: int, trainable: tuple[TensorGroup, ...], step_bytes: int) -> int:
    """The part of ``step_bytes`` (a rank's optimizer-step temporaries, priced over its whole partition: the
    optimizer's own and the fp32 gradients ``step()`` builds, 1.5 x ``step_only_fp32_grads`` with the flat 16-bit
    copy ``flatten(...).to(fp32)`` makes first) that is alive at once.

    ZeRO-1/2 step the whole partition. ZeRO-3 steps one sub-group at a time (stage3.py 0.16.5 ``step``:
    ``_prepare_sub_group`` -> ``_prepare_fp32_grad_for_sub_group``; ``_optimizer_step`` hands the optimizer that
    sub-group's flat fp32 partition alone (``param_groups[i]['params'] = [fp32_param]``), so a foreach step's
    temporaries are its size; ``_release_sub_group``, "get rid of the fp32 gradients. Not needed anymore").
    ``_create_fp16_sub_groups`` closes a sub-group once its parameters' partition elements reach ``sub_group_size``,
    so one holds at most ``SUB_GROUP_ELEMENTS`` plus the partition of the parameter that crosses it, bounded here by
    the largest of the ``trainable`` tensors' (its elements over the shard degree, rounded up).
    """
    partition = -(-trainable_params // setup.shard_degree)
    if setup.strategy != "zero3" or partition == 0:
        return step_bytes
    largest = max((g.numel for g in trainable), default=0)
    sub_group = min(partition, SUB_GROUP_ELEMENTS + -(-largest // setup.shard_degree))
    return step_bytes * sub_group // partition


def backward_only_bucket_bytes(setup: Setup, trainable: int, grad_elem_bytes: int, release: str | None = None) -> int:
    """Bytes of ZeRO-1/2's gradient buckets (``sharding.bucket_bytes``), which exist only from the engine's ``backward()``
    to the end of the gradient epilogue: ``backward()`` allocates the ipg buffers (``torch.empty(reduce_bucket_size)``,
    a second one with overlap_comm; v0.3.10 sized each ``reduce_bucket_size * 4.5``) and the epilogue's
    ``_release_ipg_buffers()`` drops them (stage2.py v0.3.10, stage_1_and_2.py v0.14.4), so they are not allocated at
    the forward/loss peak nor in ``step()``. ZeRO-3's buffers are gathered parameters, priced in every phase.
    ``release``: the DeepSpeed release that runs (None: as ``bucket_bytes`` prices them); before 0.4.0 each buffer
    is 4.5 x ``reduce_bucket_size`` (IPG_SIZED_BY_BUCKET_SINCE).
    """
    if not setup.is_deepspeed or setup.gathers_params:
        return 0
    if release is not None and version_tuple(release) < IPG_SIZED_BY_BUCKET_SINCE:
        # v0.3.x: each buffer is 4.5 x reduce_bucket_size fp16 elements, whatever the model's size
        return int(OLD_IPG_FACTOR * deepspeed_bucket_elements(setup) * 2 * ipg_buffers(setup.overlap_comm))
    return bucket_bytes(setup, trainable, grad_elem_bytes)


def early_head_grad_bytes(spec: ModelSpec, setup: Setup, grads: int, grad_elem_bytes: int) -> int:
    """Bytes of the output head's weight gradient alive from the head's backward, the first in the step, to the end of
    backward (0 where none is): the gradient a rank holds beside every saved activation at the start of backward.

    An LM head's gradient lands in ``.grad`` as backward begins and stays there; a tied head's waits in autograd's
    input buffer for the embedding's share, which comes last. None is vocabulary-sized when:

    * the head is a task head (a classifier's num_labels x h, ``ModelSpec.logits_width`` below the vocabulary) or
      none: the embedding's gradient is then the last of the step, not the first;
    * ZeRO-2 trains an untied head no larger than ``reduce_bucket_size``: the AccumulateGrad hook
      ``reduce_independent_p_g_buckets_and_remove_grads`` copies the gradient into the ipg buffer (priced as
      ``backward_only_bucket_bytes``) and points ``.grad`` at that slot, freeing its own storage:
      ``new_grad_tensor.copy_(param.grad.view(-1)); param.grad.data = new_grad_tensor.data.view_as(param.grad)``
      (deepspeed/runtime/zero/stage_1_and_2.py v0.7.2; the same copy in 0.19.8). A larger head is reduced on its own
      (``extra_large_param_to_reduce``) from its ``.grad``, and ZeRO-1 hooks the reduce only with overlap_comm
      (v0.7.2 ``if self.partition_gradients or self.overlap_comm``): both keep the gradient as priced.
    """
    if setup.lora is not None or spec.logits_width != spec.vocab_size:
        return 0
    head = spec.lm_head_params or spec.embedding_params
    tied = spec.tie_word_embeddings and not spec.lm_head_params
    if setup.shards_grads and not setup.gathers_params and setup.is_deepspeed and not tied \
            and head <= deepspeed_bucket_elements(setup):
        return 0
    return min(grads, head * grad_elem_bytes)


def installed_deepspeed() -> str | None:
    """The DeepSpeed release installed next to perfguide (the one a plan made here will train with); None if absent."""
    return installed_release("deepspeed")
