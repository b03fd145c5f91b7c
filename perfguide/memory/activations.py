"""Activation and logits bytes kept for backward, from the per-family coefficients of data/activations.json (its
format and regimes: ``activations_data``). Why linear forms over the block dims: a block's saved tensors are each a
product of the token count and one of its widths, so one traced fit per family prices every size of it.
"""
from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache

from ..model.layer_widths import layer_ffn_widths, layer_widths, mean_ffn_width, mean_widths, uniform
from ..model.types import ModelSpec
from ..setup import QUANTIZED, Setup
from .activations_data import Dim, Regime, RegimeName, activations_data
from .kbit import kbit_fp32_parts
from .linear_attention import kind_mean_per_token, linear_extra_bytes
from .litgpt_blocks import LitgptDim, litgpt_family
from .relative_positions import position_table_bytes, relative_position_bytes
from .softcap import attention_softcap_bytes, final_softcap_bytes


def engine_casts_to_16bit(setup: Setup) -> bool:
    """DeepSpeed's fp16/bf16 modes cast the whole module to 16 bit and run no autocast: ``_configure_distributed_model``
    calls ``module.half()`` / ``module.bfloat16()`` (deepspeed/runtime/engine.py, v0.3.10 through 0.14.4), and HF
    Trainer hands mixed precision to the engine. So fp32 weights + autocast under ZeRO save 16-bit activations and
    autocast casts no weight per op."""
    return setup.is_deepspeed and setup.weights_dtype == "fp32" and setup.autocast in ("bf16", "fp16")


def regime(setup: Setup) -> RegimeName:
    """Which coefficient set applies: what dtype the saved tensors are in follows weights x autocast.

    fp32 weights under FSDP or DeepSpeed mixed precision are "half" (``Setup.computes_on_16bit_copy``): DeepSpeed
    casts the module (``engine_casts_to_16bit``), FSDP gathers each unit at ``MixedPrecision.param_dtype``, which
    accelerate (0.18 through 1.15 ``set_mixed_precision``, FSDP1 and FSDP2) and transformers 4.28's own Trainer FSDP
    path set to the autocast dtype. Autocast then finds only 16-bit weights, so it casts none, and the embedding and
    norms return 16 bits, so the stream is 16-bit. Traced on two gloo ranks (scripts/trace_fsdp_mixed_precision.py,
    accelerate's FSDP1 and FSDP2 plugins, bf16, tiny Llama): the same saved bytes, dtype by dtype, as the model cast to
    bf16 without autocast, and none of plain AMP's weight casts or fp32 stream."""
    if setup.weights_dtype == "fp32" and not setup.computes_on_16bit_copy:
        return "amp" if setup.autocast else "fp32"
    return "half"


@lru_cache(maxsize=256)
def family_name(family: str, model_type: str = "", moe: bool = False, mla: bool = False, per_layer_inputs: bool = False) -> str:
    """The activations.json family a model resolves to, following aliases and ``same_as``. An unknown type takes the
    generic table of its structure: generic (dense), generic_moe (a mixture of experts: a dense table has no term for
    the router, the routed copies or the top-k indices, so an unknown MoE type priced as dense kept 0.46-0.85x its
    traced block, bench/results/family_audit.md), generic_mla (latent attention: a dense table has no term for the
    latent ranks) or generic_mla_moe (both)."""
    data = activations_data()
    families, aliases = data.families, data.aliases
    # the HF model_type is the more specific key (OPT's ReLU block is BERT-like, not GPT-2's gelu_new)
    candidates = [n if n in families else aliases.get(n) for n in (model_type, family) if n != "generic"]
    name = next((n for n in candidates if n), "generic" + "_mla" * mla + "_moe" * moe)
    name = (moe and families[name].moe) or (per_layer_inputs and families[name].per_layer_inputs) or name
    seen = {name}
    while (target := families[name].same_as) is not None and target not in seen:
        name = target
        seen.add(name)
    return name


def attention_family(family: str, model_type: str = "") -> str:
    """``family_name``, or the dense family a MoE table extends: the key of tables that price the attention."""
    name = family_name(family, model_type)
    return activations_data().families[name].dense or name


