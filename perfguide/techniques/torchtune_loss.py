"""trainer='torchtune': the step runs in a torchtune recipe, whose loss never holds the full [b, s, V] logits chain
HF's does.

162 of the 168 training configs torchtune ships (recipes/configs at its HEAD) name ``LinearCrossEntropyLoss``
(torchtune/modules/loss/cross_entropy_loss.py): the model skips its output layer, the loss selects the positions
whose label is not ignored (``index_select``: a copy of their hidden states) and runs the head and
``F.cross_entropy(logits.float(), ...)`` over 8 chunks of them. Eager, each chunk's fp32 log-softmax is what
autograd saves (4 B per logit, every chunk until backward: the head's output and its fp32 copy are not saved); the
peak is in backward, at the first chunk's log-softmax backward: its incoming fp32 gradient and its fp32 output
(8 B / 8) beside every chunk's saved 4 (traced on real CPU tensors: tests/test_torchtune_loss.py). Under ``compile``
the recipe compiles
``compute_cross_entropy`` (``apply_compile_strategy``): the generated graph keeps the chunk's 16-bit logits and
per-row statistics (2 B per logit) and its backward writes one chunk's 16-bit gradient at a time (2 B / 8), as
traced for the chunked loss on torch 2.13's Inductor (tests/test_compiled_block.py). Every label position is
counted (an upper bound: prompt and padding positions are ignored and skipped). The six configs on the older
``CEWithChunkedOutputLoss`` also hold every chunk's 16-bit logits (2 B per logit more in eager), which the check
says when it reads one.
"""

from __future__ import annotations

from typing import Any

from .base import Requires, Technique
from .effects import MemoryContext, MemoryTerms

SOURCES = (
    "https://github.com/pytorch/torchtune/blob/main/torchtune/modules/loss/cross_entropy_loss.py (LinearCrossEntropyLoss)",
    "https://github.com/pytorch/torchtune/blob/main/recipes/full_finetune_single_device.py (loss.set_model_output, apply_compile_strategy)",
)

#: LinearCrossEntropyLoss's default ``num_output_chunks``
CHUNKS = 8
#: bytes per logit at the loss's peak: eager (every chunk's saved fp32 log-softmax, one chunk's two fp32 gradients at
#: its log-softmax backward) and compiled (every chunk's saved 16-bit logits, one chunk's 16-bit gradient)
EAGER_PER_LOGIT = 4 + 8 / CHUNKS
COMPILED_PER_LOGIT = 2 + 2 / CHUNKS


class TorchtuneLoss(Technique):
    name = "torchtune_loss"
    fields = ()
    summary = "torchtune's LinearCrossEntropyLoss: the head and cross-entropy over 8 chunks of label positions, no full logits"
    sources = SOURCES
    requires = Requires(tasks=("train",))
    order = 39

    def active(self, setup: Any) -> bool:
        return bool(setup.trainer == "torchtune")

    def off(self) -> dict[str, Any]:
        return {}   # the training loop is the user's, not a trade a plan makes

    def conflict(self, setup: Any) -> str | None:
        if self.active(setup) and (setup.liger_kernel or setup.cut_cross_entropy):
            return self._refused("torchtune's recipes run neither Liger's kernels nor Cut Cross-Entropy (their loss is "
                                 "LinearCrossEntropyLoss); set liger_kernel=False and cut_cross_entropy=False, or trainer='transformers'")
        return super().conflict(setup)

    def memory(self, ctx: MemoryContext, terms: MemoryTerms) -> MemoryTerms:
        if not self.active(ctx.setup) or ctx.setup.task != "train":
            return terms
        path = loss_bytes(ctx.spec, ctx.shape, ctx.setup.torch_compile)
        note = (f"loss path priced for torchtune's LinearCrossEntropyLoss ({'compiled' if ctx.setup.torch_compile else 'eager'}, "
                f"{CHUNKS} chunks): {path / 1e9:.2f} GB at its peak instead of {terms.logits / 1e9:.2f} GB for HF's full logits")
        return terms.changed(note, logits=path)


def loss_bytes(spec: Any, shape: Any, compiled: bool) -> int:
    """The loss path's peak on the micro-batch ``shape``: per logit as the module docstring counts, plus the 16-bit
    copy of the selected positions' hidden states the chunks are cut from."""
    positions = shape.micro_batch_size * shape.seq_len
    per_logit = COMPILED_PER_LOGIT if compiled else EAGER_PER_LOGIT
    return int(per_logit * positions * spec.vocab_size) + positions * spec.hidden_size * 2


TECHNIQUES = (TorchtuneLoss(),)
