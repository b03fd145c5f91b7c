"""The optimizer (TrainingArguments ``optim``): the default fused AdamW, and lighter ones when states do not fit.

A lighter optimizer changes the training semantics less than pure 16-bit weights do, so its rung comes
before pure bf16: 8-bit AdamW (bitsandbytes blockwise quantized states, Dettmers et al. 2022) or Adafactor's
factored second moments (Shazeer & Stern 2018).

Paged optimizers (bitsandbytes ``paged_*``): state lives in CUDA unified memory from ``cudaMallocManaged``, outside
torch's caching allocator (bitsandbytes functional.get_paged), evicted to the host under pressure. Memory: the
allocator peak holds one tensor's pages, host RAM backs the rest; speed: evicted state pages over PCIe each step.
"""

from __future__ import annotations

import logging
from typing import Any

from .._base import GiB
from ..data.techniques import constant
from ..optimizer_facts import row, rows, steps_in_backward
from .base import EmitContext, LadderContext, Requires, Rung, Technique
from .effects import MemoryContext, MemoryTerms, SpeedContext, StepSeconds

logger = logging.getLogger("perfguide.techniques")

DEFAULT_OPTIMIZER = "adamw_torch_fused"
#: optim_target_modules for GaLore/APOLLO: attention and MLP Linears (the transformers optimizers guide's example);
#: embeddings, head and norms keep plain AdamW state
LOW_RANK_TARGETS = (r".*.attn.*", r".*.mlp.*")
#: lighter states, same update rule (AdamW's, its moments stored in 8 bits): tried right after exact AMP
LIGHT_OPTIMIZERS = ("adamw_bnb_8bit",)
#: a different update rule (factored second moment, no first moment): tried only after every saver that keeps
#: AdamW's rule (pure bf16, stepping inside backward, CPU offload) has failed to fit; docs/concepts.md says why
RULE_CHANGING_OPTIMIZERS = ("adafactor",)
#: after CPU offload (45), before LoRA/QLoRA change what trains
RULE_CHANGING_ORDER = 47
OPTIM_DOCS = "https://huggingface.co/docs/transformers/optimizers"
BNB_PAPER = "Dettmers et al. 2022, 8-bit Optimizers via Block-wise Quantization (arXiv:2110.02861)"
ADAFACTOR_PAPER = "Shazeer & Stern 2018, Adafactor (arXiv:1804.04235)"


def chosen_optimizer(ctx: LadderContext) -> str:
    """The requested optimizer, else the default."""
    return ctx.optimizer or DEFAULT_OPTIMIZER


class Optimizer(Technique):
    name = "optimizer"
    fields = ("optimizer",)
    summary = "which optimizer keeps which states: fused AdamW by default, 8-bit AdamW or Adafactor when states do not fit"
    sources = (OPTIM_DOCS, BNB_PAPER, ADAFACTOR_PAPER)
    requires = Requires(tasks=("train",))
    order = 20
    ladder_order = 20

    def active(self, setup: Any) -> bool:
        return setup.task == "train" and setup.optimizer is not None

    def conflict(self, setup: Any) -> str | None:
        if steps_in_backward(setup.optimizer) and (not setup.optimizer_in_backward or setup.lora is not None):
            return (f"optim={setup.optimizer!r} steps inside backward through the Trainer itself (LOMO / layer-wise hooks): a full "
                    "fine-tune with optimizer_in_backward=True (one process, gradient_accumulation_steps=1), not with LoRA or a separate step")
        return None

    def label_word(self, setup: Any) -> str | None:
        return setup.optimizer if self.active(setup) else None

    def rungs(self, ctx: LadderContext) -> list[Rung]:
        if ctx.finetune != "full" or ctx.optimizer is not None:
            return []
        def templates(names: tuple[str, ...]) -> tuple[Any, ...]:
            return tuple(ctx.base.replace(weights_dtype="fp32", autocast=ctx.autocast, optimizer=o) for o in names)

        return [Rung("lighter optimizer states", "AdamW's update rule with its two moments stored in 8 bits (bnb)",
                     templates(LIGHT_OPTIMIZERS)),
                Rung("a different update rule", "Adafactor's factored second moment and no first moment: it converges "
                     "differently from AdamW, so it comes after every saver that keeps AdamW's rule",
                     templates(RULE_CHANGING_OPTIMIZERS), order=RULE_CHANGING_ORDER)]

    def memory(self, ctx: MemoryContext, terms: MemoryTerms) -> MemoryTerms:
        if not paged(ctx.setup):
            return terms
        note = (f"paged optimizer: {ctx.optimizer_bytes / GiB:.1f} GiB of state in CUDA unified memory (outside torch's allocator), "
                "evicted to host RAM under memory pressure")
        if not (ctx.optimizer_bytes and ctx.setup.device == "cuda"):
            return terms.changed(note)
        working = ctx.largest_trainable * max(1, round(ctx.state_bytes / max(1, ctx.trainable_params)))
        return terms.changed(note, optimizer_on_device=min(ctx.optimizer_bytes, working), cpu_ram=terms.cpu_ram + ctx.optimizer_bytes)

    def speed(self, ctx: SpeedContext) -> StepSeconds:
        if not paged(ctx.setup):
            return StepSeconds()
        mem = ctx.memory()
        return StepSeconds(per_step=paged_seconds(mem.optimizer_states, free_device_bytes(ctx.hardware, mem.device_total), ctx.pcie))

    def training_args(self, ctx: EmitContext) -> dict[str, Any]:
        name = ctx.setup.optimizer
        if name is None:
            return {}
        if name in BNB_8BIT_OPTIMIZERS and not ctx.setup.bnb_embedding_override:
            from ..errors import InvalidSetupError

            # Trainer.create_optimizer registers it for every bnb optimizer with optim_bits=8: TrainingArguments cannot say otherwise
            raise InvalidSetupError(f"optim={name!r} under the HF Trainer gives embeddings 32-bit state (its GlobalOptimManager "
                                    "override); this plan was priced without it (bnb_embedding_override=False, torchtune's layout): "
                                    "plan with bnb_embedding_override=True")
        # GaLore/APOLLO project the block Linears' gradients; the Trainer raises without optim_target_modules
        return {"optim": name, "optim_target_modules": list(LOW_RANK_TARGETS)} if row(name).rank else {"optim": name}

    def prepare(self, ctx: EmitContext, model: Any) -> Any:
        """8-bit bnb states: embeddings get 32-bit state (pretrained) or a StableEmbedding (from scratch)."""
        if ctx.setup.task == "train" and ctx.setup.optimizer in BNB_8BIT_OPTIMIZERS and ctx.setup.bnb_embedding_override:
            if ctx.from_scratch:
                use_stable_embedding(model)
            else:
                register_bnb_embedding_overrides(model)
        return model


