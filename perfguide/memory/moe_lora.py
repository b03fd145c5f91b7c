"""LoRA on a transformers-5 MoE layer's fused experts and router: adapted as parameters, priced per block.

transformers 5 stores a Mixtral / Qwen3-MoE layer's experts as two 3-D parameters (``experts.gate_up_proj``,
``experts.down_proj``, run by ``grouped_mm``) and its router as a custom module around ``gate.weight``, none of them an
``nn.Linear``. From peft 0.20 ``target_modules="all-linear"`` (and a list naming the v4 expert or router names) is
rewritten to ``target_parameters`` for them (peft utils/transformers_weight_conversion.py
``_resolve_string_target_modules`` / ``_convert_peft_config_moe``; peft 0.19's conversion had no string resolution:
it took ``set()`` of the string, not run here), each wrapped by
``lora.ParamWrapper``: r x experts rows in ``lora_A`` / ``lora_B``, and ``gate_up_proj`` at rank 2r (its rank_pattern:
gate and up fused, alpha doubled too). ParamWrapper keeps no per-token adapter tensor: its forward parametrizes the
weight as ``W + s A B`` (peft 0.21 ``_LoraFactorsProxy``: one ``baddbmm`` over the expert stack; the router's 2-D
weight ``W + delta``) and runs the base module on it. So a block keeps, for backward:

- the merged expert stack (``grouped_mm`` saves its weight operand, which now requires grad), in the weight's dtype,
  and the merged router weight (none added under autocast, where the frozen router's matmul keeps a bf16 cast of its
  weight already);
- the factors ``baddbmm`` saves: on a 16-bit base ``.to(param.dtype)`` copies of the fp32 adapters, 2 B per
  r' x (in + out) element per expert; none where the adapters already have the weight's dtype. Under autocast the
  router's 2-D delta ``B @ A`` runs in bf16 and keeps 16-bit casts of both factors;
- per token, what the frozen experts and router did not keep: the router's input (``h``, its matmul's dtype), the
  gathered copy ``grouped_mm`` keeps for the gate_up weight's gradient (``hk``) and the product the down weight's
  gradient needs (``ir``), both in the experts' dtype (fp32 on fp32 weights under autocast: grouped_mm is on no
  autocast list).

Traced on real CPU tensors (peft 0.21.2, transformers 5.24, tests/test_moe_lora.py); their time: speed/moe_lora.py. With checkpointing only the
recomputed block holds the merged weights; without, every block does: at real sizes ~2.8 GB per Mixtral-8x7B layer
and ~1.2 GB per Qwen3-30B-A3B layer.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidSetupError
from ..model.linears import linear_shapes
from ..model.types import ModelSpec
from ..setup import Setup

ROUTER = "mlp.gate"
#: where a model type's router is no ``mlp.gate``: transformers 5's GptOssMLP keeps ``self.router`` (GptOssTopKRouter,
#: ``F.linear`` over its ``weight``), which peft's target_parameters adapts as ``mlp.router.weight``
_ROUTERS = {"gpt_oss": "mlp.router"}
GATE_UP, DOWN = "experts.gate_up_proj", "experts.down_proj"


@dataclass(frozen=True)
class ExpertAdapters:
    """Per MoE layer (averaged over them where only some are adapted): elements of the merged weights and of the factor
    copies one block keeps (see module doc)."""

    moe_layers: int
    expert_elems: int      # merged gate_up + down stacks
    factor_elems: int      # lhs + rhs of every adapted expert stack (r' x (in + out) per expert)
    router_elems: int      # merged router weight (0: router not adapted)
    router_factor_elems: int
    rank_elems: int        # sum of experts x in x out x r' over the adapted stacks: the multiply-adds of one A B
    router_rank_elems: int  # experts x hidden x r: the router delta's multiply-adds
    adapter_params: int     # the ParamWrapper adapters' trainable elements, all layers (no per-token branch)
    adapted_layers: int     # layers whose stacks are adapted (a layer index in target_parameters: fewer than moe_layers)
    stack_grad_elems: int = 0  # one adapted layer's backward: its merged stacks' gradient above what the block saved


#: model types whose v4 expert / router names peft rewrites to ``target_parameters`` on transformers 5: the
#: ``mixtral`` and ``qwen2_moe`` patterns of transformers 5.24 conversion_mapping ``_MODEL_TO_CONVERSION_PATTERN`` (peft
#: 0.21 ``_MOE_TARGET_MODULE_MAPPING`` knows only those two). Others with 3-D experts (gpt-oss) keep them untargeted.
#: ``qwen2_moe`` itself (Qwen1.5-MoE) is no key there, so peft leaves its experts alone.
CONVERTED_MOE_TYPES = frozenset({
    "mixtral", "minimax", "minimax_m2", "Dots3NoteTextModel", "UnlimitedOcrTextModel", "afmoe", "deepseek_v2", "deepseek_v3",
    "deepseek_v32", "dots1", "ernie4_5_moe", "glm4_moe", "glm4_moe_lite", "glm_moe_dsa", "glm4v_moe", "longcat_flash",
    "solar_open", "mellum", "qwen3_moe", "beam", "qwen3_omni_moe", "qwen3_omni_moe_thinker", "qwen3_omni_moe_text",
    "qwen3_next", "hunyuan_v1_moe", "flex_olmo", "olmoe", "sarvam_mla", "exaone_moe", "cohere2_moe"})


def fused_experts(spec: ModelSpec) -> bool:
    """A MoE whose experts are 3-D parameters (transformers 5, not one module per expert: remote code, v4) that
    peft's all-linear reaches (``CONVERTED_MOE_TYPES``)."""
    return spec.num_experts > 1 and not spec.separate_expert_modules and spec.model_type in CONVERTED_MOE_TYPES


