"""Regenerate the coefficients in perfguide/data/activations.json by tracing real HF blocks on fake tensors.

Run: ``HF_HUB_OFFLINE=1 .venv/bin/python scripts/fit_activations.py [--dry-run]``. For every family and precision
regime it traces one- and two-block models (the difference is one block) at several small shapes, varying one
dimension at a time (hidden, intermediate, q heads, kv heads) and two token counts (the slope in tokens removes
per-block constants such as autocast's cached 16-bit weight copies), then solves the per-token linear form that
``perfguide.memory.activations`` documents. Only numbers and sources are rewritten; families and aliases stay.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from perfguide.memory.tracing.build import with_depth
from perfguide.memory.tracing.step import run_step
from perfguide.setup import Setup

DATA = Path(__file__).resolve().parents[1] / "perfguide" / "data" / "activations.json"
REGIMES = {"fp32": {}, "amp": {"autocast": "bf16"}, "half": {"weights_dtype": "bf16"}}
SEQ, BATCHES, VOCAB = 64, (2, 4), 4096
Dims = dict[str, int]


def _llama(d: Dims, drop: float = 0.0) -> dict[str, Any]:
    hd = 16
    return dict(model_type="llama", hidden_size=d["h"], intermediate_size=d["i"], num_attention_heads=d["q"] // hd,
                num_key_value_heads=d["kv"] // hd, head_dim=hd, num_hidden_layers=2, vocab_size=VOCAB,
                tie_word_embeddings=False, max_position_embeddings=1024, attention_dropout=drop)


def _gemma(d: Dims, drop: float = 0.0) -> dict[str, Any]:
    """Llama's block, but GemmaRMSNorm multiplies by (1 + weight) in fp32, so a 16-bit model keeps an fp32 normalised tensor."""
    return {**_llama(d, drop), "model_type": "gemma"}


def _qwen3(d: Dims, drop: float = 0.0) -> dict[str, Any]:
    """Llama's block plus per-head RMSNorms on q and k before the rotation (q_norm, k_norm): their fp32 upcasts stay."""
    return {**_llama(d, drop), "model_type": "qwen3"}


def _olmo2(d: Dims, drop: float = 0.0) -> dict[str, Any]:
    """RMSNorms over the whole q and k projections and after (not before) each sublayer."""
    return {**_llama(d, drop), "model_type": "olmo2"}


def _phi3(d: Dims, drop: float = 0.0) -> dict[str, Any]:
    """Fused qkv_proj and gate_up_proj: the split views keep the fused outputs' storages (pad id inside the toy vocab)."""
    return {**_llama(d, drop), "model_type": "phi3", "pad_token_id": 0}


def _gemma3(d: Dims, drop: float = 0.0) -> dict[str, Any]:
    """Gemma 2's four (1 + weight) RMSNorms per block plus q_norm / k_norm, no soft-capping (sdpa runs)."""
    return {**_llama(d, drop), "model_type": "gemma3_text"}


def _stablelm(d: Dims, drop: float = 0.0) -> dict[str, Any]:
    """LayerNorm (not RMSNorm) blocks with a quarter of each head rotated (the config class's partial_rotary_factor)."""
    return dict(model_type="stablelm", hidden_size=d["h"], intermediate_size=d["i"], num_attention_heads=d["h"] // 16,
                num_key_value_heads=d["h"] // 16, num_hidden_layers=2, vocab_size=VOCAB, max_position_embeddings=1024,
                hidden_dropout=drop, attention_dropout=drop)


def _phi(d: Dims, drop: float = 0.0) -> dict[str, Any]:
    """Phi-1.5 / Phi-2: attention and MLP in parallel off one LayerNorm, half of each head rotated (class default)."""
    return dict(model_type="phi", hidden_size=d["h"], intermediate_size=d["i"], num_attention_heads=d["h"] // 16,
                num_hidden_layers=2, vocab_size=VOCAB, max_position_embeddings=1024, resid_pdrop=drop, embd_pdrop=drop,
                attention_dropout=drop)


def _gptj(d: Dims, drop: float = 0.0) -> dict[str, Any]:
    """Parallel attention and MLP off one LayerNorm; rotary_dim a quarter of the head, as GPT-J-6B's 64 of 256."""
    return dict(model_type="gptj", n_embd=d["h"], n_inner=d["i"], n_head=d["h"] // 16, rotary_dim=4, n_layer=2,
                vocab_size=VOCAB, n_positions=1024, resid_pdrop=drop, embd_pdrop=drop, attn_pdrop=drop)


def _gpt2(d: Dims, drop: float = 0.0) -> dict[str, Any]:
    return dict(model_type="gpt2", n_embd=d["h"], n_inner=d["i"], n_head=d["h"] // 16, n_layer=2, vocab_size=VOCAB,
                n_positions=1024, resid_pdrop=drop, embd_pdrop=drop, attn_pdrop=drop)


