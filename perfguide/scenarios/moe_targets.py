"""What fits when a LoRA plan's adapters reach a MoE's fused experts: the same plan with LoRA on the attention only.

peft >= 0.20 rewrites ``all-linear`` on a transformers-5 MoE to ``target_parameters`` on the expert stacks and the
router (memory/moe_lora.py), which is where most of the adapters, their AdamW states and the merged expert copies
go. Practitioners keep LoRA off the experts by naming the attention projections; peft converts only the v4 expert /
router names (``gate``, ``w1``-``w3``, ``gate_proj``/``up_proj``/``down_proj``: ``_MOE_TARGET_MODULE_MAPPING``), so a
list of attention names stays plain Linear targets. The MLP names are left out on purpose: on a qwen2_moe-pattern
model a dense or shared-expert ``gate_proj`` in the list is rewritten to the experts' ``gate_up_proj`` instead. Offered, never chosen:
the adapters change what trains.
"""

from __future__ import annotations

from collections.abc import Callable

from .. import sources
from ..memory.ledger import ledger
from ..model.linears import linear_shapes
from ..model.types import ModelSpec
from ..setup import LoraSpec
from .search import SearchResult, gib, least_memory, price
from .training import finetune_mode
from .types import Plan, Request


def attention_targets(spec: ModelSpec) -> tuple[str, ...]:
    """The block's attention Linears by leaf name (``q_proj``...), or by their path where a leaf name would also
    match a Linear outside the attention; empty where the block has none perfguide can name."""
    shapes = [s[0] for s in linear_shapes(spec)]
    attn = [p for p in shapes if "attn" in p.split(".")[0] or p.split(".")[0] == "attention"]
    leaves = tuple(dict.fromkeys(p.rsplit(".", 1)[-1] for p in attn))
    outside = [p for p in shapes if p not in attn and p.rsplit(".", 1)[-1] in leaves]
    return tuple(dict.fromkeys(attn)) if outside else leaves


def expert_free_lora(request: Request, result: SearchResult, adapters: dict[str, SearchResult],
                     plan: Callable[[Request], Plan], per: str) -> tuple[str, ...]:
    """Nothing fits and the adapters include MoE expert / router targets: the same plan with LoRA on the attention
    projections, said with the kwargs that follow it, the trainable parameters and the GiB saved, when that fits.
    ``plan``: the scenario's, without its own suggestions; ``adapters``: the LoRA alternatives of a full plan."""
    cons, spec = request.constraints, request.model
    mode = finetune_mode(cons)
    searched = result if mode != "full" else adapters.get("lora")
    if searched is None or searched.chosen is not None or not searched.options:   # all-linear LoRA fits already
        return ()
    lean = least_memory(searched)
    before = ledger(spec, lean.setup)
    targets = attention_targets(spec)
    if before.experts is None or not targets or lean.setup.lora is None:
        return ()
    lora = (cons.lora or LoraSpec()).model_copy(update={"target_modules": targets})
    update = {"lora": lora} if mode != "full" else {"lora": lora, "finetune": "lora"}
    followed = plan(request.model_copy(update={"constraints": cons.model_copy(update=update)}))
    if not followed.fits:
        return ()
    same = price(spec, lean.setup.replace(lora=lora), request.hardware, request.calibration)
    after = ledger(spec, same.setup)
    kwargs = ("finetune='lora', " if mode == "full" else "") + f"lora=LoraSpec(target_modules={targets!r})"
    return (f"{kwargs} (--lora-target-modules {','.join(targets)}) fits: LoRA on the attention projections only, "
            f"the experts and router left frozen: {after.trainable_params / 1e6:,.1f}M trainable parameters instead of "
            f"{before.trainable_params / 1e6:,.1f}M, {gib(lean.memory.device_total - same.memory.device_total)} less on the "
            f"same setup ({lean.setup.label}); {gib(followed.memory.device_total)} per {per}, {followed.throughput.step_time_s:.3g} s/step "
            f"({followed.setup.label}). all-linear adapts {spec.name}'s fused experts and router as target_parameters; "
            f"a list of other names stays Linear targets ({sources.PEFT_MOE_TARGETS})",)