def _moe_layers(spec: ModelSpec) -> int:
    return spec.total_layers if spec.num_moe_layers is None else spec.num_moe_layers


def _is_param_target(spec: ModelSpec, name: str, out: int) -> bool:
    return name.startswith("experts.") or (name.rsplit(".", 1)[-1] in ("gate", "router") and out == spec.num_experts)


def linear_module_leaves(spec: ModelSpec) -> tuple[str, ...]:
    """The leaf names of a block's ``nn.Linear`` modules (``q_proj``, ``down_proj``...): what a trainer that lists
    Linear modules itself targets (axolotl's lora_target_linear). A transformers-5 MoE's fused experts and its router
    are parameters of modules that are no Linear, so they are not among them."""
    shapes = linear_shapes(spec)
    kept = [k for k, _, o, _ in shapes if not (fused_experts(spec) and _is_param_target(spec, k, o))]
    return tuple(dict.fromkeys(k.rsplit(".", 1)[-1] for k in kept))


def fused_stacks(spec: ModelSpec) -> list[tuple[str, int, int, int]]:
    """A transformers-5 MoE's 3-D expert stacks and its router, where the spec counts its experts only in
    ``expert_params`` (Qwen3-MoE from its config): one gate_up (h x 2 width) and one down per expert, the router
    (h x experts), per MoE layer (n: experts x MoE layers; the router's, MoE layers). Nothing where the count is not
    such stacks (with or without gpt-oss's biases) or each expert is a module of its own."""
    if spec.num_experts <= 1 or spec.separate_expert_modules:
        return []
    h, w, e, layers = spec.hidden_size, spec.moe_intermediate_size or spec.intermediate_size, spec.num_experts, _moe_layers(spec)
    if spec.expert_params not in (3 * h * w * e * layers, (3 * h * w + 2 * w + h) * e * layers):
        return []
    return [(_ROUTERS.get(spec.model_type, ROUTER), h, e, layers), (GATE_UP, h, 2 * w, e * layers), (DOWN, w, h, e * layers)]


