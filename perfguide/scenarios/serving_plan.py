"""infer_gpu_one / infer_gpu_many with a serving engine (perfguide/engines/): weight format, tensor / pipeline /
expert-parallel layout and replicas, and the engine's memory budget, each priced by the engine's own memory
rule and speed.

The transformers plan stops at ``generate``; a server runs continuous batching over a paged KV cache, so the
questions differ: does the checkpoint as given fit with room for the cache (serving_menu.py says which
formats may be priced), and do G GPUs serve faster as one TP-G engine or G/t replicas of TP-t. The engine's
own knobs (gpu_memory_utilization, max_model_len, max_num_seqs, kv_cache_dtype, parallel sizes) are used as
given, or refused in one line.
"""

from __future__ import annotations

from collections.abc import Callable

from .. import engines
from .._serving_data import serving_facts
from ..decisions import Alternative, Decision
from ..engines import Engine, ServerEngine
from ..errors import ConflictingConstraintsError
from ..memory.serving import EngineMemory
from ..model.types import ModelSpec
from ..setup import ServingSetup, Setup
from . import registry
from .serving_decisions import (
    Priced,
    format_decision,
    gain,
    layout_decision,
    memory_decision,
    row,
    score,
    to_memory,
    to_setup,
    to_throughput,
)
from .serving_menu import Menu, half, menu
from .types import SERVING_KNOBS, Candidate, Constraints, Plan, Request

MAX_SEQS = 256


def engine_of(request: Request) -> Engine:
    """The named engine, else the registry's default."""
    name = request.constraints.engine
    return engines.get(name) if name else engines.default()


def check_engine(scenario: str, cons: Constraints) -> None:
    """One-line refusals for engine constraints a plan cannot honour (never a quiet substitute)."""
    info = registry.get(scenario)
    e = engines.get(cons.engine) if cons.engine else engines.default()
    if e.server and not (info.task == "infer" and info.device == "cuda"):
        raise ConflictingConstraintsError(f"engine={e.name!r} serves on GPUs; scenario {scenario!r} does not: "
                                          f"use scenario='infer_gpu_one' or 'infer_gpu_many', or engine={engines.default().name!r}")
    servers = " or ".join(repr(o.name) for o in engines.servers())
    for knob in SERVING_KNOBS:
        if getattr(cons, knob) is not None and not e.server:
            raise ConflictingConstraintsError(f"{knob}={getattr(cons, knob)!r} is a serving engine's setting; engine={e.name!r} runs "
                                              f"in your script: use engine={servers}, or drop it")
    q = cons.quantization
    if q is not None and q not in ("none", "auto") and q not in e.quantizations():
        others = " or ".join(repr(o.name) for o in engines.registry() if q in o.quantizations())
        raise ConflictingConstraintsError(f"quantization={q!r} is not a format engine={e.name!r} plans for; use one of "
                                          f"{', '.join(e.quantizations()) or '(none)'}" + (f", or engine={others}" if others else ""))
    if cons.strategy is not None and info.multi_gpu and cons.strategy not in e.strategies:
        raise ConflictingConstraintsError(f"strategy={cons.strategy!r} is not a layout of engine={e.name!r}; use one of {', '.join(e.strategies)}")


#: vLLM never served T5 (the issue asking for it, closed pointing at out-of-tree ports) and its V1 engine dropped the
#: encoder-decoder path (BART) altogether
NO_ENCODER_DECODER_SOURCE = "https://github.com/vllm-project/vllm/issues/187; https://github.com/vllm-project/vllm/issues/31004"


