"""The step time of LoRA on a transformers-5 MoE's fused experts and router: peft's merged weight, not an adapter branch.

peft >= 0.20 adapts the 3-D expert stacks and the router weight as ``target_parameters`` (memory/moe_lora.py): no
per-token ``x A B`` runs. Each forward, ``ParamWrapper._activate_lora`` registers a parametrization that rebuilds the
whole stack as ``W + s lhs rhs`` (peft 0.21 ``_LoraFactorsProxy``: one ``baddbmm`` over the experts, ``2 E in out r'``
FLOPs, reading W and writing a tensor its size) and runs transformers' ``grouped_mm`` experts on it. So, per MoE layer
and micro-step (counted on real CPU tensors, tests/test_moe_lora_speed.py):

- the merge runs twice per forward: ``torch.nn.utils.parametrize.register_parametrization`` (``unsafe=False``, peft's
  call) evaluates the new parametrization once to check its shape and dtype (``ParametrizationList.__init__``; by
  design, pytorch/pytorch#58488: errors surface at registration), then the experts' access computes it again inside
  ``parametrize.cached()``; a checkpointed block's recompute registers and merges again;
- backward, the merged weight requires grad, so ``grouped_mm`` computes its full weight gradient over the routed
  tokens (``2 x tokens x k x in x out``: a full fine-tune's expert weight-gradient FLOPs), writes it (E x in x out) and
  the ``baddbmm`` backward reads it twice for the two factors' gradients (``2 x 2 E in out r'``);
- the router, a 2-D weight (``_LoraParameterProxy``): its delta ``B A`` once per forward (``2 E h r``), its gradients
  (``4 E h r``) and the merged router weight's gradient (``2 x tokens x h x E``); its bytes (E x h) are left out.

These replace the ``6 x adapter parameters x tokens`` a per-Linear adapter costs (speed/training.py): the stacks'
r x experts rows never run per token. The merge (inner dimension r') and the factors' gradients are memory-bound:
at Qwen3-30B-A3B's size a checkpointed micro-step moves its 1.2 GB bf16 stack 11 times per layer, ~640 GB. Not
priced: the host time of registering and removing the parametrization each forward (not measured).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..memory.activations import regime
from ..memory.ledger import ledger
from ..memory.moe_lora import stack_bytes
from ..model.types import ModelSpec
from ..setup import Setup

#: merges of each expert stack per forward: register_parametrization's consistency check, then the access
MERGES_PER_FORWARD = 2


@dataclass(frozen=True)
class MergedCost:
    """One micro-step's cost of the ParamWrapper adapters on one device (see module doc)."""

    flops: float           # the merges (recomputed forwards included), factor gradients, merged weights' gradients
    model_flops: float     # the same without the recomputed forwards' merges
    bytes: float           # merged stacks written and read, their gradients written and read twice
    adapter_params: int    # the adapters' trainable elements, which run no per-token branch


NONE = MergedCost(0.0, 0.0, 0.0, 0)


def merged_cost(spec: ModelSpec, setup: Setup, tokens: float, recompute: float) -> MergedCost:
    """The merged-weight path of one micro-step over ``tokens`` matmul tokens, ``recompute`` forwards re-run in
    backward (checkpointing); nothing where no expert stack or router is a LoRA target (memory/ledger's ``experts``)."""
    adapters = ledger(spec, setup).experts
    if adapters is None:
        return NONE
    merges = MERGES_PER_FORWARD * 2.0 * adapters.rank_elems + 2.0 * adapters.router_rank_elems   # one forward's
    routed = tokens * spec.num_experts_per_tok * adapters.expert_elems / spec.num_experts
    backward = 4.0 * (adapters.rank_elems + adapters.router_rank_elems) + 2.0 * (routed + tokens * adapters.router_elems)
    stack = adapters.expert_elems * stack_bytes(regime(setup))
    moved = (1 + recompute) * MERGES_PER_FORWARD * 2 * stack + 3 * stack   # W read + merged written; grad written, read twice
    layers = adapters.moe_layers
    return MergedCost(layers * ((1 + recompute) * merges + backward), layers * (merges + backward), layers * moved,
                      adapters.adapter_params)