def all_linear_extra(spec: ModelSpec, shapes: list[tuple[str, int, int, int]]) -> list[tuple[str, int, int, int]]:
    """The expert stacks and router ``all-linear`` reaches on a converted MoE (``fused_experts``); nothing when the
    spec's own shapes list them."""
    if not fused_experts(spec) or any(_is_param_target(spec, k, o) for k, _, o, _ in shapes):
        return []
    return fused_stacks(spec)


def parameter_targets(spec: ModelSpec, names: tuple[str, ...], shapes: list[tuple[str, int, int, int]]
                      ) -> list[tuple[str, int, int, int]]:
    """The expert stacks and router weight a ``target_parameters`` list names, n counting the layers it reaches.

    peft matches each name against a parameter's full path by suffix: ``mlp.experts.gate_up_proj`` reaches every MoE
    layer's stack, ``22._checkpoint_wrapped_module.mlp.experts.down_proj`` layer 22's only (axolotl's gpt-oss example
    adapts its last two layers' experts so). A name that reaches no fused stack is refused, naming those there are."""
    if not names:
        return []
    candidates = [s for s in shapes if _is_param_target(spec, s[0], s[2])] or fused_stacks(spec)
    layers = _moe_layers(spec)
    reached: dict[tuple[str, int, int, int], set[int] | None] = {}
    for target in names:
        path = target.removesuffix(".weight")
        stack = next((s for s in candidates if path == s[0] or path.endswith("." + s[0])), None)
        index = [int(p) for p in path.split(".") if p.isdigit()]
        if stack is None or (index and index[-1] >= spec.num_layers):
            there = ", ".join(f"mlp.{s[0]}" if s[0].startswith("experts.") else f"{s[0]}.weight" for s in candidates)
            raise InvalidSetupError(f"LoRA target_parameters {target!r} reaches no fused expert stack or router of {spec.name}; "
                                    f"accepted: {there or 'none (its experts are no 3-D parameters perfguide counts)'}, "
                                    "optionally after a layer index (22.mlp.experts.down_proj)")
        seen = reached.get(stack, set())
        reached[stack] = None if seen is None or not index else seen | {index[-1]}
    return [(name, i, o, n // layers * (layers if hit is None else len(hit))) for (name, i, o, n), hit in reached.items()]


#: peft 0.21 ``_MOE_TARGET_MODULE_MAPPING``: the v4 names a target list may spell, by conversion pattern (transformers
#: 5.24 ``_MODEL_TO_CONVERSION_PATTERN``: mixtral and minimax take the mixtral one, the other converted types qwen2_moe's)
_V4_NAMES = {"mixtral": {"gate": ROUTER, "w1": GATE_UP, "w3": GATE_UP, "w2": DOWN},
             "qwen2_moe": {"gate": ROUTER, "gate_proj": GATE_UP, "up_proj": GATE_UP, "down_proj": DOWN}}
_MIXTRAL_PATTERN = frozenset({"mixtral", "minimax", "minimax_m2"})


def listed_targets(spec: ModelSpec, targets: tuple[str, ...], shapes: list[tuple[str, int, int, int]]
                   ) -> tuple[tuple[str, ...], list[tuple[str, int, int, int]]]:
    """(the targets left as modules, the expert stacks and router they became) for a target list on a converted MoE.

    peft rewrites a listed v4 name (equal, or ending in ``.<name>``) to its expert parameter and drops it from the
    module targets (``_convert_peft_config_moe``): ``down_proj`` on Qwen3-MoE adapts the expert stack, and no longer
    a dense or shared MLP's Linear of that name. One half of a fused pair (``gate_proj`` without ``up_proj``) is
    refused, as peft refuses it."""
    if not fused_experts(spec):
        return targets, []
    names = _V4_NAMES["mixtral" if spec.model_type in _MIXTRAL_PATTERN else "qwen2_moe"]
    olds = {t: old for t in targets for old in names if t == old or t.endswith("." + old)}
    fused = {old for old, new in names.items() if new == GATE_UP}
    if 0 < len(fused & set(olds.values())) < len(fused):
        raise InvalidSetupError(f"LoRA target_modules name {sorted(fused & set(olds.values()))} but not "
                                f"{sorted(fused - set(olds.values()))} on {spec.name} ({spec.model_type}): peft fuses them into the "
                                "experts' gate_up_proj and refuses one without the other; list both, or neither")
    stacks = {names[old] for old in olds.values()}
    candidates = [s for s in shapes if _is_param_target(spec, s[0], s[2])] or all_linear_extra(spec, shapes)
    chosen = [s for s in candidates if (s[0] if s[0].startswith("experts.") else ROUTER) in stacks]
    return tuple(t for t in targets if t not in olds), chosen


def split_targets(spec: ModelSpec, chosen: list[tuple[str, int, int, int]], r: int, doubled: bool = True,
                  named: bool = False) -> tuple[list[tuple[str, int, int, int]], list[tuple[int, int, int]], ExpertAdapters | None]:
    """(Linears with per-token LoRA branches, trainable (count, rows, cols) of the ParamWrapper adapters, the block's
    merged-weight facts) of the chosen targets. ``chosen`` counts an expert stack once per expert (n = experts x
    layers); gate_up trains at rank 2r where peft's conversion of gate_proj + up_proj set its rank_pattern
    (``doubled``), at r where only ``target_parameters`` named it (``named``: some did)."""
    if not (fused_experts(spec) or named):
        return chosen, [], None
    linear = [t for t in chosen if not _is_param_target(spec, t[0], t[2])]
    params = [t for t in chosen if _is_param_target(spec, t[0], t[2])]
    if not params:
        return chosen, [], None
    layers, e = _moe_layers(spec), spec.num_experts
    groups: list[tuple[int, int, int]] = []
    expert = factors = router = router_factors = ranked = router_ranked = 0
    for name, i, o, n in params:
        if name.startswith("experts."):   # one (rank x experts, in) lora_A and (out, rank x experts) lora_B per layer
            rank = 2 * r if name == GATE_UP and doubled else r
            groups += [(n // e, rank * e, i), (n // e, o, rank * e)]
            expert += i * o * n // layers
            factors += rank * (i + o) * n // layers
            ranked += rank * i * o * n // layers
        else:
            groups += [(n, r, i), (n, o, r)]
            router += i * o * n // layers
            router_factors += r * (i + o) * n // layers
            router_ranked += r * i * o * n // layers
    trainable = sum(n * rows * cols for n, rows, cols in groups)
    adapted = max(n // e if name.startswith("experts.") else n for name, _, _, n in params)
    return linear, groups, ExpertAdapters(layers, expert, factors, router, router_factors, ranked, router_ranked, trainable,
                                          min(layers, adapted), _stack_grad_elems(params, e))


def _stack_grad_elems(params: list[tuple[str, int, int, int]], experts: int) -> int:
    """The merged stacks' gradient one adapted layer's backward holds above what its block saved. ``grouped_mm``'s
    backward makes the merged stack's whole gradient (its weight operand requires grad), alive until ``baddbmm``'s
    backward reduces it to the factors' gradients. Down runs last in forward, so its gradient comes first, beside both
    saved stacks (+D); then down's stack is freed and gate_up's gradient comes beside gate_up's (G - D above the
    saved G + D). Traced on peft's own modules (tests/test_target_parameters.py). Where the two are adapted in a
    different number of layers they are read as apart (max(G, D)). The router's gradient (h x experts) comes after,
    with both stacks freed: left out."""
    stacks = {name: (i * o * experts, n) for name, i, o, n in params if name.startswith("experts.")}
    gate_up, gu_layers = stacks.get(GATE_UP, (0, 0))
    down, down_layers = stacks.get(DOWN, (0, 0))
    return max(down, gate_up - down) if gate_up and down and gu_layers == down_layers else max(gate_up, down)


def stack_bytes(regime: str) -> int:
    """Bytes per element of the merged expert stack: the stored weight's dtype (fp32 weights stay fp32 under autocast:
    the merge's ``baddbmm`` runs with autocast disabled and ``grouped_mm`` is on no autocast list). ``regime``:
    activations.regime."""
    return 4 if regime in ("fp32", "amp") else 2


def expert_lora_bytes(spec: ModelSpec, setup: Setup, adapters: ExpertAdapters | None, adapter_bytes: int,
                      restores_inputs: bool, regime: str) -> int:
    """Bytes one block keeps for its ParamWrapper adapters, averaged over all layers (a MoE layer's bytes x MoE
    layers / layers). ``restores_inputs``: the frozen-FFN prices dropped the router and experts' weight-gradient
    inputs (False where every frozen Linear keeps its inputs anyway: FSDP + LoRA); ``regime``: activations.regime."""
    if adapters is None:
        return 0
    return _per_moe_layer(spec, setup, adapters, adapter_bytes, restores_inputs, regime) * adapters.moe_layers // spec.total_layers


def expert_lora_block_excess(spec: ModelSpec, setup: Setup, adapters: ExpertAdapters | None, adapter_bytes: int,
                             restores_inputs: bool, regime: str) -> int:
    """What the one block a checkpointed run recomputes keeps above ``expert_lora_bytes``' average, when it is an
    adapted one: its own merged stacks. Where every layer is adapted this is nothing; where a layer index in
    ``target_parameters`` adapts two of 24 (axolotl's gpt-oss example), the recomputed adapted block holds a whole
    layer's merged stacks (gpt-oss-20b: 1.6 GB in bf16), not a twelfth of them; likewise a MoE layer among dense ones."""
    if adapters is None or not adapters.adapted_layers:
        return 0
    per_moe_layer = _per_moe_layer(spec, setup, adapters, adapter_bytes, restores_inputs, regime)
    one_block = per_moe_layer * adapters.moe_layers // adapters.adapted_layers
    return max(0, one_block - per_moe_layer * adapters.moe_layers // spec.total_layers)


def merged_stack_grad_bytes(adapters: ExpertAdapters | None, regime: str) -> int:
    """An adapted layer's merged-stack gradient in its backward (``_stack_grad_elems``), in the stack's dtype."""
    return adapters.stack_grad_elems * stack_bytes(regime) if adapters else 0


def _per_moe_layer(spec: ModelSpec, setup: Setup, adapters: ExpertAdapters, adapter_bytes: int, restores_inputs: bool,
                   regime: str) -> int:
    weight = stack_bytes(regime)                            # the expert stack's dtype (bf16 / fp16 / fp32)
    router = 2 if regime == "amp" else weight              # the router matmul's dtype: autocast's 16-bit cast
    # under autocast the router's matmul keeps a 16-bit cast of its weight, merged or frozen alike: nothing added
    per_layer = adapters.expert_elems * weight + (0 if regime == "amp" else adapters.router_elems * router)
    if adapter_bytes != weight:                             # fp32 adapters cast to the base's 16 bits for baddbmm
        per_layer += adapters.factor_elems * weight
    if regime == "amp":                                     # the router delta B @ A under autocast: 16-bit casts
        per_layer += adapters.router_factor_elems * 2
    if restores_inputs:
        h, k = spec.hidden_size, spec.num_experts_per_tok
        routed = (h + (spec.moe_intermediate_size or spec.intermediate_size)) * k
        per_token = (h * router if adapters.router_elems else 0) + (routed * weight if adapters.expert_elems else 0)
        per_layer += setup.micro_batch_size * setup.seq_len * per_token * adapters.adapted_layers // max(1, adapters.moe_layers)
    return per_layer
