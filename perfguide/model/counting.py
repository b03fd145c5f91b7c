"""Exact parameter counts and block shapes from a HF config dict, without torch.

Each counter mirrors the module tree transformers builds for that ``model_type`` (biases, norms, position
tables, heads included) and is checked in tests against the real module built on the meta device.
Model types or heads with no counter here are counted by instantiating the transformers class on the meta
device (see :mod:`perfguide.model.from_module`), which is exact but needs transformers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from . import fields, shape
from .fields import need, optional
from .types import Linears, ModelSpec, linear_weight_count

log = logging.getLogger("perfguide.model")


@dataclass(frozen=True)
class Counted:
    """What a counter found: shape fields for ModelSpec plus the parameter ledger.

    ``blocks`` lists (linears, other params per block, number of such blocks); "other" holds biases and norms.
    """

    dims: dict[str, Any]
    embedding: int
    lm_head: int
    other: int
    blocks: list[tuple[Linears, int, int]]
    experts: int = 1
    heads: frozenset[str] = field(default=frozenset({"lm", "base"}))  # heads this counter knows
    head: str = "lm"                                                  # the head counted

    @property
    def total(self) -> int:
        layers = sum((linear_weight_count(lin, self.experts) + extra) * n for lin, extra, n in self.blocks)
        return self.embedding + self.lm_head + self.other + layers

    @property
    def expert_params(self) -> int:
        """Routed-expert weights (``experts.*`` Linears, each counted once per expert) over all blocks."""
        if self.experts <= 1:
            return 0
        return sum((linear_weight_count(lin, self.experts) - linear_weight_count(lin, 0)) * n for lin, _, n in self.blocks)


def _lm_head(config: dict[str, Any], head: str, vocab: int, hidden: int, tied_default: bool) -> int:
    """Untied LM-head weight (0 when tied, or when the bare model has no head)."""
    if head == "base":
        return 0
    tied = config.get("tie_word_embeddings")
    return 0 if (tied_default if tied is None else tied) else vocab * hidden


def count_llama_like(config: dict[str, Any], head: str, *, norms: int = 2, qkv_bias: bool = False,
                     fused: bool = False, moe: bool = False) -> Counted:
    """Llama, Mistral, Qwen2, Gemma2 (4 norms), Phi-3 (fused qkv / gate_up), Mixtral (MoE): RMSNorm, no pos table."""
    h, layers = need(config, "hidden_size"), need(config, "num_hidden_layers")
    heads, vocab = need(config, "num_attention_heads"), need(config, "vocab_size")
    inter = need(config, "intermediate_size")
    kv = optional(config, "num_key_value_heads", heads)
    hd = optional(config, "head_dim", h // heads)
    q, k = heads * hd, kv * hd
    experts = need(config, "num_local_experts") if moe else 1
    if fused:
        lin = {"self_attn.qkv_proj": (h, q + 2 * k), "self_attn.o_proj": (q, h),
               "mlp.gate_up_proj": (h, 2 * inter), "mlp.down_proj": (inter, h)}
    else:
        lin = {"self_attn.q_proj": (h, q), "self_attn.k_proj": (h, k), "self_attn.v_proj": (h, k), "self_attn.o_proj": (q, h)}
        lin |= ({"mlp.gate": (h, experts), "experts.gate_up_proj": (h, 2 * inter), "experts.down_proj": (inter, h)}
                if moe else {"mlp.gate_proj": (h, inter), "mlp.up_proj": (h, inter), "mlp.down_proj": (inter, h)})
    attn_bias = bool(config.get("attention_bias", False))
    bias = (q + 2 * k if attn_bias or qkv_bias else 0) + (h if attn_bias else 0)
    bias += 2 * inter + h if config.get("mlp_bias") else 0
    dims = dict(hidden_size=h, num_layers=layers, num_attention_heads=heads, num_key_value_heads=kv, head_dim=hd,
                intermediate_size=inter, vocab_size=vocab, gated_mlp=True, num_experts=experts,
                num_experts_per_tok=optional(config, "num_experts_per_tok", 2) if moe else 1)
    return Counted(dims, embedding=vocab * h, lm_head=_lm_head(config, head, vocab, h, False), other=h,
                   blocks=[(lin, norms * h + bias, layers)], experts=experts)


def count_gemma2(config: dict[str, Any], head: str) -> Counted:
    counted = count_llama_like(config, head, norms=4)
    # Gemma2 ties by default (its config class does), unlike Llama.
    return replace(counted, lm_head=_lm_head(config, head, counted.dims["vocab_size"], counted.dims["hidden_size"], True))


def count_gpt2(config: dict[str, Any], head: str) -> Counted:
    """GPT-2: Conv1D weights (in, out) with biases, LayerNorms with bias, learned position table, tied head."""
    h, layers = need(config, "n_embd", "hidden_size"), need(config, "n_layer", "num_hidden_layers")
    heads, vocab = need(config, "n_head", "num_attention_heads"), need(config, "vocab_size")
    pos, inter = need(config, "n_positions", "max_position_embeddings"), optional(config, "n_inner", 4 * h)
    lin = {"attn.c_attn": (h, 3 * h), "attn.c_proj": (h, h), "mlp.c_fc": (h, inter), "mlp.c_proj": (inter, h)}
    extra = 2 * 2 * h + 3 * h + h + inter + h
    dims = dict(hidden_size=h, num_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                head_dim=h // heads, intermediate_size=inter, vocab_size=vocab, max_position_embeddings=pos,
                gated_mlp=False)
    return Counted(dims, embedding=(vocab + pos) * h, lm_head=_lm_head(config, head, vocab, h, True), other=2 * h,
                   blocks=[(lin, extra, layers)])


def count_opt(config: dict[str, Any], head: str) -> Counted:
    """OPT: learned positions with an offset of 2, optional project_in/out (350m), optional final LayerNorm."""
    h, layers = need(config, "hidden_size"), need(config, "num_hidden_layers")
    heads, vocab, inter = need(config, "num_attention_heads"), need(config, "vocab_size"), need(config, "ffn_dim")
    pos = need(config, "max_position_embeddings")
    proj = optional(config, "word_embed_proj_dim", h)
    affine = 2 * h if config.get("layer_norm_elementwise_affine", True) else 0
    bias = 4 * h + inter + h if config.get("enable_bias", True) else 0
    lin = {"self_attn.q_proj": (h, h), "self_attn.k_proj": (h, h), "self_attn.v_proj": (h, h),
           "self_attn.out_proj": (h, h), "fc1": (h, inter), "fc2": (inter, h)}
    final_norm = config.get("do_layer_norm_before", True) and not config.get("_remove_final_layer_norm", False)
    other = (affine if final_norm else 0) + (2 * h * proj if proj != h else 0)
    dims = dict(hidden_size=h, num_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                head_dim=h // heads, intermediate_size=inter, vocab_size=vocab, max_position_embeddings=pos,
                gated_mlp=False)
    return Counted(dims, embedding=vocab * proj + (pos + 2) * h, lm_head=_lm_head(config, head, vocab, proj, True),
                   other=other, blocks=[(lin, 2 * affine + bias, layers)])


def count_gpt_neox(config: dict[str, Any], head: str) -> Counted:
    """GPT-NeoX / Pythia: fused QKV, rotary (no table), two LayerNorms per block, untied head by default."""
    h, layers = need(config, "hidden_size"), need(config, "num_hidden_layers")
    heads, vocab, inter = need(config, "num_attention_heads"), need(config, "vocab_size"), need(config, "intermediate_size")
    attn_bias = 3 * h + h if config.get("attention_bias", True) else 0
    lin = {"attention.query_key_value": (h, 3 * h), "attention.dense": (h, h),
           "mlp.dense_h_to_4h": (h, inter), "mlp.dense_4h_to_h": (inter, h)}
    dims = dict(hidden_size=h, num_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                head_dim=h // heads, intermediate_size=inter, vocab_size=vocab, gated_mlp=False)
    return Counted(dims, embedding=vocab * h, lm_head=_lm_head(config, head, vocab, h, False), other=2 * h,
                   blocks=[(lin, 4 * h + attn_bias + inter + h, layers)])


def _counters() -> dict[str, Callable[[dict[str, Any], str], Counted]]:
    from .encoders import count_bert, count_t5

    def llama_like(**kw: Any) -> Callable[[dict[str, Any], str], Counted]:
        return lambda config, head: count_llama_like(config, head, **kw)

    return {"llama": llama_like(), "mistral": llama_like(), "qwen2": llama_like(qkv_bias=True),
            "phi3": llama_like(fused=True), "mixtral": llama_like(moe=True), "gemma2": count_gemma2,
            "gpt2": count_gpt2, "opt": count_opt, "gpt_neox": count_gpt_neox,
            "bert": count_bert, "roberta": count_bert, "t5": count_t5, "mt5": count_t5}


def supported_model_types() -> list[str]:
    return sorted(_counters())


def analytic_count(config: dict[str, Any], head: str | None = None) -> Counted | None:
    """The counter's result, or None when this model type or head has no counter here."""
    counter = _counters().get(str(config.get("model_type")))
    if counter is None:
        return None
    head = head or fields.head_kind(config)
    counted = counter(config, head)
    return replace(counted, head=head) if head in counted.heads else None


