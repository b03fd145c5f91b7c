"""verify(): run a few real optimizer steps of a recommendation and compare with the prediction.

It reuses the real Trainer (so the optimizer, precision and accumulation are exactly what the user will run)
and PerfGuideCallback (so measuring happens one way everywhere). An OOM never leaves the process broken: the
trainer and its optimizer state are dropped, caches emptied, and the next smaller setup is suggested.
"""

from __future__ import annotations

import gc
import logging
import tempfile
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..setup import Setup
from .types import Verification

if TYPE_CHECKING:
    from ..recommendation import Recommendation

logger = logging.getLogger("perfguide.verify")


def random_token_dataset(rec: Recommendation, rows: int, seed: int = 0) -> list[dict[str, Any]]:
    """Rows of the planned shape (seq_len tokens) for models that take input_ids + labels."""
    import torch

    g = torch.Generator().manual_seed(seed)
    vocab, seq = rec.model.vocab_size, rec.setup.seq_len
    out = []
    for _ in range(rows):
        ids = torch.randint(0, vocab, (seq,), generator=g)
        out.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()})
    return out


def smaller_setup(setup: Setup) -> Setup | None:
    """The next rung down the memory ladder that keeps the global batch: halve the micro-batch, then checkpoint."""
    if setup.micro_batch_size > 1 and setup.micro_batch_size % 2 == 0:
        return setup.replace(micro_batch_size=setup.micro_batch_size // 2, gradient_accumulation_steps=setup.gradient_accumulation_steps * 2)
    if not setup.gradient_checkpointing:
        return setup.replace(gradient_checkpointing=True)
    return None


def _check_vocabulary(model: Any, rec: Recommendation) -> None:
    """Random rows use token ids up to the plan's vocabulary; a smaller embedding would fail inside the forward
    with an index error, so say which two numbers disagree instead."""
    get = getattr(model, "get_input_embeddings", None)
    emb = get() if callable(get) else None
    rows = getattr(emb, "num_embeddings", None)
    if isinstance(rows, int) and rows < rec.model.vocab_size:
        from ..errors import PerfGuideError

        raise PerfGuideError(f"the model's input embedding has {rows} rows but the plan is for {rec.model.name!r} with "
                             f"vocab_size={rec.model.vocab_size}; verify the model the plan was made for, or pass dataset= "
                             "with token ids below the model's vocabulary")


def _is_oom(exc: BaseException) -> bool:
    import torch

    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()


def _free_memory() -> None:
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:  # noqa: BLE001 - cleanup must not raise over the original failure
        pass


class _Fault:
    """Test hook: calls ``fault(step)`` before each optimizer step (e.g. to raise a simulated OOM)."""

    def __init__(self, fault: Callable[[int], None]) -> None:
        from transformers import TrainerCallback

        class _Cb(TrainerCallback):
            def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                fault(state.global_step)

        self.callback = _Cb()


def verify(
    model: Any,
    rec: Recommendation,
    steps: int = 3,
    dataset: Any = None,
    *,
    tolerance: float = 0.25,
    prepare: bool = True,
    fault: Callable[[int], None] | None = None,
) -> Verification:
    """Measured vs predicted peak memory and step time for ``steps`` optimizer steps of ``rec``."""
    from transformers import Trainer

    from .callback import PerfGuideCallback

    if steps < 1:
        from ..errors import PerfGuideError

        raise PerfGuideError(f"steps must be >= 1, got {steps}")
    if dataset is None:
        _check_vocabulary(model, rec)
    if prepare:
        model = rec.prepare_model(model)
    s = rec.setup
    rows = s.micro_batch_size * s.gradient_accumulation_steps * steps
    data = dataset if dataset is not None else random_token_dataset(rec, rows)
    meter = PerfGuideCallback(rec, measure_after_steps=steps, threshold=tolerance)
    callbacks: list[Any] = [meter] + ([_Fault(fault).callback] if fault else [])
    with tempfile.TemporaryDirectory(prefix="perfguide-verify-") as out:
        args = rec.training_args(output_dir=out, max_steps=steps, save_strategy="no", logging_strategy="no",
                                 report_to="none", disable_tqdm=True)
        trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=callbacks)
        try:
            trainer.train()
        except Exception as exc:
            if not _is_oom(exc):
                raise
            logger.warning("verify: out of memory with %s", s.label)
            model.zero_grad(set_to_none=True)
            del trainer
            _free_memory()
            return Verification(measured=None, oom=True, ok=False, error=f"out of memory: {exc}".splitlines()[0],
                                suggestion=smaller_setup(s))
    assert meter.verification is not None  # the callback measures at the last step at the latest
    return meter.verification