def family_coefficients(family: str, model_type: str = "") -> dict[RegimeName, Regime]:
    """Resolve a family (or HF model_type) to its regime table (family_name). Families without coefficients of
    their own use the generic entry (an unknown family is not a data error)."""
    name = family_name(family, model_type)
    regimes = activations_data().families[name].regimes
    if regimes is None:
        from ..errors import DataFileError

        raise DataFileError(f"perfguide/data/activations.json: family {name!r} has no regimes and no same_as target that has")
    return regimes


def spec_family(spec: ModelSpec) -> str:
    """The activations.json family of ``spec``: ``family_name``, or its gated variant (``<family>-gated``) where an
    encoder-decoder's config names a gated FFN (``feed_forward_proj: gated-gelu``, read into ``ModelSpec.gated_mlp``:
    T5 v1.1, Flan-T5, T0, mT5), whose two input projections and gelu_new chain keep more per d_ff unit than v1.0's ReLU."""
    name = family_name(spec.family, spec.model_type, moe=spec.is_moe, mla=spec.is_mla,
                       per_layer_inputs=spec.hidden_size_per_layer_input > 0)
    gated = f"{name}-gated"
    return gated if spec.is_encoder_decoder and spec.gated_mlp and gated in activations_data().families else name


def block_dims(spec: ModelSpec) -> dict[str, int]:
    """Dimension values of one block; MoE blocks keep activations of the experts each token visits.

    The MoE dims are 0 for a dense model: ``hk`` (hidden x top-k: transformers 5's grouped_mm experts keep one
    gathered copy of the hidden state and one expert output per routed pair), ``ir`` (the routed part of the active
    FFN width, which can keep other dtypes than a dense FFN: grouped_mm is not on autocast's lists), ``e`` (routed
    experts: the router's probabilities) and ``k`` (top-k: the sort and gather indices). Every routed tensor has
    tokens x top-k rows however the router splits them over experts, so no term depends on the split."""
    moe = spec.num_experts > 1
    k = spec.num_experts_per_tok if moe else 0
    mla = spec.is_mla   # latent attention (family mla, scripts/fit_mla.py): its ranks and value width; 0 elsewhere
    q, kv = mean_widths(spec)   # the mean layer's: Gemma-4's full-attention layers are wider (model/layer_widths.py)
    return {
        "h": spec.hidden_size,
        "i": mean_ffn_width(spec),
        "q": q,
        "kv": kv,
        "1": 1,
        "hk": spec.hidden_size * k,
        "ir": (spec.moe_intermediate_size or spec.intermediate_size) * k,
        "e": spec.num_experts if moe else 0,
        "k": k,
        "ql": (spec.q_lora_rank or 0) if mla else 0,
        "kvl": (spec.kv_lora_rank or 0) if mla else 0,
        "vh": spec.num_attention_heads * (spec.v_head_dim or 0) if mla else 0,
        "r": (spec.qk_rope_head_dim or 0) if mla else 0,
        "is": round(spec.intermediate_size * spec.sparse_ffn_layers / spec.num_layers),
    }


def _linear(coef: Mapping[str, float] | Mapping[Dim, float] | Mapping[LitgptDim, float], dims: dict[str, int]) -> float:
    return sum(float(v) * dims[k] for k, v in coef.items())


def _coefs(spec: ModelSpec, setup: Setup) -> Regime:
    return family_coefficients(spec_family(spec))[regime(setup)]


def dropout_rates(spec: ModelSpec) -> tuple[float, float]:
    """(hidden, attention) dropout probability of the model in training mode.

    The model's own config wins; catalog configs often omit the keys, and HF then applies its config class's
    default (GPT-2 and BERT: 0.1; Llama: 0.0), which data/activations.json records per model type.
    """
    table = activations_data().dropout
    config = spec.config or {}
    # a model type the table does not list has no dropout default recorded: its config decides, else none
    default = table.defaults.get(spec.model_type, {})
    out = []
    for kind in ("hidden", "attention"):
        value = next((config[k] for k in table.keys[kind] if isinstance(config.get(k), (int, float))), None)
        out.append(float(default.get(kind, 0.0) if value is None else value))
    return out[0], out[1]


def layer_bytes(spec: ModelSpec, setup: Setup, keeps_frozen_inputs: bool = False) -> int:
    """Bytes one block keeps for backward for one micro-batch (no checkpointing).

    ``keeps_frozen_inputs``: the frozen Linears still keep their inputs (bitsandbytes before 0.43.2, see
    bnb_inputs.quantized_matmul_keeps_inputs), so LoRA does not drop them.
    """
    return _layer_bytes(spec, setup, keeps_frozen_inputs, block_dims(spec))