def servable(spec: ModelSpec, engine: ServerEngine) -> None:
    """A server plan prices a decoder's token loop over a paged KV cache (per output token: time, KV bytes). A model
    that generates no tokens (an encoder, a task head) has no output token to time, and an encoder-decoder's encoder
    pass and cross-attention cache are not in that account: refused in one line, pointing at the engine that prices
    them, rather than planned with a time per output token of a model that has none."""
    here = engines.default().name
    what = spec.architecture or spec.model_type
    if spec.is_encoder_decoder:
        raise ConflictingConstraintsError(
            f"engine={engine.name!r} is priced as a decoder-only token loop over a paged KV cache; {spec.name} is an encoder-decoder "
            f"({what}) whose encoder pass and cross-attention cache that account leaves out (vLLM serves no T5: {NO_ENCODER_DECODER_SOURCE}); "
            f"use engine={here!r}")
    if not spec.generates:
        raise ConflictingConstraintsError(
            f"engine={engine.name!r} plans token generation; {spec.name} ({what}, head {spec.head!r}) generates no tokens: it answers in one "
            f"forward pass, which engine={here!r} prices")


def _tp_ok(request: Request, t: int) -> bool:
    """vLLM's rule: the query heads divide by TP; KV heads divide, or are replicated when TP exceeds them."""
    spec, kv = request.model, request.model.num_key_value_heads
    return spec.num_attention_heads % t == 0 and (kv % t == 0 or t % kv == 0)


def _degrees(request: Request, gpus: int) -> list[tuple[int, int]]:
    """(TP, PP) pairs whose product divides the GPUs: the given sizes, else every TP with PP 1."""
    c, spec = request.constraints, request.model
    if c.tensor_parallel_size or c.pipeline_parallel_size:
        tp, pp = c.tensor_parallel_size or 1, c.pipeline_parallel_size or 1
        if gpus % (tp * pp) or not _tp_ok(request, tp) or pp > (spec.num_decoder_layers or spec.num_layers):
            raise ConflictingConstraintsError(
                f"tensor_parallel_size={tp} x pipeline_parallel_size={pp} does not fit {gpus} GPU(s) and {spec.num_attention_heads} query / "
                f"{spec.num_key_value_heads} KV heads: TP x PP must divide the GPUs and TP the query heads; use one of "
                f"{', '.join(str(t) for t in range(1, gpus + 1) if gpus % t == 0 and _tp_ok(request, t))}")
        return [(tp, pp)]
    node = _per_node(request)
    ok = [t for t in range(1, node + 1) if node % t == 0 and _tp_ok(request, t)]   # tensor parallel stays within a node
    if c.strategy == "single" or any(g.mig for g in request.hardware.gpus):
        return [(1, 1)]
    if c.strategy == "tp":
        ok = [t for t in ok if t > 1]
        if not ok:
            raise ConflictingConstraintsError(f"strategy='tp' is not possible on {gpus} GPU(s): no degree > 1 divides both the GPUs and "
                                              f"{spec.num_attention_heads} query heads; use strategy='single'")
    nodes = gpus // node      # several nodes: pipeline stages across them, one stage a node's TP group (or replicas)
    stages = [p for p in range(1, nodes + 1) if nodes % p == 0 and p <= (spec.num_decoder_layers or spec.num_layers)]
    return [(t, p) for t in ok for p in stages]


def _expert_parallel(request: Request, engine: ServerEngine, replicas: int) -> list[bool]:
    """Expert parallelism is priced for MoE models with several replicas (with one, EP = TP splits the same)."""
    asked = request.constraints.enable_expert_parallel
    if asked and not request.model.is_moe:
        raise ConflictingConstraintsError(f"enable_expert_parallel=True needs a mixture-of-experts model; {request.model.name} is dense: drop it")
    if asked and not engine.expert_parallel:
        servers = " or ".join(repr(e.name) for e in engines.servers() if e.expert_parallel)
        own = (f" ({engine.title}'s {engine.expert_parallel_flags[0]} splits each TP group's experts: the same bytes per GPU as TP)"
               if engine.expert_parallel_flags else "")
        raise ConflictingConstraintsError(f"enable_expert_parallel=True spreads the experts over every GPU of TP x DP, which engine={engine.name!r} "
                                          f"does not do{own}; use engine={servers}, or drop it")
    if asked is not None:
        return [asked]
    return [False, True] if request.model.is_moe and replicas > 1 and engine.expert_parallel else [False]


