"""The library releases and DeepSpeed knobs a published row ran, patched into perfguide's memory model while that row
is priced: the DeepSpeed release and ZeRO buckets, the transformers release of T5's attention and of checkpointed
blocks' recompute. Each context restores what it patched; a row that states nothing runs as is.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

from perfguide.model.types import ModelSpec
from perfguide.setup import Setup


@contextmanager
def _patched(module: object, name: str, value: object) -> Iterator[None]:
    """``module.name`` is ``value`` inside the block, what it was after it."""
    saved = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, saved)


@contextmanager
def deepspeed_runtime(row: dict[str, str]) -> Iterator[None]:
    """Price a ZeRO row with the DeepSpeed release and the ``reduce_bucket_size`` its notes state or infer
    ("DeepSpeed 0.3.10", "reduce_bucket_size 2e8"), where the model otherwise prices the installed release and
    DeepSpeed's default bucket (memory/zero_runtime.py: before 0.4.0 each ipg buffer held 4.5 buckets). The
    ``overlap_comm`` a row states is its Setup's field (accuracy_setup._strategy). Other rows, and what a row does not
    state: as is."""
    import perfguide.memory.analytic as analytic
    from perfguide._data import load

    stated = re.search(r"DeepSpeed (\d+\.\d+\.\d+)", row["notes"])
    if re.search(r"DeepSpeed ZeRO-3", row["parallelism"]):   # the release: whether one GPU gathers (zero3_window)
        ran = stated.group(1) if stated else None
        with zero3_knobs_stated(row), _patched(analytic, "installed_deepspeed", (lambda: ran) if stated else analytic.installed_deepspeed):
            yield
        return
    if not re.search(r"DeepSpeed ZeRO-[12]", row["parallelism"]):
        yield
        return
    bucket = re.search(r"reduce_bucket_size (\d+(?:\.\d+)?e\d+)", row["notes"])
    table, saved_release = load("calibration"), analytic.installed_deepspeed
    saved_bucket = table["deepspeed_bucket_elements"]["value"]
    if stated:
        release = stated.group(1)
        analytic.installed_deepspeed = lambda: release   # type: ignore[assignment]
    if bucket:
        table["deepspeed_bucket_elements"]["value"] = int(float(bucket.group(1)))
    try:
        yield
    finally:
        analytic.installed_deepspeed = saved_release
        table["deepspeed_bucket_elements"]["value"] = saved_bucket


@contextmanager
def zero3_knobs_stated(row: dict[str, str]) -> Iterator[None]:
    """Price a ZeRO-3 row with the bucket sizes its notes state ("reduce_bucket_size 5e8, stage3_prefetch_bucket_size
    5e7, stage3_param_persistence_threshold 1e5"), where the model otherwise prices the Trainer's "auto" values
    (memory/zero_runtime.py zero3_knobs); a row that states none: as is."""
    import perfguide.memory.analytic as analytic
    from perfguide.memory.zero3_window import Zero3Knobs

    keys = ("reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold")
    found = [re.search(rf"(?<![\w.]){key} (\d+(?:\.\d+)?e\d+)", row["notes"]) for key in keys]
    if not all(found):
        yield
        return
    knobs = Zero3Knobs(*(int(float(m.group(1))) for m in found if m))
    with _patched(analytic, "zero3_knobs", lambda spec: knobs):
        yield


@contextmanager
def t5_release(row: dict[str, str]) -> Iterator[None]:
    """Price a T5 row with the transformers release it ran (perfguide/memory/t5_releases.py: the fp32 softmax before
    5.15, the unconditional fp16 clamp from 4.28), where the model otherwise prices the installed release. For T5 no
    other release-dependent term exists (the causal-LM loss eras and caches skip encoder-decoders; no attention era or
    buffer entry names t5), so only those two move. Other rows, and rows without a stated or inferred release: as is."""
    from accuracy_loss import _transformers_version

    import perfguide.memory.analytic as analytic

    release = _transformers_version(row)
    if release is None or not row["model_hf_id"].startswith("google-t5/"):
        yield
        return
    with _patched(analytic, "installed_transformers", lambda: release):
        yield


@contextmanager
def checkpoint_release(row: dict[str, str]) -> Iterator[None]:
    """Price a checkpointed block's backward with the checkpoint variant of the transformers release the row ran
    (perfguide/memory/block_backward.py: reentrant before 5.0, non-reentrant since; a MoE block's experts one at a time
    before 5.0, with the copies that loop saves: expert_loop_saved_bytes) and its recompute with that release's
    attention (eras.attention_era_bytes: accuracy_loss._attention_era_delta prices the uncheckpointed rows at the loss
    peak), where the model otherwise takes the installed release's. Only these terms read the release
    here; rows without a stated or inferred one: as is."""
    from accuracy_loss import _transformers_version

    release = _transformers_version(row)
    variant = None if FSDP_WRAPPER_NON_REENTRANT in row["grad_checkpointing"] else release
    with recompute_release(release, variant):
        yield


#: blocks checkpointed by FSDP's own wrapper, not transformers' gradient_checkpointing_enable: accelerate's FSDP plugin
#: (fsdp_config activation_checkpointing) applies torch's checkpoint_wrapper with CheckpointImpl.NO_REENTRANT (accelerate
#: 0.34.0 Accelerator.prepare_model), non-reentrant whatever the transformers release
FSDP_WRAPPER_NON_REENTRANT = "checkpoint_wrapper NO_REENTRANT"


@contextmanager
def recompute_release(release: str | None, variant: str | None = "") -> Iterator[None]:
    """checkpoint_release for a release named directly (None: as is); the techniques bench uses it for sources that
    pin a release in their example scripts. ``variant``: the release whose checkpoint variant the blocks ran (None: a
    current one, non-reentrant), where it is not the training release's own ("": the release's)."""
    import perfguide.memory.analytic as analytic

    if release is None:
        yield
        return
    saved, era, loop = analytic.block_backward_bytes, analytic.eras.attention_era_bytes, analytic.expert_loop_saved_bytes
    checkpoint = release if variant == "" else variant
    analytic.block_backward_bytes = lambda spec, setup, _installed=None, *a: saved(spec, setup, checkpoint, *a)   # type: ignore[assignment]
    analytic.expert_loop_saved_bytes = lambda spec, setup, _installed, **kw: loop(spec, setup, release, **kw)   # type: ignore[assignment]
    ran = release

    def row_era(spec: ModelSpec, setup: Setup, release: str, *, checkpointed: bool = False) -> int:
        return era(spec, setup, ran if checkpointed else release, checkpointed=checkpointed)

    analytic.eras.attention_era_bytes = row_era
    try:
        yield
    finally:
        analytic.block_backward_bytes, analytic.eras.attention_era_bytes, analytic.expert_loop_saved_bytes = saved, era, loop