def widest_layer_excess(spec: ModelSpec, setup: Setup, keeps_frozen_inputs: bool = False) -> int:
    """What the depth's widest layer keeps beyond the mean layer ``layer_bytes`` prices, for a model whose layers differ
    in width (model/layer_widths.py): a recomputed block's peak is one block's, not the mean's. Gemma-4-31B's full
    layers keep 1.2x its mean layer (traced at its released widths)."""
    if uniform(spec):
        return 0
    dims = block_dims(spec)
    mean = _layer_bytes(spec, setup, keeps_frozen_inputs, dims)
    kinds = set(zip(layer_widths(spec), layer_ffn_widths(spec)))
    return max(_layer_bytes(spec, setup, keeps_frozen_inputs, {**dims, "q": q, "kv": kv, "i": i}) for (q, kv), i in kinds) - mean


def ffn_layer_bytes(spec: ModelSpec, setup: Setup, keeps_frozen_inputs: bool = False) -> int:
    """The FFN-wide share of ``layer_bytes`` (its terms per FFN unit per token: the MLP's intermediates, and peft's
    fp32 MLP under a kbit base): what a tiled MLP (techniques/tiled_mlp.py) keeps for one shard of tokens instead of
    for the whole sequence. The same coefficients with every other block width set to 0."""
    return _width_bytes(spec, setup, keeps_frozen_inputs, "i") + fp32_mlp_bytes(spec, setup, keeps_frozen_inputs)


def attention_side_bytes(spec: ModelSpec, setup: Setup, keeps_frozen_inputs: bool = False) -> int:
    """What ``layer_bytes`` keeps for the attention half of a block: all but the FFN-wide share and half the
    hidden-wide one. A pre-norm block's hidden-wide saved tensors are, by the hand count of the traced tables, one
    norm's and one normed Linear input per half (input_layernorm and q/k/v's input; post_attention_layernorm and
    gate/up's), and backward frees the MLP half's before it reaches the attention: what a recomputed block still holds
    at its attention's backward (memory/block_backward.py flash_backward_bytes)."""
    return layer_bytes(spec, setup, keeps_frozen_inputs) - mlp_shares(spec, setup, keeps_frozen_inputs)[1]


def mlp_shares(spec: ModelSpec, setup: Setup, keeps_frozen_inputs: bool = False) -> tuple[int, int]:
    """(the FFN-wide share of a block's saved bytes, its whole MLP half's: ``layer_bytes - attention_side_bytes``) for a
    decoder block; (0, 0) otherwise."""
    if spec.is_encoder_decoder:
        return 0, 0
    ffn = ffn_layer_bytes(spec, setup, keeps_frozen_inputs)
    return ffn, ffn + _width_bytes(spec, setup, keeps_frozen_inputs, "h") // 2


def _width_bytes(spec: ModelSpec, setup: Setup, keeps_frozen_inputs: bool, width: str) -> int:
    """The terms of ``layer_bytes`` per unit of one block width (``"i"``, ``"h"``) per token, every other width 0."""
    dims = {k: (v if k == width else 0) for k, v in block_dims(spec).items()}
    return _layer_bytes(spec, setup, keeps_frozen_inputs, dims, per_width=True)


