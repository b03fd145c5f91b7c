"""What a recomputed block's backward holds beyond the tensors its recompute saved: the gradients in flight.

With checkpointing, the peak of the backward pass is inside one block: every block's input, the block's recomputed
activations, and the activation gradients its backward is building. The recompute term (activations.layer_bytes)
prices only the saved tensors; this module prices the rest, as traced on real tensors (data/activations.json
``block_backward``: scripts/trace_block_backward.py, the source text has the hand count of each FFN coefficient).

Where it matters: a small vocabulary. Mistral-7B or Llama-2-7B (32,000 logits per token: 12 B each at the loss's
backward, 0.37 MiB per token) hold less at the loss peak than one block's recompute plus its gradients (under peft's
kbit preparation the MLP intermediates and their gradients are fp32: 14 B saved + 10 B in flight per FFN unit, 0.33
MiB per token at 14,336 FFN units), so their peak is the block backward; Llama-3.1-8B (128,256 logits) keeps its
peak at the loss and does not move.

Full fine-tuning (every weight trainable; ``full_finetune_per_token``, traced with ``--full``): at the gated
product's backward its gradient and its two factors' gradients are alive while down_proj's backward has released
the product it kept for its weight gradient: 2 tensors, 4 B per FFN unit in 16 bits (fp32 weights under autocast
included: the MLP runs in 16 bits), 8 B in fp32. Liger's SwiGLU writes its factors' gradients into its saved gate
and up: only the product's gradient (2 / 4 B). The weight gradients themselves are per parameter, not per token:
each lands in ``.grad`` as its Linear's backward runs (traced: at the peak down_proj's, h x i elements, is there on
a first micro-step), which is the ledger's gradients term (analytic: all of them at the end of backward, the sharded
unit's under FSDP / ZeRO-3 in the gather term), so nothing per parameter is added here. On a later accumulation
micro-step HF has added it in place and freed it before its peak; Liger's peak (down_proj's own backward) and
reentrant fp32 weights under autocast (the bf16 gradient before its cast back) still hold that one h x i transient:
not priced (2 B x h x i, 0.11 GiB at Llama-3-8B).

Reference, traced (scripts/trace_block_backward.py --saved, h 128, FFN 448): every term is measured above the
storages the recompute saves for backward (saved_tensors_hooks), which is what layer_bytes prices, so recompute +
term is the block's peak. Stop 35's terms were measured above the live bytes as the recompute ended, which also hold
what the block's forward still references there without saving it (the attention's residual sum, the MLP output,
under LoRA a norm output): 6 B per hidden unit per token for LoRA on a 16-bit base, 4 in peft's fp32 stream and for
a 16-bit full fine-tune, 2 for fp32 weights under autocast, 0 in fp32; the block's peak was priced that much low
(Mistral-7B QLoRA at 32k tokens: 0.5 GiB). The per-FFN-unit terms do not depend on the reference.

Non-reentrant checkpointing recomputes on the first unpack of a saved tensor, so the block's nodes that save none
(the residual add, peft's cast and scaling, the cast of the gradient to the bf16 MLP output) run first: the terms'
start mark holds their gradients, 2-6 B per hidden unit per token (data ``before_recompute_per_token``, traced and
hand-counted), added here. Alive as each recompute starts and priced by no other term: the gradient into the block,
the rotary cos / sin, the batch, and at block 0 (the end of backward) its own input (``recompute_start_bytes``,
scripts/trace_backward_phases.py names every storage there). The rotary pair(s) and the batch are alive from the
forward on, so the loss peak of a checkpointed step holds them too (``step_input_bytes``; Gemma 3 computes a pair
for its local layers and one for its global ones). At block 0 a first micro-step has not yet made block 0's
gradients nor an untied embedding's (``first_step_pending_params``), which the end of backward no longer counts.

MoE blocks: the coefficients are per active FFN unit (the k routed experts' width), as transformers 5's grouped_mm runs
every routed pair at once. transformers 4 runs the experts one after another, so its backward holds one expert's
gradients at a time: ``expert_loop_per_token`` (traced under 4.48.1 for Mixtral, LoRA on a frozen base, reentrant;
scripts/trace_moe_block.py), about a quarter of an active expert's width per token for Mixtral's top-2 of 8; its
recompute saves two h-wide copies per routed pair in the stream's dtype where the grouped table has one 16-bit copy
(``expert_loop_saved_bytes``, added to the recompute by analytic.py). The fms-acceleration QLoRA rows (4.48.1) were
priced 7-11% high without them.

Scope, as traced: LoRA on a frozen base and full fine-tuning, gated MLPs (SwiGLU / GeGLU) as HF runs them (under
LoRA Liger's fused RMSNorm / SwiGLU run the same terms: its technique hook prices the block's peak difference,
traced, scripts/trace_block_backward.py --liger); the MLP's gradients come at another moment than eager attention's s x s backward
(masks.eager_backward_transient_bytes), so the block backward holds the larger of the two (analytic.py). Other setups
(a classic two-matrix MLP, fp8 autocast, encoder-decoders) get nothing here, as before.

Gemma 2 and 3 (data ``post_mlp_norm``): each block has four RMSNorms that compute in fp32 (``x.float()``,
``* (1 + weight.float())``, ``.type_as(x)``), one of them after the MLP, so the block's backward starts with that
norm's fp32 backward while every tensor the recompute saved is alive, and the MLP's gradients come after it, once the
norm has freed its fp32 copies. The peak is the larger of the two moments, each linear in the shapes: in a bf16 full
fine-tune 18 B per hidden unit per token at the norm's ``pow`` backward (reentrant) against 4 B per FFN unit less 6
per hidden unit at the gated product's, where Llama's coefficients priced 4 per FFN unit + 2 per hidden unit (Gemma
3 1B: 20.7 KB per token against 30.0). Traced over h, FFN, heads, kv heads, head_dim, local and global blocks and
Gemma 3 1B's own block shape (scripts/trace_gemma_block_backward.py); every coefficient counted from the ops in the
data's source. Liger's patch (fused_swiglu) replaces the norms too and keeps Llama's Liger terms, not traced here.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .._data import DataModel
from ..model.types import ModelSpec
from ..setup import Setup

#: bytes of an int64 element, and the collated batch's int64 tensors a causal LM's loop holds through the step:
#: input_ids, labels, attention_mask (transformers' DataCollatorForLanguageModeling)
INT64, BATCH_TENSORS = 8, 3
Case = Literal["fp32_stream", "half_autocast", "half"]
FullCase = Literal["half", "half_autocast", "fp32_autocast", "fp32"]
Mode = Literal["reentrant", "non_reentrant"]
PerToken = dict[Mode, dict[Literal["i", "h"], float]]


#: per checkpoint variant, the two moments of a block whose last norm follows its MLP (PostMlpNorm)
Moments = dict[Mode, dict[Literal["norm", "mlp"], dict[Literal["i", "h"], float]]]


class PostMlpNorm(DataModel):
    """data/activations.json ``block_backward.post_mlp_norm``: blocks with an fp32 norm after the MLP (Gemma 2 / 3),
    whose backward peaks at the larger of two moments, each in bytes per token per FFN unit ("i") and hidden unit
    ("h"): the norm's fp32 backward ("norm") and the gated product's ("mlp"), by LoRA stream case and full case."""

    source: str = Field(min_length=10)
    model_types: list[str]
    lora: dict[Case, Moments]
    full: dict[FullCase, Moments]
    #: non-reentrant only, per hidden unit per token: the gradients made before the recompute starts (the norm's
    #: fp32 cast of the incoming gradient), held by the moments' start mark as before_recompute_per_token's are
    before_recompute: dict[Literal["lora", "full"], dict[str, float]]


class ExpertLoop(DataModel):
    """data/activations.json ``block_backward.expert_loop``: a MoE block whose experts run one after another
    (transformers 4's ``for expert_idx in range(self.num_experts)``), LoRA on a frozen base, reentrant checkpointing.
    Bytes per token by stream case: ``expert_i`` per FFN unit of one expert per token that expert takes, ``expert_h``
    per hidden unit beside it, ``rest_h`` per hidden unit where the block's backward peaks outside the experts."""

    source: str = Field(min_length=10)
    loops_before: str   # the first transformers release whose MoE blocks run every expert at once (grouped_mm)
    model_types: list[str]
    per_token: dict[Case, dict[Literal["expert_i", "expert_h", "rest_h"], float]]
    #: bytes per routed hidden unit per token the loop's recompute saves beyond the grouped table (expert_loop_saved_bytes)
    saved_hk: dict[Case, float]


class BlockBackward(DataModel):
    """data/activations.json ``block_backward``: bytes per token in flight, per FFN unit ("i") and hidden unit ("h")."""

    source: str = Field(min_length=10)
    reentrant_before: str   # the first transformers release whose gradient checkpointing is non-reentrant by default
    in_flight_per_token: dict[Case, PerToken]
    full_finetune_source: str = Field(min_length=10)
    #: full fine-tuning, by the MLP the patched model runs: HF's modules ("hf") or Liger's fused SwiGLU ("liger")
    full_finetune_per_token: dict[Literal["hf", "liger"], dict[FullCase, PerToken]]
    before_recompute_source: str = Field(min_length=10)
    #: non-reentrant only: per hidden unit per token, the block's gradients made before its recompute starts (the
    #: coefficients' start mark holds them), LoRA by stream case, full fine-tuning by full case
    before_recompute_per_token: dict[Literal["lora", "full"], dict[str, float]]
    rotary_per_layer_type_source: str = Field(min_length=10)
    #: model types whose decoder computes one rotary cos / sin pair per kind of layer (config.layer_types)
    rotary_per_layer_type: list[str]
    expert_loop: ExpertLoop | None = None
    post_mlp_norm: PostMlpNorm


def stream_case(setup: Setup) -> Case | None:
    """Which traced case a setup is: the dtype its MLP intermediates are in and whether autocast runs (None: not traced).

    A quantized base prepared by peft (``kbit_upcast``) under autocast keeps an fp32 stream, and bitsandbytes' k-bit
    Linears return their input's dtype, so the MLP runs in fp32 (activations.stream_regime); a 16-bit base keeps
    16-bit intermediates, with or without autocast. fp32 weights and DeepSpeed's 16-bit casts were not traced."""
    from .activations import engine_casts_to_16bit, kbit_fp32_stream

    if setup.weights_dtype == "fp32" or engine_casts_to_16bit(setup):
        return None
    if kbit_fp32_stream(setup):
        return "fp32_stream"
    return "half_autocast" if setup.autocast else "half"


def full_case(setup: Setup) -> FullCase | None:
    """Which traced full fine-tuning case a setup is (None: not traced). A 16-bit copy of fp32 weights (DeepSpeed's
    bf16/fp16 engine, FSDP's param_dtype: Setup.computes_on_16bit_copy) runs as a 16-bit model, with autocast
    under FSDP and without it under DeepSpeed (activations.engine_casts_to_16bit). fp8 training is priced as its
    16-bit case (its float8 Linears return the 16-bit dtype they are given), as stream_case does; not traced."""
    from .activations import engine_casts_to_16bit

    if setup.weights_dtype not in ("fp32", "bf16", "fp16"):
        return None
    if setup.weights_dtype != "fp32" or setup.computes_on_16bit_copy:
        return "half" if not setup.autocast or engine_casts_to_16bit(setup) else "half_autocast"
    return "fp32_autocast" if setup.autocast else "fp32"


def checkpoint_mode(release: str | None) -> Mode:
    """transformers' default checkpoint variant at ``release`` (None: a current one)."""
    from .activations_data import activations_data
    from .loss_path import version_tuple

    first = activations_data().block_backward.reentrant_before
    return "reentrant" if release is not None and version_tuple(release) < version_tuple(first) else "non_reentrant"


def block_backward_bytes(spec: ModelSpec, setup: Setup, release: str | None = None, fused_swiglu: bool = False,
                         mlp_tokens: int = 0) -> int:
    """Bytes one checkpointed block's backward holds beyond its recompute's saved tensors (call it only when the
    blocks are checkpointed). ``release``: the transformers release that trains (its checkpoint variant);
    ``fused_swiglu``: Liger's SwiGLU runs the MLP (its technique's hook says so: MemoryTerms.fused_swiglu);
    ``mlp_tokens``: the tokens the MLP's backward runs at once where a tiled MLP runs it shard by shard
    (MemoryTerms.mlp_tokens; 0: the whole sequence), so the FFN-wide gradients in flight are one shard's."""
    if not spec.gated_mlp or spec.is_encoder_decoder:
        return 0
    from .activations_data import activations_data

    data, mode = activations_data().block_backward, checkpoint_mode(release)
    lora = setup.lora is not None
    key = stream_case(setup) if lora else full_case(setup)
    if key is None:
        return 0
    group: Literal["lora", "full"] = "lora" if lora else "full"
    h, s = spec.hidden_size, setup.seq_len
    i = spec.active_intermediate_size * (min(s, mlp_tokens) / s if mlp_tokens else 1.0)   # FFN units per token of s
    gemma = data.post_mlp_norm
    if spec.model_type in gemma.model_types and not fused_swiglu:
        moments = (gemma.lora[key] if lora else gemma.full[key])[mode]  # type: ignore[index]
        norm, mlp = moments["norm"], moments["mlp"]
        early = gemma.before_recompute[group][key] if mode == "non_reentrant" else 0.0
        per_token = max(norm["h"] * h, mlp["i"] * i + mlp["h"] * h) + early * h
    else:
        coef = data.in_flight_per_token[key][mode] if lora else data.full_finetune_per_token["liger" if fused_swiglu else "hf"][key][mode]  # type: ignore[index]
        early = data.before_recompute_per_token[group][key] if mode == "non_reentrant" else 0.0
        per_token = coef["i"] * i + (coef["h"] + early) * h
    looped = expert_loop_per_token(spec, setup, release, key if lora else None)
    return max(0, int(setup.micro_batch_size * s * (per_token if looped is None else looped)))


def expert_loop_per_token(spec: ModelSpec, setup: Setup, release: str | None, case: str | None) -> float | None:
    """Bytes per token a MoE block's backward holds in flight where ``release`` runs its experts one after another
    (None: not such a block, or not traced; the grouped coefficients then apply).

    transformers 4's MoE blocks loop over the experts (``current_state = hidden_states[None, top_x]``, the expert's
    MLP, ``index_add_``), so autograd runs one expert's backward at a time and frees its saved tensors before the next
    expert's starts: at the gated product's backward of the first expert backward reaches (the loop's last) its gradient
    and its two factors' gradients, 3 x 4 B (fp32 stream) / 3 x 2 B (16-bit) per unit of that expert's width and per
    token it takes, are in flight, not the k routed experts' of every token that grouped_mm (transformers 5) holds.
    That expert takes ``tokens x top-k / experts`` of a balanced router (Mixtral is trained with a load-balancing loss;
    its paper, arXiv:2401.04088 section 5, finds the expert assignment of layers 0, 15 and 31 near 1/8 on every Pile
    domain). Where the block's backward peaks outside the experts (its output's gradient, the per-expert scatter of the
    input gradient, the attention) the traced ``rest_h`` applies. Traced: scripts/trace_moe_block.py under 4.48.1."""
    loop = _looping(spec, release, case)
    if loop is None or case is None or checkpoint_mode(release) != "reentrant":
        return None
    coef = loop.per_token[case]   # type: ignore[index]
    expert = spec.moe_intermediate_size or spec.intermediate_size
    one_expert = coef["expert_i"] * expert * spec.num_experts_per_tok / spec.num_experts + coef["expert_h"] * spec.hidden_size
    return max(one_expert, coef["rest_h"] * spec.hidden_size)


def expert_loop_saved_bytes(spec: ModelSpec, setup: Setup, release: str | None, *, checkpointed: bool) -> int:
    """Bytes a MoE block of a release that loops over its experts saves for backward beyond the grouped table (which
    transformers 5 was traced on: one 16-bit copy per routed pair, 2 B per hidden unit, with the experts frozen).

    Per routed pair transformers 4 keeps the expert's output (saved by ``* routing_weights``) and the weighted product
    (saved whole by ``index_add_``, whose backward formula names ``source``: torch's IndexAddBackward0 holds
    ``source_``), both in the stream's dtype: fp32 in peft's kbit stream (bitsandbytes' Linear4bit returns fp32 there),
    bf16 otherwise (data ``saved_hk``: traced 8 / 4 B per routed hidden unit, less the grouped table's 2). Every block
    keeps them unless checkpointed (then the recomputed one). LoRA on a frozen base in the traced stream cases only."""
    case = stream_case(setup) if setup.lora is not None else None
    loop = _looping(spec, release, case)
    if loop is None or case is None or case not in loop.saved_hk:
        return 0
    per_token = loop.saved_hk[case] * spec.hidden_size * spec.num_experts_per_tok
    return int(setup.micro_batch_size * setup.seq_len * per_token * (1 if checkpointed else spec.total_layers))


def _looping(spec: ModelSpec, release: str | None, case: str | None) -> ExpertLoop | None:
    """The traced expert-loop entry where ``release`` runs ``spec``'s experts one after another in a traced case."""
    from .activations_data import activations_data
    from .loss_path import version_tuple

    loop = activations_data().block_backward.expert_loop
    if loop is None or case is None or release is None or not spec.is_moe or spec.model_type not in loop.model_types:
        return None
    if case not in loop.per_token or version_tuple(release) >= version_tuple(loop.loops_before):
        return None
    return loop


def rotary_pairs(spec: ModelSpec) -> int:
    """The rotary cos / sin pairs a decoder's forward computes: one per kind of layer where the model computes one for
    each (data ``rotary_per_layer_type``: Gemma 3's local and global rope), else one."""
    from .activations_data import activations_data

    if spec.model_type in activations_data().block_backward.rotary_per_layer_type:
        return len(set(spec.attention_layer_types()))
    return 1


def step_input_bytes(spec: ModelSpec, setup: Setup, *, pairs: int | None = None) -> int:
    """Bytes a checkpointed decoder-only step holds from its forward to the end of backward that no activation term
    prices: the rotary cos / sin (``pairs`` of them, default rotary_pairs; ``[1, s, head_dim]`` each in the stream's
    dtype: transformers makes position ids ``[1, s]`` when the batch brings none), the position ids, and the collated
    batch the loop holds (input ids, labels, attention mask: int64). Alive at the loss (analytic's forward phase) and
    as every block's recompute starts. The rotary pair for gated-MLP (rotary) families only."""
    if spec.is_encoder_decoder or not spec.generates:
        return 0
    from .activations import stream_regime

    rope_dim = spec.qk_rope_head_dim or spec.head_dim
    count = rotary_pairs(spec) if pairs is None else pairs
    rotary = count * 2 * rope_dim * (2 if stream_regime(setup) == "half" else 4) * setup.seq_len if spec.gated_mlp else 0
    batch = INT64 * (BATCH_TENSORS * setup.micro_batch_size + 1) * setup.seq_len   # + the position ids, per sequence
    return rotary + batch


def recompute_start_bytes(spec: ModelSpec, setup: Setup, *, first_block: bool, release: str | None = None) -> int:
    """Bytes alive as autograd starts to recompute a block that no other phase term prices: the gradient backward
    hands the block (its output's: the next block's input in shape and dtype) and step_input_bytes. ``first_block``:
    block 0, the end of backward, where its own input (the checkpoint keeps it) is alive too; the top block's is in
    the blocks' inputs (boundary_bytes). At block 0 non-reentrant checkpointing (``release``: checkpoint_mode's) has
    freed every rotary pair but block 0's kind's with the last block of that kind; reentrant's CheckpointFunction keeps
    its non-tensor arguments (the pair) until the graph is freed, so all are alive.
    Traced (scripts/trace_backward_phases.py: a 3-block Llama, h 128, head_dim 32, every case and checkpoint
    variant; ``--arch=gemma3``: two local blocks and a global one), each storage named and per token to the byte.
    Decoder-only stacks."""
    if spec.is_encoder_decoder or not spec.generates:
        return 0
    from .activations import checkpoint_boundary_bytes

    boundary = checkpoint_boundary_bytes(spec, setup)   # one block's input: its gradient is the same shape and dtype
    pairs = 1 if first_block and checkpoint_mode(release) == "non_reentrant" else None
    return boundary * (2 if first_block else 1) + step_input_bytes(spec, setup, pairs=pairs)


def first_step_pending_params(spec: ModelSpec, setup: Setup) -> int:
    """Parameters whose gradient a first micro-step (every ``.grad`` None: ``zero_grad(set_to_none=True)``, no
    accumulation) has not made yet at block 0's backward peak, which the end-of-backward phase would otherwise hold
    whole. Traced (scripts/trace_backward_phases.py ``--grads``, both checkpoint variants): block 0's own gradients
    but down_proj's (its backward runs first; in the Gemma 3 trace the peak came before it, so this is the lower
    count), and an untied embedding's, made by the embedding's backward after block 0's; a tied one's gradient is the
    head's, waiting in autograd's input buffer from the start of backward, so alive. Full fine-tuning of a dense
    decoder on one GPU or under DDP (each ``.grad`` made by its AccumulateGrad); sharded gradients (ZeRO, FSDP) and
    MoE get nothing, and LoRA's pending gradients (block 0's adapters) are not priced (tens of MB at most)."""
    if setup.lora is not None or spec.is_moe or spec.is_encoder_decoder or not spec.generates or setup.strategy not in ("single", "ddp"):
        return 0
    stack = spec.total_params - spec.embedding_params - spec.lm_head_params - spec.vision_params - spec.hidden_size   # less the final norm
    down = spec.intermediate_size * spec.hidden_size if spec.gated_mlp else 0
    return max(0, stack // spec.num_layers - down) + (spec.embedding_params if spec.lm_head_params else 0)


def kv_replication(spec: ModelSpec, split: int) -> int:
    """How many times a sequence split over ``split`` ranks repeats each K/V head: DeepSpeed's Ulysses
    (``UlyssesSPAttentionHF``: ``kv_replication_factor = world_size // kv_head_count`` where the split is wider than
    the model's K/V heads, ``repeat_interleave`` before the all-to-all) gives every rank one K/V head over the whole
    sequence. 1 where the heads divide over the ranks, or without a split. Every split is priced as Ulysses, as the
    speed model's all-to-alls are (speed/sequence_split.py): ring attention (axolotl's context_parallel_size, torch's
    context_parallel) keeps k / v sharded, so past its K/V heads this is an upper bound there."""
    kv = spec.num_key_value_heads
    return split // kv if split > kv and not spec.is_encoder_decoder and not spec.is_mla else 1


def replicated_kv_bytes(spec: ModelSpec, setup: Setup, split: int) -> int:
    """Bytes a block keeps for backward beyond its table where Ulysses repeats the K/V heads (``kv_replication``): the
    attention kernel saves k and v at one head over the whole sequence, ``replication`` times the rank's slice at every
    K/V head (16-bit; ``setup`` is one rank's slice)."""
    extra_heads = spec.num_key_value_heads * (kv_replication(spec, split) - 1)
    return setup.micro_batch_size * setup.seq_len * 2 * 2 * extra_heads * spec.head_dim


def flash_backward_bytes(spec: ModelSpec, setup: Setup, split: int = 1) -> int:
    """Bytes alive at a recomputed block's attention backward under flash-attn (``attn_implementation=
    "flash_attention_2"`` or ``"flash_attention_3"``) beyond the tensors the recompute saved: the kernel's workspace and its gradients, which no
    CPU trace shows, as ``mha_bwd`` allocates them (Dao-AILab/flash-attention csrc/flash_attn/flash_api.cpp, v2.6+;
    ``FlashAttnFunc.backward`` passes ``empty_like`` dq, dk, dv): dq, dk, dv in the compute dtype, an fp32
    ``dq_accum`` of ``[b, round128(s), heads, round32(head_dim)]`` (``loop`` is always true), an fp32 ``softmax_d`` of
    ``[b, heads, round128(s)]``, and for grouped K/V heads ``dk_expanded`` / ``dv_expanded`` at every query head
    (summed into dk / dv after the kernel); beside them the output's gradient the kernel reads (query-wide); the
    residual stream's gradient is the block's incoming one in shape (recompute_start_bytes). By then the block's MLP
    half has run its backward and freed what it saved (activations.attention_side_bytes), so the block's backward
    peaks here only where the MLP's moment is the smaller (a tiled MLP's one shard: techniques/tiled_mlp.py).
    FlashAttention-3 (``"flash_attention_3"``, hopper/flash_api.cpp ``mha_bwd``) keeps the same gradients and
    accumulates in fp32 instead: ``dq_accum`` ``[b, heads, round(s) * round_up_headdim(d)]``, ``softmax_d`` and
    ``softmax_lse_log2`` ``[b, heads, round(s)]``, and for grouped K/V heads ``dk_accum`` / ``dv_accum`` at the K/V
    heads (fp32), not expanded copies at every query head.
    Under a sequence split over ``split`` ranks (``setup`` is one rank's slice) the kernel runs the whole sequence for
    heads / split heads, the same elements; where Ulysses repeats the K/V heads (``kv_replication``) dk / dv are
    ``replication`` times the slice's and the query heads meet their K/V head one to one once each rank has one of
    each (no expanded copies).
    Decoder stacks with one head width (MLA's split q / v widths are not counted): 0 otherwise."""
    if not setup.flash_attention or spec.is_encoder_decoder or spec.is_mla:
        return 0
    b, s, heads, kv, d = setup.micro_batch_size, setup.seq_len, spec.num_attention_heads, spec.num_key_value_heads, spec.head_dim
    s_rounded, half = -(-s // 128) * 128, 2   # flash-attn runs fp16 / bf16 only
    kv_kernel = kv * kv_replication(spec, split)   # K/V heads the kernel sees, over the rank's share of the sequence
    grouped = heads // split != max(1, kv // split) if split > 1 else kv != heads   # the kernel expands K/V for its queries
    grads = half * s * (2 * heads * d + 2 * kv_kernel * d)   # the output's gradient and dq, dk, dv
    if setup.attn_implementation == "flash_attention_3":
        d_rounded = next((r for r in (64, 96, 128, 192, 256) if d <= r), d)   # round_up_headdim
        workspace = 4 * s_rounded * heads * (d_rounded + 2) + (2 * 4 * s_rounded * kv_kernel * d_rounded if grouped else 0)
    else:
        d_rounded = -(-d // 32) * 32 if d <= 192 else 256
        workspace = 4 * s_rounded * heads * (d_rounded + 1) + (2 * half * s * heads * d if grouped else 0)
    return b * (grads + workspace)