def _bert(d: Dims, drop: float = 0.0) -> dict[str, Any]:
    return dict(model_type="bert", hidden_size=d["h"], intermediate_size=d["i"], num_attention_heads=d["h"] // 16,
                num_hidden_layers=2, vocab_size=VOCAB, max_position_embeddings=1024, architectures=["BertForMaskedLM"],
                hidden_dropout_prob=drop, attention_probs_dropout_prob=drop)


def _gpt_neox(d: Dims, drop: float = 0.0) -> dict[str, Any]:
    return dict(model_type="gpt_neox", hidden_size=d["h"], intermediate_size=d["i"], num_attention_heads=d["h"] // 16,
                num_hidden_layers=2, vocab_size=VOCAB, max_position_embeddings=1024, hidden_dropout=drop, attention_dropout=drop)


def _opt(d: Dims, drop: float = 0.0) -> dict[str, Any]:
    return dict(model_type="opt", hidden_size=d["h"], ffn_dim=d["i"], num_attention_heads=d["h"] // 16, num_hidden_layers=2,
                word_embed_proj_dim=d["h"], vocab_size=VOCAB, max_position_embeddings=1024, dropout=drop, attention_dropout=drop)


def _biogpt(d: Dims, drop: float = 0.0) -> dict[str, Any]:
    return dict(model_type="biogpt", hidden_size=d["h"], intermediate_size=d["i"], num_attention_heads=d["h"] // 16,
                num_hidden_layers=2, vocab_size=VOCAB, max_position_embeddings=1024, hidden_dropout_prob=drop,
                attention_probs_dropout_prob=drop, activation_dropout=0.0, layerdrop=0.0)


def _falcon(d: Dims, drop: float = 0.0) -> dict[str, Any]:
    """Falcon-7B's block: attention and a GELU MLP in parallel off one LayerNorm, multi-query (one K/V head), rotary.
    (Falcon-40B/180B's new_decoder_architecture broadcasts K and V to every query head and adds a second LayerNorm.)"""
    return dict(model_type="falcon", hidden_size=d["h"], ffn_hidden_size=d["i"], num_attention_heads=d["h"] // 16,
                multi_query=True, new_decoder_architecture=False, parallel_attn=True, bias=False, alibi=False,
                num_hidden_layers=2, vocab_size=VOCAB, max_position_embeddings=1024, tie_word_embeddings=False,
                hidden_dropout=drop, attention_dropout=drop)


def _gpt_bigcode(d: Dims, drop: float = 0.0) -> dict[str, Any]:
    """GPT-2's block with one shared K/V head (multi_query, StarCoder / SantaCoder) and gelu_pytorch_tanh."""
    return dict(model_type="gpt_bigcode", n_embd=d["h"], n_inner=d["i"], n_head=d["h"] // 16, multi_query=True,
                n_layer=2, vocab_size=VOCAB, n_positions=1024, resid_pdrop=drop, embd_pdrop=drop, attn_pdrop=drop)


def _starcoder2(d: Dims, drop: float = 0.0) -> dict[str, Any]:
    """GQA with biases, LayerNorms and a plain (not gated) gelu_pytorch_tanh MLP: c_fc, c_proj."""
    return dict(model_type="starcoder2", hidden_size=d["h"], intermediate_size=d["i"], num_attention_heads=d["h"] // 16,
                num_key_value_heads=d["kv"] // 16, num_hidden_layers=2, vocab_size=VOCAB, max_position_embeddings=1024,
                tie_word_embeddings=False, residual_dropout=drop, embedding_dropout=drop, attention_dropout=drop)


def _cohere(d: Dims, drop: float = 0.0) -> dict[str, Any]:
    """Attention and a SwiGLU MLP in parallel off one bias-free LayerNorm (fp32 statistics), GQA."""
    return dict(model_type="cohere", hidden_size=d["h"], intermediate_size=d["i"], num_attention_heads=d["h"] // 16,
                num_key_value_heads=d["kv"] // 16, num_hidden_layers=2, vocab_size=VOCAB, max_position_embeddings=1024,
                tie_word_embeddings=False, attention_dropout=drop, pad_token_id=0)


def _bloom(d: Dims, drop: float = 0.0) -> dict[str, Any]:
    """ALiBi and eager attention only (BloomPreTrainedModel sets no _supports_sdpa); FFN fixed at 4h, gelu by hand."""
    return dict(model_type="bloom", hidden_size=d["h"], n_head=d["h"] // 16, n_layer=2, vocab_size=VOCAB,
                tie_word_embeddings=False, hidden_dropout=drop, attention_dropout=drop)


def _mpt(d: Dims, drop: float = 0.0) -> dict[str, Any]:
    """MPT: ALiBi, eager attention only (MptPreTrainedModel sets no _supports_sdpa), no biases, FFN expansion_ratio x h.
    Hidden dropout only: 5.24's MptAttentionConfig types attn_pdrop as int and refuses 0.1 (MPT-7B's config says 0)."""
    return dict(model_type="mpt", d_model=d["h"], n_heads=d["h"] // 16, n_layers=2, expansion_ratio=4, max_seq_len=1024,
                vocab_size=VOCAB, tie_word_embeddings=False, resid_pdrop=drop, emb_pdrop=drop,
                attn_config={"alibi": True})


