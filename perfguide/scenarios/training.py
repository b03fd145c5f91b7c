"""The training planner shared by train_gpu_one, train_gpu_many and train_cpu: search the fit ladder
(composed from perfguide.techniques) for one device type and explain the result as Decisions.

The scenarios differ in the base Setup, the layout levels they cross the ladder with (several GPUs) and
what they suggest when nothing fits; everything else about a training plan is decided here.
"""

from __future__ import annotations

from collections.abc import Callable

from .. import sources, techniques
from ..decisions import Alternative, Decision
from ..errors import ConflictingConstraintsError, unknown_value
from ..hardware.types import GPU, Hardware
from ..memory.ledger import adapter_bytes
from ..model.tasks import headless_training_note
from ..model.types import ModelSpec
from ..optimizer_facts import row as optimizer_row
from ..setup import OPTIMIZERS, LoraSpec, Setup
from ..speed.training import merged_expert_seconds
from ..techniques.torchtune_loss import TORCHTUNE_DTYPE
from .bnb_gate import quantization_runs, runnable_rungs
from .compile_choice import compile_choice
from .dora_note import dora_note
from .host import host_assumption_warnings, host_decision, pin_memory_decision
from .kbit_cast import adapter_dtype_decision, kbit_cast_decision
from .ladder import training_rungs
from .master_weights import check_master_weights, master_weights_decision
from .module_state import dequantized_checkpoint_decision
from .rules_attention import decide_attention
from .rules_precision import Precision
from .search import (
    Option,
    Priced,
    Rung,
    SearchResult,
    broken_limit,
    candidates,
    fits_ram,
    gib,
    least_memory,
    micro_batch_choices,
    search,
    speed_warnings,
    usable_bytes,
)
from .technique_decisions import technique_decisions
from .types import Candidate, Constraints, Plan, Request

Suggest = Callable[[Request, SearchResult, dict[str, SearchResult], str], tuple[str, ...]]

_GUIDE = sources.TRAIN_GPU_ONE
_LADDER_SOURCE = f"{_GUIDE} (batch size first, then gradient accumulation; checkpointing, optimizer and precision trade memory)"


def check_optimizer(name: str | None) -> None:
    if name is not None and name not in OPTIMIZERS:
        raise unknown_value("optimizer", name, OPTIMIZERS, ConflictingConstraintsError)


#: constraints the ladder's techniques read: each technique's own switch, and the layout/precision ones several read
TECHNIQUE_CONSTRAINTS = (*(t.switch for t in techniques.registry() if t.switch), "strategy", "allow_offload", "precision")


def technique_wants(cons: Constraints) -> dict[str, object]:
    """What the user forced per technique (the ladder's techniques read it; None means the search decides)."""
    return {k: getattr(cons, k) for k in TECHNIQUE_CONSTRAINTS if getattr(cons, k) is not None}


def objective_fields(cons: Constraints) -> dict[str, object]:
    """The training objective every candidate of the plan shares (the user's, never searched)."""
    trainer = cons.trainer or ("trl" if cons.objective == "dpo" else "transformers")
    return {"objective": cons.objective, "precompute_ref_log_probs": cons.precompute_ref_log_probs, "trainer": trainer}


#: the adapter alternatives a full fine-tune's plan prices beside it (for its decisions and what would fit)
ADAPTER_KINDS = ("lora", "qlora")

def finetune_mode(cons: Constraints) -> str:
    """None means full fine-tuning; a LoRA spec without a mode means LoRA."""
    return cons.finetune or ("lora" if cons.lora is not None else "full")


def attention(cons: Constraints, prec: Precision, gpu: GPU | None, spec: ModelSpec, local: bool,
              seq_len: int | None = None) -> tuple[str, Decision]:
    """The shared attention rule (rules_attention) for the plan's device and compute dtype."""
    d = decide_attention(spec, cons.attn_implementation, gpu, prec.autocast, local=local, seq_len=seq_len)
    return str(d.value), d


