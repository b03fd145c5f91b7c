"""axolotl's ``chunked_cross_entropy``: transformers' causal-LM loss replaced by one that cuts the model's 16-bit
logits into chunks and runs a compiled cross-entropy on each, so no fp32 copy of the whole logits ever exists.

Read in axolotl's code (src/axolotl/monkeypatch/loss/chunked.py, applied by loaders/patch_manager.py
``_apply_chunked_cross_entropy_patch``; the loss is torchtune's CEWithChunkedOutputLoss, copied): the patch swaps
``transformers.loss.loss_utils.ForCausalLMLoss``, which the model's forward calls on the logits its head returned
(16-bit under autocast or bf16 weights). It pads and shifts the labels, ``source.chunk(n, dim=1)`` (8 chunks unless
``chunked_cross_entropy_num_chunks``), ``reshape(-1, V)`` each (a copy of the chunk when the micro-batch holds more
than one row) and sums ``torch.compile``'d ``F.cross_entropy(chunk.float(), ...)`` over them. Inductor's graph for
that call saves its 16-bit input and a per-row statistic and its backward writes one 16-bit gradient the size of the
chunk (tests/test_compiled_block.py reads the generated code); autograd then joins the chunks' gradients (the split's
backward). So the loss path peaks at two 16-bit logits per position and vocabulary entry: the logits (or their chunk
copies) beside the gradients gathering for the join, then the join's output beside them. HF's own loss holds 12 B
per logit (memory/loss_path.py). Traced on real CPU tensors with the compiled call's contract
(tests/test_chunked_cross_entropy.py): within 5% of 2 x the head's bytes per logit at 1, 2 and 4 rows.

Priced where a config runs it (``perfguide check`` of an axolotl YAML, ``estimate``); a plan never turns it on and
cannot apply it (axolotl applies its own patch).
"""

from __future__ import annotations

from typing import Any

from ..memory.loss_path import head_bytes
from .base import HF_TRAINERS, Requires, Technique
from .cut_cross_entropy import supported
from .effects import MemoryContext, MemoryTerms

SOURCES = (
    "https://github.com/axolotl-ai-cloud/axolotl/blob/main/src/axolotl/monkeypatch/loss/chunked.py",
    "https://github.com/pytorch/torchtune/pull/1390 (CEWithChunkedOutputLoss)",
)

#: the tensors of the loss path alive at its peak, in units of the head's logits: the logits (or their chunk copies)
#: and the chunks' 16-bit gradients, then those gradients and the split backward's joined output
HEAD_COPIES_AT_PEAK = 2


def loss_bytes(spec: Any, setup: Any, shape: Any) -> int:
    """The loss path's peak on the micro-batch ``shape`` (the logits' width as HF's loss prices it)."""
    return HEAD_COPIES_AT_PEAK * head_bytes(setup) * shape.micro_batch_size * shape.seq_len * spec.logits_width


class ChunkedCrossEntropy(Technique):
    name = "chunked_cross_entropy"
    fields = ("chunked_cross_entropy",)
    summary = "axolotl's chunked cross-entropy: the loss over chunks of the 16-bit logits, never upcast whole"
    sources = SOURCES
    requires = Requires(tasks=("train",), binding=True, trainers=HF_TRAINERS, model_codes=("transformers",))
    order = 38
    label_order = 64

    def active(self, setup: Any) -> bool:
        return bool(setup.chunked_cross_entropy)

    def label_word(self, setup: Any) -> str | None:
        return "chunked-ce" if self.active(setup) else None

    def off(self) -> dict[str, Any]:
        return {"chunked_cross_entropy": False}

    def conflict(self, setup: Any) -> str | None:
        """The patch replaces transformers' loss function; a fused loss computes the loss inside the patched forward and
        never calls it (axolotl refuses it beside Cut Cross-Entropy), and TRL's own losses do not call it either."""
        if not self.active(setup):
            return None
        if setup.cut_cross_entropy or setup.liger_kernel:
            fused = "cut_cross_entropy" if setup.cut_cross_entropy else "liger_kernel's fused linear cross-entropy"
            return self._refused(f"chunked_cross_entropy replaces transformers' loss function, which {fused} bypasses "
                                 "(axolotl refuses the pair)")
        from .trl_trainer import model_loss_runs

        if not model_loss_runs(setup):
            return self._refused("chunked_cross_entropy patches the model's own loss, which TRL's trainer does not run "
                                 "here (its loss scores tokens with a head of its own)")
        return super().conflict(setup)

    def not_emitted(self, model: Any) -> str | None:
        return "axolotl applies its chunked loss itself (monkeypatch/loss/chunked.py); a plan made here does not patch transformers' loss"

    def memory(self, ctx: MemoryContext, terms: MemoryTerms) -> MemoryTerms:
        if not (self.active(ctx.setup) and ctx.setup.task == "train" and supported(ctx.spec)):
            return terms
        path = loss_bytes(ctx.spec, ctx.setup, ctx.shape)
        note = (f"loss path priced for axolotl's chunked cross-entropy: {path / 1e9:.2f} GB at its peak (the 16-bit logits "
                f"and their gradient) instead of {terms.logits / 1e9:.2f} GB for HF's loss on full logits")
        return terms.changed(note, logits=path)


TECHNIQUES = (ChunkedCrossEntropy(),)