def _workload(request: Request) -> tuple[int, int]:
    return request.constraints.prompt_len or request.seq_len, request.constraints.max_new_tokens


def _max_model_len(request: Request) -> int:
    prompt, output = _workload(request)
    limit = request.model.max_position_embeddings
    asked = request.constraints.max_model_len
    if asked is not None:
        if limit and asked > limit:
            raise ConflictingConstraintsError(f"max_model_len={asked} exceeds the model's max_position_embeddings ({limit}), which the "
                                              f"engines refuse; use max_model_len <= {limit}")
        return asked
    return min(prompt + output, limit or prompt + output)


def _sized(request: Request, engine: ServerEngine, m: Menu, fmt: str, layout: tuple[int, int, bool], gpus: int,
           eager: bool = False) -> ServingSetup:
    c = request.constraints
    tp, pp, ep = layout
    gpu = request.hardware.smallest_gpu
    assert gpu is not None
    base = ServingSetup(engine=engine.name, weight_format=fmt, dtype=half(gpu), checkpoint_format=m.checkpoint, quantized_model=c.quantized_model,
                        tensor_parallel_size=tp, pipeline_parallel_size=pp, data_parallel_size=gpus // (tp * pp),
                        enable_expert_parallel=ep, max_model_len=_max_model_len(request),
                        max_num_seqs=c.max_num_seqs or c.batch_size or MAX_SEQS, max_num_batched_tokens=engine.batched_tokens(gpu, tp),
                        enforce_eager=eager, kv_cache_dtype=c.kv_cache_dtype or "auto", enable_prefix_caching=True)
    if c.gpu_memory_utilization is not None:
        return base.model_copy(update={"gpu_memory_utilization": c.gpu_memory_utilization})
    return base.model_copy(update={"gpu_memory_utilization": engine.utilization(gpu, request.hardware, base, c.headroom)})