def plan_training(request: Request, base: Setup, prec: Precision, fixed: tuple[Decision, ...], per_rank_batch: int,
                  suggest: Suggest, adapter_kinds: tuple[str, ...] = ADAPTER_KINDS,
                  expand: Callable[[list[Rung]], list[Rung]] | None = None,
                  choose: Callable[[list[Priced]], Priced] | None = None,
                  tier: Callable[[Rung], object] | None = None, verdict_only: bool = False) -> Plan:
    """Search the ladder for one device type and assemble the Plan; shared by the training scenarios.

    ``suggest(request, result, adapters, mode)`` says what would fit when nothing does.
    ``verdict_only``: the plan a suggestion prices for its verdict, setup and numbers alone (what would fit at a
    shorter length, a smaller batch, ...): no adapter alternatives and no candidate table, each a search's worth.
    ``expand(rungs)`` turns the ladder's rungs into the rungs searched (multi-GPU: each rung x sharding level);
    ``choose(fitting)`` picks among a rung's fitting options (default: the fastest).
    """
    hw, spec, cons = request.hardware, request.model, request.constraints
    mode = finetune_mode(cons)
    check_master_weights(cons.master_weights, mode)
    lora = cons.lora or LoraSpec()
    choices = micro_batch_choices(per_rank_batch, cons.micro_batch_size)

    def run(kind: str) -> SearchResult:
        rungs = training_rungs(base, prec.autocast, prec.half, prec.pure_half_allowed, finetune=kind, lora=lora,
                               optimizer=cons.optimizer, checkpointing=cons.gradient_checkpointing, model=spec, hardware=hw,
                               wants=technique_wants(cons))
        rungs = runnable_rungs(rungs, hw)  # no bnb rung where the target's capability flags say it cannot run
        return search(spec, expand(rungs) if expand else rungs, hw, per_rank_batch, choices, cons.headroom, choose,
                      factors=request.calibration, tier=tier)

    result = run(mode)
    warnings = list(prec.warnings) + [n for n in (headless_training_note(spec),) if n]
    if cons.trainer == "torchtune":   # priced as torchtune's loop; the outputs this plan writes are HF's
        warnings.append("trainer='torchtune': priced as a torchtune recipe runs (LinearCrossEntropyLoss); "
                        "training_args() and the accelerate / DeepSpeed files are Hugging Face's and do not run it: set "
                        "these values in your torchtune config (perfguide check CONFIG writes them in its keys)")
    def alternative(kind: str) -> SearchResult:
        """An adapter alternative the forced layout cannot run is simply not offered (the asked mode raised already)."""
        try:
            return run(kind)
        except ConflictingConstraintsError:
            return SearchResult(chosen=None, rung=None)

    kinds = [k for k in adapter_kinds if (k != "qlora" or quantization_runs("nf4", hw)) and not verdict_only]
    adapters = {} if mode != "full" or cons.from_scratch else {k: alternative(k) for k in kinds}
    chosen = result.chosen or least_memory(result)
    chosen, compile_decs = compile_choice(request, chosen) if result.chosen is not None else (chosen, [])
    decisions = [*fixed, pin_memory_decision(chosen.setup, hw.cpu), *ladder_decisions(request, result, chosen, mode, adapters), *master_weights_decision(request, chosen), *compile_decs,
                 *kbit_cast_decision(request, chosen), *adapter_dtype_decision(request, chosen), *technique_decisions(request, chosen), *host_decision(hw), *dequantized_checkpoint_decision("train", spec)]
    warnings += rung_warnings(result, cons) + speed_warnings(spec, chosen.setup, hw, request.calibration)
    warnings += host_assumption_warnings(hw, chosen.memory.cpu_ram, cons.headroom, result.chosen is not None,
                                         _ram_blocked(result, hw, cons.headroom))
    suggestions = () if result.chosen else suggest(request, result, adapters, mode)
    cands = () if verdict_only else candidates(result, hw, cons.headroom) + tuple(
        c for r in adapters.values() for c in candidates(r, hw, cons.headroom) if c.verdict != "does-not-fit" or r.chosen is None)
    cands = tuple(c.model_copy(update={"verdict": "fits"}) if c.verdict == "chosen" and c.setup != chosen.setup else c for c in cands)
    if result.chosen is not None and all(c.setup != chosen.setup for c in cands):   # torch.compile turned on after the search
        cands += (Candidate(setup=chosen.setup, memory=chosen.memory, throughput=chosen.throughput, verdict="chosen",
                            why="the fastest fitting setup, compiled (see the torch_compile decision)"),)
    return Plan(setup=chosen.setup, memory=chosen.memory, throughput=chosen.throughput, decisions=tuple(decisions),
                candidates=cands, warnings=tuple(warnings), fits=result.chosen is not None, suggestions=suggestions)


