"""infer_gpu_one / infer_gpu_many with a serving engine (vLLM, SGLang): weight format, tensor-parallel degree
and replicas, and the engine's memory budget, each priced by the engine memory and speed models.

The transformers plan stops at ``generate``; a server runs continuous batching over a paged KV cache, so the
questions differ: which format (16-bit, FP8, int4 Marlin, bitsandbytes) fits with room for the cache and at
what published quality cost, and whether G GPUs serve faster as one TP-G engine or G/t replicas of TP-t.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from .. import engines
from .._serving_data import serving_facts
from ..decisions import Alternative, Decision
from ..engines import Engine, ServerEngine
from ..errors import ConflictingConstraintsError
from ..memory.serving import EngineMemory, describe
from ..memory.types import MemoryEstimate
from ..setup import ServingSetup, Setup
from ..speed.serving import ServingSpeed
from ..speed.types import Throughput
from . import registry
from .bnb_gate import quantization_runs
from .types import Candidate, Plan, Request

MAX_SEQS = 256
BATCHED_TOKENS = 8192


class Priced(NamedTuple):
    serving: ServingSetup
    memory: EngineMemory
    speed: ServingSpeed | None


def engine_of(request: Request) -> Engine:
    """The named engine, else the registry's default."""
    name = request.constraints.engine
    return engines.get(name) if name else engines.default()


def check_engine(scenario: str, engine: str | None, quantization: str | None, strategy: str | None) -> None:
    """One-line refusals for engine constraints a plan cannot honour (never a quiet substitute)."""
    info = registry.get(scenario)
    e = engines.get(engine) if engine else engines.default()
    if e.server and not (info.task == "infer" and info.device == "cuda"):
        raise ConflictingConstraintsError(f"engine={e.name!r} serves on GPUs; scenario {scenario!r} does not: "
                                          f"use scenario='infer_gpu_one' or 'infer_gpu_many', or engine={engines.default().name!r}")
    if quantization is not None and quantization not in e.quantizations():
        others = " or ".join(repr(o.name) for o in engines.registry() if quantization in o.quantizations())
        raise ConflictingConstraintsError(f"quantization={quantization!r} is not a format engine={e.name!r} plans for; use one of "
                                          f"{', '.join(e.quantizations()) or '(none)'}" + (f", or engine={others}" if others else ""))
    if strategy is not None and info.multi_gpu and strategy not in e.strategies:
        raise ConflictingConstraintsError(f"strategy={strategy!r} is not a layout of engine={e.name!r}; use one of {', '.join(e.strategies)}")


def _formats(request: Request, engine: ServerEngine) -> list[str]:
    """Formats the engine and GPU run, cheapest in quality first; a named quantization is the only one tried."""
    gpu = request.hardware.smallest_gpu
    assert gpu is not None
    named = request.constraints.quantization
    if named:
        if not engine.runs(named, gpu):
            row = engine.formats[named]
            raise ConflictingConstraintsError(f"quantization={named!r} does not run on {gpu.name} ({gpu.vendor.upper()}) in {engine.name} "
                                              f"{engine.version} (it needs {'/'.join(v.upper() for v in row.vendors)}, compute capability >= "
                                              f"{row.min_cc[0]}.{row.min_cc[1]} on NVIDIA), per {engine.facts.formats_source}; "
                                              f"use {' or '.join(repr(f) for f in engine.quantizations() if engine.runs(f, gpu)) or 'none'} "
                                              "or no quantization (16-bit weights)")
        return [named]
    formats = serving_facts().formats
    half = "bf16" if gpu.supports_bf16 else "fp16"
    ok = [f for f in engine.formats if engine.runs(f, gpu) and (formats[f].bits < 16 or f == half)
          and (f != "nf4" or quantization_runs("nf4", request.hardware))]
    return sorted(ok, key=lambda f: formats[f].quality_cost_pct)


def _degrees(request: Request, gpus: int) -> list[int]:
    """TP degrees vLLM accepts: dividing the GPUs and the query heads; KV heads divide or are replicated."""
    spec = request.model
    kv = spec.num_key_value_heads
    ok = [t for t in range(1, gpus + 1) if gpus % t == 0 and spec.num_attention_heads % t == 0 and (kv % t == 0 or t % kv == 0)]
    forced = request.constraints.strategy
    if forced == "single" or any(g.mig for g in request.hardware.gpus):
        return [1]
    if forced == "tp":
        wide = [t for t in ok if t > 1]
        if not wide:
            raise ConflictingConstraintsError(f"strategy='tp' is not possible on {gpus} GPU(s): no degree > 1 divides both the GPUs and "
                                              f"{spec.num_attention_heads} query heads; use strategy='single'")
        return wide
    return ok


