"""The parameter side of a training step: what the weights are stored as and which tensors train.

Below the techniques: the speed model's optimizer and communication bytes and CPU offload's PCIe traffic count
the same trainable tensors the memory model does, so they read them here.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidSetupError
from ..model.adapted import SAVED_EMBEDDINGS, SAVED_HEADS
from ..model.linears import linear_params, linear_shapes
from ..model.recurrent import PEFT_REFUSES_OUT_PROJ, fused_out_proj
from ..model.types import ModelSpec, derived
from ..setup import DTYPE_BYTES as SETUP_DTYPE_BYTES
from ..setup import Setup
from .kbit import kbit_fp32_parts
from .moe_lora import GATE_UP, ExpertAdapters, all_linear_extra, listed_targets, parameter_targets, split_targets
from .optimizers import TensorGroup, group_bytes
from .top_of_stack import quantized_head

#: Bytes of the unquantized weight dtypes, as ints (setup.DTYPE_BYTES is the one table).
DTYPE_BYTES = {d: int(SETUP_DTYPE_BYTES[d]) for d in ("fp32", "bf16", "fp16")}
NF4_BLOCK, NF4_DQ_BLOCK = 64, 256   # bnb 4-bit absmax block; double-quant block of the absmax values
LORA_ADAPTER_BYTES = 4              # PEFT autocast_adapter_dtype=True keeps adapters fp32 on 16-bit bases


@dataclass(frozen=True)
class Ledger:
    """Parameter-side facts of one (spec, setup): storage bytes and trainable tensors."""

    weight_bytes: int
    param_count: int
    trainable: tuple[TensorGroup, ...]
    trainable_params: int
    param_bytes: int                 # bytes per element of the adapters (or every trainable tensor): params, grads, torch state
    lora_inputs_per_layer: int = 0   # sum of input widths of adapted Linears in one block
    lora_rank_per_layer: int = 0
    dora_outputs_per_layer: int = 0  # sum of output widths of DoRA-adapted Linears in one block (0 without DoRA)
    experts: ExpertAdapters | None = None  # LoRA on fused MoE experts / router as parameters (memory/moe_lora.py)
    dora_weights_per_layer: int = 0  # sum of in x out of DoRA-adapted Linears in one block (their base weights' elements)
    dora_identity_per_layer: int = 0  # sum of in x (in + out) of them: peft runs lora_A and lora_B on an in x in identity
    dora_largest: tuple[int, int] = (0, 0)  # (in, out) of the DoRA Linear whose weight norm holds the most at once
    padded_outputs_per_layer: int = 0  # litgpt LoRAQKVLinear with some of q/k/v adapted: their output widths (_padded_outputs)
    shared_inputs_per_layer: int = 0  # input widths of adapted Linears that read a tensor another one reads (_shared_inputs)
    attention_output_inputs_per_layer: int = 0  # input width of an adapted o_proj that reads the attention's saved output
    linear_adapter_params: int = 0   # lora_A + lora_B elements on the adapted Linears (no MoE wrappers, DoRA or saved copies)

    @property
    def trainable_bytes(self) -> int:
        """One copy of the trainable tensors (their weights, or their gradients), each group at its own width."""
        return group_bytes(self.trainable, self.param_bytes)

    @property
    def largest_width(self) -> int:
        """Bytes per element of the largest trainable tensor (a 16-bit modules_to_save copy beside fp32 adapters)."""
        top = max(self.trainable, key=lambda g: g.numel, default=None)
        return (top.width if top is not None else None) or self.param_bytes


def _expert_matrices(spec: ModelSpec) -> list[TensorGroup]:
    """Routed-expert weights a spec counts only in ``expert_params`` (fused 3-D expert tensors: Qwen3-MoE, gpt-oss,
    DeepSeek), as matrices of one expert's width: optimizers see them as large tensors (bitsandbytes quantizes their
    state to 8 bits, torchao too), not as 1-D vectors kept in fp32."""
    if not spec.fused_expert_params:
        return []
    width = spec.moe_intermediate_size or spec.intermediate_size
    n = spec.expert_params // (spec.hidden_size * width)
    return [TensorGroup(n, width, spec.hidden_size, "linear")] if n else []


def full_groups(spec: ModelSpec) -> list[TensorGroup]:
    """Every parameter tensor of the model grouped by shape: embeddings, head, block Linears, 1-D rest."""
    h = spec.hidden_size
    groups: list[TensorGroup] = []
    tok = min(spec.embedding_params, spec.vocab_size * h)
    if tok:
        groups.append(TensorGroup(1, tok // h, h, "embedding"))
    if spec.embedding_params > tok:  # learned position embeddings and the like
        groups.append(TensorGroup(1, max(1, (spec.embedding_params - tok) // h), h, "embedding"))
    if spec.lm_head_params:
        groups.append(TensorGroup(1, max(1, spec.lm_head_params // h), h, "head"))
    groups += [TensorGroup(n, o, i, "linear") for _, i, o, n in linear_shapes(spec)]
    experts = _expert_matrices(spec)
    groups += experts
    rest = spec.total_params - spec.embedding_params - spec.lm_head_params - linear_params(spec) - sum(g.total for g in experts)
    if rest > 0:
        groups.append(TensorGroup(rest // h, h, 1, "other"))
        if rest % h:
            groups.append(TensorGroup(1, rest % h, 1, "other"))
    return groups


def _targets(spec: ModelSpec, setup: Setup) -> tuple[list[tuple[str, int, int, int]], bool]:
    """(Block Linears and fused expert stacks LoRA adapts, whether peft's conversion reached gate_up: its rank is then
    doubled). PEFT matches a target module when its name equals it or ends with '.<target>'; ``target_parameters``
    add the stacks they name (moe_lora.parameter_targets), a stack both reach counted once."""
    lora = setup.lora
    assert lora is not None
    shapes = linear_shapes(spec)
    fused = fused_out_proj(spec.model_type)   # a Mamba-2 out-projection the fused kernel reads as a bare weight
    if lora.target_modules == "all-linear":
        chosen = [s for s in shapes if s[0] != fused] + all_linear_extra(spec, shapes)
    else:
        targets, experts = listed_targets(spec, lora.target_modules, shapes)   # v4 expert / router names peft converts
        chosen = [s for s in shapes if any(s[0] == t or s[0].endswith("." + t) for t in targets)] + experts
        if fused and any(s[0] == fused for s in chosen) and (spec.model_type in PEFT_REFUSES_OUT_PROJ
                                                             or setup.linear_attention_kernels == "mamba_ssm"):
            why = ("peft refuses it" if spec.model_type in PEFT_REFUSES_OUT_PROJ
                   else "mamba-ssm's fused kernel reads its weight directly, so an adapter on it trains nothing")
            raise InvalidSetupError(f"LoRA on {spec.name}'s Mamba-2 out_proj ({fused}): {why}; drop out_proj from "
                                    "target_modules (all-linear leaves it out)")
        if not chosen and not lora.target_parameters:
            names = ", ".join(sorted({s[0].rsplit(".", 1)[-1] for s in shapes}))
            raise InvalidSetupError(f"LoRA target_modules {list(targets)} match no Linear of {spec.name}; accepted: all-linear, {names}")
    doubled = any(s[0] == GATE_UP for s in chosen)
    named = {s[0]: s for s in parameter_targets(spec, lora.target_parameters, shapes)}
    kept = [s for s in chosen if s[0] not in named or named[s[0]][3] <= s[3]]
    return kept + [s for name, s in named.items() if not any(c[0] == name for c in kept)], doubled


#: bytes per non-quantized parameter (embeddings, head, norms) of a quantized base being trained: prepare_model runs
#: peft's prepare_model_for_kbit_training, which casts every fp16/bf16 parameter that is not Params4bit to fp32
#: (peft utils/other.py); measured on a real bnb 4-bit / 8-bit CPU model (tests/test_adapted_models.py)
KBIT_PREPARED_REST_BYTES = 4


def quantized_weight_bytes(spec: ModelSpec, dtype: str, upcast: bool = True, head: bool = False,
                           double_quant: bool = True, recast: bool = False, experts: bool = False) -> int:
    """bnb int8: 1 B + fp32 row scale per Linear; nf4: 0.5 B + absmax, double-quantized (uint8 per 64 + fp32 per 256
    blocks) or not (fp32 per 64: bitsandbytes ``compress_statistics=False``, litgpt's ``bnb.nf4``). Rest: fp32 after
    the kbit preparation (training plans are always LoRA on the quantized base), 16-bit where the run skips it.
    ``head``: the LM head is quantized too, as litgpt's own vocabulary x hidden Linear even where the Hub model ties
    it (top_of_stack.quantized_head). ``recast`` (TRL's cast after the upcast, ``Setup.kbit_recast_bf16``): the
    embeddings and an unquantized head back to 2 bytes, the norms and other small parameters still fp32. ``experts``
    (``Setup.quantized_experts``): fused 3-D expert tensors quantized as the Linears are, int8 with an fp32 scale per
    row of their last dimension (axolotl's int8_vectorwise_quant over the flattened tensor)."""
    shapes = linear_shapes(spec)
    fused = spec.fused_expert_params if experts else 0
    linear = linear_params(spec) + fused
    rest = (spec.total_params - linear - (spec.lm_head_params if head else 0)) * (KBIT_PREPARED_REST_BYTES if upcast else 2)
    if upcast and recast:
        rest -= (spec.embedding_params + (0 if head else spec.lm_head_params)) * (KBIT_PREPARED_REST_BYTES - 2)
    vocab_rows = (spec.lm_head_params or spec.vocab_size * spec.hidden_size) // spec.hidden_size if head else 0
    if dtype == "int8":
        rows = sum(o * n for _, _, o, n in shapes) + fused // spec.hidden_size
        return rest + linear + rows * 4 + vocab_rows * spec.hidden_size + vocab_rows * 4
    quantized = linear + vocab_rows * spec.hidden_size
    blocks = -(-quantized // NF4_BLOCK)
    absmax = blocks + (-(-blocks // NF4_DQ_BLOCK)) * 4 if double_quant else blocks * 4
    return rest + quantized // 2 + absmax


def nf4_quant_state_bytes(spec: ModelSpec) -> int:
    """The absmax statistics of every 4-bit Linear with bnb's double quant: one uint8 absmax per 64-weight block plus
    one fp32 absmax per 256 of those (bitsandbytes functional.quantize_4bit, ``compress_statistics=True``).

    They live in the weight's ``QuantState``, a Python attribute of ``Params4bit``, not a parameter or buffer, which
    matters wherever a wrapper only handles parameters (analytic.replicated_quant_state). Llama-2-70B's 68.45B Linear
    weights: 1,069,547,520 + 4 x 4,177,920 = 1.086 GB.
    """
    blocks = -(-linear_params(spec) // NF4_BLOCK)
    return blocks + (-(-blocks // NF4_DQ_BLOCK)) * 4


def _frozen_groups(spec: ModelSpec, trainable: int) -> tuple[TensorGroup, ...]:
    """A module with frozen parameters (``requires_grad=False``) trains only the rest: gradients and optimizer
    state exist for ``trainable`` elements. Which tensors they are is not recorded, so they are priced as
    hidden-wide matrices (exact for element-wise optimizers; factored/8-bit states are approximate)."""
    h = spec.hidden_size
    groups = [TensorGroup(1, trainable // h, h, "linear")] if trainable >= h else []
    if trainable % h:
        groups.append(TensorGroup(1, trainable % h, 1, "other"))
    return tuple(groups)


def ledger(spec: ModelSpec, setup: Setup) -> Ledger:
    """Weight storage and trainable tensors for this setup: a fact of the model, its weight dtype and its adapters,
    computed once per spec for each (derived: a plan prices hundreds of Setups that share them)."""
    return derived(spec, ("ledger", setup.weights_dtype, kbit_fp32_parts(setup), setup.kbit_quantizer, setup.nf4_double_quant, setup.quantized_experts,
                          setup.kbit_recast_bf16, setup.kbit_recast_adapters, setup.lora, fsdp2_upcasts_trainables(setup),
                          setup.model_code),
                   lambda: _ledger(spec, setup))


def saved_module_groups(spec: ModelSpec, setup: Setup) -> tuple[TensorGroup, ...]:
    """The trainable copies ``modules_to_save`` adds: PEFT's ModulesToSaveWrapper keeps the original (frozen, already
    in the weights) and trains a deep copy, one vocabulary x hidden matrix per named embedding or head.

    The copy takes the dtype the original has when ``get_peft_model`` runs (a deep copy; peft's
    ``autocast_adapter_dtype`` upcasts only the adapter layers), so on a 16-bit base, or after TRL's bf16 recast of the
    embeddings and head, the copies are 16-bit beside fp32 adapters: such a group carries its own ``width``, which its
    weights, gradients and optimizer states take (checked on a real peft model, tests/test_mixed_width.py)."""
    lora = setup.lora
    if lora is None or not lora.modules_to_save:
        return ()
    unknown = [n for n in lora.modules_to_save if n.rsplit(".", 1)[-1] not in SAVED_EMBEDDINGS + SAVED_HEADS]
    if unknown:
        raise InvalidSetupError(f"modules_to_save {unknown} is not priced: perfguide prices the token embedding and the LM head "
                                f"({', '.join(SAVED_EMBEDDINGS[:2] + SAVED_HEADS[:1])}, ...)")
    wd = setup.weights_dtype
    copy_bytes = DTYPE_BYTES[wd] if wd in DTYPE_BYTES else (2 if setup.kbit_recast_bf16 or not kbit_fp32_parts(setup) else 4)
    copy_bytes = LORA_ADAPTER_BYTES if fsdp2_upcasts_trainables(setup) else copy_bytes
    width = copy_bytes if copy_bytes != adapter_bytes(setup) else None
    # the copy is a module of its original's class: an embedding's copy takes the Trainer's 32-bit bnb state override
    return tuple(TensorGroup(1, spec.vocab_size, spec.hidden_size, "embedding" if n.rsplit(".", 1)[-1] in SAVED_EMBEDDINGS else "head",
                             width) for n in lora.modules_to_save)


def fsdp2_upcasts_trainables(setup: Setup) -> bool:
    """Whether accelerate makes every trainable tensor fp32 before ``fully_shard``: its ``fsdp2_prepare_model`` casts
    each trainable parameter that is not fp32 to fp32 whenever ``mixed_precision`` is not "no" (a LoRA plan's autocast
    dtype, techniques/precision.py) and the model holds no bitsandbytes Params4bit (accelerate 1.15 utils/fsdp_utils.py:
    "FSDP2 requires uniform orig_dtype among trainable params in each group"; torch's ``FSDPParamGroup._init_mp_dtypes``
    raises "FSDP expects uniform original parameter dtype" on a unit holding both). A 16-bit modules_to_save copy or
    16-bit adapters then train in fp32 (checked with accelerate's own preparation on CPU, tests/test_mixed_width_fsdp.py)."""
    return (setup.lora is not None and setup.is_fsdp and setup.fsdp_version == 2 and setup.autocast is not None
            and setup.weights_dtype != "nf4")


def adapter_bytes(setup: Setup) -> int:
    """Bytes per LoRA adapter element (parameter, gradient, each AdamW moment: torch keeps the moments in the
    parameter's dtype): fp32 as PEFT creates them on a quantized base and upcasts them on a 16-bit one
    (``autocast_adapter_dtype``), bf16 after TRL 0.7.5-0.8.6's recast (``kbit_recast_adapters``: ``module.to(torch.bfloat16)``
    on every PEFT tuner layer; later releases' recast leaves them fp32), and the base's 16 bits on a bf16/fp16 base
    without the upcast (peft before 0.12). litgpt creates its adapters (``lora_A``, ``lora_B``) inside
    ``fabric.init_module()``, whose precision plugin sets the default dtype (HalfPrecision's and
    BitsandbytesPrecision's ``_DtypeContextManager``), so they take the run's compute dtype: bf16 under ``bf16-true``,
    on a 16-bit and a quantized base alike (traced: scripts/trace_litgpt.py). ``LoraSpec.adapter_dtype`` names the
    dtype a stack that makes its adapters itself gives them (torchtune: its run dtype)."""
    if fsdp2_upcasts_trainables(setup):
        return LORA_ADAPTER_BYTES
    if setup.lora is not None and setup.lora.adapter_dtype is not None:   # made by the stack itself (torchtune)
        return int(DTYPE_BYTES[setup.lora.adapter_dtype])
    if setup.model_code == "litgpt" and setup.autocast is None:
        return DTYPE_BYTES.get(setup.compute_dtype, LORA_ADAPTER_BYTES)
    if setup.kbit_recast_adapters:
        return 2
    keeps_base_dtype = setup.lora is not None and not setup.lora.autocast_adapter_dtype
    return DTYPE_BYTES[setup.weights_dtype] if keeps_base_dtype and setup.weights_dtype in ("bf16", "fp16") else LORA_ADAPTER_BYTES


#: the query / key / value projections litgpt fuses into one Linear (``attn.attn``, a ``LoRAQKVLinear``)
QKV_NAMES = frozenset({"q_proj", "k_proj", "v_proj", "query", "key", "value"})


def _lora_inputs(chosen: list[tuple[str, int, int, int]], model_code: str) -> list[tuple[str, int, int, int]]:
    """The adapted Linears whose inputs the adapters keep: each one's under transformers (PEFT adapts q_proj, k_proj,
    v_proj separately, each with its own dropout and input copy); litgpt's ``LoRAQKVLinear`` adapts the fused qkv
    Linear once, one ``lora_dropout(x)`` and one ``lora_A`` for every enabled projection (litgpt/lora.py), so the
    q / k / v targets count one input."""
    if model_code != "litgpt":
        return chosen
    qkv = [s for s in chosen if s[0].rsplit(".", 1)[-1] in QKV_NAMES]
    return [s for s in chosen if s not in qkv] + qkv[:1]


#: Linears of one module that read one input tensor in transformers' decoder blocks: attention's q / k / v (self-
#: attention) and the gated MLP's gate / up (LlamaAttention.forward, LlamaMLP.forward: ``self.q_proj(hidden_states)``,
#: ``self.k_proj(hidden_states)``...; ``self.gate_proj(x)``, ``self.up_proj(x)``)
SHARED_INPUT_SETS = (frozenset({"q_proj", "k_proj", "v_proj"}), frozenset({"gate_proj", "up_proj"}))


def _shared_inputs(chosen: list[tuple[str, int, int, int]], spec: ModelSpec, model_code: str) -> int:
    """Input elements over the model of the adapted Linears that read the same tensor as another adapted Linear of
    their module (every reader after the first): PEFT's ``lora_A`` keeps that tensor itself where the adapter takes it
    uncast and undropped (lora_activations.lora_layer_bytes), one storage for all its readers. Decoder-only
    transformers blocks (an encoder-decoder's cross-attention reads q and k / v from different tensors); litgpt's
    fused qkv already counts one input (``_lora_inputs``)."""
    if model_code != "transformers" or spec.is_encoder_decoder:
        return 0
    total = 0
    for names in SHARED_INPUT_SETS:
        readers: dict[str, list[int]] = {}
        for name, i, _, n in chosen:
            parent, _, leaf = name.rpartition(".")
            if leaf in names:
                readers.setdefault(parent, []).append(i * n)
        total += sum(sum(group[1:]) for group in readers.values())
    return total


def _attention_output_inputs(chosen: list[tuple[str, int, int, int]], spec: ModelSpec, setup: Setup) -> int:
    """Input elements over the model of an adapted ``o_proj`` whose input is the attention kernel's own saved output:
    SDPA's flash and memory-efficient kernels and flash-attn return it in [batch, seq, heads, head_dim] memory, so
    transformers' ``attn_output.transpose(1, 2).contiguous()`` and reshape are views of it (traced on CPU's flash
    kernel, scripts/trace_compiled_block.py; the CUDA kernels allocate their output the same way). Eager attention's
    ``probs @ v`` is [batch, heads, seq, head_dim]: the transpose copies."""
    if setup.model_code != "transformers" or spec.is_encoder_decoder or setup.attn_implementation == "eager":
        return 0
    return sum(i * n for name, i, _, n in chosen if name.rpartition(".")[2] == "o_proj")


def _padded_outputs(chosen: list[tuple[str, int, int, int]], model_code: str) -> int:
    """Output elements over the model that litgpt's ``LoRAQKVLinear`` keeps when some but not all of q, k, v are
    adapted: its ``lora_B`` (a grouped conv1d) returns the enabled projections only and ``zero_pad`` scatters them
    into the fused width, which keeps the conv1d output alive until backward; with all three enabled it skips the
    padding. Traced (litgpt 0.4.12, real CPU tensors, scripts/trace_litgpt.py): phi-shaped, q and v of 320 each
    adapted, 1280 B per token per block (2 B per element), none with q, k, v all adapted."""
    qkv = [s for s in chosen if s[0].rsplit(".", 1)[-1] in QKV_NAMES]
    return sum(o * n for _, _, o, n in qkv) if model_code == "litgpt" and 0 < len(qkv) < 3 else 0


def _ledger(spec: ModelSpec, setup: Setup) -> Ledger:
    wd = setup.weights_dtype
    base = (spec.total_params * DTYPE_BYTES[wd] if wd in DTYPE_BYTES
            else quantized_weight_bytes(spec, wd, kbit_fp32_parts(setup), quantized_head(setup), setup.nf4_double_quant,
                                        setup.kbit_recast_bf16, setup.quantized_experts))
    if setup.lora is None:
        trainable = spec.total_params if spec.trainable_params is None else min(spec.trainable_params, spec.total_params)
        groups = tuple(full_groups(spec)) if trainable == spec.total_params else _frozen_groups(spec, trainable)
        return Ledger(base, spec.total_params, groups, trainable, DTYPE_BYTES[wd])
    r = setup.lora.r
    targets, doubled = _targets(spec, setup)
    chosen, wrapped, experts = split_targets(spec, targets, r, doubled, named=bool(setup.lora.target_parameters))
    groups = tuple(g for _, i, o, n in chosen for g in (TensorGroup(n, r, i), TensorGroup(n, o, r)))
    linear_adapters = sum(g.total for g in groups)
    groups += tuple(TensorGroup(n, rows, cols) for n, rows, cols in wrapped)
    if experts and (setup.lora.use_dora or setup.lora.dropout):  # peft ParamWrapper.__init__ raises on both
        raise InvalidSetupError(f"LoRA on {spec.name}'s fused MoE experts / router (peft ParamWrapper) accepts neither use_dora "
                                "nor lora_dropout > 0: set dropout 0 and no DoRA, or target the attention projections only")
    if setup.lora.use_dora:  # DoRA (refused by peft's ParamWrapper, so on the Linears only) trains a magnitude of out_features per adapted Linear (peft lora_magnitude_vector,
        # one of LoraLayer.adapter_layer_names, so upcast with the adapters)
        groups += tuple(TensorGroup(n, o, 1, "other") for _, _, o, n in chosen)
    trainable = sum(g.total for g in groups)
    layers = spec.total_layers
    inputs = sum(i * n for _, i, _, n in _lora_inputs(chosen, setup.model_code)) // layers
    ranks = sum(r * n for *_, n in chosen) // layers
    dora = sum(o * n for _, _, o, n in chosen) // layers if setup.lora.use_dora else 0
    dora_weights = sum(i * o * n for _, i, o, n in chosen) // layers if setup.lora.use_dora else 0
    identity = sum(i * (i + o) * n for _, i, o, n in chosen) // layers if setup.lora.use_dora else 0
    largest = max(((i, o) for _, i, o, _ in chosen), key=lambda s: s[0] * (s[0] + 4 * s[1]), default=(0, 0)) if setup.lora.use_dora else (0, 0)
    saved = saved_module_groups(spec, setup)
    groups += saved
    trainable += sum(g.total for g in saved)
    nbytes = adapter_bytes(setup)
    return Ledger(base + group_bytes(groups, nbytes), spec.total_params + trainable, groups, trainable, nbytes, inputs, ranks, dora,
                  experts, dora_weights, identity, largest,
                  padded_outputs_per_layer=_padded_outputs(chosen, setup.model_code) // layers,
                  shared_inputs_per_layer=_shared_inputs(chosen, spec, setup.model_code) // layers,
                  attention_output_inputs_per_layer=_attention_output_inputs(chosen, spec, setup) // layers,
                  linear_adapter_params=linear_adapters)