def _ram_blocked(result: SearchResult, hw: Hardware, headroom: float) -> tuple[str, int] | None:
    """The first searched setup that fits the GPUs but not the host RAM (its label and the RAM it needs), if any."""
    for _, opt in result.options:
        p = opt.too_big
        if opt.best is None and p is not None and p.memory.cpu_ram and not fits_ram(p.memory, hw, headroom):
            usable = usable_bytes(p.memory, headroom)
            if usable is None or p.memory.needed <= usable:
                return p.setup.label, p.memory.cpu_ram
    return None


# --- decisions --------------------------------------------------------------------------------------

def _usable(p: Priced, request: Request) -> int:
    return usable_bytes(p.memory, request.constraints.headroom) or 0


def ladder_decisions(request: Request, result: SearchResult, chosen: Priced, mode: str,
                     adapters: dict[str, SearchResult]) -> list[Decision]:
    s = chosen.setup
    return [
        _micro_decision(request, result, chosen),
        Decision(setting="gradient_accumulation_steps", value=s.gradient_accumulation_steps,
                 reason=f"keeps the global batch fixed: {s.batch_factors} = {s.global_batch_size}", number=s.global_batch_size, unit="samples", source=f"{_GUIDE}#gradient-accumulation"),
        _weights_decision(result, chosen, request.constraints.master_weights),
        _optimizer_decision(request, result, chosen),
        _checkpointing_decision(request, result, chosen),
        _finetune_decision(request, chosen, mode, adapters),
    ]


def _option_of(result: SearchResult, p: Priced) -> Option | None:
    return next((o for _, o in result.options if o.best is p or o.too_big is p), None)


def _micro_decision(request: Request, result: SearchResult, chosen: Priced) -> Decision:
    cons, s = request.constraints, chosen.setup
    opt = _option_of(result, chosen)
    usable = _usable(chosen, request)
    alts = []
    if opt is not None and opt.too_big is not None and opt.too_big is not chosen:
        why, number = broken_limit(opt.too_big.memory, request.hardware, cons.headroom)
        alts.append(Alternative(value=opt.too_big.setup.micro_batch_size, number=number, unit="bytes",
                                why_not=f"{why} ({cons.headroom:.0%} headroom)"))
    if cons.micro_batch_size:
        reason = f"micro_batch_size={cons.micro_batch_size} was requested"
    elif result.chosen is None:
        reason = f"even the smallest micro-batch does not fit: {broken_limit(chosen.memory, request.hardware, cons.headroom)[0]}"
    else:
        reason = (f"fastest micro-batch dividing the per-device batch {per_rank(s)} that fits with {cons.headroom:.0%} headroom: "
                  f"{gib(chosen.memory.needed)} of {gib(usable)} usable")
    # the number is the batch itself, in tokens (the bytes it costs are in the reason and the alternatives); a DPO
    # micro-batch counts preference pairs, each a chosen and a rejected row in the same forward
    rows = 2 if s.objective == "dpo" else 1
    reason += " (preference pairs: a chosen and a rejected row each)" if rows == 2 else ""
    reason += ("; per_device_eval_batch_size is set to it too: TrainingArguments' default evaluates 8 rows at once, whose "
               "full logits alone can exceed this step's memory when the micro-batch is smaller")
    return Decision(setting="per_device_train_batch_size", value=s.micro_batch_size, reason=reason,
                    number=rows * s.micro_batch_size * s.seq_len, unit="tokens per micro-batch", source=_LADDER_SOURCE, alternatives=tuple(alts))


def per_rank(s: Setup) -> int:
    return s.micro_batch_size * s.gradient_accumulation_steps


