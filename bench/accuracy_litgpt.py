"""How litgpt's bitsandbytes inference lays out memory, where it differs from transformers' (bench rows only).

litgpt (Lit-GPT 2023-10 .. 2024) quantizes through Lightning Fabric's ``BitsandbytesPrecision`` plugin, which
replaces every ``torch.nn.Linear`` of litgpt's ``GPT`` (lm_head included) and quantizes each weight on the GPU:

- litgpt's ``GPT`` keeps ``lm_head`` as its own Linear (a tied Hub model is converted with a copy of the
  embedding), so the lm_head is priced even where the Hub config ties it. Evidence: the quantize doc's falcon-7b
  rows read 28.95 GB at 32-true and 14.50 GB at bf16-true = 7.22 B params x 4 / x 2 (+ ~0.07 GB), where the
  tied Hub model has 6.92 B.
- Lightning's quantize step casts the 16-bit weight to fp16 on the GPU (``.to(device, torch.half)``) and quantizes
  it while the Linear still holds its previous weight: loading one int8 Linear holds the old int8 codes, the fp16
  copy (2 B/elt) and double_quant's row- and column-major int8 outputs (CB, CBt: 1 + 1 B/elt).
- A 4-bit Linear on a prompt of more than one token runs bitsandbytes' ``MatMul4Bit``: ``dequantize_4bit``
  returns the fp16 dtype the weight was quantized from, and ``.to(A.dtype)`` casts it again when the compute dtype
  is bf16: 2 + 2 B/elt of the Linear next to the prefill's activations (one token decodes by ``gemv_4bit``).

The largest Linear decides both transients (falcon-7b: the 65024 x 4544 lm_head). Returns the estimate with the
weights and the peak replaced; nothing here is fitted: bytes per element come from the code paths above.
"""

from __future__ import annotations

from perfguide.memory.inference import FP32, HALF, _linear_weight_bytes
from perfguide.memory.types import MemoryEstimate
from perfguide.model.types import ModelSpec


def _format(quantization: str) -> tuple[str, bool] | None:
    """(bnb layout, double quantization) for a litgpt ``--quantize`` value; None when not bitsandbytes."""
    q = quantization.removeprefix("bnb.")
    if q.startswith(("nf4", "fp4")):  # fp4 and nf4 share the layout: 4-bit codes + absmax per 64 weights
        return "nf4", q.endswith("-dq")
    if q == "int8":
        return "int8", False
    return None


def litgpt_linears(spec: ModelSpec, blocks: int | None = None) -> list[tuple[int, int]]:
    """Every Linear of litgpt's GPT as (in, out): the blocks' (experts counted) and its own lm_head; ``blocks``: only
    that many blocks (the root device of generate/sequentially.py, which also holds the lm_head)."""
    block = list(spec.block_linears.values())
    return block * (spec.total_layers if blocks is None else blocks) + [(spec.hidden_size, spec.vocab_size)]


def litgpt_weight_bytes(spec: ModelSpec, quantization: str, dtype_bytes: int, blocks: int | None = None) -> int:
    """Weights as litgpt holds them: every Linear in the bnb layout (lm_head too), the rest (embedding, norms) 16-bit
    / fp32; with ``blocks``, the root device's share."""
    fmt = _format(quantization)
    linears = litgpt_linears(spec, blocks)
    linear_elts = sum(i * o for i, o in linears)
    rest = spec.total_params - spec.lm_head_params - spec.linear_params
    if fmt is None:
        return (linear_elts + rest) * dtype_bytes
    layout, dq = fmt
    quantized = sum(_linear_weight_bytes(i, o, layout, dq) for i, o in linears)
    return int(quantized + rest * dtype_bytes)


def litgpt_transient_bytes(spec: ModelSpec, quantization: str, compute_bytes: int, compute_is_fp16: bool,
                           blocks: int | None = None) -> tuple[int, int]:
    """(load transient, prefill transient) of the largest quantized Linear, in bytes."""
    fmt = _format(quantization)
    if fmt is None:
        return 0, 0
    layout, dq = fmt
    i, o = max(litgpt_linears(spec, blocks), key=lambda s: s[0] * s[1])
    n = i * o
    new = _linear_weight_bytes(i, o, layout, dq)
    if layout == "int8":
        load = HALF * n + new + n  # fp16 copy + CB (+ SCB) + CBt, next to the old codes (counted in the weights)
        prefill = n  # the first forward turns CB into the Ampere tile layout (CxB) before freeing CB
        return int(load), prefill
    load = HALF * n + new
    prefill = HALF * n + (0 if compute_is_fp16 else compute_bytes * n)
    return int(load), prefill


def litgpt_inference(spec: ModelSpec, est: MemoryEstimate, quantization: str, weights_dtype: str,
                     devices: int = 1, rest: int | None = None) -> MemoryEstimate:
    """``est`` (perfguide's transformers-layout estimate) re-laid out as litgpt runs it; on several devices
    (generate/sequentially.py) the root's share, whose max_memory_allocated litgpt prints: n_layer / devices blocks
    with the embedding, final norm and lm_head."""
    dtype_bytes = FP32 if weights_dtype == "fp32" else HALF
    blocks = None if devices == 1 else -(-spec.total_layers // devices)
    weights = litgpt_weight_bytes(spec, quantization, dtype_bytes, blocks)
    if rest is None:   # KV cache, prefill activations, logits (the caller's 16-bit plan's, for a quantized row)
        rest = est.peak_allocated - est.weights
    load, prefill = litgpt_transient_bytes(spec, quantization, dtype_bytes, weights_dtype == "fp16", blocks)
    peak = weights + max(rest + prefill, load)
    delta = peak - est.peak_allocated
    return est.model_copy(update={"weights": weights, "peak_allocated": peak,
                                  "peak_reserved": est.peak_reserved + delta, "device_total": est.device_total + delta, "fit_total": est.needed + delta})