def _batch(request: Request, mem: EngineMemory, serving: ServingSetup) -> int:
    """Sequences one replica decodes at once: the requested concurrency split over replicas, else as many
    workload-length sequences as the KV cache holds (up to max_num_seqs); latency preference runs one."""
    prompt, output = _workload(request)
    fit = max(1, mem.kv_cache_tokens // (prompt + output))
    asked = request.constraints.batch_size
    if asked:
        return max(1, min(fit, serving.max_num_seqs, -(-asked // serving.data_parallel_size)))
    if request.constraints.prefer == "latency":
        return 1
    return min(fit, serving.max_num_seqs)


def _price(request: Request, engine: ServerEngine, serving: ServingSetup) -> Priced:
    mem = engine.memory(request.model, serving, request.hardware)
    slots = mem.state_slots
    if slots and slots < mem.state_slots_needed and request.constraints.max_num_seqs is None and request.constraints.batch_size is None:
        serving, mem = _within_state_slots(request, engine, serving, slots)
    if not mem.fits:
        return Priced(serving, mem, None)
    prompt, output = _workload(request)
    return Priced(serving, mem, engine.speed(request.model, serving, request.hardware, prompt, output, _batch(request, mem, serving)))


def _within_state_slots(request: Request, engine: ServerEngine, serving: ServingSetup, slots: int) -> tuple[ServingSetup, EngineMemory]:
    """The most sequences a hybrid's recurrent-state pages let vLLM start with (it refuses max_num_seqs above its pool
    blocks). Fewer sequences profile a smaller sampler and capture fewer graphs, so the blocks grow as max_num_seqs
    falls: the largest max_num_seqs within its own blocks, by bisection from the first count (which always holds)."""
    def at(seqs: int) -> tuple[ServingSetup, EngineMemory]:
        s = serving.model_copy(update={"max_num_seqs": seqs})
        return s, engine.memory(request.model, s, request.hardware)

    low, high = slots, serving.max_num_seqs - 1
    while low < high:
        mid = (low + high + 1) // 2
        if (at(mid)[1].state_slots or 0) >= mid:
            low = mid
        else:
            high = mid - 1
    return at(low)


def _layouts(request: Request, engine: ServerEngine, m: Menu, fmt: str, gpus: int) -> list[Priced]:
    """Every layout for one format; one that does not fit at the engine's default memory knob is priced with the knob
    raised (an engine with a static fraction), else without CUDA graphs (eager), whichever first fits."""
    priced = []
    for tp, pp in _degrees(request, gpus):
        for ep in _expert_parallel(request, engine, gpus // (tp * pp)):
            p = _price(request, engine, _sized(request, engine, m, fmt, (tp, pp, ep), gpus))
            if p.speed is None:   # a static fraction raised just enough keeps the CUDA graphs; else without them
                raised = _raised(request, engine, p)
                p = raised if raised.speed is not None else _price(request, engine, _sized(request, engine, m, fmt, (tp, pp, ep), gpus, eager=True))
            priced.append(p)
    return priced


def _raised(request: Request, engine: ServerEngine, p: Priced) -> Priced:
    """A static memory fraction (SGLang's) raised as far as holding the weights and one request needs, when the
    engine's default leaves too little and the user set none; above 1 - headroom it stays as it was (does not fit)."""
    need = engine.fraction_to_fit(p.memory, p.serving)
    if need is None or request.constraints.gpu_memory_utilization is not None or need > 1 - request.constraints.headroom:
        return p
    if need <= p.serving.gpu_memory_utilization:
        return p
    return _price(request, engine, p.serving.model_copy(update={"gpu_memory_utilization": need}))


def _tiered(request: Request, priced: list[Priced]) -> Priced | None:
    """Formats within the acceptable quality cost compete on speed; a costlier tier wins only when none of the
    cheaper ones fits, or when it is at least the trade-off factor faster."""
    formats, facts = serving_facts().formats, serving_facts()
    tiers: dict[float, list[Priced]] = {}
    for p in priced:
        tiers.setdefault(max(formats[p.serving.weight_format].quality_cost_pct, facts.acceptable_quality_cost_pct.value), []).append(p)
    best: Priced | None = None
    for tier in sorted(tiers):
        fits = [p for p in tiers[tier] if p.speed is not None]
        if not fits:
            continue
        top = max(fits, key=lambda p: score(request, p))
        if best is None or gain(request, top, best) >= facts.quality_trade_speedup.value:
            best = top
    return best


def _choose(request: Request, engine: ServerEngine, m: Menu, gpus: int) -> tuple[Priced | None, list[Priced]]:
    """The checkpoint as given first; lossy formats only when it does not fit (or competing, with 'auto')."""
    given = _layouts(request, engine, m, m.served, gpus)
    fits = [p for p in given if p.speed is not None]
    if fits and not m.compete:
        return max(fits, key=lambda p: score(request, p)), given
    lossy = [p for f in m.lossy for p in _layouts(request, engine, m, f, gpus)]
    tried = given + lossy                      # every format is priced: the report compares them all
    return _tiered(request, tried), tried


def dispatch(request: Request, in_script: Callable[[Request], Plan]) -> Plan:
    """A server engine plans here; the engine that runs in the user's script plans with ``in_script``, and its
    plan names the first server's alternative."""
    engine = engine_of(request)
    if isinstance(engine, ServerEngine):
        servable(request.model, engine)
        return plan(request, engine)
    return with_engine_hint(request, in_script(request), engine)


def _per_node(request: Request) -> int:
    if not request.info.multi_gpu:
        return 1
    return min(request.constraints.num_gpus or request.hardware.gpu_count, request.hardware.gpu_count)


def _gpus(request: Request) -> int:
    """Every GPU the plan may use: those of one node, times the nodes of a multi-node target."""
    return _per_node(request) * (request.hardware.nodes if request.info.multi_gpu else 1)


def on_nodes(setup: Setup, per_node: int) -> Setup:
    """A layout with more GPUs than a node holds, as a Setup counts them: ``num_gpus`` per node, ``nodes`` of them."""
    total = setup.num_gpus
    if total <= per_node or total % per_node:
        return setup
    return setup.model_copy(update={"num_gpus": per_node, "nodes": total // per_node})


def _setup(request: Request, p: Priced) -> Setup:
    prompt, output = _workload(request)
    return on_nodes(to_setup(p, prompt, output), max(1, request.hardware.gpu_count))


def _candidate(request: Request, p: Priced, chosen: Priced | None, peak: float) -> Candidate:
    return Candidate(setup=_setup(request, p), memory=to_memory(p.memory), throughput=to_throughput(request.model, p, peak),
                     verdict="chosen" if p is chosen else "fits" if p.speed else "does-not-fit", why=row(p))


def plan(request: Request, engine: ServerEngine) -> Plan:
    """The engine plan: format, layout, budget; a layout nothing fits comes back with fits=False and why."""
    gpus = _gpus(request)
    m = menu(request, engine)
    chosen, tried = _choose(request, engine, m, gpus)
    gpu = request.hardware.smallest_gpu
    assert gpu is not None
    peak = (gpu.half_tflops("bf16" if gpu.supports_bf16 else "fp16") or 0.0) * 1e12
    shown = chosen or max(tried, key=lambda p: p.memory.max_concurrency)
    # the number: its predicted speed, or where nothing fits the KV-cache room the best layout leaves (below 1: no request)
    number, unit = ((shown.speed.output_tokens_per_s, "output tokens/s predicted") if shown.speed is not None else
                    (shown.memory.max_concurrency, "x max_model_len the best layout's KV cache holds"))
    engine_decision = Decision(setting="engine", value=engine.name, reason=f"{engine.title} named by the engine constraint: "
                               f"{engine.summary}", source=engine.docs_source, number=number, unit=unit)
    candidates = tuple(_candidate(request, p, chosen, peak) for p in tried)
    common = dict(setup=_setup(request, shown), memory=to_memory(shown.memory),
                  throughput=to_throughput(request.model, shown, peak), candidates=candidates, engine_memory=shown.memory)
    if chosen is None:
        from .serving_nofit import no_fit  # it prices the alternatives with this module's layouts

        return Plan(decisions=(engine_decision,), fits=False, suggestions=no_fit(request, engine, m, gpus, tried), **common)
    decisions = [engine_decision, format_decision(request, engine, m, chosen, tried),
                 memory_decision(engine, chosen, request.constraints.gpu_memory_utilization is not None)]
    if gpus > 1:
        decisions.append(layout_decision(request, engine, chosen, tried))
    warnings: tuple[str, ...] = ()
    if chosen.serving.quantized_model:
        warnings = (f"serves the pre-quantized checkpoint {chosen.serving.quantized_model} ({chosen.serving.weight_format}) in place of "
                    f"{request.model_id or request.model.name}",)
    spans = chosen.serving.tensor_parallel_size * chosen.serving.pipeline_parallel_size // _per_node(request)
    if spans > 1:
        n, rank, head = engine.multinode_flags
        warnings += (f"one engine spans {spans} nodes ({chosen.serving.pipeline_parallel_size} pipeline stages of TP"
                     f"{chosen.serving.tensor_parallel_size}): run the command on every node, adding {n} {spans} {rank} 0..{spans - 1} "
                     f"{head} <head node address>; each token crosses the network {chosen.serving.pipeline_parallel_size - 1} time(s)",)
    warnings += _concurrency_short(request, chosen)
    default = engine.default_utilization(gpu, chosen.serving)
    if engine.fraction_to_fit(chosen.memory, chosen.serving) is not None and chosen.serving.gpu_memory_utilization > default \
            and request.constraints.gpu_memory_utilization is None:
        free = (chosen.memory.total - chosen.memory.cuda_context) / 2**30      # what the fraction is a fraction of
        left = (1 - chosen.serving.gpu_memory_utilization) * free
        warnings += (f"{engine.memory_setting} raised from {engine.title}'s default {default} to {chosen.serving.gpu_memory_utilization} "
                     f"so the weights and one {chosen.serving.max_model_len}-token request fit: {left:.2f} GiB stay outside the pool "
                     f"for activations and CUDA graphs, where {engine.title}'s own rule reserves {(1 - default) * free:.2f} GiB; "
                     f"if it runs out of memory, lower the chunked prefill size or max_model_len",)
    return Plan(decisions=tuple(decisions), warnings=warnings, fits=True, **common)


def _concurrency_short(request: Request, chosen: Priced) -> tuple[str, ...]:
    """A forced ``batch_size`` the KV cache (or max_num_seqs) cannot hold at once is said, not quietly priced lower:
    the engine queues or preempts the rest, and the speed shown is at the concurrency that runs."""
    asked, s = request.constraints.batch_size, chosen.serving
    running = (chosen.speed.batch if chosen.speed is not None else 1) * s.data_parallel_size
    if not asked or running >= asked:
        return ()
    prompt, output = _workload(request)
    if s.max_num_seqs * s.data_parallel_size < asked:
        limit, lever = f"max_num_seqs={s.max_num_seqs} per replica", "raise max_num_seqs"
    else:
        limit = f"the KV cache holds {chosen.memory.kv_cache_tokens:,} tokens per replica"
        lever = "use kv_cache_dtype='fp8', more GPUs, or a shorter prompt_len + max_new_tokens"
    return (f"batch_size={asked} asked, {running} run at once: {limit}, {running} sequences of {prompt + output} tokens over "
            f"{s.data_parallel_size} replica(s); the engine queues or preempts the rest and the speed shown is at {running}; for "
            f"{asked} {lever}",)


def with_engine_hint(request: Request, plan_: Plan, here: Engine) -> Plan:
    """A plan run in the user's script names what the first serving engine would do with the same request, so
    a user who is serving people sees the continuous-batching alternative and its predicted speed; the plan
    itself is unchanged."""
    servers = engines.servers()
    if not servers:
        return plan_
    other = servers[0]
    asked = request.model_copy(update={"constraints": request.constraints.model_copy(update={"engine": other.name})})
    try:
        check_engine(request.scenario, asked.constraints)
        servable(asked.model, other)
        best, _ = _choose(asked, other, menu(asked, other), _gpus(request))
    except ConflictingConstraintsError:
        return plan_
    if best is None or best.speed is None:
        return plan_
    speed = plan_.throughput.tokens_per_s if plan_.fits else 0.0
    gpus, used = _gpus(request), plan_.setup.num_gpus * plan_.setup.nodes
    where = f" on {gpus} GPUs" if gpus != used else ""  # a transformers plan runs on one node; the engine spans them all
    hint = Decision(setting="engine", value=here.name, number=best.speed.output_tokens_per_s, unit=f"tokens/s with {other.title}",
                    reason=f"the default: {here.summary}", source=other.docs_source,
                    alternatives=(Alternative(value=other.name, number=best.speed.output_tokens_per_s, unit="tokens/s",
                                              why_not=f"not asked for; for serving many requests pass engine={other.name!r}: predicted {row(best)}{where} "
                                                      f"vs {speed:,.0f} tok/s here" + (f" on {used} GPUs" if where else "")),))
    return plan_.model_copy(update={"decisions": (*plan_.decisions, hint)})
