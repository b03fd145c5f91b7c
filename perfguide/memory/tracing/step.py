"""One steady-state training step of the real HF modules on fake tensors, measured phase by phase.

Steady state means the optimizer state already exists (it is created on the first ``step()``, and jobs OOM on
the second step, not the first) and, with gradient accumulation, the gradients of the previous micro-step are
still held during forward and backward.
"""

from __future__ import annotations

import contextlib
from typing import Any

from pydantic import Field

from ..._base import Model
from ..._interrupt import check as check_interrupt
from ...setup import Setup
from .build import build_on_meta
from .tracker import PHASES, make_tracker

#: TrainingArguments ``optim`` values whose step we run for real; the rest get an analytic optimizer term.
TRACED_OPTIMIZERS: tuple[str, ...] = ("adamw_torch", "adamw_torch_fused", "adafactor", "sgd", "adagrad", "rmsprop")
ALLOCATOR_BLOCK = 512  # CUDA caching allocator rounds every request up to 512 bytes (kMinBlockSize)


class PhasePeak(Model):
    """Live bytes at the highest point of one phase, split by category (tracker.CATEGORIES)."""

    total: int
    parts: dict[str, int]


class StepTrace(Model):
    """What one traced step measured: the peak of each phase, the parameter counts, and how SDPA was run."""

    phases: dict[str, PhasePeak]
    params: int
    trainable_params: int
    sdpa_kernels: dict[str, int]
    optimizer_traced: bool
    trainable_groups: list[tuple[int, int, str, int]] = Field(default_factory=list)  # (rows, cols, kind, count) of trainable tensors
    trainable_bytes_per_param: int = 4
    traffic: dict[str, int] = Field(default_factory=dict)  # bytes memory-bound ops read + write, by phase (tracker)