def _workload(request: Request) -> tuple[int, int]:
    return request.constraints.prompt_len or request.seq_len, request.constraints.max_new_tokens


def _sized(request: Request, engine: ServerEngine, fmt: str, tp: int, gpus: int, eager: bool = False) -> ServingSetup:
    prompt, output = _workload(request)
    limit = request.model.max_position_embeddings or (prompt + output)
    base = ServingSetup(engine=engine.name, weight_format=fmt, tensor_parallel_size=tp, data_parallel_size=gpus // tp,
                        max_model_len=min(prompt + output, limit), max_num_seqs=request.constraints.batch_size or MAX_SEQS,
                        max_num_batched_tokens=BATCHED_TOKENS, enforce_eager=eager,
                        kv_cache_dtype="auto", enable_prefix_caching=True)
    gpu = request.hardware.smallest_gpu
    assert gpu is not None
    util = engine.utilization(gpu, request.hardware, base, request.constraints.headroom)
    return base.model_copy(update={"gpu_memory_utilization": util})


def _batch(request: Request, mem: EngineMemory, serving: ServingSetup) -> int:
    """Sequences one replica decodes at once: the requested concurrency split over replicas, else as many
    workload-length sequences as the KV cache holds (up to max_num_seqs); latency preference runs one."""
    prompt, output = _workload(request)
    fit = max(1, mem.kv_cache_tokens // (prompt + output))
    asked = request.constraints.batch_size
    if asked:
        return max(1, min(fit, -(-asked // serving.data_parallel_size)))
    if request.constraints.prefer == "latency":
        return 1
    return min(fit, serving.max_num_seqs)


def _price(request: Request, engine: ServerEngine, serving: ServingSetup) -> Priced:
    mem = engine.memory(request.model, serving, request.hardware)
    if not mem.fits:
        return Priced(serving, mem, None)
    prompt, output = _workload(request)
    speed = engine.speed(request.model, serving, request.hardware, prompt, output, _batch(request, mem, serving))
    return Priced(serving, mem, speed)


def _score(request: Request, p: Priced) -> float:
    assert p.speed is not None
    return -p.speed.time_per_output_token_ms if request.constraints.prefer == "latency" else p.speed.output_tokens_per_s


def _layouts(request: Request, engine: ServerEngine, fmt: str, gpus: int) -> list[Priced]:
    """Every TP degree for one format; a layout that only fits without CUDA graphs is priced eager."""
    priced = []
    for tp in _degrees(request, gpus):
        p = _price(request, engine, _sized(request, engine, fmt, tp, gpus))
        if p.speed is None:
            eager = _price(request, engine, _sized(request, engine, fmt, tp, gpus, eager=True))
            p = eager if eager.speed is not None else p
        priced.append(p)
    return priced


def _choose(request: Request, engine: ServerEngine, gpus: int) -> tuple[Priced | None, list[Priced]]:
    """Formats within the acceptable quality cost compete on speed; a costlier tier is priced only when none of
    the cheaper ones fits, and its fastest fitting layout wins."""
    formats = serving_facts().formats
    acceptable = serving_facts().acceptable_quality_cost_pct.value
    tiers: dict[float, list[str]] = {}
    for f in _formats(request, engine):
        tiers.setdefault(max(formats[f].quality_cost_pct, acceptable), []).append(f)
    priced = {tier: [p for f in tiers[tier] for p in _layouts(request, engine, f, gpus)] for tier in sorted(tiers)}
    tried = [p for tier in sorted(priced) for p in priced[tier]]   # every format is priced: the report compares them all
    best: Priced | None = None
    for tier in sorted(priced):
        fits = [p for p in priced[tier] if p.speed is not None]
        if not fits:
            continue
        top = max(fits, key=lambda p: _score(request, p))
        if best is None or _gain(request, top, best) >= serving_facts().quality_trade_speedup.value:
            best = top
    return best, tried


def _beaten(request: Request, chosen: Priced, tried: list[Priced]) -> str:
    """The cheaper-in-quality format the chosen one displaced, with the speed-up that paid for it."""
    formats = serving_facts().formats
    cost = formats[chosen.serving.weight_format].quality_cost_pct
    cheaper = [p for p in tried if p.speed is not None and formats[p.serving.weight_format].quality_cost_pct < cost]
    if not cheaper:
        return ""
    best = max(cheaper, key=lambda p: _score(request, p))
    return f" ({_gain(request, chosen, best):.1f}x the best of {best.serving.weight_format}, which fits at {_row(best)})"


def _gain(request: Request, new: Priced, old: Priced) -> float:
    """How many times faster ``new`` is than ``old`` for the preference."""
    assert new.speed is not None and old.speed is not None
    if request.constraints.prefer == "latency":
        return old.speed.time_per_output_token_ms / new.speed.time_per_output_token_ms
    return new.speed.output_tokens_per_s / old.speed.output_tokens_per_s


def _rank(request: Request, p: Priced) -> tuple[bool, float]:
    return (p.speed is not None, _score(request, p) if p.speed is not None else p.memory.max_concurrency)


def _row(p: Priced) -> str:
    s = p.serving
    where = f"TP{s.tensor_parallel_size} x {s.data_parallel_size} replica(s), {s.weight_format}"
    if p.speed is None:
        return f"{where}: does not fit ({p.memory.max_concurrency:.2f}x max_model_len in the KV cache)"
    return (f"{where}: {p.speed.output_tokens_per_s:,.0f} tok/s at batch {p.speed.batch}/replica, "
            f"{p.speed.time_per_output_token_ms:.1f} ms/token, KV {p.memory.kv_cache_tokens:,} tokens")


def _format_decision(request: Request, engine: ServerEngine, chosen: Priced, tried: list[Priced]) -> Decision:
    formats = serving_facts().formats
    f = chosen.serving.weight_format
    facts = formats[f]
    best: dict[str, Priced] = {}
    for p in tried:  # each other format's best layout (a fitting one over one that does not)
        k = p.serving.weight_format
        if k != f and (k not in best or _rank(request, p) > _rank(request, best[k])):
            best[k] = p
    alts = tuple(Alternative(value=k, number=formats[k].quality_cost_pct, unit="% quality cost",
                             why_not=_row(p) + f"; published quality cost ~{formats[k].quality_cost_pct}%")
                 for k, p in best.items())
    ckpt = f" Needs a {f.upper()} checkpoint of {request.model.name} (pass its repo as model)." if not engine.formats[f].at_load else ""
    acceptable, trade = serving_facts().acceptable_quality_cost_pct.value, serving_facts().quality_trade_speedup.value
    why = ("named by the quantization constraint" if request.constraints.quantization else
           f"the fastest fitting format within {acceptable}% published quality cost"
           if facts.quality_cost_pct <= acceptable else
           f"no format within {acceptable}% quality cost fits, or this one is at least {trade}x faster than the best that does"
           + _beaten(request, chosen, tried))
    assert chosen.speed is not None
    return Decision(setting="quantization", value=engine.quantization_choice(chosen.serving),
                    number=facts.quality_cost_pct, unit="% quality cost", source=facts.source, alternatives=alts,
                    reason=f"{f}: {why}; {chosen.speed.output_tokens_per_s:,.0f} tok/s, published quality cost ~{facts.quality_cost_pct}%.{ckpt}")


def _layout_decision(request: Request, engine: ServerEngine, chosen: Priced, tried: list[Priced]) -> Decision:
    s = chosen.serving
    same = [p for p in tried if p.serving.weight_format == s.weight_format and p.serving != s]
    alts = tuple(Alternative(value=f"tp={p.serving.tensor_parallel_size} dp={p.serving.data_parallel_size}", why_not=_row(p))
                 for p in same)
    return Decision(setting="tensor_parallel_size", value=s.tensor_parallel_size, number=_score(request, chosen),
                    unit="ms/token (negative)" if request.constraints.prefer == "latency" else "tokens/s",
                    reason=f"best predicted {request.constraints.prefer} of the layouts that fit: {_row(chosen)}; tensor parallel "
                           "cuts per-token latency but pays two all-reduces per layer, replicas multiply throughput",
                    source="Lambda vllm-benchmark (data parallel beats tensor parallel once the model fits); " + engine.docs_source,
                    alternatives=alts)


def _memory_decision(engine: ServerEngine, chosen: Priced) -> Decision:
    m, s = chosen.memory, chosen.serving
    eager = " CUDA graphs are off (enforce_eager): their memory is what lets max_model_len fit." if s.enforce_eager else ""
    return Decision(setting=engine.memory_setting, value=s.gpu_memory_utilization, number=float(m.kv_cache_tokens), unit="KV cache tokens",
                    reason=f"{describe(m)}.{eager}",
                    source=engine.memory_source)


def _to_memory(m: EngineMemory, request: Request) -> MemoryEstimate:
    kv = max(0, m.kv_cache_bytes)
    peak = m.weights + m.activation_peak + kv
    total = m.budget + m.cuda_context
    return MemoryEstimate(weights=m.weights, gradients=0, optimizer_states=0, activations=m.activation_peak, kv_cache=kv,
                          other=m.non_torch + m.cuda_graphs, cuda_context=m.cuda_context, peak_allocated=peak,
                          peak_reserved=peak + m.non_torch + m.cuda_graphs, device_total=total, capacity=m.total,
                          fits=m.fits and total <= m.total, notes=(describe(m),))


def _to_throughput(p: Priced) -> Throughput:
    if p.speed is None:
        return Throughput(step_time_s=0.0, tokens_per_s=0.0)
    sp = p.speed
    return Throughput(step_time_s=sp.time_per_output_token_ms / 1000, tokens_per_s=sp.output_tokens_per_s,
                      prefill_time_s=sp.ttft_ms / 1000, decode_tokens_per_s=1000 / sp.time_per_output_token_ms,
                      time_per_output_token_ms=sp.time_per_output_token_ms, bound=sp.bound, comm_time_s=sp.comm_ms / 1000)


def _setup(request: Request, p: Priced) -> Setup:
    prompt, output = _workload(request)
    s = p.serving
    dtype = "fp16" if s.weight_format == "fp16" else "bf16"
    return Setup(task="infer", micro_batch_size=p.speed.batch if p.speed else 1,
                 seq_len=prompt, new_tokens=output, weights_dtype=dtype, strategy="tp" if s.tensor_parallel_size > 1 else "single",
                 num_gpus=s.tensor_parallel_size * s.data_parallel_size, serving=s)


def dispatch(request: Request, in_script: Callable[[Request], Plan]) -> Plan:
    """A server engine plans here; the engine that runs in the user's script plans with ``in_script``, and its
    plan names the first server's alternative."""
    engine = engine_of(request)
    if isinstance(engine, ServerEngine):
        return plan(request, engine)
    return with_engine_hint(request, in_script(request), engine)


def _gpus(request: Request) -> int:
    if not request.info.multi_gpu:
        return 1
    return min(request.constraints.num_gpus or request.hardware.gpu_count, request.hardware.gpu_count)


def plan(request: Request, engine: ServerEngine) -> Plan:
    """The engine plan: format, layout, budget; a layout nothing fits comes back with fits=False and why."""
    gpus = _gpus(request)
    chosen, tried = _choose(request, engine, gpus)
    engine_decision = Decision(setting="engine", value=engine.name, reason=f"{engine.title} named by the engine constraint: "
                               f"{engine.summary}", source=engine.docs_source)
    candidates = tuple(Candidate(setup=_setup(request, p), memory=_to_memory(p.memory, request), throughput=_to_throughput(p),
                                 verdict="chosen" if chosen is not None and p is chosen else "fits" if p.speed else "does-not-fit",
                                 why=_row(p)) for p in tried)
    if chosen is None:
        best = max(tried, key=lambda p: p.memory.max_concurrency)
        return Plan(setup=_setup(request, best), memory=_to_memory(best.memory, request), throughput=_to_throughput(best),
                    decisions=(engine_decision,), candidates=candidates, fits=False, engine_memory=best.memory,
                    suggestions=(f"no format and layout leaves room for one {best.serving.max_model_len}-token sequence; best: {_row(best)}. "
                                 "Use more GPUs (infer_gpu_many), a shorter prompt_len + max_new_tokens, or a bigger GPU",))
    decisions = [engine_decision, _format_decision(request, engine, chosen, tried), _memory_decision(engine, chosen)]
    if gpus > 1:
        decisions.append(_layout_decision(request, engine, chosen, tried))
    warnings: tuple[str, ...] = ()
    fmt = chosen.serving.weight_format
    if not engine.formats[fmt].at_load:
        warnings = (f"{fmt.upper()} needs a pre-quantized checkpoint: serve an {fmt.upper()} repo of {request.model.name}, not the 16-bit one",)
    return Plan(setup=_setup(request, chosen), memory=_to_memory(chosen.memory, request), throughput=_to_throughput(chosen),
                decisions=tuple(decisions), candidates=candidates, warnings=warnings, fits=True, engine_memory=chosen.memory)


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
        check_engine(request.scenario, other.name, request.constraints.quantization, request.constraints.strategy)
        best, _ = _choose(asked, other, _gpus(request))
    except ConflictingConstraintsError:
        return plan_
    if best is None or best.speed is None:
        return plan_
    speed = plan_.throughput.tokens_per_s if plan_.fits else 0.0
    hint = Decision(setting="engine", value=here.name, number=best.speed.output_tokens_per_s, unit=f"tokens/s with {other.title}",
                    reason=f"the default: {here.summary}", source=other.docs_source,
                    alternatives=(Alternative(value=other.name, number=best.speed.output_tokens_per_s, unit="tokens/s",
                                              why_not=f"not asked for; for serving many requests pass engine={other.name!r}: predicted {_row(best)} "
                                                      f"vs {speed:,.0f} tok/s here"),))
    return plan_.model_copy(update={"decisions": (*plan_.decisions, hint)})