def _glm4(d: Dims, drop: float = 0.0) -> dict[str, Any]:
    """Llama's block with q/k/v biases, half-width (partial) rotary, a fused gate_up_proj, and two more RMSNorms, after
    the attention and after the MLP (post_self_attn_layernorm, post_mlp_layernorm): their inputs and fp32 upcasts stay."""
    return {**_llama(d, drop), "model_type": "glm4", "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2}


def _qwen3_5(d: Dims, drop: float = 0.0) -> dict[str, Any]:
    """Qwen3.5's full-attention block (every layer full here; its gated-DeltaNet layers are scripts/fit_linear_attention.py's):
    Qwen3's per-head q/k RMSNorms (1 + weight, fp32), a q_proj twice as wide whose second half gates the attention output
    through a sigmoid, half-width (partial) rotary, Gemma-style (1 + weight) RMSNorms around the block."""
    return {**_llama(d, drop), "model_type": "qwen3_5_text", "layer_types": ["full_attention"] * 2, "use_cache": False,
            "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2}


def _lfm2(d: Dims, drop: float = 0.0) -> dict[str, Any]:
    """LFM2's attention block (every layer attention here): per-head q/k RMSNorms, out_proj, a SwiGLU MLP (w1, w3, w2)
    built at the width given (block_auto_adjust_ff_dim off: the spec reports the built width, model/shape.ffn_width).
    Its short-convolution blocks keep within 1.5% of this block at LFM2's released widths (docs/validation.md 99)."""
    return dict(model_type="lfm2", hidden_size=d["h"], intermediate_size=d["i"], num_attention_heads=d["h"] // 16,
                num_key_value_heads=d["kv"] // 16, num_hidden_layers=2, layer_types=["full_attention"] * 2,
                full_attn_idxs=[0, 1], block_auto_adjust_ff_dim=False, vocab_size=VOCAB, tie_word_embeddings=False,
                max_position_embeddings=1024, use_cache=False, pad_token_id=0, eos_token_id=1, bos_token_id=2)


def _afmoe(d: Dims, drop: float = 0.0) -> dict[str, Any]:
    """Arcee's AFMoE block (Trinity Nano / Mini / Large) with its FFN dense (num_dense_layers: every layer here): per-head
    q/k RMSNorms, a gate_proj as wide as the queries whose sigmoid gates the attention output, and RMSNorms both before
    and after each sublayer. Sliding-window layers (three in four of the releases) rotate q and k; the global ones do
    not, and keep the same bytes in bf16 and 128 B less per token at this point under autocast: the sliding block is fitted."""
    return {**_llama(d, drop), "model_type": "afmoe", "num_dense_layers": 2, "layer_types": ["sliding_attention"] * 2,
            "sliding_window": 4096, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
            "num_shared_experts": 1, "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2}


def _apertus(d: Dims, drop: float = 0.0) -> dict[str, Any]:
    """Swiss AI's Apertus: per-head q/k RMSNorms and a plain (not gated) MLP, up_proj -> xIELU -> down_proj, run by
    transformers' Python xIELU (the CUDA kernel is a separate package), which keeps more per unit than SwiGLU's pair."""
    return {**_llama(d, drop), "model_type": "apertus", "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2}


def _arcee(d: Dims, drop: float = 0.0) -> dict[str, Any]:
    """Arcee's AFM-4.5B: Llama's attention and a plain (not gated) MLP with ReLU^2: one projection's output, not two."""
    return {**_llama(d, drop), "model_type": "arcee", "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2}


def _hyperclovax(d: Dims, drop: float = 0.0) -> dict[str, Any]:
    """Naver's HyperCLOVA X SEED: Llama's block with RMSNorms after each sublayer too (use_post_norm) and scaled
    residuals (residual_multiplier)."""
    return {**_llama(d, drop), "model_type": "hyperclovax", "use_post_norm": True, "residual_multiplier": 0.5,
            "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2}


def _exaone4(d: Dims, drop: float = 0.0) -> dict[str, Any]:
    """LG's EXAONE 4.0: per-head q/k RMSNorms and RMSNorms after (not before) each sublayer; its sliding layers (three
    in four of the 32B) rotate q and k, as every layer of the 1.2B does: the sliding block is fitted."""
    return {**_llama(d, drop), "model_type": "exaone4", "layer_types": ["sliding_attention"] * 2, "sliding_window": 4096,
            "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2}


def _gemma4(d: Dims, drop: float = 0.0) -> dict[str, Any]:
    """Gemma 3's block plus an RMSNorm without weight on the values and a scalar on the block's output, its per-layer
    widths priced as the mean layer's (model/layer_widths.py). Both blocks full attention at the sliding layers'
    widths: the config class makes the last layer full, so a sliding pair traces a second layer kind's rotary tables
    into the difference (2 B per h more at the checkpoint boundary); a sliding block and a full one whose keys double
    as values save the same bytes per token in 16 bits (the value norm reads the key projection's saved output). No
    per-layer embeddings (hidden_size_per_layer_input 0: the 26B-A4B and 31B)."""
    return {**_llama(d, drop), "model_type": "gemma4_text", "layer_types": ["full_attention"] * 2, "global_head_dim": 16,
            "hidden_size_per_layer_input": 0, "vocab_size_per_layer_input": VOCAB, "pad_token_id": 0, "eos_token_id": 1,
            "bos_token_id": 2}


def _gemma4_ple(d: Dims, drop: float = 0.0) -> dict[str, Any]:
    """Gemma-4 with per-layer embeddings at the class default (256 wide, the E2B / E4B's): each layer gates its hidden
    state down to them, multiplies in its slice of the per-layer inputs (computed before the first block, b x s x
    layers x 256) and projects back; a layer's share of those inputs is in the one-minus-two-block difference."""
    return {**_gemma4(d, drop), "hidden_size_per_layer_input": 256}


def _gemma3n(d: Dims, drop: float = 0.0, sparsity: float = 0.0) -> dict[str, Any]:
    """Gemma 3n's block (E2B / E4B): Gemma 3's attention and FFN inside AltUp's four copies of the hidden state and
    their router, LAuReL's rank-64 side path and the per-layer embeddings' 256-wide path, at the class defaults (the
    releases' own widths), so their per-token terms land in the h terms and the constant. A dense FFN; the sparse
    layers' excess is ``sparse_ffn_terms``. No layer reuses another's K/V (the traced block computes its own)."""
    return {**_llama(d, drop), "model_type": "gemma3n_text", "intermediate_size": [d["i"]] * 2,
            "layer_types": ["full_attention"] * 2, "num_kv_shared_layers": 0, "activation_sparsity_pattern": [sparsity] * 2,
            "vocab_size_per_layer_input": VOCAB, "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2}


def sparse_ffn_terms(regime: dict[str, Any]) -> tuple[float, float]:
    """(bytes per FFN unit per token, the frozen-base share of them) a Gemma 3n layer with activation sparsity keeps
    beyond a dense one (its gaussian top-k cutoff over the gate's output): sparse minus dense at two FFN widths."""
    steps = [{**BASE, "i": i} for i in (BASE["i"], 2 * BASE["i"])]
    full = [token_slope(_gemma3n(d, sparsity=0.95), regime) - token_slope(_gemma3n(d), regime) for d in steps]
    frozen = [frozen_slope(_gemma3n(d, sparsity=0.95), regime) - frozen_slope(_gemma3n(d), regime) for d in steps]
    return (round((full[1] - full[0]) / BASE["i"], 3), round((frozen[1] - frozen[0]) / BASE["i"], 3))


def ckpt_with_constant(build: Callable[..., dict[str, Any]], regime: dict[str, Any]) -> dict[str, float]:
    """A checkpoint boundary per token per block with a part no width of the fit moves, from two hidden sizes: the
    layer's 256-wide per-layer input (Gemma 3n, Gemma-4's E2B / E4B) and AltUp's router state (Gemma 3n, whose block
    input is four copies of the hidden state)."""
    a, b = (token_slope(build({**BASE, "h": h}), regime, gradient_checkpointing=True) for h in (BASE["h"], 2 * BASE["h"]))
    per_h = (b - a) / BASE["h"]
    return {"h": round(per_h, 3), "1": round(a - per_h * BASE["h"], 3)}


#: family -> (config builder, dimensions that vary independently; q and kv follow h where the family ties them)
FAMILIES: dict[str, tuple[Callable[..., dict[str, Any]], tuple[str, ...]]] = {
    "llama": (_llama, ("h", "i", "q", "kv")),
    "gpt2": (_gpt2, ("h", "i")),
    "bert": (_bert, ("h", "i")),
    # their own tables: eager attention upcasts the softmax to fp32 in 16-bit models (GPT-2/BERT do not)
    "gpt_neox": (_gpt_neox, ("h", "i")),
    "opt": (_opt, ("h", "i")),
    "biogpt": (_biogpt, ("h", "i")),
    # their own tables since stop 36: traced against the llama alias they had, 7-25% more per token (norms they add)
    "gemma": (_gemma, ("h", "i", "q", "kv")),
    "qwen3": (_qwen3, ("h", "i", "q", "kv")),
    "olmo2": (_olmo2, ("h", "i", "q", "kv")),
    "phi3": (_phi3, ("h", "i", "q", "kv")),
    "gemma3_text": (_gemma3, ("h", "i", "q", "kv")),
    # parallel / LayerNorm blocks that had the llama or gpt2 table: 13-20% fewer bytes per token than it priced
    "stablelm": (_stablelm, ("h", "i")),
    "phi": (_phi, ("h", "i")),
    "gptj": (_gptj, ("h", "i")),
    # stop 40 (bench/family_audit.py): priced through the gpt2 alias or the generic (llama) table, 4-90% off
    "falcon": (_falcon, ("h", "i")),
    "gpt_bigcode": (_gpt_bigcode, ("h", "i")),
    "starcoder2": (_starcoder2, ("h", "i", "kv")),
    "cohere": (_cohere, ("h", "i", "kv")),
    "bloom": (_bloom, ("h",)),
    "mpt": (_mpt, ("h",)),
    # stop 70 (bench/family_audit.py): GLM-4 priced through the generic (llama) table, 22% under the traced block
    "glm4": (_glm4, ("h", "i", "q", "kv")),
    # stop 70: Qwen3.5's full-attention layers priced through the generic (llama) table, 29% under the traced block
    "qwen3_5_text": (_qwen3_5, ("h", "i", "q", "kv")),
    # stop 70: LFM2 priced through the generic (llama) table at its written block_ff_dim, 15% over at 1.2B's widths
    "lfm2": (_lfm2, ("h", "i", "kv")),
    # stop 72 (bench/family_audit.py): AFMoE's block priced through the generic (llama) table; its MoE block's
    # difference is scripts/fit_moe_activations.py's family afmoe, which extends this one
    "afmoe_dense": (_afmoe, ("h", "i", "q", "kv")),
    # stop 72 (bench/family_audit.py, half / amp): priced through the generic (llama) table, Apertus 0.729 / 0.618,
    # HyperCLOVA X 0.803 / 0.833, EXAONE 4 0.863 / 0.941, Arcee's AFM 1.396 / 1.361
    "apertus": (_apertus, ("h", "i", "q", "kv")),
    "arcee": (_arcee, ("h", "i", "q", "kv")),
    "hyperclovax": (_hyperclovax, ("h", "i", "q", "kv")),
    "exaone4": (_exaone4, ("h", "i", "q", "kv")),
    # stop 73: Gemma 4 priced through Gemma 3's table at the config's head_dim, 0.94 of Gemma-4-31B's traced block
    "gemma4_text": (_gemma4, ("h", "i", "q", "kv")),
    "gemma4_ple": (_gemma4_ple, ("h", "i", "q", "kv")),
    # stop 73 (bench/family_audit.py): Gemma 3n priced through the generic (llama) table, 0.45 of its traced block at
    # its class-default widths (AltUp, LAuReL, per-layer embeddings)
    "gemma3n_text": (_gemma3n, ("h", "i", "q", "kv")),
}
#: families whose model class refuses SDPA: every term is traced with eager attention, the per-token part and the
#: per-(head x s^2) part separated by two lengths (``eager_only_slope``), and eager_per_token is empty
EAGER_ONLY = frozenset({"bloom", "mpt"})
#: families whose SDPA call runs the math path (heads broadcast without enable_gqa): fitted like EAGER_ONLY under
#: SDPA, the s^2 part stored as sdpa_per_head_s2 and added to eager's excess, so eager_per_head_s2 is eager's whole term
MATH_SDPA = frozenset({"falcon"})
#: families whose checkpoint boundary has a part no fitted width moves (a per-layer input 256 wide): ``ckpt_with_constant``
CKPT_CONSTANT = frozenset({"gemma3n_text", "gemma4_ple"})
#: families whose first layers sparsify their FFN activation: the ``is`` dim (``sparse_ffn_terms``)
SPARSE_FFN = frozenset({"gemma3n_text"})
#: kv stays below q at every point: GQA and MHA models differ in which K/V copies SDPA keeps (fp32 expands them),
#: and for MHA (q == kv) the GQA form gives the same total, so fitting on GQA shapes is exact for both.
FAMILIES_FREE = {build: free for build, free in FAMILIES.values()}
BASE: Dims = {"h": 64, "i": 128, "q": 128, "kv": 32}
DROP = 0.1       # the HF default hidden/attention dropout of GPT-2 and BERT configs
LORA_R = 8
#: config keys (HF names) holding a block's hidden-state and attention-probability dropout, and the model types
#: whose config-class defaults are recorded (catalog configs often omit these keys and inherit the defaults)
DROPOUT_KEYS = {"hidden": ("resid_pdrop", "hidden_dropout_prob", "hidden_dropout", "dropout", "dropout_rate"),
                "attention": ("attn_pdrop", "attention_probs_dropout_prob", "attention_dropout", "attn_dropout",
                              "dropout_rate")}   # T5Attention: self.dropout = config.dropout_rate


def block_bytes(config: dict[str, Any], setup: Setup, phase: str = "head", part: str = "activations") -> int:
    """Bytes one block adds to ``part`` at the ``phase`` peak: two-block trace minus one-block trace."""
    two = run_step(with_depth(config, 2), setup).phases[phase].parts.get(part, 0)
    one = run_step(with_depth(config, 1), setup).phases[phase].parts.get(part, 0)
    return two - one


def token_slope(config: dict[str, Any], regime: dict[str, Any], seq: int = SEQ, **extra: Any) -> float:
    """Bytes per token per block: the block's bytes at two batch sizes, so per-block constants cancel."""
    a, b = (block_bytes(config, Setup(micro_batch_size=bs, seq_len=seq, optimizer="sgd", **regime, **extra)) for bs in BATCHES)
    return (b - a) / ((BATCHES[1] - BATCHES[0]) * seq)


def eager_only_slope(config: dict[str, Any], regime: dict[str, Any]) -> float:
    """The per-token part of an eager-only block's bytes: its slope per token is p + alpha x heads x s, so two lengths
    (s and 2s) give p = 2 slope(s) - slope(2s)."""
    return 2 * token_slope(config, regime) - token_slope(config, regime, seq=2 * SEQ)


def eager_only_s2(config: dict[str, Any], regime: dict[str, Any]) -> float:
    """An eager-only block's bytes per (batch x head x s^2): (slope(2s) - slope(s)) / (heads x s)."""
    heads = config.get("num_attention_heads") or config.get("n_head") or config["n_heads"]
    return (token_slope(config, regime, seq=2 * SEQ) - token_slope(config, regime)) / (heads * SEQ)


def per_token(build: Callable[..., dict[str, Any]], free: tuple[str, ...], regime: dict[str, Any],
              slope: Callable[[dict[str, Any]], float] | None = None) -> dict[str, float]:
    """Solve bytes/token/block = sum(coef[d] * dim[d]) + coef['1'] from one-at-a-time dimension steps.

    ``slope`` maps a config to its bytes per token per block (default: the plain traced slope)."""
    import numpy as np

    slope = slope or (lambda cfg: token_slope(cfg, regime))
    points = _points(free)
    rows, ys = [], []
    for dims in points:
        full = _full(dims, free)
        ys.append(slope(build(full)))
        rows.append([full[d] for d in free] + [1])
    coef = np.linalg.lstsq(np.array(rows, dtype=float), np.array(ys), rcond=None)[0]
    out = {d: round(float(c), 3) for d, c in zip((*free, "1"), coef)}
    return {k: v for k, v in out.items() if abs(v) > 1e-6}


def eager_s2(build: Callable[..., dict[str, Any]], regime: dict[str, Any], drop: float = 0.0,
             dims: Dims | None = None) -> tuple[float, float]:
    """(bytes per batch*head*s^2, leftover bytes per token) that eager attention adds over SDPA, from two lengths."""
    import numpy as np

    cfg = build(dims or _base_dims(build), drop)
    heads = cfg.get("num_attention_heads") or cfg.get("n_head")
    rows, ys = [], []
    for seq in (64, 128):
        common = dict(micro_batch_size=2, seq_len=seq, optimizer="sgd", **regime)
        diff = block_bytes(cfg, Setup(attn_implementation="eager", **common)) - block_bytes(cfg, Setup(**common))
        rows.append([2 * heads * seq * seq, 2 * seq])
        ys.append(diff)
    alpha, beta = np.linalg.solve(np.array(rows, dtype=float), np.array(ys, dtype=float))
    return round(float(alpha), 3), round(float(beta), 3)


def eager_per_token(build: Callable[..., dict[str, Any]], free: tuple[str, ...], regime: dict[str, Any]) -> dict[str, float]:
    """Bytes per token per block eager attention keeps beyond SDPA, as a linear form over the block dims.

    ``eager_s2``'s leftover per-token term at each one-at-a-time dimension step (the same points as ``per_token``):
    eager attention saves q, k and v as contiguous copies for its matmuls and no SDPA output or logsumexp, so the
    per-token bytes differ from the SDPA trace by a few hidden-sized tensors, with a sign that depends on the family."""
    import numpy as np

    points = _points(free)
    rows, ys = [], []
    for dims in points:
        full = _full(dims, free)
        ys.append(eager_s2(build, regime, dims=full)[1])
        rows.append([full[d] for d in free] + [1])
    coef = np.linalg.lstsq(np.array(rows, dtype=float), np.array(ys), rcond=None)[0]
    out = {d: round(float(c), 3) for d, c in zip((*free, "1"), coef)}
    return {k: v for k, v in out.items() if abs(v) > 1e-6}


def _full(dims: Dims, free: tuple[str, ...]) -> Dims:
    """The point's q and kv: a family without free heads ties them to h (q alone where only kv varies)."""
    return {**dims, **({} if "q" in free else {"q": dims["h"]}), **({} if "kv" in free or "q" in free else {"kv": dims["h"]})}


def _base(free: tuple[str, ...]) -> Dims:
    """The fit's centre point: where q is tied to h (64) but kv is free, kv starts at a quarter of q, so that its
    doubled step stays grouped (kv < q) like the others (an MHA point would switch SDPA's kept copies)."""
    return {**BASE, "kv": BASE["kv"] // 2} if "kv" in free and "q" not in free else BASE


def _points(free: tuple[str, ...]) -> list[Dims]:
    """The centre and one doubled step per free dimension."""
    base = _base(free)
    return [dict(base)] + [{**base, d: base[d] * 2} for d in free]


def _base_dims(build: Callable[..., dict[str, Any]]) -> Dims:
    free = FAMILIES_FREE[build]
    return _full(_base(free), free)


def frozen_slope(config: dict[str, Any], regime: dict[str, Any]) -> float:
    """Bytes per token per block that full fine-tuning keeps and a frozen (LoRA) base does not.

    Full-FT slope minus the LoRA slope (all-linear, r=LORA_R), plus back the adapters' own tensors as
    ``lora_activations.lora_layer_bytes`` counts them, so that analytic = full - frozen + lora_layer_bytes holds."""
    from perfguide.memory.ledger import ledger
    from perfguide.memory.lora_activations import lora_layer_bytes
    from perfguide.model.types import ModelSpec
    from perfguide.setup import LoraSpec

    lora = LoraSpec(r=LORA_R, alpha=2 * LORA_R, target_modules="all-linear")
    setup = Setup(micro_batch_size=1, seq_len=1, optimizer="sgd", lora=lora, **regime)
    led = ledger(ModelSpec.from_any(dict(config)), setup)
    adapters = lora_layer_bytes(setup, led.lora_inputs_per_layer, led.lora_rank_per_layer)
    return token_slope(config, regime) - token_slope(config, regime, lora=lora) + adapters


def dropout_defaults() -> dict[str, dict[str, float]]:
    """Hidden/attention dropout of each known model type's HF config class, as the config omits them."""
    from transformers import AutoConfig

    data = json.loads(DATA.read_text(encoding="utf-8"))
    out: dict[str, dict[str, float]] = {}
    for model_type in sorted(set(data["aliases"]) | set(FAMILIES)):
        try:
            cfg = AutoConfig.for_model(model_type).to_dict()
        except (ValueError, KeyError):
            continue
        out[model_type] = {kind: float(next((cfg[k] for k in keys if isinstance(cfg.get(k), (int, float))), 0.0))
                           for kind, keys in DROPOUT_KEYS.items()}
    return out


def fit_family(name: str) -> tuple[dict[str, Any], list[str]]:
    build, free = FAMILIES[name]
    regimes, remarks = {}, []
    eager_only, math_sdpa = name in EAGER_ONLY, name in MATH_SDPA
    for regime, kw in REGIMES.items():
        t0 = time.perf_counter()
        kw = {**kw, "attn_implementation": "eager"} if eager_only else kw
        dims = _base_dims(build)
        base, dropped = build(dims), build(dims, DROP)
        tokens = BATCHES[1] * SEQ
        setup = Setup(micro_batch_size=BATCHES[1], seq_len=SEQ, optimizer="sgd", **kw)
        ckpt = token_slope(base, kw, gradient_checkpointing=True) / BASE["h"]
        logits = run_step(base, setup).phases["backward_head"].parts["logits"] / (tokens * VOCAB)
        sdpa_s2 = round(eager_only_s2(base, kw), 3) if math_sdpa else 0.0
        if eager_only or math_sdpa:
            drop_h = (eager_only_slope(dropped, kw) - eager_only_slope(base, kw)) / BASE["h"]
        else:
            drop_h = (token_slope(dropped, kw) - token_slope(base, kw)) / BASE["h"]
        if eager_only:
            alpha, alpha_drop = (round(eager_only_s2(cfg, kw), 3) for cfg in (base, dropped))
        else:
            alpha, _ = eager_s2(build, kw)
            alpha_drop, _ = eager_s2(build, kw, DROP)
            alpha = round(alpha + sdpa_s2, 3)
            alpha_drop = round(alpha_drop + sdpa_s2, 3)
        regimes[regime] = {
            "per_token": per_token(build, free, kw, slope=partial(eager_only_slope, regime=kw) if eager_only or math_sdpa else None),
            "eager_per_head_s2": alpha,
            **({"sdpa_per_head_s2": sdpa_s2} if math_sdpa else {}),
            "eager_per_token": {} if eager_only else eager_per_token(build, free, kw),
            "ckpt_per_token": {"h": round(ckpt, 3)},
            "logits_per_token_vocab": round(logits, 3),
            "dropout_per_token": {"h": round(drop_h, 3)},
            "eager_dropout_per_head_s2": round(alpha_drop - alpha, 3),
            "frozen_linear_inputs_per_token": per_token(build, free, kw, slope=lambda cfg, kw=kw: frozen_slope(cfg, kw)),
        }
        print(f"  {name}/{regime}: {json.dumps(regimes[regime])} ({time.perf_counter() - t0:.1f}s)", flush=True)
    return regimes, remarks


def family_args(doc: str, families: Iterable[str], argv: list[str] | None) -> argparse.Namespace:
    """``--dry-run`` and ``--family`` (repeatable), the options both fit scripts take."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="print the coefficients without writing the data file")
    ap.add_argument("--family", action="append", choices=sorted(families), help="only these families")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = family_args(__doc__, FAMILIES, argv)
    import torch
    import transformers

    data = json.loads(DATA.read_text(encoding="utf-8"))
    remarks: list[str] = []
    for name in args.family or sorted(FAMILIES):
        print(f"tracing {name} ...", flush=True)
        regimes, notes = fit_family(name)
        remarks += notes
        for regime, kw in REGIMES.items():
            if name in CKPT_CONSTANT:
                regimes[regime]["ckpt_per_token"] = ckpt_with_constant(FAMILIES[name][0], kw)
            if name in SPARSE_FFN:   # its sparse layers' excess per FFN unit: the ``is`` dim
                full, frozen = sparse_ffn_terms(kw)
                regimes[regime]["per_token"]["is"] = full
                if frozen:
                    regimes[regime]["frozen_linear_inputs_per_token"]["is"] = frozen
                print(f"  {name}/{regime}: sparse FFN layers keep {full} B more per FFN unit (frozen share {frozen})", flush=True)
        data["families"].setdefault(name, {})["regimes"] = regimes
        data["aliases"].pop(name, None)
        data["families"][name]["source"] = (
            f"scripts/fit_activations.py: fake-tensor traces of HF {name} blocks (torch {torch.__version__}, transformers "
            f"{transformers.__version__}), one-minus-two-block differences at h/i/q/kv steps around {BASE} and "
            f"b*s in {[b * SEQ for b in BATCHES]}, CUDA SDPA kernel choice and autocast lists emulated, 512 B allocator rounding. "
            "amp per-token terms exclude autocast's cached 16-bit weight copies (a per-block constant of 2 bytes per Linear weight). "
            f"Base terms traced with dropout off; dropout terms = traces at p={DROP} minus p=0 (CUDA fused native_dropout: "
            f"1-byte masks); frozen_linear_inputs = full fine-tuning minus PEFT LoRA all-linear r={LORA_R}, plus the adapters' "
            "own tensors as lora_activations.lora_layer_bytes counts them."
            " eager_per_token = eager minus SDPA bytes per token per block at the same dimension steps (the per-token "
            "part of the two-length eager fit)."
            + (f" Eager only (the model class refuses SDPA): every term traced with eager attention; per_token = the "
               f"per-token part of traces at s {SEQ} and {2 * SEQ} (2 slope(s) - slope(2s)), eager_per_head_s2 the "
               "rest; eager_per_token empty." if name in EAGER_ONLY else "")
            + (f" SDPA runs the math path (one K/V head broadcast, no enable_gqa): per_token = 2 slope(s) - slope(2s) "
               f"at s {SEQ}, sdpa_per_head_s2 the rest; eager_per_head_s2 = eager's excess over SDPA plus it."
               if name in MATH_SDPA else "")
            + f" Block code: transformers/models/{name}/modeling_{name}.py."
        )
    if not args.family:
        data["dropout"] = {"keys": DROPOUT_KEYS, "defaults": dropout_defaults(),
                           "source": f"HF config-class defaults (transformers {transformers.__version__}, AutoConfig.for_model); "
                                     "a model's own config value wins"}
    for r in remarks:
        print("note:", r)
    write_data(data, args.dry_run)
    return 0


def least_squares(rows: list[dict[str, int]], ys: list[float], terms: tuple[str, ...]) -> dict[str, float]:
    """Coefficients over ``terms`` that best give ``ys`` from the ``rows``' dims (bytes per token), rounded to 3 places,
    zeros dropped; the worst residual is printed (0 where the form is exact). The other fit scripts' solver."""
    import numpy as np

    x = np.array([[row[t] for t in terms] for row in rows], dtype=float)
    coef, *_ = np.linalg.lstsq(x, np.array(ys, dtype=float), rcond=None)
    worst = float(np.max(np.abs(x @ coef - np.array(ys, dtype=float))))
    print(f"    fit over {len(rows)} points, worst residual {worst:.3f} B/token", flush=True)
    out = {t: round(float(c), 3) for t, c in zip(terms, coef)}
    return {t: v for t, v in out.items() if abs(v) > 1e-6}


def difference_fit(label: str, steps: Iterable[dict[str, int]], dims: Callable[[dict[str, int]], dict[str, int]],
                   terms: tuple[str, ...], measure: Callable[[dict[str, int], dict[str, Any], int], float],
                   regimes: dict[str, dict[str, Any]], lengths: tuple[int, int], tokens: int) -> dict[str, Any]:
    """Per regime, the linear form over ``terms`` of ``measure`` (bytes at a fit point, a regime and a length) per
    token: the slope between the two ``lengths`` (``tokens`` more tokens at the second), so per-call constants cancel.
    The recurrent-layer fits' loop (fit_linear_attention, fit_mamba)."""
    points = list(steps)
    out = {}
    for name, regime in regimes.items():
        short, long = ([measure(p, regime, n) for p in points] for n in lengths)
        out[name] = {"per_token": least_squares([dims(p) for p in points], [(b - a) / tokens for a, b in zip(short, long)], terms)}
        print(f"  {label}/{name}: {json.dumps(out[name])}", flush=True)
    return out


def write_data(data: dict[str, Any], dry_run: bool) -> None:
    """Rewrite activations.json (the fit scripts' last step), unless ``--dry-run``."""
    if not dry_run:
        DATA.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {DATA}")


if __name__ == "__main__":
    sys.exit(main())