def _layer_bytes(spec: ModelSpec, setup: Setup, keeps_frozen_inputs: bool, dims: dict[str, int], per_width: bool = False) -> int:
    c = _coefs(spec, setup)
    b, s = setup.micro_batch_size, setup.seq_len
    hidden_p, attn_p = dropout_rates(spec)
    mode = regime(setup)
    # litgpt's own block (litgpt_blocks.py): no dropout, always SDPA
    lit = litgpt_family(spec, setup) if mode == "half" else None
    per_token = _linear(lit.per_token if lit else c.per_token, dims)
    kinds = None if per_width else kind_mean_per_token(spec, setup, mode)
    if kinds is not None:   # Nemotron-H and Falcon-H1: layers priced whole, by kind
        per_token = kinds
    if hidden_p > 0 and lit is None:
        per_token += _linear(c.dropout_per_token, dims)
    if setup.lora is not None and lit is not None:   # bnb keeping frozen inputs: only the norms' trained-weight tensors go
        per_token -= _linear(lit.frozen_linear_inputs_per_token, dims) - (_linear(lit.linear_inputs_per_token, dims) if keeps_frozen_inputs else 0)
    elif setup.lora is not None and not keeps_frozen_inputs:
        per_token -= _linear(c.frozen_linear_inputs_per_token or frozen_linear_inputs(setup), dims)
    if per_width:   # the per-token terms of the widths in ``dims`` only (no s x s, position or fp32 MLP terms)
        return int(b * s * (per_token + (_linear(c.eager_per_token, dims) if setup.attn_implementation == "eager" and lit is None else 0.0)))
    total = b * s * per_token + (b * spec.num_attention_heads * s * s * lit.per_head_s2 if lit else 0.0)
    if setup.attn_implementation == "sdpa" and lit is None and unexpanded_kv(spec):
        total += b * spec.num_attention_heads * s * s * c.sdpa_per_head_s2
    if setup.attn_implementation == "eager" and lit is None:
        total += b * s * _linear(c.eager_per_token, dims)
        s2 = c.eager_per_head_s2 + (c.eager_dropout_per_head_s2 if attn_p > 0 else 0.0)
        # the full s x s in every block: HF eager applies a sliding window as a mask on full scores (Gemma 2,
        # Mistral v0.1: traced, a window of 16 and of 4096 save the same bytes at s 64 / 128)
        total += b * spec.num_attention_heads * s * s * s2 + attention_softcap_bytes(spec, setup)
    # DeBERTa-v2's position scores, b x heads x s x 2k per kind (relative_positions.py), in the block's compute dtype
    nbytes = 4 if mode == "fp32" else 2
    total += relative_position_bytes(spec, setup, nbytes)
    total += position_table_bytes(spec, setup, nbytes, mode == "amp", hidden_p)   # pos_dropout: hidden_dropout_prob
    total += linear_extra_bytes(spec, setup, mode)   # a hybrid's recurrent layers, at their share of the depth
    return int(total + fp32_mlp_bytes(spec, setup, keeps_frozen_inputs))


def unexpanded_kv(spec: ModelSpec) -> bool:
    """Grouped K/V heads reach SDPA as they are (Falcon-7B's multi-query branch); Falcon-40B/180B's new architecture
    expands them to every query head first (modeling_falcon.py ``_split_heads``): a fused kernel, no s x s."""
    return spec.num_key_value_heads < spec.num_attention_heads and not (spec.config or {}).get("new_decoder_architecture")


def fp32_mlp_bytes(spec: ModelSpec, setup: Setup, keeps_frozen_inputs: bool = False) -> int:
    """Bytes an MLP keeps beyond the 16-bit coefficients when its quantized base runs in an fp32 stream.

    bitsandbytes' Linear4bit / Linear8bitLt return ``out.to(input dtype)``, so after peft's kbit upcast (fp32 stream,
    ``stream_regime``) gate_proj and up_proj return fp32 and the activation of the fp32 gate is fp32: the three
    tensors the gated product's backward needs (the gate for the activation's backward, the activated gate and up for
    the product's) take 4 B instead of the 2 the ``half`` coefficients count. Traced (scripts/trace_block_backward.py,
    real nf4 tensors): the recompute saves 14 B per FFN unit per token in the fp32 stream against 8 with a bf16 base.
    A two-matrix MLP (GPT-NeoX, OPT, Falcon) has one such tensor, the activation's fp32 input. Where the frozen
    4-bit down projection keeps its input (``keeps_frozen_inputs``: bitsandbytes before 0.43.2, MatMul4Bit's
    ``ctx.tensors = (A, B)``), that input (the gated product, or the activation's output) is fp32 too: one tensor
    more. Traced on lit-gpt 064fd523's blocks (scripts/trace_litgpt_mixed_stream.py: bnb nf4 on CPU with the input
    kept, bf16-mixed minus bf16-true per token per block): 8 B per FFN unit for its Llama block, 4 for its GPT-NeoX
    block, as these counts give.
    """
    if spec.is_encoder_decoder or not kbit_fp32_stream(setup):
        return 0
    tensors = (3 if spec.gated_mlp else 1) + (1 if keeps_frozen_inputs else 0)
    return setup.micro_batch_size * setup.seq_len * spec.active_intermediate_size * tensors * 2