def _weights_decision(result: SearchResult, chosen: Priced, asked: str | None = None) -> Decision:
    s, m = chosen.setup, chosen.memory
    static = m.weights + m.gradients + m.optimizer_states
    if s.lora is not None:
        reason = f"the frozen base is stored in {s.weights_dtype}; only the {'16-bit' if adapter_bytes(s) == 2 else 'fp32'} adapters train"
    elif s.trainer == "torchtune":
        reason = f"{TORCHTUNE_DTYPE}: dtype {s.weights_dtype}"
    elif asked is not None:
        reason = (f"master_weights={asked!r} was requested: " + ("bf16 weights, grads and optimizer states (no fp32 copy)"
                  if s.weights_dtype == "bf16" else f"fp32 master weights, grads and optimizer states, autocast {s.autocast or 'off'}"))
    elif s.weights_dtype == "bf16":
        exact = [o for r, o in result.options if r.name.startswith(("exact", "lighter"))]
        need = min((o.too_big.memory.needed for o in exact if o.too_big), default=0)
        reason = (f"no fp32-master setup of the rungs before it fits (exact AMP, lighter optimizer states: the smallest needs "
                  f"{gib(need)}); pure bf16 stores weights, grads and optimizer "
                  "states in bf16: less than half the bytes, but updates lose precision at small learning rates")
    elif s.autocast:
        reason = f"true AMP: fp32 master weights, grads and optimizer states; autocast runs the matmuls in {s.autocast}"
    else:
        reason = "fp32 weights and compute"
    alts = () if s.weights_dtype != "fp32" or s.lora else (
        Alternative(value="bf16", why_not="pure bf16 saves memory but its optimizer update is lossy; only used when fp32 masters do not fit"),)
    return Decision(setting="weights_dtype", value=s.weights_dtype, reason=reason, number=static, unit="bytes",
                    source=techniques.get("mixed_precision").source, alternatives=alts)


def _optimizer_decision(request: Request, result: SearchResult, chosen: Priced) -> Decision:
    s = chosen.setup
    others: dict[str, Alternative] = {}
    for rung, o in result.options:
        t = o.template
        if t.optimizer is None or t.optimizer == s.optimizer or t.optimizer in others or t.weights_dtype != s.weights_dtype or _layout(t) != _layout(s):
            continue
        if o.best is None and o.too_big is not None:
            others[t.optimizer] = Alternative(value=t.optimizer, number=o.too_big.memory.device_total, unit="bytes",
                                              why_not=f"does not fit: {gib(o.too_big.memory.needed)} > {gib(_usable(o.too_big, request))}")
        elif o.best is not None:
            others[t.optimizer] = Alternative(value=t.optimizer, number=o.best.step_time, unit="s",
                                              why_not=f"{rung.name}: {o.best.step_time:.3g} s/step vs {chosen.step_time:.3g}")
    if request.constraints.optimizer:
        reason = f"optimizer={s.optimizer!r} was requested"
    elif s.optimizer == "adamw_torch_fused":
        reason = "fused AdamW: one kernel for the whole update, the transformers 5.x default"
    elif s.optimizer == "adamw_bnb_8bit":
        reason = "32-bit AdamW states do not fit; bnb 8-bit AdamW keeps 2 B/param of state (embeddings stay 32-bit under Trainer)"
    else:
        reason = f"{s.optimizer} is the fastest optimizer whose states fit"
    return Decision(setting="optim", value=s.optimizer, reason=reason, number=chosen.memory.optimizer_states, unit="bytes",
                    source=techniques.get("optimizer").source, alternatives=tuple(others.values()))


def _layout(s: Setup) -> tuple[str, bool, bool]:
    """How states are spread over devices; alternatives are only compared within one layout."""
    return s.strategy, s.offload_optimizer, s.offload_params


