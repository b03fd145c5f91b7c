"""What a serving plan says about its choices: one row per priced layout, the format, layout and memory
decisions with their numbers and sources, and the plan's Setup / memory / speed in the API's shapes."""

from __future__ import annotations

from typing import NamedTuple

from .._serving_data import serving_facts
from ..decisions import Alternative, Decision
from ..engines import ServerEngine
from ..memory.serving import EngineMemory, describe, start_limit
from ..memory.types import MemoryEstimate
from ..model.types import ModelSpec
from ..setup import ServingSetup, Setup
from ..speed.serving import ServingSpeed
from ..speed.types import Throughput
from .serving_menu import Menu
from .types import Request


class Priced(NamedTuple):
    serving: ServingSetup
    memory: EngineMemory
    speed: ServingSpeed | None


def score(request: Request, p: Priced) -> float:
    assert p.speed is not None
    return -p.speed.time_per_output_token_ms if request.constraints.prefer == "latency" else p.speed.output_tokens_per_s


def gain(request: Request, new: Priced, old: Priced) -> float:
    """How many times faster ``new`` is than ``old`` for the preference."""
    assert new.speed is not None and old.speed is not None
    if request.constraints.prefer == "latency":
        return old.speed.time_per_output_token_ms / new.speed.time_per_output_token_ms
    return new.speed.output_tokens_per_s / old.speed.output_tokens_per_s


def _rank(request: Request, p: Priced) -> tuple[bool, float]:
    return (p.speed is not None, score(request, p) if p.speed is not None else p.memory.max_concurrency)


def layout_words(s: ServingSetup) -> str:
    pp = f" x PP{s.pipeline_parallel_size}" if s.pipeline_parallel_size > 1 else ""
    ep = " + EP" if s.enable_expert_parallel else ""
    return f"TP{s.tensor_parallel_size}{pp}{ep} x {s.data_parallel_size} replica(s), {s.weight_format}"


def row(p: Priced) -> str:
    where = layout_words(p.serving)
    if p.speed is None:
        return f"{where}: does not fit ({p.memory.max_concurrency:.2f}x max_model_len in the KV cache)"
    return (f"{where}: {p.speed.output_tokens_per_s:,.0f} tok/s at batch {p.speed.batch}/replica, "
            f"{p.speed.time_per_output_token_ms:.1f} ms/token, KV {p.memory.kv_cache_tokens:,} tokens")


def _why_format(request: Request, m: Menu, chosen: Priced, tried: list[Priced]) -> str:
    f = chosen.serving.weight_format
    formats = serving_facts().formats
    if m.named:
        return "named by the quantization constraint"
    if f == m.served:
        kind = f"its own {f} weights" if m.checkpoint else f"{f}, its own precision"
        return f"the checkpoint as given ({kind}) fits" + ("; no lossy format is faster by the trade-off" if m.compete else "")
    given = [p for p in tried if p.serving.weight_format == m.served]
    best_given = max(given, key=lambda p: _rank(request, p)) if given else None
    acceptable, trade = serving_facts().acceptable_quality_cost_pct.value, serving_facts().quality_trade_speedup.value
    if best_given is not None and best_given.speed is not None:
        lead = f"quantization='auto': {gain(request, chosen, best_given):.1f}x the checkpoint as given ({row(best_given)})"
    else:
        lead = f"the checkpoint as given ({m.served}) does not fit" + (f": {row(best_given)}" if best_given else "")
    tier = (f"the fastest fitting format within {acceptable}% published quality cost" if formats[f].quality_cost_pct <= acceptable else
            f"nothing within {acceptable}% quality cost fits, or this one is at least {trade}x faster than the best that does")
    return f"{lead}; {f} quantized at load is {tier}"


def format_decision(request: Request, engine: ServerEngine, m: Menu, chosen: Priced, tried: list[Priced]) -> Decision:
    formats = serving_facts().formats
    f = chosen.serving.weight_format
    facts = formats[f]
    best: dict[str, Priced] = {}
    for p in tried:  # each other format's best layout (a fitting one over one that does not)
        k = p.serving.weight_format
        if k != f and (k not in best or _rank(request, p) > _rank(request, best[k])):
            best[k] = p
    alts = tuple(Alternative(value=k, number=formats[k].quality_cost_pct, unit="% quality cost",
                             why_not=row(p) + f"; published quality cost ~{formats[k].quality_cost_pct}%")
                 for k, p in best.items())
    where = "quantized at load from the 16-bit checkpoint" if chosen.serving.checkpoint_format != f and facts.bits < 16 else \
            "as stored in the checkpoint" if facts.bits < 16 else "unquantized"
    assert chosen.speed is not None
    return Decision(setting="quantization", value=engine.quantization_choice(chosen.serving),
                    number=facts.quality_cost_pct, unit="% quality cost", source=facts.source, alternatives=alts,
                    reason=f"{f} weights ({where}): {_why_format(request, m, chosen, tried)}; {chosen.speed.output_tokens_per_s:,.0f} tok/s, "
                           f"published quality cost ~{facts.quality_cost_pct}%")