def frozen_linear_inputs(setup: Setup) -> dict[str, float]:
    """Default bytes per token the frozen block Linears no longer keep, for tables that do not list them.

    A frozen ``y = x @ W.T`` needs only ``W`` for ``grad_x``; its input ``x`` was saved solely for ``grad_W``.
    Per block those inputs are the two normed hidden states (attention and MLP input, ``h`` each, shared by
    q/k/v and gate/up), the attention output (``q``) and the MLP inner activation (``i``), in the dtype the
    matmul runs in (16-bit casts under autocast and in pure half precision, fp32 otherwise). These are the
    values the hand-derived tables carried (gpt2/bert: h 8, q 4, i 4 in fp32; h 4, q 2, i 2 at 16 bit); the
    fitted tables trace LoRA and carry their own entry, so this is only a fallback for hand-written families.
    """
    nbytes = 4 if regime(setup) == "fp32" else 2
    return {"h": 2 * nbytes, "q": nbytes, "i": nbytes}


def stream_regime(setup: Setup) -> RegimeName:
    """The dtype regime of the residual stream between blocks (what a checkpointed block keeps as its input).

    It follows ``regime()`` except for a quantized base whose other parameters were upcast to fp32 (peft's
    prepare_model_for_kbit_training, ``kbit_upcast``): the fp32 embedding output and the fp32 norm weights
    (``weight * hidden.to(input_dtype)`` promotes) make every residual add fp32, and bitsandbytes' Linear4bit /
    Linear8bitLt return ``out.to(input dtype)``, so the stream stays fp32 as under autocast. Traced on a 2- and
    4-block nf4 Llama (transformers + peft + bitsandbytes 0.50, CPU, real tensors): each checkpointed block
    adds 4 bytes per hidden element per token, not 2.
    """
    if kbit_fp32_parts(setup):
        return "amp"
    return regime(setup)


def kbit_fp32_stream(setup: Setup) -> bool:
    """A quantized base after peft's kbit upcast: its 16-bit-regime blocks run in an fp32 stream (``stream_regime``),
    so bitsandbytes' k-bit Linears return fp32 and the MLP's intermediates are fp32 too."""
    return setup.weights_dtype in QUANTIZED and stream_regime(setup) != "half"


def checkpoint_boundary_bytes(spec: ModelSpec, setup: Setup) -> int:
    """Bytes one checkpointed block keeps between forward and backward: its input hidden states, in the
    stream's dtype (``stream_regime``)."""
    c = family_coefficients(spec_family(spec))[stream_regime(setup)]
    return int(setup.micro_batch_size * setup.seq_len * _linear(c.ckpt_per_token, block_dims(spec)))


def activation_bytes(spec: ModelSpec, setup: Setup, lora_extra_per_layer: int = 0,
                     keeps_frozen_inputs: bool = False) -> tuple[int, int]:
    """(bytes every block keeps at the end of forward, bytes one block keeps), nothing recomputed.

    Checkpointing (techniques/gradient_checkpointing.py) replaces the first by the blocks' inputs and brings the
    second back, one block at a time, during backward.
    """
    per_layer = layer_bytes(spec, setup, keeps_frozen_inputs) + lora_extra_per_layer
    return per_layer * spec.total_layers, per_layer


def head_positions(spec: ModelSpec, setup: Setup) -> int:
    """Positions per row the LM head and loss run over: an encoder-decoder's decoder tokens (the labels' length,
    memory/seq2seq.py), else seq_len."""
    return setup.decoder_len if spec.is_encoder_decoder else setup.seq_len


def logits_bytes(spec: ModelSpec, setup: Setup) -> int:
    """Loss-path buffers at their peak: logits, fp32 log-softmax output and their gradients (b*s*V each).

    HF's ForCausalLMLoss upcasts logits to fp32; at the start of backward the log-softmax output and two
    gradients of the same size coexist; a final-logit soft-cap keeps its tanh output besides (softcap.py).
    Checkpointing does not touch them (they live outside the blocks).
    The width is the head's (``ModelSpec.logits_width``: the vocabulary, or a classifier's labels), over every
    position, or one per sequence for sequence classification; a bare model has no logits.
    """
    c = _coefs(spec, setup)
    positions = 1 if spec.logits_per_sequence else head_positions(spec, setup)
    return int(setup.micro_batch_size * positions * spec.logits_width * c.logits_per_token_vocab) + final_softcap_bytes(spec, setup)
