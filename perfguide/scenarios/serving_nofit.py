"""When no serving layout fits: what would, priced. A pre-quantized 4-bit checkpoint of the model on this engine, and
another engine that quantizes this 16-bit checkpoint at load where this one cannot (vLLM 0.33 has no bitsandbytes;
SGLang 0.5.23 still loads nf4), each with the row it would run at, so a suggestion followed as written fits."""

from __future__ import annotations

from .. import engines
from .._serving_data import serving_facts
from ..engines import ServerEngine
from ..errors import ConflictingConstraintsError
from ..memory.serving import bytes_per_weight
from .bnb_gate import quantization_runs
from .serving_decisions import Priced, row, score
from .serving_menu import Menu, checkpoint_only, menu
from .serving_plan import MAX_SEQS, _choose, _layouts
from .types import Request


def no_fit(request: Request, engine: ServerEngine, m: Menu, gpus: int, tried: list[Priced]) -> tuple[str, ...]:
    """The limit that was hit and what would fit instead: a pre-quantized 4-bit checkpoint (priced), another engine's
    at-load format (priced), more GPUs, shorter requests."""
    best = max(tried, key=lambda p: p.memory.max_concurrency)
    text = f"no format and layout leaves room for one {best.serving.max_model_len}-token sequence; best: {row(best)}."
    gpu = request.hardware.smallest_gpu
    assert gpu is not None
    given_16bit = m.checkpoint is None and not request.constraints.quantized_model
    others = tuple(_other_engine(request, engine, gpus)) if given_16bit and request.constraints.quantization in (None, "auto") else ()
    others = (*_fp8_kv_cache(request, engine, gpus), *_fewer_sequences(request, engine, gpus), *others)
    if given_16bit:
        for f in checkpoint_only(engine, gpu):
            fits = [p for p in _layouts(request, engine, m._replace(served=f), f, gpus) if p.speed is not None]
            if fits:
                top = max(fits, key=lambda p: score(request, p))
                return (f"{text} A pre-quantized {f} checkpoint of {request.model_id or request.model.name} fits: {row(top)}; pass "
                        f"quantized_model='org/repo' (its repo id or local path)", *others)
    return (f"{text} Use more GPUs (infer_gpu_many), a shorter prompt_len + max_new_tokens, or a bigger GPU", *others)


def _fitting_with(request: Request, engine: ServerEngine, gpus: int, update: dict[str, object]) -> Priced | None:
    """The plan ``engine`` makes for the request with ``update`` applied to its constraints, when one fits."""
    asked = request.model_copy(update={"constraints": request.constraints.model_copy(update=update)})
    try:
        chosen, _ = _choose(asked, engine, menu(asked, engine), gpus)
    except ConflictingConstraintsError:
        return None
    return chosen if chosen is not None and chosen.speed is not None else None


def _fp8_kv_cache(request: Request, engine: ServerEngine, gpus: int) -> list[str]:
    """The same request with the KV cache in fp8 (1 byte per element instead of 2: twice the tokens in the same
    pool), priced, where the request left the cache's dtype to the engine and the GPU has fp8 (Ada and later; on
    Ampere several of vLLM's attention backends refuse an fp8 cache: vllm-project/vllm#7714)."""
    gpu = request.hardware.smallest_gpu
    if request.constraints.kv_cache_dtype is not None or gpu is None or not gpu.supports_fp8:
        return []
    chosen = _fitting_with(request, engine, gpus, {"kv_cache_dtype": "fp8"})
    if chosen is None:
        return []
    return [f"kv_cache_dtype='fp8' fits: {engine.title} keeps keys and values in 1 byte instead of 2, twice the tokens in the "
            f"same pool ({row(chosen)}; https://docs.vllm.ai/en/latest/features/quantization/quantized_kvcache/)"]


def _fewer_sequences(request: Request, engine: ServerEngine, gpus: int) -> list[str]:
    """The most concurrent sequences (halving from the plan's) at which a layout fits, where the request left both
    max_num_seqs and batch_size to perfguide: vLLM profiles its sampler over max_num_seqs rows of the vocabulary, which
    on a small card can take the room one request needs (Qwen3-8B fp8 on a 12 GB card: ~1.4 GiB at 256)."""
    c = request.constraints
    if c.max_num_seqs is not None or c.batch_size is not None:
        return []
    seqs = MAX_SEQS // 2
    while seqs >= 1:
        if (chosen := _fitting_with(request, engine, gpus, {"max_num_seqs": seqs})) is not None:
            return [f"max_num_seqs={seqs} fits: {engine.title} sizes its start-up profile by the sequences it may run at once "
                    f"(its sampler over that many rows of the vocabulary), fewer leave the room one request needs ({row(chosen)})"]
        seqs //= 2
    return []


def _other_engine(request: Request, engine: ServerEngine, gpus: int) -> list[str]:
    """The first other server that quantizes this 16-bit checkpoint at load, in a format this engine cannot, and fits:
    its plan run as the line says (engine=, quantization=) on this hardware."""
    gpu = request.hardware.smallest_gpu
    assert gpu is not None
    own = {f for f, r in engine.formats.items() if r.at_load and engine.runs(f, gpu)}
    for other in engines.servers():
        if other.name == engine.name:
            continue
        formats = [f for f, r in other.formats.items() if r.at_load and f not in own and serving_facts().formats[f].bits < 16
                   and other.runs(f, gpu) and (f != "nf4" or quantization_runs("nf4", request.hardware))]
        for f in formats:
            if (chosen := _fitting_with(request, other, gpus, {"engine": other.name, "quantization": f})) is not None:
                where = f" on hardware={request.hardware.name!r}" if request.hardware.name else ""
                return [f"engine={other.name!r} with quantization={f!r} fits{where}: {other.title} quantizes this 16-bit checkpoint at load "
                        f"({other.formats[f].choice}, {bytes_per_weight(f):.4g} B per weight, {engine.title} {engine.version} cannot): "
                        f"{row(chosen)}"]
    return []
