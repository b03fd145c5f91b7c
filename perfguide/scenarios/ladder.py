"""The fit ladder one training plan searches: the technique registry's rungs (``techniques.ladder``), cut to what the
request forces (master weights, each technique's switch, a strategy laid out by the scenario) and to what runs.

search.py prices and ranks the rungs this module composes; the two meet at ``Rung``.
"""

from __future__ import annotations

from dataclasses import replace

from .. import techniques
from ..errors import ConflictingConstraintsError
from ..hardware.types import Hardware
from ..model.types import ModelSpec
from ..optimizer_facts import steps_in_backward
from ..setup import OPTIMIZERS, LoraSpec, Setup
from ..techniques import LadderContext, Rung
from ..techniques.torchtune_loss import as_recipe_runs


def training_rungs(base: Setup, autocast: str | None, half: str | None, pure_half_allowed: bool, *, finetune: str,
                   lora: LoraSpec, optimizer: str | None, checkpointing: bool | None, model: ModelSpec | None = None,
                   hardware: Hardware | None = None, wants: dict[str, object] | None = None) -> list[Rung]:
    """The memory-saving ladder in order of what each rung gives up, composed from the technique registry
    (each technique's ``ladder_order`` and ``rungs``; axis techniques such as checkpointing are searched inside
    every rung, so they are tried before the optimizer or the weights change). Sources: the transformers
    guide https://huggingface.co/docs/transformers/perf_train_gpu_one (fill the GPU, then trade memory)."""
    ctx = LadderContext(base=base, autocast=autocast, half=half, pure_half_allowed=pure_half_allowed,
                        finetune=finetune, lora=lora, optimizer=optimizer, checkpointing=checkpointing,
                        model=model, hardware=hardware, wants=dict(wants or {}))
    rungs = in_backward_only(ctx) if steps_in_backward(optimizer) else techniques.ladder(ctx)
    rungs = honour_switches(as_the_loop_runs(runnable(master_weights_filter(rungs, ctx), ctx)), ctx)
    if base.world_size == 1 and ctx.wants.get("strategy") not in (None, "single"):
        # one GPU, a sharding strategy asked for: the scenario crosses the semantics rungs with that strategy's layouts
        # (strategies.layout_search: without offload and offloaded), so the rungs that come laid out already are dropped
        rungs = [r for r in (Rung(r.name, r.tradeoff, tuple(t for t in r.templates if t.strategy == "single"), r.order) for r in rungs)
                 if r.templates]
    return rungs


def in_backward_only(ctx: LadderContext) -> list[Rung]:
    """``optim='lomo'``, ``'adalomo'`` or a ``*_layerwise`` name: transformers steps it inside backward, so only the
    step-in-backward rung can run it (one process, no accumulation, full fine-tuning); refused in one line otherwise."""
    name = ctx.optimizer
    if ctx.finetune != "full" or ctx.wants.get("optimizer_in_backward") is False or ctx.base.world_size > 1:
        raise ConflictingConstraintsError(
            f"optim={name!r} steps each parameter inside backward (transformers: LOMO fused_backward / layer-wise hooks, "
            "no DDP, no gradient accumulation): it needs a full fine-tune on one GPU with optimizer_in_backward not False; "
            f"use scenario='train_gpu_one', or an optimizer that steps after backward (accepted: {', '.join(n for n in OPTIMIZERS if not steps_in_backward(n))})")
    plain = replace(ctx, optimizer=None)
    out = []
    for r in techniques.ladder(plain):
        ts = tuple(dict.fromkeys(t.replace(optimizer=name) for t in r.templates if t.optimizer_in_backward))
        if ts:
            out.append(Rung(r.name, r.tradeoff, ts))
    return out


def master_weights_filter(rungs: list[Rung], ctx: LadderContext) -> list[Rung]:
    """``master_weights='fp32'`` keeps only fp32-master full fine-tunes, ``'bf16'`` only pure-bf16 ones."""
    want = ctx.wants.get("master_weights")
    if want is None or ctx.finetune != "full":
        return rungs
    if want == "bf16" and not ctx.pure_half_allowed:
        raise ConflictingConstraintsError("master_weights='bf16' needs bf16 compute (a GPU with bf16 tensor cores); "
                                          "use master_weights='fp32' or None")
    keep = "fp32" if want == "fp32" else "bf16"
    out = [Rung(r.name, r.tradeoff, tuple(t for t in r.templates if t.weights_dtype == keep)) for r in rungs]
    return [r for r in out if r.templates]


def honour_switches(rungs: list[Rung], ctx: LadderContext) -> list[Rung]:
    """A technique forced on (``fp8=True``, ``liger_kernel=True``, ``activation_offloading=True``,
    ``optimizer_in_backward=True``...) keeps only the templates that use it, forced off only those that do not: the
    search then picks among them, and never hands back the switch the other way. Where no template is left it is
    refused in one line that says why it cannot run here."""
    for t in techniques.registry():
        want = ctx.wants.get(t.switch) if t.switch else None
        if not isinstance(want, bool):
            continue
        kept = [Rung(r.name, r.tradeoff, tuple(s for s in r.templates if t.active(s) == want)) for r in rungs]
        kept = [r for r in kept if r.templates]
        if not kept:
            why = _why_not_on(t, ctx) if want else None
            raise ConflictingConstraintsError(
                f"{t.switch}={want!r} cannot be honoured in this plan: "
                + (why or f"no candidate for these constraints can {'use' if want else 'go without'} it "
                           f"({_switch_context(ctx)})")
                + f"; drop {t.switch} or change what conflicts with it")
        rungs = kept
    return rungs


def _why_not_on(t: techniques.Technique, ctx: LadderContext) -> str | None:
    """Why the forced technique cannot run on the plan's base Setup, asked with its switch on (a technique that is off
    has nothing against it); None where that Setup itself is refused, or the technique has nothing to say."""
    try:
        on = ctx.base.replace(task="train", **({t.switch: True} if t.switch else {}))
    except ValueError:
        return None
    return t.why_not(on, ctx.hardware, ctx.model)


def _switch_context(ctx: LadderContext) -> str:
    model = ctx.model.model_type if ctx.model is not None else "this model"
    return (f"finetune={ctx.finetune!r}, precision {ctx.autocast or 'fp32'}, {ctx.base.world_size} process(es), "
            f"model type {model!r}")


def as_the_loop_runs(rungs: list[Rung]) -> list[Rung]:
    """Each template as its training loop runs it: a torchtune recipe trains in one dtype with no autocast, so its
    rungs are pure bf16 (or fp32) and AMP over fp32 masters is dropped (techniques/torchtune_loss.py); the Hugging
    Face loops run every template as it is."""
    kept = [Rung(r.name, r.tradeoff, tuple(dict.fromkeys(t for t in map(as_recipe_runs, r.templates) if t is not None)), r.order)
            for r in rungs]
    return [r for r in kept if r.templates]


def runnable(rungs: list[Rung], ctx: LadderContext) -> list[Rung]:
    """Only templates every active technique says it can run (Liger on a family it patches, activation offloading
    with checkpointing...): the search never prices a combination that does not run as priced."""
    def ok(s: Setup) -> bool:
        return not any(t.active(s) and t.why_not(s, ctx.hardware, ctx.model) for t in techniques.registry())

    kept = [Rung(r.name, r.tradeoff, tuple(s for s in r.templates if ok(s)), r.order) for r in rungs]
    return [r for r in kept if r.templates]
