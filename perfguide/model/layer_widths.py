"""Each decoder layer's widths, where they differ along depth (attention heads and widths, the FFN).

Why per layer: Gemma-4's full-attention layers are twice as wide per head (``global_head_dim`` 512 against 256) with
fewer K/V heads (``num_global_key_value_heads``), and its small releases' last layers reuse earlier layers' K/V. A block
table priced at the config's ``head_dim`` kept 0.94 of what Gemma-4-31B's blocks save on average, and a cache priced
so holds twice the full layers' K/V. The saved bytes and the cache are linear in the widths, so the mean layer's
widths price the stack exactly (``mean_widths``) and the cache sums its layers (``kv_elements``). Gemma 3n's shared
layers likewise; MiMo-V2-Flash's sliding layers hold twice the K/V heads of its full ones, its values narrower than
its keys.
"""

from __future__ import annotations

from .types import ModelSpec


def layer_widths(spec: ModelSpec) -> tuple[tuple[int, int], ...]:
    """(query width, K/V width) of each decoder layer: heads x head width. A full-attention layer of a model with a
    ``global_head_dim`` takes that width and its ``num_global_key_value_heads`` (Gemma4TextConfig's per-layer config);
    a layer that reuses an earlier layer's K/V (the last ``num_kv_shared_layers``) projects none."""
    kinds = spec.attention_layer_types()
    first_shared = len(kinds) - min(spec.num_kv_shared_layers, len(kinds))
    out = []
    for i, kind in enumerate(kinds):
        wide = spec.global_head_dim is not None and kind == "full_attention"
        head = spec.global_head_dim if wide and spec.global_head_dim else spec.head_dim
        kv_heads = (spec.num_global_key_value_heads or spec.num_key_value_heads) if wide else (
            spec.sliding_key_value_heads if kind == "sliding_attention" and spec.sliding_key_value_heads else spec.num_key_value_heads)
        out.append((spec.num_attention_heads * head, 0 if i >= first_shared else kv_heads * head))
    return tuple(out)


def uniform(spec: ModelSpec) -> bool:
    """Every layer has the config's widths and values as wide as keys (every model but Gemma's and MiMo-V2-Flash's)."""
    return (spec.global_head_dim is None and not spec.num_kv_shared_layers and spec.value_head_dim is None
            and spec.sliding_key_value_heads is None)


def mean_widths(spec: ModelSpec) -> tuple[int, int]:
    """(query width, K/V width) of the mean layer, rounded: what a per-token block table multiplies."""
    if uniform(spec):
        return spec.num_attention_heads * spec.head_dim, spec.num_key_value_heads * spec.head_dim
    widths = layer_widths(spec)
    return (round(sum(q for q, _ in widths) / len(widths)), round(sum(kv for _, kv in widths) / len(widths)))


def kv_elements(spec: ModelSpec, kv_heads: int | None = None) -> tuple[int, ...]:
    """Cached elements per position of each (decoder) layer: ``ModelSpec.kv_elements_per_token`` where the layers are
    uniform, else K and V of each layer's own width. ``kv_heads``: the heads of the config's count one rank holds
    (tensor parallelism), each layer keeping that share of its own heads, at least one."""
    layers = len(spec.attention_layer_types())
    if uniform(spec) or spec.is_mla:
        return (spec.kv_elements_per_token(kv_heads),) * layers
    out = []
    for q, kv in layer_widths(spec):
        head = q // spec.num_attention_heads
        heads = kv // head
        if kv_heads is not None and heads:
            heads = max(1, heads * kv_heads // spec.num_key_value_heads)
        out.append(heads * (head + (spec.value_head_dim or head)))   # keys, then values (MiMo's narrower)
    return tuple(out)


def layer_ffn_widths(spec: ModelSpec) -> tuple[int, ...]:
    """Each layer's FFN width: ``active_intermediate_size``, twice it in a layer that reuses K/V where Gemma-4's
    ``use_double_wide_mlp`` is set (Gemma4TextMLP)."""
    kinds = spec.attention_layer_types()
    first_shared = len(kinds) - min(spec.num_kv_shared_layers, len(kinds))
    double = 2 if spec.double_wide_shared_mlp else 1
    return tuple(spec.active_intermediate_size * (double if i >= first_shared else 1) for i in range(len(kinds)))


def mean_ffn_width(spec: ModelSpec) -> int:
    """The mean layer's FFN width: ``active_intermediate_size``, where Gemma-4's ``use_double_wide_mlp`` doubles the
    MLP of each layer that reuses K/V (Gemma4TextMLP), at their share of the depth."""
    if not (spec.double_wide_shared_mlp and spec.num_kv_shared_layers):
        return spec.active_intermediate_size
    widths = layer_ffn_widths(spec)
    return round(sum(widths) / len(widths))
