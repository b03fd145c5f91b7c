"""DeepSeek-V4's cache: a sliding window of keys, plus compressed entries that grow with the sequence.

Every V4 layer attends to a window of recent positions (its one K/V head, keys and values one tensor) and, in its
compressed layers, to entries that pool ``rate`` positions each (transformers 5.24 models/deepseek_v4
``DeepseekV4HCACache``, ``DeepseekV4CSACache``). The generic cache reading saw only the window, so a V4 plan priced
its cache flat in the length: at 2^20 positions DeepSeek-V4-Flash's cache holds 6.7 GiB per sequence, 650 times the
window's 10.7 MiB.
What each layer keeps, per sequence, ``n`` positions in, all in the model's dtype:

- the window: ``min(n, window - 1)`` positions of ``head_dim``, one tensor for keys and values in a compressed layer
  (``values = keys``), two in a plain sliding layer (DynamicSlidingWindowLayer concatenates each);
- a heavily compressed layer (HCA): ``n // rate`` entries of ``head_dim`` and the positions since the last full
  window, ``n % rate``, of ``head_dim`` twice (the compressor's buffered kv and gate);
- a compressed sparse layer (CSA): the same with buffers twice as wide (its two overlapping series), the last
  window's first series kept for the next (``rate`` x ``head_dim``, kv and gate), and its lightning indexer's own
  compressor at ``index_head_dim`` with the same three parts.
"""

from __future__ import annotations

from ..model.types import ModelSpec

#: transformers' DeepseekV4Config: a legacy per-layer ratio names the layer's kind, and the kinds' default rates
KIND_OF_RATIO = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}
DEFAULT_RATES = {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128}
COMPRESSED = frozenset(DEFAULT_RATES)


def compressed_kinds(spec: ModelSpec) -> list[str] | None:
    """Each decoder layer's attention kind, or None for a model without compressed attention. Read as the config
    class derives it: ``layer_types``, else the legacy ``compress_ratios`` (the released config.json's key, one more
    entry than layers: the multi-token-prediction layer), else two HCA layers then CSA / HCA alternating."""
    config = spec.config or {}
    if spec.model_type != "deepseek_v4":
        return None
    layers = spec.num_decoder_layers or spec.num_layers
    types = config.get("layer_types")
    ratios = config.get("compress_ratios")
    if isinstance(types, list) and types:
        kinds = [str(t) for t in types]
    elif isinstance(ratios, list) and ratios:
        kinds = [KIND_OF_RATIO.get(int(r), "sliding_attention") for r in ratios]
    else:
        kinds = ["heavily_compressed_attention"] * min(layers, 2) + [
            "compressed_sparse_attention" if i % 2 else "heavily_compressed_attention" for i in range(max(layers - 2, 0))]
    return kinds[:layers]


def _rates(spec: ModelSpec) -> dict[str, int]:
    given = (spec.config or {}).get("compress_rates")
    return {**DEFAULT_RATES, **({k: int(v) for k, v in given.items()} if isinstance(given, dict) else {})}


def _compressor_elements(n: int, rate: int, width: int, overlapping: bool) -> int:
    """One compressor's entries, buffered kv and gate, and (overlapping) the kept last-window series."""
    entries = (n // rate) * width
    buffered = 2 * (n % rate) * width * (2 if overlapping else 1)
    kept = 2 * rate * width if overlapping and n >= rate else 0
    return entries + buffered + kept


def layer_elements(kind: str, n: int, window: int | None, head_dim: int, index_dim: int, rate: int) -> int:
    """Elements one layer caches for one sequence after ``n`` positions (no window: every position kept)."""
    kept = (n if not window else min(n, window - 1)) * head_dim
    if kind not in COMPRESSED:
        return 2 * kept
    sparse = kind == "compressed_sparse_attention"
    elements = kept + _compressor_elements(n, rate, head_dim, sparse)
    return elements + (_compressor_elements(n, rate, index_dim, True) if sparse else 0)


def compressed_cache_bytes(spec: ModelSpec, batch: int, tokens: int, dtype_bytes: int) -> int | None:
    """What a V4 model's cache holds after ``tokens`` positions, or None for any other model."""
    kinds = compressed_kinds(spec)
    if kinds is None:
        return None
    window, rates = spec.sliding_window, _rates(spec)
    index = (spec.config or {}).get("index_head_dim") or 0
    per_sequence = sum(layer_elements(k, tokens, window, spec.head_dim, int(index), rates.get(k, 1)) for k in kinds)
    return batch * per_sequence * dtype_bytes