def paged(setup: Any) -> bool:
    """Whether the optimizer keeps its state in CUDA unified memory (data/optimizers.json ``paged``)."""
    return setup.task == "train" and setup.optimizer is not None and row(setup.optimizer).paged


def paged_seconds(states: int, free_device: int, pcie_bytes_per_s: float) -> float:
    """Seconds per optimizer step of paging evicted optimizer state in and out; nothing when it all stays on the GPU.

    Every evicted byte is prefetched in for its update and written back when the driver evicts it for the next
    tensor's prefetch; the two directions run on separate copy engines at once (techniques.json ``paged_pcie_passes``
    says where in bitsandbytes and the UVM driver), and bnb synchronizes after each tensor, so none of it hides
    behind compute."""
    evicted = max(0, states - max(0, free_device))
    return constant("paged_pcie_passes") * evicted / pcie_bytes_per_s


def free_device_bytes(hardware: Any, device_total: int, headroom: float = 0.10) -> int:
    """What unified-memory pages may fill on the GPU besides the allocator's own peak."""
    gpu = hardware.smallest_gpu
    if gpu is None:
        return 0
    return int(gpu.allocatable * (1 - headroom)) - device_total  # what CUDA can allocate, not the board total


#: Optimizers whose state bnb keeps in 8 bits (Trainer.create_optimizer registers embeddings for 32-bit state for these;
#: torchtune, which instantiates bnb's classes itself, registers nothing: Setup.bnb_embedding_override).
BNB_8BIT_OPTIMIZERS = tuple(name for name, facts in rows().items() if facts.bnb_8bit)


def register_bnb_embedding_overrides(model: Any) -> int:
    """Give every nn.Embedding weight 32-bit optimizer state, as Trainer.create_optimizer does.

    bnb reads the overrides lazily at the first ``step()``, so this must run before it; an 8-bit state
    for embeddings makes training unstable (Dettmers, transformers#14819). Returns how many were added.
    """
    import bitsandbytes as bnb
    import torch

    manager = bnb.optim.GlobalOptimManager.get_instance()
    known = {(id(m), name) for m, name, _ in manager.module_weight_config_triple}
    added = 0
    for module in model.modules():
        if isinstance(module, torch.nn.Embedding) and (id(module), "weight") not in known:
            manager.register_module_override(module, "weight", {"optim_bits": 32})
            added += 1
    return added


def use_stable_embedding(model: Any) -> None:
    """From-scratch models only: bnb StableEmbedding (Xavier init + LayerNorm, 32-bit state by itself).

    Never for pretrained weights: the extra LayerNorm made fine-tuning worse (transformers#14819).
    """
    import bitsandbytes as bnb

    old = model.get_input_embeddings()
    if isinstance(old, bnb.nn.StableEmbedding):
        return
    # no device=/dtype= here: bnb 0.50 passes them positionally into torch 2.13's nn.Embedding, one slot off
    new = bnb.nn.StableEmbedding(old.num_embeddings, old.embedding_dim, padding_idx=old.padding_idx)
    new = new.to(device=old.weight.device, dtype=old.weight.dtype)
    model.set_input_embeddings(new)
    if getattr(model.config, "tie_word_embeddings", False):
        model.tie_weights()
    logger.info("replaced %s with bnb.nn.StableEmbedding (training from scratch)", type(old).__name__)


TECHNIQUES = (Optimizer(),)