def layout_decision(request: Request, engine: ServerEngine, chosen: Priced, tried: list[Priced]) -> Decision:
    s = chosen.serving
    same = [p for p in tried if p.serving.weight_format == s.weight_format and p.serving != s]
    alts = tuple(Alternative(value=layout_words(p.serving), why_not=row(p)) for p in same)
    moe = (" Expert parallelism puts each expert on one GPU of all TP x DP and sends tokens to it (all-to-all) instead of "
           "splitting every expert within a TP group." if request.model.is_moe else "")
    return Decision(setting="tensor_parallel_size", value=s.tensor_parallel_size, number=score(request, chosen),
                    unit="ms/token (negative)" if request.constraints.prefer == "latency" else "tokens/s",
                    reason=f"best predicted {request.constraints.prefer} of the layouts that fit: {row(chosen)}; tensor parallel "
                           f"cuts per-token latency but pays two all-reduces per layer, replicas multiply throughput.{moe}",
                    source="Lambda vllm-benchmark (data parallel beats tensor parallel once the model fits); " + engine.docs_source,
                    alternatives=alts)


def memory_decision(engine: ServerEngine, chosen: Priced, asked: bool) -> Decision:
    m, s = chosen.memory, chosen.serving
    eager = " CUDA graphs are off (enforce_eager): their memory is what lets max_model_len fit." if s.enforce_eager else ""
    given = " (as given)" if asked else ""
    if m.state_slots is not None:
        eager += (f" max_num_seqs={s.max_num_seqs}: {engine.title} refuses to start with more sequences than its {m.state_slots:,} pool "
                  f"blocks, each a recurrent-state page of this hybrid model.")
    return Decision(setting=engine.memory_setting, value=s.gpu_memory_utilization, number=float(m.kv_cache_tokens), unit="KV cache tokens",
                    reason=f"{engine.memory_setting}={s.gpu_memory_utilization}{given}: {describe(m)}.{eager}", source=engine.memory_source)


def to_memory(m: EngineMemory) -> MemoryEstimate:
    """The engine's account as a MemoryEstimate, with the KV-cache figures the engine logs."""
    kv = max(0, m.kv_cache_bytes)
    peak = m.weights + m.activation_peak + kv
    total = m.budget + m.cuda_context
    limit = start_limit(m)
    return MemoryEstimate(weights=m.weights, gradients=0, optimizer_states=0, activations=m.activation_peak, kv_cache=kv,
                          other=m.non_torch + m.cuda_graphs, cuda_context=m.cuda_context, peak_allocated=peak,
                          peak_reserved=peak + m.non_torch + m.cuda_graphs, device_total=total, capacity=m.total,
                          fits=m.fits and total <= m.total, notes=(describe(m), *((limit,) if limit else ())),
                          kv_cache_tokens=m.kv_cache_tokens, max_concurrency=m.max_concurrency, start_limit=limit)


def to_throughput(spec: ModelSpec, p: Priced, peak_flops: float) -> Throughput:
    """Speed in the API's shape; MFU from the tokens/s, 2 x active params per token, over every GPU's peak."""
    if p.speed is None:
        return Throughput(step_time_s=0.0, tokens_per_s=0.0)
    sp, s = p.speed, p.serving
    gpus = s.tensor_parallel_size * s.pipeline_parallel_size * s.data_parallel_size
    mfu = sp.output_tokens_per_s * 2 * spec.active_params / (gpus * peak_flops) if peak_flops else 0.0
    return Throughput(step_time_s=sp.time_per_output_token_ms / 1000, tokens_per_s=sp.output_tokens_per_s,
                      prefill_time_s=sp.ttft_ms / 1000, decode_tokens_per_s=1000 / sp.time_per_output_token_ms,
                      time_per_output_token_ms=sp.time_per_output_token_ms, bound=sp.bound, comm_time_s=sp.comm_ms / 1000,
                      mfu=min(1.0, mfu))


def to_setup(p: Priced, prompt: int, output: int) -> Setup:
    """The plan's Setup: its batch is per replica (``micro_batch_size``), its GPUs every rank of every replica."""
    s = p.serving
    return Setup(task="infer", micro_batch_size=p.speed.batch if p.speed else 1, seq_len=prompt, new_tokens=output,
                 weights_dtype=s.dtype, strategy="tp" if s.tensor_parallel_size > 1 else "single",
                 num_gpus=s.tensor_parallel_size * s.pipeline_parallel_size * s.data_parallel_size, serving=s)