def _trainable_groups(model: Any) -> list[tuple[int, int, str, int]]:
    """Trainable tensors grouped by shape and kind, the unit in which optimizer state rules differ."""
    import torch

    kinds = {}
    for module in model.modules():
        kind = "embedding" if isinstance(module, torch.nn.Embedding) else "linear" if isinstance(module, torch.nn.Linear) else "other"
        for p in module.parameters(recurse=False):
            kinds[id(p)] = kind if p.dim() == 2 else "other"
    counts: dict[tuple[int, int, str], int] = {}
    for p in model.parameters():
        if p.requires_grad:
            rows, cols = (p.shape[0], p.numel() // max(1, p.shape[0])) if p.dim() >= 2 else (p.numel(), 1)
            key = (int(rows), int(cols), kinds.get(id(p), "other"))
            counts[key] = counts.get(key, 0) + 1
    return [(r, c, k, n) for (r, c, k), n in sorted(counts.items())]


def _optimizer(name: str | None, params: list[Any]) -> Any | None:
    """The optimizer the Trainer builds for ``optim=name``, with the CUDA defaults made explicit.

    Fake parameters are not ``nn.Parameter``s, so torch would silently pick the for-loop implementations;
    on CUDA ``adamw_torch`` runs foreach (a parameter-sized temporary in the step), ``adamw_torch_fused`` fused.
    """
    import torch

    if name is None or name not in TRACED_OPTIMIZERS:
        return None
    if name == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor(params, lr=1e-4, scale_parameter=False, relative_step=False)
    if name == "adamw_torch_fused":
        return torch.optim.AdamW(params, lr=1e-4, fused=True)
    cls = {"adamw_torch": torch.optim.AdamW, "sgd": torch.optim.SGD, "adagrad": torch.optim.Adagrad, "rmsprop": torch.optim.RMSprop}[name]
    return cls(params, lr=1e-4, foreach=True)


def _inputs(model: Any, batch: int, seq: int, target: int | None = None) -> dict[str, Any]:
    """Unpadded token batches with labels; no attention mask, so SDPA may use its causal fast path as on GPU.

    An encoder-decoder's labels set its decoder's length (the model shifts them into ``decoder_input_ids``), so
    ``target`` tokens of labels give the decoder its own length, as a seq2seq collator's separately padded labels do.
    A speech encoder (Whisper) reads ``2 x seq`` log-mel frames in the model's dtype (the HF recipe's collator casts
    them), which its convolutions turn into ``seq`` positions."""
    import torch

    vocab = model.config.get_text_config().vocab_size if hasattr(model.config, "get_text_config") else model.config.vocab_size
    labels = torch.randint(0, vocab, (batch, target or seq))
    if getattr(model, "main_input_name", None) == "input_features":   # Whisper: log-mel frames, two per encoder position
        features = torch.randn(batch, model.config.num_mel_bins, 2 * seq, dtype=model.dtype)
        return {"input_features": features, "labels": labels}
    ids = torch.randint(0, vocab, (batch, seq))
    return {"input_ids": ids, "labels": labels if target is not None else ids.clone()}


def _head_hooks(model: Any, tracker: Any) -> list[Any]:
    """Label the output head and loss (forward) and the gradients flowing back into it (backward) as logits."""
    head = model.get_output_embeddings()
    if head is None:
        return []

    def enter_head(module: Any, args: Any) -> None:
        tracker.set_phase("head")
        x = args[0] if args else None
        if x is not None and getattr(x, "requires_grad", False):
            x.register_hook(lambda grad: tracker.set_phase("backward"))

    return [head.register_forward_pre_hook(enter_head)]


def _interrupt_points(tracker: Any) -> Any:
    """A deferred Ctrl-C (perfguide._interrupt) raised as each module's forward starts: plain Python frames
    (``Module._call_impl``), unlike the dispatch hook C++ calls from inside an op. Only in the forward phase: in
    backward the autograd engine (C++) may be the caller, as when checkpointing recomputes a block."""
    import torch

    def point(module: Any, args: Any) -> None:
        if tracker.phase == "forward":
            check_interrupt()

    return torch.nn.modules.module.register_module_forward_pre_hook(point)


def run_step(config: dict[str, Any], setup: Setup) -> StepTrace:
    """Build, move to fake memory, warm the optimizer, then trace forward, backward and step of one micro-batch."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from .cuda_emulation import make_cuda_emulation, make_scalar_fallback

    model = build_on_meta(config, setup)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    n_meta = sum(p.numel() for p in model.parameters())
    low = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(setup.autocast or "")
    round_to = ALLOCATOR_BLOCK if setup.device == "cuda" else 1
    emulation = make_cuda_emulation(low, emulate_sdpa=setup.device == "cuda")
    with contextlib.ExitStack() as stack:
        stack.enter_context(_unpacked_rows())
        stack.enter_context(FakeTensorMode(allow_non_fake_inputs=True))
        stack.enter_context(make_scalar_fallback())
        model.to_empty(device="cpu")
        base.tie_weights()  # to_empty re-creates Parameters and so unties shared embeddings
        params = list(model.parameters())
        if sum(p.numel() for p in params) != n_meta:
            raise RuntimeError("parameter count changed while materialising fake weights (tied weights lost)")
        trainable = [p for p in params if p.requires_grad]
        groups = _trainable_groups(model)
        elem_bytes = trainable[0].element_size() if trainable else 4
        opt = _optimizer(setup.optimizer, trainable)
        if opt is not None:
            for p in trainable:
                p.grad = torch.zeros_like(p)
            opt.step()
            opt.zero_grad(set_to_none=True)
        if setup.gradient_accumulation_steps > 1:
            for p in trainable:
                p.grad = torch.zeros_like(p)
        batch = _inputs(base, setup.micro_batch_size, setup.seq_len, setup.target_len)
        tracker = stack.enter_context(_tracked(model, opt, round_to))
        hooks = _head_hooks(base, tracker)
        stack.callback(_interrupt_points(tracker).remove)  # global: removed however the step ends
        stack.enter_context(emulation)
        tracker.set_phase("forward")
        loss = model(**batch).loss
        emulation.end_region()
        check_interrupt()
        tracker.set_phase("backward_head")
        emulation.backward(loss)
        del loss
        check_interrupt()
        tracker.set_phase("optimizer")
        torch.nn.utils.clip_grad_norm_(trainable, 1.0, foreach=True)
        if opt is not None:
            opt.step()
            opt.zero_grad(set_to_none=True)
        for h in hooks:
            h.remove()
        phases = {ph: PhasePeak(total=tracker.peaks[ph][0], parts=tracker.peaks[ph][1]) for ph in PHASES if ph in tracker.peaks}
    return StepTrace(
        phases=phases, params=n_meta, trainable_params=sum(p.numel() for p in trainable),
        sdpa_kernels=dict(emulation.kernels), optimizer_traced=opt is not None,
        trainable_groups=groups, trainable_bytes_per_param=elem_bytes, traffic=dict(tracker.traffic),
    )


@contextlib.contextmanager
def _unpacked_rows() -> Any:
    """Tell transformers' mask builder that the traced rows are not packed sequences, as it finds on a GPU.

    Without a 2-D attention mask and without a cache (training with checkpointing: use_cache is off) masking_utils
    reads position_ids to detect packed sequences, and on a tensor it cannot read (a fake one) it assumes packing: it
    then builds a b x 1 x s x s bool causal mask that real training never builds (is_causal, flash kernel), and SDPA
    runs the memory-efficient kernel with its b x s x s bias. Our batches are one sequence per row (``_inputs``), for
    which the real function returns None."""
    try:
        from transformers import masking_utils
    except ImportError:   # releases before masking_utils never looked
        yield
        return
    real = getattr(masking_utils, "find_packed_sequence_indices", None)
    if real is None:
        yield
        return
    masking_utils.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = real


@contextlib.contextmanager
def _tracked(model: Any, opt: Any | None, round_to: int) -> Any:
    """Enter the tracker with parameters, buffers, gradients and optimizer state already charged."""
    tracker = make_tracker(round_to)
    hooks = []
    for p in model.parameters():
        tracker.charge(p, "weights")
        if p.grad is not None:
            tracker.charge(p.grad, "gradients")
        if p.requires_grad:
            hooks.append(p.register_post_accumulate_grad_hook(lambda q: tracker.charge(q.grad, "gradients")))
    for b in model.buffers():
        tracker.charge(b, "weights")
    if opt is not None:
        # torch keeps ``step`` counters on the host unless the optimizer is fused or capturable
        on_host = not (opt.defaults.get("fused") or opt.defaults.get("capturable"))
        for state in opt.state.values():
            for name, v in state.items():
                if not (on_host and name == "step"):
                    tracker.charge(v, "optimizer_states")
    try:
        with tracker:
            yield tracker
    finally:
        for h in hooks:
            h.remove()
