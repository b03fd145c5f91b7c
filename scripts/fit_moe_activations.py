"""Fit the MoE families of perfguide/data/activations.json: a dense family's table plus the MoE block's difference.

Run: ``HF_HUB_OFFLINE=1 .venv/bin/python scripts/fit_moe_activations.py [--dry-run] [--family mixtral]``.

transformers 5 runs a MoE block's experts through ``config._experts_implementation``, which
``PreTrainedModel.get_correct_experts_implementation`` sets to ``grouped_mm`` for every model whose experts class
carries ``@use_experts_implementation`` (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, gpt-oss, DeepSeek-V3 ...), on CUDA and
CPU alike; ``integrations/moe.grouped_mm_experts_forward`` sorts the (token, expert) pairs by expert, gathers one copy
of the hidden state per pair, and runs ``torch.nn.functional.grouped_mm`` (CUDA: the CUTLASS kernel in bf16 on SM80+,
a loop of mm for other dtypes; CPU: the same op, autograd's formula saving the same operands), so a CPU run takes the
CUDA code path. Its fake kernel refuses fp32 operands (``_meta_grouped_mm_common`` checks bf16), where a fake-tensor
trace stops, so this fit runs real CPU tensors: the MoE sublayer of a one-block model and the FFN of a dense model of
the same hidden size whose width is the MoE block's active width, each fed the normed hidden state (requiring grad, as
in training) at two token counts; the bytes of the storages autograd saves (``saved_tensors_hooks``; parameters and the
shared input left out) differenced per token, in the three dtype regimes (autocast: perfguide's CUDA autocast lists,
``memory/tracing/cuda_emulation.py``) and with the base frozen (LoRA elsewhere: the frozen FFN keeps no input for a
weight gradient). Everything else in the block (norms, attention, residual adds) is the same code in both, so the
per-token difference is the MoE block's over the dense table (scripts/fit_activations.py's fake-tensor traces), fitted
as a linear form over the block dims plus four MoE dims (``activations.block_dims``): ``hk`` = hidden x top-k (the
dispatch copy and the experts' output, one per routed pair), ``ir`` = routed active FFN width (top-k x expert width),
``e`` = routed experts (the fp32 router probabilities) and ``k`` = top-k (index tensors).
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Any

from fit_activations import DATA, family_args, least_squares, write_data

Dims = dict[str, int]
#: base point of the fit; every other point changes one or two of these (h and k together separate h x k from h and k)
BASE: Dims = {"h": 64, "ie": 64, "e": 4, "k": 2, "shared": 0}
TOKENS = (128, 256)
#: weights dtype and autocast dtype of each regime (activations.regime)
REGIMES = {"fp32": ("float32", None), "amp": ("float32", "bfloat16"), "half": ("bfloat16", None)}


def _common(d: Dims) -> dict[str, Any]:
    return dict(hidden_size=d["h"], num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_hidden_layers=1,
                vocab_size=256, tie_word_embeddings=False, max_position_embeddings=1024)


def _mixtral(d: Dims) -> dict[str, Any]:
    """Softmax router in fp32 whose top-k weights stay fp32 into the combine."""
    return {**_common(d), "model_type": "mixtral", "intermediate_size": d["ie"], "num_local_experts": d["e"],
            "num_experts_per_tok": d["k"]}


def _qwen3_moe(d: Dims) -> dict[str, Any]:
    """Top-k weights renormalised (Qwen3-30B-A3B's norm_topk_prob) and cast back to the logits' dtype."""
    return {**_common(d), "model_type": "qwen3_moe", "moe_intermediate_size": d["ie"], "intermediate_size": 4 * d["h"],
            "num_experts": d["e"], "num_experts_per_tok": d["k"], "norm_topk_prob": True}


def _qwen2_moe(d: Dims) -> dict[str, Any]:
    """A dense shared expert beside the routed ones, scaled by a sigmoid gate; top-k not renormalised (Qwen1.5-MoE-A2.7B)."""
    return {**_common(d), "model_type": "qwen2_moe", "moe_intermediate_size": d["ie"], "intermediate_size": 4 * d["h"],
            "num_experts": d["e"], "num_experts_per_tok": d["k"], "norm_topk_prob": False,
            "shared_expert_intermediate_size": d["shared"]}


def _olmoe(d: Dims) -> dict[str, Any]:
    """OLMoE: softmax router, top-k not renormalised; RMSNorms before each sublayer (Llama's, not OLMo 2's after) and
    over the whole q and k projections, which keep what Qwen3's per-head q/k norms keep but one rsqrt per token
    instead of one per head (its dense table, 4 B x (heads + kv heads - 2) per token over). intermediate_size is
    the expert width."""
    return {**_common(d), "model_type": "olmoe", "intermediate_size": d["ie"], "num_experts": d["e"],
            "num_experts_per_tok": d["k"], "norm_topk_prob": False}


def _gpt_oss(d: Dims) -> dict[str, Any]:
    """gpt-oss: a biased router whose top-k logits are softmaxed in their own dtype; experts with biases, the
    gate/up columns interleaved, both clamped (``swiglu_limit``) and gated as ``(up + 1) * gate * sigmoid(alpha *
    gate)``, which saves more per routed unit than Mixtral's ``silu(gate) * up``. intermediate_size is the expert
    width. Its attention (sinks, eager only) is the dense table's (see NOTES)."""
    return {**_common(d), "model_type": "gpt_oss", "intermediate_size": d["ie"], "num_local_experts": d["e"],
            "num_experts_per_tok": d["k"], "layer_types": ["full_attention"]}


def _glm4_moe(d: Dims) -> dict[str, Any]:
    """GLM-4.5 / 4.6's MoE block: a sigmoid router with a score-correction bias and group-limited top-k, its weights
    renormalised and scaled, and shared experts (one plain SwiGLU MLP, n_shared x the routed width) added unscaled.
    intermediate_size is the dense layers' width (first_k_dense_replace, 0 here: every block routed)."""
    return {**_common(d), "model_type": "glm4_moe", "moe_intermediate_size": d["ie"], "intermediate_size": 4 * d["h"],
            "n_routed_experts": d["e"], "num_experts_per_tok": d["k"], "n_shared_experts": d["shared"] // d["ie"],
            "first_k_dense_replace": 0, "n_group": 1, "topk_group": 1, "norm_topk_prob": True,
            "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2}


def _deepseek_v3(d: Dims) -> dict[str, Any]:
    """DeepSeek-V3's MoE block (Kimi-K2 and Moonlight run the same code): GLM-4.5's router and shared experts; its
    latent attention (MLA) is outside the measured FFN. Group-limited routing over one group here."""
    return {**_glm4_moe(d), "model_type": "deepseek_v3", "kv_lora_rank": 32, "q_lora_rank": 64, "qk_rope_head_dim": 8,
            "qk_nope_head_dim": 16, "v_head_dim": 16, "num_key_value_heads": 4}


def _glm4_moe_lite(d: Dims) -> dict[str, Any]:
    """GLM-4.7-Flash: DeepSeek-V3's latent attention and GLM-4.5's MoE block (sigmoid router, shared experts)."""
    return {**_deepseek_v3(d), "model_type": "glm4_moe_lite", "mlp_layer_types": ["sparse"]}   # its first layer is dense


def _qwen3_5_moe(d: Dims) -> dict[str, Any]:
    """Qwen3.5-MoE's block (Qwen3.6-35B-A3B too): Qwen2-MoE's (a shared expert scaled by a sigmoid gate beside the routed
    ones) with top-k renormalised; one full-attention block, whose gated attention is qwen3_5_text's table (the
    gated-DeltaNet layers' difference is activations.json linear_attention)."""
    return {**_common(d), "model_type": "qwen3_5_moe_text", "moe_intermediate_size": d["ie"], "num_experts": d["e"],
            "num_experts_per_tok": d["k"], "shared_expert_intermediate_size": d["shared"], "layer_types": ["full_attention"],
            "use_cache": False, "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2}


def _qwen3_next(d: Dims) -> dict[str, Any]:
    """Qwen3-Next: the same MoE block and gated attention as Qwen3.5-MoE."""
    return {**_qwen3_5_moe(d), "model_type": "qwen3_next", "norm_topk_prob": True}


def _minimax_m2(d: Dims) -> dict[str, Any]:
    """MiniMax-M2: a sigmoid router with a score-correction bias (DeepSeek-V3's, without groups or shared experts),
    routed experts of intermediate_size; RMSNorms over the whole q and k projections (OLMoE's, on Qwen3's table)."""
    return {**_common(d), "model_type": "minimax_m2", "intermediate_size": d["ie"], "num_local_experts": d["e"],
            "num_experts_per_tok": d["k"]}


def _llama4(d: Dims) -> dict[str, Any]:
    """Llama-4's MoE block (Llama4TextMoe): every token through every expert, its input scaled by the router's sigmoid
    score of that expert (zero off the top-k), plus a shared expert of the experts' width; every layer routed."""
    return {**_common(d), "model_type": "llama4_text", "intermediate_size": d["ie"], "intermediate_size_mlp": 4 * d["h"],
            "num_local_experts": d["e"], "num_experts_per_tok": d["k"], "interleave_moe_layer_step": 1,
            "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2}


def _ernie4_5_moe(d: Dims) -> dict[str, Any]:
    """ERNIE-4.5's MoE block (ERNIE-4.5-21B-A3B, 300B-A47B): a router run in fp32 with autocast off (its fp32 copy of
    the hidden state is saved for the router weight's gradient), softmax top-k chosen with a score-correction bias and
    renormalised, and shared experts (one SwiGLU MLP, moe_num_shared_experts x the routed width) added unscaled.
    moe_layer_start_index 0: the one block routed (the releases' first layer is dense)."""
    return {**_common(d), "model_type": "ernie4_5_moe", "moe_intermediate_size": d["ie"], "intermediate_size": 4 * d["h"],
            "moe_num_experts": d["e"], "moe_k": d["k"], "moe_num_shared_experts": d["shared"] // d["ie"],
            "moe_layer_start_index": 0, "moe_layer_end_index": 0, "moe_layer_interval": 1, "use_bias": False}


def _afmoe(d: Dims) -> dict[str, Any]:
    """AFMoE's MoE block: a sigmoid router whose logits are cast to fp32, top-k chosen with an expert bias, renormalised
    and scaled; shared experts (one SwiGLU MLP, num_shared_experts x the routed width) added unscaled."""
    return {**_common(d), "model_type": "afmoe", "moe_intermediate_size": d["ie"], "intermediate_size": 4 * d["h"],
            "num_experts": d["e"], "num_experts_per_tok": d["k"], "num_shared_experts": d["shared"] // d["ie"],
            "num_dense_layers": 0, "layer_types": ["sliding_attention"], "sliding_window": 4096,
            "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2}


def _afmoe_dense(d: Dims) -> dict[str, Any]:
    """AFMoE with its one block dense, as wide as the MoE block's active experts."""
    return {**_afmoe(d), "num_dense_layers": 1, "intermediate_size": d["k"] * d["ie"] + d["shared"]}


def _gemma4(d: Dims) -> dict[str, Any]:
    """Gemma-4's MoE layer (26B-A4B): its dense MLP (intermediate_size, the ``shared`` width) runs on every token beside
    the experts, each with its own RMSNorms, routed from the block's residual stream by a weightless-norm router whose
    softmax is fp32 and whose top-k weights are renormalised and scaled per expert. The MoE block is inline in the
    decoder layer, so the whole one-block model is measured (``WHOLE_MODEL``)."""
    return {**_common(d), "model_type": "gemma4_text", "enable_moe_block": True, "num_experts": d["e"],
            "top_k_experts": d["k"], "moe_intermediate_size": d["ie"], "intermediate_size": d["shared"],
            "global_head_dim": 16, "layer_types": ["full_attention"], "hidden_size_per_layer_input": 0,
            "vocab_size_per_layer_input": 256, "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2}


def _gemma4_dense(d: Dims) -> dict[str, Any]:
    """Gemma-4 with its one block dense, its MLP as wide as the MoE block's dense MLP and active experts."""
    return {**_gemma4(d), "enable_moe_block": False, "intermediate_size": d["k"] * d["ie"] + d["shared"]}


def _every_expert_dense(d: Dims) -> dict[str, Any]:
    """The dense model whose FFN is as wide as every expert and the shared one (what a Llama-4 token runs through)."""
    return {**_common(d), "model_type": "mistral", "intermediate_size": d["e"] * d["ie"] + d["ie"]}


def _every_expert_features(d: Dims) -> dict[str, int]:
    """The block dims of a Llama-4 as transformers builds it (model/code.built_by): top-k = every expert, one shared
    expert of the experts' width."""
    return {"h": d["h"], "i": (d["e"] + 1) * d["ie"], "hk": d["h"] * d["e"], "ir": d["e"] * d["ie"], "e": d["e"],
            "k": d["e"], "1": 1}


def _dense(model_type: str) -> Callable[[Dims], dict[str, Any]]:
    """The dense model whose FFN is as wide as the MoE block's active experts."""
    def build(d: Dims) -> dict[str, Any]:
        return {**_common(d), "model_type": model_type, "intermediate_size": d["k"] * d["ie"] + d["shared"]}
    return build


#: MoE family -> (MoE config builder, dense comparator builder, dense family whose table it extends, extra points)
MOE: dict[str, tuple[Callable[[Dims], dict[str, Any]], Callable[[Dims], dict[str, Any]], str, tuple[Dims, ...]]] = {
    "mixtral": (_mixtral, _dense("mistral"), "llama", ()),
    "qwen3_moe": (_qwen3_moe, _dense("qwen3"), "qwen3", ()),
    "qwen2_moe": (_qwen2_moe, _dense("qwen2"), "llama", ({**BASE, "shared": 64}, {**BASE, "shared": 128})),
    # stop 40 (bench/family_audit.py): priced by the generic (dense llama) table, 17% low
    "olmoe": (_olmoe, _dense("qwen3"), "qwen3", ()),
    # stop 41 (bench/family_audit.py): priced by the mixtral table, 21% low in bf16
    "gpt_oss": (_gpt_oss, _dense("mistral"), "llama", ()),
    # stop 70 (bench/family_audit.py): priced by the generic (dense llama) table, 31% low in bf16
    "glm4_moe": (_glm4_moe, _dense("mistral"), "llama", ()),
    # stop 70: DeepSeek-V3 / Kimi-K2 / Moonlight priced by the mixtral table (0.83), GLM-4.7-Flash by the generic (0.56)
    "deepseek_v3": (_deepseek_v3, _dense("mistral"), "mla", ()),
    "glm4_moe_lite": (_glm4_moe_lite, _dense("mistral"), "mla_equal_v", ()),
    # stop 70 (bench/family_audit.py): priced by the generic (dense llama) table, 19% low in bf16
    "minimax_m2": (_minimax_m2, _dense("qwen3"), "qwen3", ()),
    # stop 70: Qwen3.5-MoE and Qwen3-Next's attention and MoE blocks priced by the generic table
    "qwen3_5_moe_text": (_qwen3_5_moe, _dense("qwen2"), "qwen3_5_text", ({**BASE, "shared": 64}, {**BASE, "shared": 128})),
    "qwen3_next": (_qwen3_next, _dense("qwen2"), "qwen3_5_text", ({**BASE, "shared": 64}, {**BASE, "shared": 128})),
    # stop 71 (bench/family_audit.py, priced as built): Llama-4 through the mixtral table 0.977 in half, 1.556 under autocast
    "llama4_text": (_llama4, _every_expert_dense, "llama", ()),
    # stop 72 (bench/family_audit.py): ERNIE-4.5-21B-A3B priced by the generic (dense llama) table with its shared
    # experts unread (moe_num_shared_experts): 0.570 of a fake-tensor trace of its block at its released widths
    "ernie4_5_moe": (_ernie4_5_moe, _dense("ernie4_5"), "llama", ()),
    # stop 72: Arcee's Trinity (AFMoE) priced through the generic table, 0.46 of its traced block at the audit's widths
    "afmoe": (_afmoe, _afmoe_dense, "afmoe_dense", ()),
    # stop 73: Gemma-4-26B-A4B priced through Gemma 3's dense table, 0.51 of its traced block at its released widths
    "gemma4_moe": (_gemma4, _gemma4_dense, "gemma4_text", ()),
}
#: families whose MoE block is inline in the decoder layer (no FFN module to run alone): the whole one-block model is
#: measured from its input embeddings on, and the dense comparator's same parts cancel in the difference
WHOLE_MODEL = frozenset({"gemma4_text"})
#: families fitted on their own points and block dims (every expert runs: top-k is the expert count as built)
OWN_POINTS: dict[str, tuple[tuple[Dims, ...], Callable[[Dims], dict[str, int]], tuple[str, ...]]] = {
    "llama4_text": (tuple({**BASE, "k": 1, **c} for c in ({}, {"h": 128}, {"ie": 128}, {"e": 8}, {"h": 128, "e": 8},
                                                       {"ie": 128, "e": 8}, {"e": 2}, {"e": 6})),
                    _every_expert_features, ("h", "hk", "ir", "e", "i", "1")),
}
#: families whose every MoE block carries shared experts n_shared x the routed width (GLM-4.5: n_shared_experts 1):
#: fitted at points where the shared width follows the routed one, and at twice it
SHARED_EXPERTS = frozenset({"glm4_moe", "deepseek_v3", "glm4_moe_lite", "ernie4_5_moe", "afmoe", "gemma4_moe"})
#: what a family's source says beyond the common text
NOTES = {"olmoe": " OLMoE's RMSNorms over the whole q and k projections keep one rsqrt per token where Qwen3's per-head "
                  "norms (the dense table here) keep one per head: 4 B x (heads + kv heads - 2) per token priced over "
                  "(tests/test_moe_activations.py). Block code: transformers/models/olmoe/modeling_olmoe.py."}
STEPS: tuple[Dims, ...] = (
    BASE, {**BASE, "h": 128}, {**BASE, "ie": 128}, {**BASE, "k": 4}, {**BASE, "h": 128, "k": 4}, {**BASE, "k": 1},
    {**BASE, "e": 8}, {**BASE, "e": 8, "k": 3},
)


def features(d: Dims) -> dict[str, int]:
    """The block dims ``activations.block_dims`` gives a MoE model of these sizes."""
    return {"h": d["h"], "i": d["k"] * d["ie"] + d["shared"], "hk": d["h"] * d["k"], "ir": d["k"] * d["ie"],
            "e": d["e"], "k": d["k"], "1": 1}


def saved_bytes(run: Callable[[], Any], outside: set[int], regime: str) -> int:
    """Bytes of the storages autograd saves while ``run`` runs (CUDA autocast lists emulated in the amp regime),
    ``outside`` (data pointers of parameters and inputs: not the measured part's) left out."""
    import torch

    from perfguide.memory.tracing.cuda_emulation import make_cuda_emulation

    autocast = REGIMES[regime][1]
    seen: dict[int, int] = {}

    def pack(t: Any) -> Any:
        if t.untyped_storage().data_ptr() not in outside:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with make_cuda_emulation(getattr(torch, autocast) if autocast else None, emulate_sdpa=False):
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = run()
    del out
    return sum(seen.values())


def one_block(config: dict[str, Any], regime: str, **kw: Any) -> Any:
    """A one-block model of ``config`` (a raw dict naming its model_type) in the regime's weights dtype, training."""
    import torch
    import transformers

    layer_types = {"layer_types": ["full_attention"]} if config["model_type"] == "gpt_oss" else {}
    hf_config = transformers.AutoConfig.for_model(**{**config, "num_hidden_layers": 1, **layer_types})
    torch.manual_seed(0)
    dtype = getattr(torch, REGIMES[regime][0])
    return transformers.AutoModelForCausalLM.from_config(hf_config, dtype=dtype, **kw).train()


def _input(shape: tuple[int, ...], regime: str) -> Any:
    """A hidden state requiring grad and not a leaf, as a normed one is: autocast caches the casts of leaves only."""
    import torch

    return torch.randn(*shape, dtype=getattr(torch, REGIMES[regime][0]), requires_grad=True) * 1.0


def _ptrs(tensors: Any) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in tensors}


def ffn_saved(config: dict[str, Any], regime: str, tokens: int, frozen: bool) -> int:
    """Bytes of the storages block 0's FFN (dense MLP or MoE block) saves for backward on ``tokens`` tokens."""
    import torch

    whole = config["model_type"] in WHOLE_MODEL
    # eager attention in a whole model: the same in the MoE model and its comparator (so it cancels), and it runs on
    # real CPU tensors under the emulated autocast lists, where SDPA would see q and k upcast by the norms, v not
    model = one_block(config, regime, **({"attn_implementation": "eager"} if whole else {}))
    layer = model.model.layers[0]
    ffn = model if whole else getattr(layer, "mlp", None) or layer.feed_forward   # Llama-4 names its FFN feed_forward
    if getattr(model.config, "num_local_experts", getattr(model.config, "num_experts", 1)) > 1:
        # Llama-4's experts carry no @use_experts_implementation: their bmm over every expert is what runs
        expected = "eager" if config["model_type"] == "llama4_text" else "grouped_mm"
        assert model.config._experts_implementation == expected, model.config._experts_implementation
    for p in ffn.parameters():
        torch.nn.init.normal_(p, std=0.02)
        p.requires_grad_(not frozen)
    x = _input((1, tokens, config["hidden_size"]), regime)
    run = (lambda: ffn(inputs_embeds=x).logits) if whole else (lambda: ffn(x))
    return saved_bytes(run, _ptrs(ffn.parameters()) | _ptrs([x]), regime)


def slope(config: dict[str, Any], regime: str, frozen: bool = False) -> float:
    """Bytes per token: two token counts differenced, so per-call constants (offsets, autocast's weight casts) cancel."""
    a, b = (ffn_saved(config, regime, t, frozen) for t in TOKENS)
    return (b - a) / (TOKENS[1] - TOKENS[0])


#: attention shapes of the eager-only fit (h, heads, kv heads) at gpt-oss's head_dim 64, so per-head terms (the sink
#: column of the probabilities, max's int64 indices) land in ``q`` at the width every gpt-oss release has
ATTN_SHAPES = ((64, 4, 2), (128, 4, 2), (64, 8, 2), (64, 4, 4))
ATTN_HEAD_DIM = 64
#: (batch, length) points: batch differences at two lengths separate b x s from b x heads x s^2
ATTN_POINTS = ((1, 32), (2, 32), (1, 64), (2, 64))
#: families whose attention runs only eager and saves other bytes than their dense table's
EAGER_ONLY = frozenset({"gpt_oss"})


def attn_saved(model_type: str, shape: tuple[int, int, int], regime: str, batch: int, seq: int) -> int:
    """Bytes of the storages block 0's eager self-attention saves for backward (real CPU tensors)."""
    import torch

    h, heads, kv = shape
    model = one_block({"model_type": model_type, "hidden_size": h, "num_attention_heads": heads,
                       "num_key_value_heads": kv, "head_dim": ATTN_HEAD_DIM, "intermediate_size": 64,
                       "vocab_size": 256, "max_position_embeddings": 1024, "attention_dropout": 0.0},
                      regime, attn_implementation="eager")
    attn = model.model.layers[0].self_attn
    x = _input((batch, seq, h), regime)
    rope = model.model.rotary_emb(x, torch.arange(seq)[None].expand(batch, seq))
    # the rotary cos / sin are shared by every block: not the block's
    outside = _ptrs(model.parameters()) | _ptrs([x]) | _ptrs(rope)
    return saved_bytes(lambda: attn(x, position_embeddings=rope, attention_mask=None), outside, regime)


def attn_terms(model_type: str, shape: tuple[int, int, int], regime: str) -> tuple[float, float]:
    """(bytes per token, bytes per batch x heads x s^2) of the eager attention at one shape."""
    b1s1, b2s1, b1s2, b2s2 = (attn_saved(model_type, shape, regime, b, s) for b, s in ATTN_POINTS)
    (s1, s2), heads = (ATTN_POINTS[0][1], ATTN_POINTS[2][1]), shape[1]
    d1, d2 = b2s1 - b1s1, b2s2 - b1s2           # one more row: s P + heads s^2 Q at each length
    q = (d2 / s2 - d1 / s1) / (heads * (s2 - s1))
    return d1 / s1 - heads * s1 * q, q


def norms_saved(model_type: str, h: int, regime: str, tokens: int) -> int:
    """Bytes block 0's two RMSNorms save for backward on ``tokens`` tokens (real CPU tensors, input left out)."""
    model = one_block({"model_type": model_type, "hidden_size": h, "num_attention_heads": 4, "num_key_value_heads": 2,
                       "head_dim": 16, "intermediate_size": 64, "vocab_size": 256}, regime)
    layer, total = model.model.layers[0], 0
    for norm in (layer.input_layernorm, layer.post_attention_layernorm):
        x = _input((1, tokens, h), regime)
        total += saved_bytes(functools.partial(norm, x), _ptrs(norm.parameters()) | _ptrs([x]), regime)
    return total


def norms_difference(name: str, regime: str) -> float:
    """Bytes per token per h the family's two norms keep beyond Llama's (gpt-oss multiplies the weight in fp32 and
    casts after, so under bf16 weights it keeps the fp32 product where Llama keeps a bf16 copy)."""
    def per_token(model_type: str, h: int) -> float:
        return (norms_saved(model_type, h, regime, 256) - norms_saved(model_type, h, regime, 128)) / 128

    diffs = [(per_token(name, h) - per_token("llama", h)) / h for h in (64, 128)]
    assert abs(diffs[0] - diffs[1]) < 1e-9, diffs   # linear in h, nothing per token beside it
    return diffs[0]


def fit_eager_attention(name: str, regime: str, table: dict[str, Any]) -> dict[str, Any]:
    """The family's eager terms: its own s^2 coefficient, and its eager per-token bytes as the dense table's plus
    what its attention saves per token beyond the dense family's (Llama's) at the same shapes; and what its norms
    keep beyond Llama's, in ``per_token``."""
    import numpy as np

    ours = [attn_terms(name, shape, regime) for shape in ATTN_SHAPES]
    dense = [attn_terms("llama", shape, regime) for shape in ATTN_SHAPES]
    rows = np.array([[h, heads * ATTN_HEAD_DIM, kv * ATTN_HEAD_DIM, 1] for h, heads, kv in ATTN_SHAPES], dtype=float)
    diff = np.array([o[0] - d[0] for o, d in zip(ours, dense)])
    coef, *_ = np.linalg.lstsq(rows, diff, rcond=None)
    print(f"    eager attention: s^2 {[round(o[1], 3) for o in ours]} B, per-token difference {diff.tolist()}, "
          f"worst residual {float(np.max(np.abs(rows @ coef - diff))):.3f}", flush=True)
    extra = {k: round(float(c), 3) for k, c in zip(("h", "q", "kv", "1"), coef) if abs(c) > 1e-6}
    norms = norms_difference(name, regime)
    print(f"    norms: {norms:+.3f} B per token per h beyond Llama's", flush=True)
    return {**table, "per_token": merged(table["per_token"], {"h": norms}), "eager_per_head_s2": round(ours[0][1], 3),
            "eager_per_token": merged(table["eager_per_token"], extra)}


def fit(points: list[Dims], ys: list[float], free: tuple[str, ...],
        dims: Callable[[Dims], dict[str, int]] = features) -> dict[str, float]:
    """Least squares over ``free`` dims (fit_activations.least_squares on the block dims of each point)."""
    return least_squares([dims(d) for d in points], ys, free)


def merged(base: dict[str, float], extra: dict[str, float]) -> dict[str, float]:
    out = dict(base)
    for k, v in extra.items():
        out[k] = round(out.get(k, 0.0) + v, 3)
    return {k: v for k, v in out.items() if abs(v) > 1e-6}


def fit_family(name: str, data: dict[str, Any]) -> dict[str, Any]:
    moe, dense, base_family, extra_points = MOE[name]
    points = [*STEPS, *extra_points]
    if name in SHARED_EXPERTS:
        points = [{**d, "shared": d["ie"]} for d in STEPS] + [{**d, "shared": 2 * d["ie"]} for d in STEPS[:4]]
    free = ("h", "hk", "ir", "e", "k", "1") + (("i",) if extra_points or name in SHARED_EXPERTS else ())
    dims = features
    if name in OWN_POINTS:
        own, dims, free = OWN_POINTS[name]
        points = list(own)
    regimes = {}
    for regime in REGIMES:
        table = dict(data["families"][base_family]["regimes"][regime])
        full = [slope(moe(d), regime) - slope(dense(d), regime) for d in points]
        kept = [slope(moe(d), regime, frozen=True) - slope(dense(d), regime, frozen=True) for d in points]
        per_token = fit(points, full, free, dims)
        frozen = fit(points, [f - k for f, k in zip(full, kept)], free, dims)
        table["per_token"] = merged(table["per_token"], per_token)
        table["frozen_linear_inputs_per_token"] = merged(table["frozen_linear_inputs_per_token"], frozen)
        regimes[regime] = fit_eager_attention(name, regime, table) if name in EAGER_ONLY else table
        print(f"  {name}/{regime}: moe-minus-dense {json.dumps(per_token)}, frozen {json.dumps(frozen)}", flush=True)
    return regimes


def main(argv: list[str] | None = None) -> int:
    args = family_args(__doc__ or "", MOE, argv)
    import torch
    import transformers

    data = json.loads(DATA.read_text(encoding="utf-8"))
    for name in args.family or sorted(MOE):
        print(f"tracing {name} ...", flush=True)
        regimes = fit_family(name, data)
        base_family = MOE[name][2]
        data["aliases"].pop(name, None)
        data["families"][name] = {"regimes": regimes, "dense": base_family, "source": (
            f"scripts/fit_moe_activations.py: the {base_family} table (scripts/fit_activations.py) plus what a {name} "
            f"MoE block saves for backward beyond a dense FFN of its active width, counted on real CPU tensors "
            f"(saved_tensors_hooks; torch {torch.__version__}, transformers {transformers.__version__}, "
            f"experts_implementation grouped_mm: the release's default on CUDA and CPU; CUDA autocast lists emulated), "
            f"per token between {TOKENS[0]} and {TOKENS[1]} tokens, at steps in h, expert width, experts and top-k "
            f"around {BASE}; frozen_linear_inputs the same difference with the FFN's weights frozen. Other terms "
            "(attention, eager, checkpoint boundary, logits, dropout) are the dense table's: the MoE block changes "
            "none of them." + NOTES.get(name, ""))}
    write_data(data, args.dry_run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