def _checkpointing_decision(request: Request, result: SearchResult, chosen: Priced) -> Decision:
    s = chosen.setup
    flip = result.option(optimizer=s.optimizer, weights_dtype=s.weights_dtype, lora=s.lora, strategy=s.strategy,
                         offload_optimizer=s.offload_optimizer, offload_params=s.offload_params, gradient_checkpointing=not s.gradient_checkpointing)
    alts = []
    if flip is not None:
        if flip.best is None:
            alts.append(Alternative(value=not s.gradient_checkpointing, number=flip.too_big.memory.device_total if flip.too_big else None,
                                    unit="bytes", why_not="does not fit even at the smallest micro-batch"))
        else:
            alts.append(Alternative(value=not s.gradient_checkpointing, number=flip.best.step_time, unit="s",
                                    why_not=f"{flip.best.step_time:.3g} s/step (micro-batch {flip.best.setup.micro_batch_size}) vs {chosen.step_time:.3g}"))
    if request.constraints.gradient_checkpointing is not None:
        reason = f"gradient_checkpointing={s.gradient_checkpointing} was requested"
    elif s.gradient_checkpointing:
        reason = ("activations do not fit otherwise, or the larger micro-batch it allows outweighs re-running the forward "
                  "(+1 forward = +33% matmul FLOPs; docs measure ~20% slower)")
    else:
        reason = "activations fit without it, so no forward is recomputed"
    return Decision(setting="activation_checkpointing", value=s.gradient_checkpointing, reason=reason, number=chosen.memory.activations,
                    unit="bytes", source=techniques.get("gradient_checkpointing").source, alternatives=tuple(alts))


def _finetune_decision(request: Request, chosen: Priced, mode: str, adapters: dict[str, SearchResult]) -> Decision:
    alts = []
    for kind, r in adapters.items():
        if r.chosen is not None:
            c = r.chosen
            priced = f"{gib(c.memory.device_total)} per device, {c.step_time:.3g} s/step"
            full_fits = mode == "full" and _fits(chosen, request)
            alts.append(Alternative(value=kind, number=c.memory.device_total, unit="bytes",
                                    why_not=f"full fine-tuning fits, and trains every weight ({kind}: {priced})" if full_fits
                                    else f"offered in the suggestions: {priced}"))
    reason = (f"finetune={mode!r} was requested" if request.constraints.finetune or request.constraints.lora else
              "full fine-tuning preferred: every weight trains; LoRA/QLoRA are offered when it does not fit")
    if mode != "full":
        lora = chosen.setup.lora
        reason += f" (r={lora.r}, alpha={lora.alpha}, targets={lora.target_modules})" if lora else ""
        reason += _merged_experts_note(request, chosen) + dora_note(request, chosen)
    return Decision(setting="finetune", value=mode, reason=reason, number=chosen.memory.device_total, unit="bytes",
                    source=techniques.get("lora").source, alternatives=tuple(alts))


def _merged_experts_note(request: Request, chosen: Priced) -> str:
    """What LoRA on a MoE's fused experts costs in time (speed/moe_lora.py): said where the plan's targets reach them."""
    merged, seconds = merged_expert_seconds(request.model, chosen.setup, request.hardware, chosen.throughput)
    if not merged.flops:
        return ""
    share = f", ~{seconds:.3g} s of the {chosen.step_time:.3g} s step" if seconds else ""
    return (f"; peft runs {request.model.name}'s fused experts on a merged weight W + s*A@B, rebuilt from the whole expert "
            f"stack twice per forward, and computes their full weight gradient: {merged.flops / 1e12:,.1f} TFLOP and "
            f"{merged.bytes / 1e9:,.0f} GB per micro-step{share}; LoRA on the attention projections alone skips it "
            f"({sources.PEFT_MOE_TARGETS})")


def _fits(p: Priced, request: Request) -> bool:
    return p.memory.needed <= _usable(p, request)


def rung_warnings(result: SearchResult, cons: Constraints) -> list[str]:
    s = result.chosen.setup if result.chosen else None
    if s is None:
        return []
    out = []
    if s.weights_dtype == "bf16" and s.lora is None:
        out.append("pure bf16 training: weights, grads and optimizer states in bf16 lose small updates; "
                   "watch the loss, or use a bigger GPU / LoRA to keep fp32 master weights")
    facts = optimizer_row(s.optimizer) if s.optimizer else None
    if facts is not None and facts.package == "bitsandbytes":
        out.append(f"optim={s.optimizer!r} needs bitsandbytes >= 0.46.1 on the training machine"
                   + ("; training from scratch: use bnb.nn.StableEmbedding for the embeddings" if cons.from_scratch and facts.bnb_8bit else ""))
    elif facts is not None and facts.package is not None:
        out.append(f"optim={s.optimizer!r} needs {facts.package} on the training machine")
    if s.optimizer == "adafactor":
        out.append("Adafactor may converge differently from AdamW; re-tune the learning rate")
    return out
