"""Train on several GPUs (and nodes): the fastest layout that fits, the global batch kept fixed (transformers perf_train_gpu_many).

World size = GPUs per node x nodes; each rank gets global / world samples, split into micro-batch x
accumulation. The train_gpu_one ladder (precision, optimizer, checkpointing, LoRA/QLoRA) is searched with
every semantics rung crossed with the layout levels of strategies.py: DDP, gradient/optimizer sharding and full
sharding are one tier ranked by the interconnect-aware step time (FSDP2 kept on near-ties with DeepSpeed), CPU
offload a later tier tried only when nothing on-GPU fits (host RAM checked per node).
"""

from __future__ import annotations

from functools import partial

from .. import sources
from ..decisions import Alternative, Decision
from ..errors import ConflictingConstraintsError
from ..setup import QUANTIZED, Setup
from .host import gpu_dataloader
from .hybrid import hybrid_decision
from .moe_targets import expert_free_lora
from .nofit_training import freed_knobs, longest_sequence, precomputed_reference
from .rules_linear_attention import decide_linear_kernels
from .rules_precision import gpu_precision
from .search import (
    Option,
    Priced,
    SearchResult,
    best_for_template,
    bigger_gpu,
    fits,
    gib,
    least_memory,
    micro_batch_choices,
    not_fitting_why,
    price,
    usable_bytes,
    usable_ram,
)
from .sequence_split import sequence_splits, split_decision
from .strategies import (
    FSDP_TIE_TOLERANCE,
    SEQUENCE_LEVEL,
    SHARDING_TIE_TOLERANCE,
    SPLIT_OFFLOAD_LEVEL,
    Layout,
    Level,
    check_forced,
    comm_bytes,
    incompatible,
    is_offload_level,
    layout_of,
    layout_search,
    level_index,
    levels,
    sharding_depth,
)
from .training import attention, check_optimizer, finetune_mode, objective_fields, plan_training
from .types import Candidate, Plan, Request

_SOURCE = f"{sources.TRAIN_GPU_MANY}; {sources.DEEPSPEED} (ZeRO stage escalation order); {sources.ZERO_ESTIMATORS} (ZeRO estimators)"
MAX_NODES = 64


def world_of(request: Request) -> tuple[int, int]:
    """(GPUs per node, nodes) the plan uses; num_gpus may use fewer GPUs than the node has, never more."""
    hw, cons = request.hardware, request.constraints
    per_node = cons.num_gpus or hw.gpu_count
    if per_node > hw.gpu_count:
        raise ConflictingConstraintsError(f"num_gpus={per_node} but each node has {hw.gpu_count} GPU(s); use num_gpus <= {hw.gpu_count}")
    return per_node, hw.nodes


