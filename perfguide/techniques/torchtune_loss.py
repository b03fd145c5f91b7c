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

from typing import TYPE_CHECKING, Any

from .base import Requires, Technique
from .effects import MemoryContext, MemoryTerms

if TYPE_CHECKING:
    from ..setup import Setup

SOURCES = (
    "https://github.com/pytorch/torchtune/blob/main/torchtune/modules/loss/cross_entropy_loss.py (LinearCrossEntropyLoss)",
    "https://github.com/pytorch/torchtune/blob/main/recipes/full_finetune_single_device.py (loss.set_model_output, apply_compile_strategy)",
)

#: how a torchtune recipe holds its weights: said by the plans' weights and master-weights decisions
TORCHTUNE_DTYPE = ("a torchtune recipe casts the model to its dtype and trains in it (training.set_default_dtype: no "
                   "autocast, no fp32 master copy; its LoRA adapters are built in it too)")

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

    def memory(self, ctx: MemoryContext, terms: MemoryTerms) -> MemoryTerms:
        if not self.active(ctx.setup) or ctx.setup.task != "train":
            return terms
        path = loss_bytes(ctx.spec, ctx.shape, ctx.setup.torch_compile)
        note = (f"loss path priced for torchtune's LinearCrossEntropyLoss ({'compiled' if ctx.setup.torch_compile else 'eager'}, "
                f"{CHUNKS} chunks): {path / 1e9:.2f} GB at its peak instead of {terms.logits / 1e9:.2f} GB for HF's full logits")
        return terms.changed(note, logits=path)


def as_recipe_runs(s: Setup) -> Setup | None:
    """``s`` as a torchtune recipe runs it, or None where no recipe config can say it. A recipe casts the model to
    its ``dtype`` and trains in it (training.set_default_dtype, no autocast): pure bf16 or fp32, never fp32 masters
    under bf16 autocast; its LoRA adapters are built in that dtype too, a QLoRA base gets no peft k-bit upcast and
    a bitsandbytes optimizer is instantiated directly (no Trainer embedding override). TF32 is left at torch's
    default (off), and its StatefulDataLoader loads in the main process without pinned memory (the recipes pass
    no num_workers or pin_memory). ``enable_fp8_training`` (torchao float8 over the bf16 model) is its fp8."""
    if s.task != "train" or s.trainer != "torchtune":
        return s
    if s.weights_dtype == "fp32" and s.autocast is not None:
        return None
    dtype = s.weights_dtype if s.weights_dtype in ("bf16", "fp16", "fp32") else "bf16"
    changes: dict[str, Any] = {"autocast": "fp8" if s.autocast == "fp8" else None, "tf32": False, "bnb_embedding_override": False,
                               "dataloader_num_workers": 0, "dataloader_pin_memory": False}
    if s.lora is not None:
        changes["lora"] = s.lora.model_copy(update={"adapter_dtype": dtype})
    if s.quantized:
        changes["kbit_upcast"] = False
    return s.replace(**changes)


def loss_bytes(spec: Any, shape: Any, compiled: bool) -> int:
    """The loss path's peak on the micro-batch ``shape``: per logit as the module docstring counts, plus the 16-bit
    copy of the selected positions' hidden states the chunks are cut from."""
    positions = shape.micro_batch_size * shape.seq_len
    per_logit = COMPILED_PER_LOGIT if compiled else EAGER_PER_LOGIT
    return int(per_logit * positions * spec.vocab_size) + positions * spec.hidden_size * 2


TECHNIQUES = (TorchtuneLoss(),)