def build_spec(config: dict[str, Any], counted: Counted, name: str, source: str, **extra: Any) -> ModelSpec:
    """Assemble the ModelSpec from a counter's result plus what every config says the same way."""
    model_type = str(config.get("model_type", "unknown"))
    blocks = counted.blocks
    layers = counted.dims.get("num_decoder_layers") or counted.dims["num_layers"]
    dims = {"max_position_embeddings": config.get("max_position_embeddings"),
            **shape.read_all(config, model_type, layers), "expert_params": counted.expert_params, **counted.dims}
    values: dict[str, Any] = dict(
        name=name, model_type=model_type, architecture=fields.architecture(config), family=fields.family(model_type),
        tie_word_embeddings=counted.lm_head == 0 and counted.head != "base", total_params=counted.total, embedding_params=counted.embedding,
        lm_head_params=counted.lm_head, block_linears=blocks[0][0],
        decoder_block_linears=blocks[1][0] if len(blocks) > 1 else {}, native_dtype=fields.native_dtype(config),
        source=source, config=config, **dims)
    return ModelSpec(**(values | extra))


def spec_from_config(config: dict[str, Any], name: str, source: str) -> ModelSpec:
    """A ModelSpec with exact counts for ``config``'s head class (``architectures[0]``, else the LM head).

    Model types and heads without a counter here are instantiated on the meta device through transformers.
    """
    if not isinstance(config.get("model_type"), str):
        from ..errors import InvalidModelError

        raise InvalidModelError(f"config for {name!r} is missing required key 'model_type' "
                                f"(supported: {', '.join(supported_model_types())}).")
    counted = analytic_count(config)
    if counted is not None:
        return build_spec(config, counted, name, source)
    from .from_module import spec_via_meta_module

    log.info("no analytic counter for %s (%s); instantiating it on the meta device",
             config.get("model_type"), fields.architecture(config))
    return spec_via_meta_module(config, name, source)