def per_rank_batch(global_batch: int, world: int) -> int:
    if global_batch % world:
        lower, upper = (global_batch // world) * world, -(-global_batch // world) * world
        near = " or ".join(str(b) for b in (lower, upper) if b > 0)
        raise ConflictingConstraintsError(f"global_batch_size={global_batch} is not a multiple of the world size {world} "
                                          f"(GPUs per node x nodes); use {near}, or change num_gpus/nodes")
    return global_batch // world


def plan(request: Request, *, suggestions: bool = True) -> Plan:
    """``suggestions=False``: the plan alone, for hints that only need the verdict, the setup and its numbers
    (plan_training's ``verdict_only``)."""
    hw, spec, cons = request.hardware, request.model, request.constraints
    gpu = hw.smallest_gpu
    if gpu is None:
        raise ConflictingConstraintsError("train_gpu_many needs GPUs; use scenario='train_cpu'")
    check_optimizer(cons.optimizer)
    per_node, nodes = world_of(request)
    world = per_node * nodes
    check_forced(cons.strategy, world, finetune_mode(cons))
    batch = per_rank_batch(request.global_batch_size, world)
    prec = gpu_precision(spec, gpu, cons.precision)
    impl, attn_dec = attention(cons, prec, gpu, request.model, request.hardware.source == "probe", request.seq_len)
    linear, linear_decs = decide_linear_kernels(request.model, cons.linear_attention_kernels, prec.autocast or prec.half,
                                                local=request.hardware.source == "probe", seq_len=request.seq_len)
    workers, pin, host_decs = gpu_dataloader(hw.cpu, per_node)
    base = Setup(task="train", avg_seq_len=request.constraints.avg_seq_len, target_len=request.constraints.target_len, **objective_fields(request.constraints), device="cuda", seq_len=request.seq_len, tf32=prec.tf32, attn_implementation=impl, **linear,
                 dataloader_num_workers=workers, dataloader_pin_memory=pin, gradient_accumulation_steps=batch,
                 num_gpus=per_node, nodes=nodes)
    p = plan_training(request, base, prec, (*prec.decisions, attn_dec, *linear_decs, *host_decs), per_rank_batch=batch,
                      suggest=partial(_what_would_fit, per_node=per_node) if suggestions else lambda *_: (),
                      verdict_only=not suggestions,
                      **layout_search(world, cons.allow_offload, cons.strategy, nodes, sequence_splits(request, per_node, nodes)))
    return add_layout(request, p, batch)


def ladder_of(request: Request, s: Setup) -> tuple[Level, ...]:
    """Every layout level of the plan's world, offload included, with the sequence splits it offers."""
    return levels(s.world_size, True, s.nodes, request.constraints.strategy, sequence_splits(request, s.num_gpus, s.nodes))


# --- the layout part of the plan ----------------------------------------------------------------------

def compare_layouts(request: Request, template: Setup, batch: int, splits: bool = True) -> list[tuple[Layout, Level, Option | None, str | None]]:
    """Every layout of the full ladder priced for the chosen semantics (micro-batch searched for each); the
    sequence-split level only with ``splits`` (a plan that splits, or one that fits nowhere): an unsplit plan that fits
    never takes it, so pricing it there would only list layouts the search does not offer."""
    cons = request.constraints
    choices = micro_batch_choices(batch, cons.micro_batch_size)
    out: list[tuple[Layout, Level, Option | None, str | None]] = []
    for lv in (lv for lv in ladder_of(request, template) if splits or lv.name not in (SEQUENCE_LEVEL, SPLIT_OFFLOAD_LEVEL)):
        for lay in lv.layouts:
            why = incompatible(template, lay)
            if why is None and (lay.offload_optimizer or lay.offload_params) and not cons.allow_offload:
                why = "allow_offload=False"
            if why is None and cons.strategy is not None and lay.strategy != cons.strategy:
                why = f"strategy={cons.strategy!r} was requested"
            incompatible_here = incompatible(template, lay) is not None   # cannot even be priced (fp8 under ZeRO)
            opt = None if incompatible_here else best_for_template(request.model, lay.apply(template), request.hardware,
                                                                    batch, choices, cons.headroom, request.calibration)
            out.append((lay, lv, opt, why))
    return out


def add_layout(request: Request, p: Plan, batch: int) -> Plan:
    """The layout's decisions (strategy, backend, offload, launcher), every layout priced as a candidate, its warnings."""
    chosen = Priced(p.setup, p.memory, p.throughput)
    compared = compare_layouts(request, p.setup, batch, splits=p.setup.sequence_ranks > 1 or not p.fits)
    decisions = [*p.decisions, strategy_decision(request, chosen, compared, p.fits), backend_decision(request, chosen, compared)]
    decisions += hybrid_decision(request, chosen, compared)
    decisions += quant_storage_decision(chosen)
    decisions += offload_decision(request, chosen)
    decisions += split_decision(request, chosen, compared)
    decisions.append(launcher_decision(p.setup))
    seen = {c.setup for c in p.candidates}
    extra = tuple(_candidate(request, lay, opt, why) for lay, _, opt, why in compared
                  if opt is not None and (shown := opt.best or opt.too_big) is not None and shown.setup not in seen)
    return p.model_copy(update={"decisions": tuple(decisions), "candidates": p.candidates + extra,
                                "warnings": p.warnings + tuple(layout_warnings(request, chosen))})


def _candidate(request: Request, lay: Layout, opt: Option, why: str | None) -> Candidate:
    h = request.constraints.headroom
    shown = opt.best or opt.too_big
    assert shown is not None, "only options with a priced setup become candidates (add_layout filters)"
    if why is not None:
        verdict, text = "incompatible", why
    elif opt.best is not None:
        verdict, text = "fits", f"{lay.name}: {opt.best.step_time:.3g} s/step ({opt.best.throughput.comm_time_s:.3g} s exposed communication)"
    else:
        verdict, text = "does-not-fit", f"{lay.name}: {not_fitting_why(shown.memory, request.hardware, h)}"
    return Candidate(setup=shown.setup, memory=shown.memory, throughput=shown.throughput, verdict=verdict, why=text)


def _numbers(request: Request, p: Priced) -> str:
    t = p.throughput
    text = (f"{gib(p.memory.device_total)} per GPU, {t.step_time_s:.3g} s/step with {t.comm_time_s:.3g} s of communication not "
            f"hidden behind compute ({gib(comm_bytes(request.model, p.setup))} sent per rank per step)")
    return text + (f", {gib(p.memory.cpu_ram)} host RAM per node" if p.memory.cpu_ram else "")


def _link(request: Request) -> str:
    hw = request.hardware
    intra = f"{hw.interconnect} ({hw.intra_node_bandwidth_gbps:g} GB/s per GPU)" if hw.intra_node_bandwidth_gbps else hw.interconnect
    return intra + (f", {hw.inter_node_bandwidth_gbps or 'unknown'} GB/s between nodes" if hw.nodes > 1 else "")


def strategy_decision(request: Request, chosen: Priced, compared: list, fits_: bool) -> Decision:
    s, cons = chosen.setup, request.constraints
    lay = layout_of(s)
    ladder = ladder_of(request, s)
    mine = level_index(ladder, lay)
    alts = []
    for other, lv, opt, why in compared:
        if other == lay:
            continue
        best = opt.best if opt else None
        shown = best or (opt.too_big if opt else None)
        if why is not None:
            note = f"not offered: {why}"
        elif best is None:
            note = f"does not fit: {not_fitting_why(shown.memory, request.hardware, cons.headroom)}" if shown else "does not fit"
        elif level_index(ladder, other) > mine and is_offload_level(lv.name):
            note = f"fits, but '{lv.name}' is only used when no on-GPU layout fits (it spends host RAM and PCIe time)"
        else:
            note = f"fits, but {'slower' if best.step_time > chosen.step_time else 'loses the FSDP2 tie-break'}"
        if shown is not None:
            note += f": {_numbers(request, shown)}"
        alts.append(Alternative(value=other.name, why_not=note, number=shown.memory.device_total if shown else None,
                                unit="bytes per GPU" if shown else None))
    return Decision(setting="strategy", value=s.strategy, reason=_strategy_reason(request, chosen, compared, fits_),
                    number=chosen.memory.device_total, unit="bytes per GPU", source=_SOURCE, alternatives=tuple(alts))


def _strategy_reason(request: Request, chosen: Priced, compared: list, fits_: bool) -> str:
    s, cons = chosen.setup, request.constraints
    lay = layout_of(s)
    where = f"{s.world_size} GPU(s) ({s.num_gpus} per node x {s.nodes} node(s)) over {_link(request)}" if s.world_size > 1 else "one GPU"
    numbers = _numbers(request, chosen)
    if not fits_ and cons.strategy:   # the forced strategy stays: say what each of its layouts breaks
        broken = "; ".join(f"{o.name}: {not_fitting_why(shown.memory, request.hardware, cons.headroom)}" for o, _, opt, why in compared
                           if why is None and opt is not None and (shown := opt.best or opt.too_big) is not None)
        return (f"strategy={cons.strategy!r} was requested and none of its layouts fits {where} ({broken}); the closest is "
                f"{lay.name}: {numbers}")
    if not fits_:
        return f"nothing fits on {where}; the closest layout is {lay.name}: {numbers}"
    if cons.strategy:
        return f"strategy={cons.strategy!r} was requested; {lay.name} on {where}: {numbers}"
    ladder = ladder_of(request, s)
    failed = [(o, opt) for o, lv, opt, why in compared if why is None and opt is not None and opt.best is None
              and level_index(ladder, o) < level_index(ladder, lay)]
    cheaper = "; ".join(f"{o.name} needs {gib(opt.too_big.memory.device_total)}" for o, opt in failed if opt.too_big)
    usable = gib(usable_bytes(chosen.memory, cons.headroom) or 0)
    slower = [(o, opt.best) for o, lv, opt, why in compared if why is None and opt is not None and opt.best is not None
              and not is_offload_level(lv.name) and o != lay and opt.best.step_time > chosen.step_time]
    tied = [o.name for o, lv, opt, why in compared if why is None and opt is not None and opt.best is not None
            and not is_offload_level(lv.name) and o != lay and opt.best.step_time <= chosen.step_time * (1 + SHARDING_TIE_TOLERANCE)
            and sharding_depth(opt.best.setup) > sharding_depth(s)]   # a tie the shallower sharding won, not a plain faster pick
    if slower and s.strategy not in ("ddp", "single"):
        o, best = min(slower, key=lambda ob: ob[1].step_time)
        ties = f"; {', '.join(tied)} within {SHARDING_TIE_TOLERANCE:.0%} (the shallower sharding is kept)" if tied else ""
        return (f"the fastest layout that fits: {lay.name} at {chosen.step_time:.3g} s/step against {o.name} at "
                f"{best.step_time:.3g} s/step, the next fastest (every on-GPU layout keeps the training the same, so they are "
                f"ranked by predicted step time){ties}{f'; over {usable} usable: {cheaper}' if cheaper else ''}; {where}: {numbers}")
    if s.strategy in ("ddp", "single"):
        return (f"a full replica (model states + activations) fits one GPU ({gib(chosen.memory.device_total)} of {usable} usable): "
                f"DDP syncs once per step and sharding would only add communication; {where}: {numbers}")
    return f"cheaper layouts do not fit {usable} usable per GPU ({cheaper or 'see alternatives'}); {lay.name} on {where}: {numbers}"


def backend_decision(request: Request, chosen: Priced, compared: list) -> Decision:
    """FSDP2 vs DeepSpeed: the tie-break between layouts of the same sharding level, stated with both step times."""
    s, h = chosen.setup, request.constraints.headroom
    lay = layout_of(s)
    ladder = ladder_of(request, s)
    rule = (f"FSDP2 (native torch, the Trainer's default FSDP version, no extra package or JSON) is kept over DeepSpeed ZeRO of the "
            f"same sharding level unless ZeRO is predicted more than {FSDP_TIE_TOLERANCE:.0%} faster")
    alts, fitting_fsdp = [], []
    for o, _, opt, why in compared:
        if o == lay or o.backend == lay.backend or level_index(ladder, o) != level_index(ladder, lay) or opt is None:
            continue
        b = opt.best
        if why is not None:
            note, number = f"not offered: {why}", None
        elif b is None:
            note, number = f"does not fit: {not_fitting_why(opt.too_big.memory, request.hardware, h)}", None
        else:
            note, number = f"{b.step_time:.3g} s/step vs {chosen.step_time:.3g}, {gib(b.memory.device_total)} per GPU", b.step_time
            fitting_fsdp += [b] if o.backend == "FSDP2" else []
        alts.append(Alternative(value=o.name, why_not=note, number=number, unit="s/step" if number is not None else None))
    if lay.backend == "torch DDP":
        outcome = "no sharding needed, so plain DDP"
    elif lay.backend == "FSDP2":
        outcome = "FSDP2 chosen"
    elif request.constraints.strategy:
        outcome = f"strategy={request.constraints.strategy!r} was requested"
    elif fitting_fsdp:
        outcome = f"ZeRO chosen: more than {FSDP_TIE_TOLERANCE:.0%} faster than the FSDP2 layout of its level"
    else:
        outcome = "ZeRO chosen: no FSDP2 layout of this sharding level fits or can run this setup"
    return Decision(setting="sharding_backend", value=lay.backend, reason=f"{outcome}; tie-break: {rule}", number=chosen.step_time,
                    unit="s/step", source=f"{sources.TRAIN_GPU_MANY}; {sources.FSDP} (FSDP2 is the Trainer default)", alternatives=tuple(alts))


def quant_storage_decision(chosen: Priced) -> list[Decision]:
    """The storage dtype of the packed 4-bit base, with the base's bytes per GPU that it decides: whole on every GPU under
    ZeRO-1/2, a 1/world shard where the parameters are sharded (uint8 there would keep the whole base on every GPU)."""
    s, weights = chosen.setup, chosen.memory.weights
    if s.weights_dtype == "nf4" and s.is_deepspeed and not s.shards_params:
        return [Decision(setting="bnb_4bit_quant_storage", value="uint8", number=weights, unit="bytes of weights per GPU (whole)",
                         reason=(f"{s.strategy} keeps the model whole on every GPU ({gib(weights)}) and DeepSpeed casts the module to "
                                 f"{s.autocast or 'bf16'}, floating tensors only: bitsandbytes' default uint8 storage keeps the packed "
                                 "4-bit base out of that cast (a float storage dtype would be cast with it)"),
                         source=sources.ZERO12_QLORA)]
    if s.weights_dtype != "nf4" or not s.shards_params:
        return []
    dtype = s.autocast or "bf16"
    return [Decision(setting="bnb_4bit_quant_storage", value=dtype, number=weights, unit="bytes of weights per GPU (sharded)",
                     reason=(f"sharding flattens the packed 4-bit weights with the other params, so their storage dtype must match the "
                             f"compute dtype ({dtype}): {gib(weights)} of weights per GPU over {s.world_size} ranks; with the "
                             "default uint8 accelerate leaves the 4-bit base unsharded on every GPU"),
                     source="accelerate utils/fsdp_utils.py fsdp2_prepare_model (Params4bit); PEFT docs (FSDP/ZeRO-3 + QLoRA)")]


def offload_decision(request: Request, chosen: Priced) -> list[Decision]:
    s = chosen.setup
    if not (s.offload_optimizer or s.offload_params):
        return []
    ram = usable_ram(request.hardware, request.constraints.headroom)
    take = "take" if chosen.memory.cpu_ram <= ram else "would take"
    return [Decision(setting="offload", value=layout_of(s).name, number=chosen.memory.cpu_ram, unit="bytes host RAM per node",
                     reason=(f"no layout fits on the GPUs alone; the offloaded states of the node's {s.num_gpus} rank(s) {take} "
                             f"{gib(chosen.memory.cpu_ram)} of {gib(ram)} usable host RAM"),
                     source=f"{sources.DEEPSPEED} (ZeRO-Offload); {sources.ZERO_ESTIMATORS} (DeepSpeed CPU bytes)"
                     + (f"; {sources.FSDP_QLORA}" if s.weights_dtype in QUANTIZED else ""))]


def launcher_decision(s: Setup) -> Decision:
    world = s.world_size
    cmd = f"accelerate launch --num_processes {world}"
    if s.nodes > 1:
        cmd += f" --num_machines {s.nodes} --machine_rank $MACHINE_RANK --main_process_ip $MAIN_PROCESS_IP"
    if world == 1:   # one GPU under DeepSpeed / FSDP (train_gpu_one with a ZeRO stage asked for): no DataParallel to avoid
        return Decision(setting="launcher", value=f"{cmd} train.py", number=world, unit="processes",
                        reason=(f"{s.strategy} runs inside a process group even on one GPU: the launcher creates it (one rank) and hands "
                                "the Trainer its config; rec.launch_command('train.py') gives the full command"),
                        source=f"{sources.DEEPSPEED} (deploying on one GPU; in a notebook, the distributed environment by hand)",
                        alternatives=(Alternative(value="python train.py", why_not="no process group: MASTER_ADDR, MASTER_PORT, RANK, "
                                                  "LOCAL_RANK and WORLD_SIZE must then be set by hand"),))
    return Decision(setting="launcher", value=f"{cmd} train.py", number=world, unit="processes",
                    reason=(f"one process per GPU ({s.num_gpus} per node x {s.nodes} node(s)); a plain `python train.py` makes the "
                            "Trainer wrap the model in nn.DataParallel instead; rec.launch_command('train.py') gives the full command"),
                    source=f"{sources.TRAIN_GPU_MANY} (DataParallel vs DistributedDataParallel)",
                    alternatives=(Alternative(value="python train.py", why_not="nn.DataParallel: one process, GPU 0 gathers everything"),
                                  Alternative(value=f"torchrun --nproc_per_node {s.num_gpus}", why_not="equivalent for Trainer scripts; "
                                              "accelerate also reads the FSDP/DeepSpeed YAML")))


DATAPARALLEL_WARNING = ("launch with `accelerate launch` or `torchrun`, not plain `python`: on a multi-GPU box the Trainer then wraps "
                        "the model in nn.DataParallel (one process, GPU 0 overloaded, none of the sharding this plan needs)")


def layout_warnings(request: Request, chosen: Priced) -> list[str]:
    s, hw = chosen.setup, request.hardware
    out = [DATAPARALLEL_WARNING] if s.world_size > 1 else []
    t = chosen.throughput
    if s.strategy not in ("ddp", "single") and s.num_gpus > 1 and not hw.fast_link:
        # an adapter plan is already the small one: LoRA cannot be what makes DDP fit
        ddp = "DDP, where a replica fits one GPU," if s.lora is not None else "DDP (or LoRA to make DDP fit)"
        out.append(f"the GPUs talk over {hw.interconnect} (no NVLink): {s.strategy}'s collectives take {t.comm_total_s:.3g} s per step, "
                   f"{t.comm_time_s:.3g} s of it exposed (not hidden behind compute) in the {t.step_time_s:.3g} s step; "
                   f"{ddp} keeps communication to one all-reduce per step")
    if s.nodes > 1 and hw.inter_node_bandwidth_gbps is None:
        out.append("the network between nodes is unknown: step time assumes a default inter-node bandwidth; "
                   "ZeRO/FSDP across nodes needs a fast fabric (InfiniBand / EFA)")
    if s.is_deepspeed:
        load = (" and build TrainingArguments(deepspeed=...) before from_pretrained, so ZeRO-3 partitions the weights while loading"
                if s.zero_stage == 3 else "")   # ZeRO-1/2 keep whole weights on every rank: the load order does not matter
        out.append(f"DeepSpeed: install it on every node{load}")
    if s.sequence_parallel > 1:
        n = s.sequence_parallel
        out.append(f"each sequence is split over {n} GPUs (DeepSpeed Ulysses): launch from the accelerate YAML, which carries the "
                   "split (CLI --write-accelerate-config accelerate.yaml, or rec.write_accelerate_config(); accelerate >= 1.12, "
                   "deepspeed >= 0.18.2); every batch must carry position_ids and a length that is a multiple of "
                   f"{n}: TRL's SFTTrainer does both with SFTConfig(pad_to_multiple_of={n}) (rec.sft_config()), a plain Trainer "
                   "with rec.data_collator(tokenizer)")
    if s.is_fsdp and s.gradient_checkpointing:
        out.append("with FSDP use fsdp_config['activation_checkpointing']=True, not TrainingArguments(activation_checkpointing=True): both raise")
    return out


# --- nothing fits ---------------------------------------------------------------------------------------

def _what_would_fit(request: Request, result: SearchResult, adapters: dict[str, SearchResult], mode: str, *, per_node: int) -> tuple[str, ...]:
    """Nothing fits: LoRA/QLoRA here, LoRA off the MoE experts, more nodes of the same GPUs, or bigger GPUs."""
    hw, spec, h = request.hardware, request.model, request.constraints.headroom
    out = [*freed_knobs(request, partial(plan, suggestions=False)), *precomputed_reference(request, partial(plan, suggestions=False)),
           *(f"finetune={kind!r} fits: {gib(r.chosen.memory.device_total)} per GPU, {r.chosen.step_time:.3g} s/step ({r.chosen.setup.label})"
             for kind, r in adapters.items() if r.chosen is not None),
           *expert_free_lora(request, result, adapters, partial(plan, suggestions=False), "GPU"),
           *longest_sequence(request, partial(plan, suggestions=False))]
    lean = least_memory(result).setup.replace(micro_batch_size=1, gradient_accumulation_steps=1)
    more = more_nodes(request, lean)
    if more:
        n, p = more
        gpu = (hw.name or "...").split(":")[0]  # a named target is passed back by name; a probed one has none
        out.append(f"nodes={n} ({n} x {per_node} GPUs, hardware='{gpu}:{per_node}x{n}') fits with {layout_of(p.setup).name}: "
                   f"{gib(p.memory.device_total)} per GPU" + (f", {gib(p.memory.cpu_ram)} host RAM per node" if p.memory.cpu_ram else ""))
    big = bigger_gpu(spec, lean, hw, h)
    if big:
        name, p = big
        out.append(f"hardware='{name}:{per_node}" + (f"x{hw.nodes}'" if hw.nodes > 1 else "'") +
                   f" fits {layout_of(lean).name}: {gib(p.memory.device_total)} per GPU")
    return tuple(out) or (f"{spec.name} does not fit on up to {MAX_NODES} nodes of {per_node} x {hw.smallest_gpu.name if hw.smallest_gpu else 'GPU'}; "
                          "try finetune='qlora' or bigger GPUs",)


def more_nodes(request: Request, lean: Setup) -> tuple[int, Priced] | None:
    """Fewest nodes (doubling, up to MAX_NODES) on which a fully sharded layout of ``lean`` fits, RAM included."""
    hw, h, cons = request.hardware, request.constraints.headroom, request.constraints
    lays = [lay for lv in levels(2, cons.allow_offload) if lv.name in ("shard everything", "CPU offload") for lay in lv.layouts
            if (cons.strategy is None or lay.strategy == cons.strategy) and incompatible(lean, lay) is None]
    nodes = hw.nodes * 2
    while nodes <= MAX_NODES:
        bigger = hw.model_copy(update={"nodes": nodes})
        for lay in lays:
            p = price(request.model, lay.apply(lean).replace(nodes=nodes), bigger)
            if fits(p.memory, bigger, h):
                return nodes, p
        nodes *= 2
    return None
