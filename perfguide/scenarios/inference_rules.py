"""Rules shared by infer_gpu_one, infer_gpu_many and infer_cpu: each returns a Decision with its number.

The scenarios only differ in which layouts they try (one GPU; replicas / tensor parallel / layer split;
CPU); dtype, attention, quantization, batch and cache rules are the same and live here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from .. import sources
from ..decisions import Alternative, Decision
from ..errors import ConflictingConstraintsError
from ..memory import estimate_memory
from ..memory.inference import activation_bytes_per_element, cached_tokens, inference_data, kv_cache_bytes, loaded_format, recurrent_state_bytes, weight_bytes
from ..memory.types import MemoryEstimate
from ..model.quantized import checkpoint_format
from ..model.recurrent import STATE_ONLY
from ..setup import QUANTIZED, Setup
from ..speed import estimate_speed
from ..speed.types import Throughput
from . import search
from .bnb_gate import quantization_runs
from .rules_attention import decide_attention
from .rules_precision import inference_cpu_dtype, inference_gpu_dtype
from .search import gib, usable_bytes
from .types import Candidate, Plan, Request

MAX_AUTO_BATCH = 64
SRC_QUANT = f"{sources.BNB_QUANTIZATION}; {sources.LITGPT_RESOURCE_TABLES} (quantized decode rows, data/inference.json)"
SRC_CACHE = f"{sources.LLM_OPTIMS}#static-kv-cache-and-torchcompile (static cache + torch.compile: up to 4x)"


def prompt_len(request: Request) -> int:
    return request.constraints.prompt_len or request.seq_len


def fits(mem: MemoryEstimate, request: Request) -> bool:
    """The training rule, headroom on host RAM included: offloaded weights share the RAM with the process itself."""
    return search.fits(mem, request.hardware, request.constraints.headroom)


def price(request: Request, setup: Setup) -> tuple[MemoryEstimate, Throughput]:
    spec, hw = request.model, request.hardware
    room = request.constraints.headroom  # offloaded plans split GPU/CPU by the same headroom the fit check keeps
    return estimate_memory(spec, setup, hw, headroom=room), estimate_speed(spec, setup, hw, headroom=room)


def candidate(request: Request, setup: Setup, why: str = "") -> Candidate:
    mem, speed = price(request, setup)
    return Candidate(setup=setup, memory=mem, throughput=speed, verdict="fits" if fits(mem, request) else "does-not-fit", why=why)


# --- dtype and attention: one rule each for training and inference (rules_precision, rules_attention) -------
def gpu_dtype(request: Request) -> tuple[str, Decision, list[str]]:
    gpu = request.hardware.smallest_gpu
    assert gpu is not None, "gpu_dtype is only asked for GPU plans"
    return inference_gpu_dtype(request.model, gpu, request.constraints.precision)


def cpu_dtype(request: Request) -> tuple[str, Decision, list[str]]:
    return inference_cpu_dtype(request.hardware.cpu, request.constraints.precision)


def attention(request: Request, dtype: str, on_gpu: bool) -> Decision:
    """16-bit compute for 16-bit and bitsandbytes weights (their matmuls dequantize to the compute dtype)."""
    compute = dtype if dtype in ("bf16", "fp16") else "fp16" if dtype in QUANTIZED else None
    gpu = request.hardware.smallest_gpu if on_gpu else None
    return decide_attention(request.model, request.constraints.attn_implementation, gpu, compute,
                            local=request.hardware.source == "probe", seq_len=request.seq_len)


# --- batch, quantization, cache --------------------------------------------------------------------
def largest_batch(request: Request, setup: Setup, limit: int = 4096) -> int:
    """Largest micro_batch_size that fits (memory grows monotonically with it); 0 if even 1 does not."""
    def ok(b: int) -> bool:
        return fits(estimate_memory(request.model, setup.replace(micro_batch_size=b), request.hardware,
                                    headroom=request.constraints.headroom), request)
    if not ok(1):
        return 0
    lo, hi = 1, 2
    while hi <= limit and ok(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, limit + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def kv_decision(request: Request, setup: Setup, max_batch: int) -> Decision:
    spec = request.model
    tokens = cached_tokens(setup, spec)
    cross = setup.seq_len if spec.is_encoder_decoder else 0
    one = kv_cache_bytes(spec, 1, tokens, activation_bytes_per_element(setup), static=setup.cache_implementation == "static",
                         cross_tokens=cross)
    if not spec.generates:
        what = "no KV cache (one forward pass)"
    elif spec.is_mla:
        index = spec.sparse_index
        what = (f"KV cache = {spec.num_decoder_layers or spec.num_layers} layers x (latent {spec.kv_lora_rank} + rope key "
                f"{spec.qk_rope_head_dim}" + (f" + sparse-attention indexer key {index.head_dim}" if index else "") + f") x {tokens} "
                "tokens per sequence (MLA, compressed as transformers caches it)")
    else:
        gqa = f"{spec.num_key_value_heads} KV heads for {spec.num_attention_heads} query heads"
        kinds = spec.cache_layer_types()
        slide = sum(k in ("sliding_attention", "chunked_attention") for k in kinds)
        state = sum(k in STATE_ONLY for k in kinds)
        windowed = f" ({slide} of {len(kinds)} layers keep only their window)" if slide else ""
        if state:
            windowed += (f" ({state} of {len(kinds)} layers keep a fixed state instead, "
                         f"{recurrent_state_bytes(spec, 1, activation_bytes_per_element(setup)) / 2**20:.1f} MiB per sequence)")
        what = f"KV cache = 2 x {spec.kv_layers} layers x {gqa} x {spec.head_dim} x {tokens} tokens per sequence{windowed}"
    return Decision(setting="max_batch_size", value=max_batch, number=float(one), unit="bytes KV cache per sequence",
                    reason=f"{what}; {max_batch} concurrent sequences fit beside the weights",
                    source=f"{sources.LLM_TUTORIAL_OPTIMIZATION} (KV cache bytes per token)")


def choose_batch(request: Request, max_batch: int) -> tuple[int, Decision]:
    """The requested concurrency; with none given and throughput preferred, the largest power of 2 that fits."""
    asked = request.constraints.batch_size
    if asked is not None or request.constraints.prefer == "latency" or max_batch <= 1:
        b = asked or 1
        if asked:
            reason = "requested concurrency"
        elif request.constraints.prefer == "latency":
            reason = "one sequence at a time: lowest latency per token (prefer='latency')"
        else:  # throughput preferred, but the cache of a second sequence does not fit beside the weights
            reason = f"{max_batch} sequence(s) fit beside the weights: no room to batch for throughput"
        return b, Decision(setting="batch_size", value=b, reason=reason, number=float(max_batch), unit="largest batch that fits",
                           source=f"{sources.LLM_TUTORIAL_OPTIMIZATION} (KV cache bytes per token)")
    b = min(MAX_AUTO_BATCH, 2 ** int(math.log2(max_batch)))
    return b, Decision(setting="batch_size", value=b, number=float(max_batch), unit="largest batch that fits",
                       reason=(f"decode is memory-bandwidth bound: one weight read serves all {b} sequences, so tokens/s grows "
                               f"almost linearly with batch (capped at {MAX_AUTO_BATCH} to keep per-token latency sane)"
                               if request.model.generates else
                               f"one forward pass over {b} sequences: a bigger batch amortises the weight reads and kernel "
                               f"launches until the matmuls are compute bound (capped at {MAX_AUTO_BATCH})"),
                       source=sources.LLM_TUTORIAL_OPTIMIZATION)


def quant_ladder(request: Request, base: Setup, dtype16: str) -> Iterable[tuple[Setup, str]]:
    """16-bit first; bnb 8-bit then 4-bit NF4 only when needed (or forced by the quantization constraint)."""
    forced = request.constraints.quantization
    if (stored := checkpoint_format(request.model.config)) is not None:  # pre-quantized: loaded as saved, never re-quantized
        yield stored_setup(request, base, dtype16, stored)
        return
    if forced not in (None, "none", "auto"):
        yield base.replace(weights_dtype=forced), "quantization given as a constraint"
        return
    yield base.replace(weights_dtype=dtype16), f"{dtype16} weights"
    if forced == "none":  # the checkpoint as it is, never quantized
        return
    for q in ("int8", "nf4"):
        if base.device != "cuda" or quantization_runs(q, request.hardware):  # the GPUs' bnb capability flags
            yield base.replace(weights_dtype=q), f"bitsandbytes {q}"


def keeps_16bit_weights(request: Request) -> bool:
    """Whether offloading 16-bit weights to the CPU honours the quantization asked for: no request and 'auto' (a lossy
    format may win, none has to) allow it, and so does 'none' for a 16-bit checkpoint (served as it is); a format name
    does not, nor a pre-quantized checkpoint ('none' set by as_the_module_is: served as saved, never as 16-bit)."""
    forced = request.constraints.quantization
    if forced == "none":
        return checkpoint_format(request.model.config) is None
    return forced in (None, "auto")


def stored_setup(request: Request, base: Setup, dtype16: str, stored: str) -> tuple[Setup, str]:
    """A pre-quantized checkpoint in the format ``from_pretrained`` leaves in memory on this device; a different
    quantization asked for is refused (transformers cannot re-quantize a quantized checkpoint)."""
    forced = request.constraints.quantization
    if forced not in (None, "none", "auto", stored):
        raise ConflictingConstraintsError(f"{request.model.name} is saved {stored}-quantized (its quantization_config), not "
                                          f"quantization={forced!r}: drop quantization, or pass the 16-bit checkpoint")
    fmt, why = loaded_format(stored, base.device, _cc(request, base))
    quantized = fmt if fmt in QUANTIZED else dtype16
    return base.replace(weights_dtype=quantized, checkpoint_format=fmt), why


def _cc(request: Request, setup: Setup) -> tuple[int, int] | None:
    gpu = request.hardware.smallest_gpu if setup.device == "cuda" else None
    return gpu.compute_capability if gpu else None


def chosen_weights(request: Request, setup: Setup) -> int:
    return weight_bytes(request.model, setup.weights_dtype, stored=setup.checkpoint_format)


def quant_decision(request: Request, chosen: Setup, tried: list[Candidate]) -> Decision:
    slow = inference_data().quant_decode_slowdown.value
    q = chosen.weights_dtype
    if (stored := checkpoint_format(request.model.config)) is not None:
        return Decision(setting="quantization_config", value=None, source=SRC_QUANT, number=float(chosen_weights(request, chosen)),
                        unit="bytes of weights", reason=loaded_format(stored, chosen.device, _cc(request, chosen))[1]
                        + "; no quantization_config is passed (transformers keeps the checkpoint's own and refuses one of another class)")
    alts = tuple(Alternative(value=c.setup.weights_dtype, why_not=f"needs {gib(c.memory.device_total)}, over the "
                             f"{gib(usable_bytes(c.memory, request.constraints.headroom) or 0)} usable",
                             number=float(c.memory.device_total), unit="bytes")
                 for c in tried if c.verdict == "does-not-fit")
    alts += tuple(Alternative(value=c.setup.weights_dtype, number=c.throughput.tokens_per_s, unit="tokens/s",
                              why_not=f"fits, but slower here: {c.throughput.tokens_per_s:,.1f} tok/s, "
                                      f"{c.throughput.time_per_output_token_ms or 0:.0f} ms per token")
                  for c in tried if c.verdict == "fits" and c.setup.weights_dtype != q)
    if chosen.offload_params:   # the number: the least any quantized layout needed on the GPU
        short = [c.memory.device_total for c in tried if c.verdict == "does-not-fit"]
        return Decision(setting="quantization_config", value=None, source=SRC_QUANT, alternatives=alts,
                        number=float(min(short)) if short else float(chosen_weights(request, chosen)),
                        unit="bytes the leanest GPU-only layout needs" if short else "bytes of weights",
                        reason="nothing fits on the GPU even in 4-bit; bnb 4-bit cannot be CPU-offloaded, so 16-bit weights are split")
    if q not in ("int8", "nf4"):
        return Decision(setting="quantization_config", value=None, source=SRC_QUANT, alternatives=alts,
                        number=float(chosen_weights(request, chosen)), unit="bytes of weights (they fit as they are)",
                        reason=(f"{q} weights and the KV cache fit: bitsandbytes would only slow decoding "
                                f"(int8 ~{slow['int8']}x, nf4 ~{slow['nf4']}x time per token)" if request.model.generates else
                                f"{q} weights fit: bitsandbytes would only slow the forward (dequantization in every matmul)"))
    why = ("named by the quantization constraint" if request.constraints.quantization not in (None, "auto") else
           "16-bit does not fit; the faster of the bitsandbytes formats that fit, by this plan's speed model")
    return Decision(setting="quantization_config", value=q, number=float(slow[q]), unit="x time per token", source=SRC_QUANT,
                    alternatives=alts, reason=f"bitsandbytes {q}: {why}; it costs ~{slow[q]}x time per token versus 16-bit "
                                              "(dequantization in every matmul)")


def cache_decision(request: Request, setup: Setup, speed: Throughput, on_gpu: bool) -> tuple[Setup, Decision]:
    """Static cache + torch.compile when latency is preferred and decode is overhead/bandwidth bound on a GPU."""
    quantized = setup.weights_dtype in ("int8", "nf4")
    want = (request.constraints.prefer == "latency" and on_gpu and not quantized and setup.new_tokens > 0
            and setup.strategy in ("single", "tp") and speed.bound in ("launch-overhead", "memory-bandwidth"))
    if not want:
        why = ("one forward pass (an encoder / task head): no KV cache and no decode steps to replay" if setup.new_tokens == 0 else
               "throughput preferred: batches and prompt lengths vary, and every new shape recompiles"
               if request.constraints.prefer == "throughput" else
               "compile of bitsandbytes-quantized models is unsupported" if quantized else
               "no CUDA graphs on CPU / with layer-split or offloaded models")
        ms = speed.time_per_output_token_ms   # a single forward has none: its deciding number is the 0 tokens it decodes
        return setup, Decision(setting="cache_implementation", value="dynamic", reason=why, source=SRC_CACHE,
                               number=ms if ms is not None else setup.new_tokens,
                               unit="ms per output token" if ms is not None else "tokens decoded", alternatives=(
            Alternative(value="static + torch.compile", why_not=why),))
    fast = setup.replace(cache_implementation="static", torch_compile=True)
    after = estimate_speed(request.model, fast, request.hardware, headroom=request.constraints.headroom)
    before_ms, after_ms = speed.time_per_output_token_ms, after.time_per_output_token_ms
    assert before_ms is not None and after_ms is not None, "inference estimates always carry time per output token"
    gain = before_ms / after_ms
    return fast, Decision(setting="cache_implementation", value="static", number=round(gain, 2), unit="x faster per token",
                          reason=f"latency preferred and decode is {speed.bound} bound: a static cache lets torch.compile "
                                 "(mode='reduce-overhead') replay CUDA graphs; pad prompts to a few lengths to avoid recompiles",
                          source=SRC_CACHE, alternatives=(Alternative(value="dynamic", why_not=f"{gain:.2f}x slower per token"),))


def no_fit_suggestions(request: Request, best: Candidate) -> tuple[str, ...]:
    from .inference_nofit import what_would_fit  # it prices candidates with this module

    return what_would_fit(request, best)


def finish(request: Request, chosen: Candidate, decisions: list[Decision], candidates: list[Candidate],
           warnings: list[str], ok: bool) -> Plan:
    """Mark the chosen candidate and wrap everything into a Plan. A plan that does not fit shows its setup as
    'does-not-fit', never 'chosen' (the table and the verdict say the same thing)."""
    verdict = "chosen" if ok else "does-not-fit"
    marked = tuple(c.model_copy(update={"verdict": verdict}) if c.setup == chosen.setup else c for c in candidates)
    if chosen.setup not in [c.setup for c in candidates]:
        marked += (chosen.model_copy(update={"verdict": verdict}),)
    warns = list(warnings) + [n for n in chosen.memory.notes if "offloaded" in n]
    return Plan(setup=chosen.setup, memory=chosen.memory, throughput=chosen.throughput, decisions=tuple(decisions),
                candidates=marked, warnings=tuple(warns), fits=ok, suggestions=() if ok else no_fit_suggestions(request, chosen))


def _speed_score(request: Request, c: Candidate) -> float:
    ms = c.throughput.time_per_output_token_ms
    return -(ms or 0.0) if request.constraints.prefer == "latency" else c.throughput.tokens_per_s


def first_fit(request: Request, options: Iterable[tuple[Setup, str]]) -> tuple[Candidate | None, list[Candidate]]:
    """The first option (the weights as they are) when it fits; else the fastest of the others that fit, by this
    cost model's own speed (bitsandbytes nf4 dequantizes faster than int8's LLM.int8 matmuls on most GPUs)."""
    tried = [candidate(request, setup, why) for setup, why in options]
    if tried and tried[0].verdict == "fits":
        return tried[0], tried[:1]
    fits = [c for c in tried[1:] if c.verdict == "fits"]
    return (max(fits, key=lambda c: _speed_score(request, c)) if fits else None), tried


def max_memory_map(request: Request, setup: Setup, mem: MemoryEstimate) -> dict[Any, str]:
    """Per-GPU weight budgets for device_map='auto': capacity less headroom, context, KV cache and transients."""
    hw = request.hardware
    per_gpu: dict[Any, str] = {g.index: f"{_weight_budget(request, g.allocatable, mem) // 2**20}MiB" for g in hw.gpus[: setup.num_gpus]}
    per_gpu["cpu"] = f"{int(hw.cpu.ram_available * (1 - request.constraints.headroom)) // 2**20}MiB"
    return per_gpu


def _weight_budget(request: Request, allocatable: int, mem: MemoryEstimate) -> int:
    keep = mem.peak_allocated - mem.weights  # cache + transients + logits stay on every GPU
    return max(0, int(allocatable * (1 - request.constraints.headroom)) - mem.cuda_context - keep)


def max_memory_decision(request: Request, setup: Setup, mem: MemoryEstimate, reason: str) -> Decision:
    """accelerate's ``max_memory`` for device_map='auto', with the weight bytes it lets the smallest GPU hold."""
    budget = min(_weight_budget(request, g.allocatable, mem) for g in request.hardware.gpus[: setup.num_gpus])
    return Decision(setting="max_memory", value=max_memory_map(request, setup, mem), number=float(budget),
                    unit="bytes of weights per GPU", reason=reason, source=sources.BIG_MODEL_INFERENCE)
