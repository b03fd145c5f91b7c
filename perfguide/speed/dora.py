"""DoRA's step time beyond LoRA's: the weight norm every forward, and the base matmul again where dropout is on.

peft's ``DoraLinearLayer.forward`` (0.21; the same arithmetic since 0.12) does, per adapted Linear and forward:

- the delta weight through the modules (``get_lora_weight``: ``lora_B(lora_A(torch.eye(in))).T``, so FSDP's hooks
  run): ``2 in^2 r + 2 in r out`` FLOPs, and an in x in identity written and read (before peft 0.12
  ``lora_B.weight @ lora_A.weight``: ``2 r in out``, no identity);
- the column norm ``||W.to(x.dtype) + s BA||`` (``get_weight_norm``), detached as the paper's section 4.3 says, so
  no gradient flows through it: memory-bound passes over in x out elements, counted below;
- where the base matmul runs again (``memory.lora_activations.dora_reruns_base``: ``lora_dropout`` > 0, or peft
  before 0.14), ``F.linear(dropout(x), W)``: ``2 T in out`` FLOPs forward and as many backward for the input's
  gradient (the frozen weight takes none).

A checkpointed block's recompute runs all of it again. Counted on real CPU tensors (FlopCounterMode,
tests/test_dora_speed.py). Bytes per forward and weight element, with ``a`` the adapters' bytes (x is cast to them):
the weight cast where its dtype differs (read ``w``, write ``a``; a k-bit base dequantized to 16 bits first), the delta written (``a``), scaled (read and write
``a``), added (read two, write one) and the norm's read: ``7a`` (+ ``w + a``); the identity ``in^2 a``, written and
read. Not priced: autocast's casts of the delta and identity (a few bytes more per element), the magnitude-sized
vectors. Beside the norm, the magnitude scalings of the base and adapter outputs and their gradients move bytes per
token and adapted output unit (``token_bytes``, counted by scripts/count_dora_bytes.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..memory.ledger import ledger
from ..memory.lora_activations import adapter_dtype_bytes, dora_identity, dora_reruns_base
from ..model.types import ModelSpec
from ..setup import DTYPE_BYTES, Setup
from .rates import constant

#: bytes moved per weight element by the norm's passes, in units of the adapters' bytes (see the module doc)
NORM_PASSES = 7


@dataclass(frozen=True)
class DoraCost:
    """One micro-step's DoRA cost on one device (see module doc)."""

    flops: float          # the identity matmuls and the re-run matmul, recomputed forwards included
    model_flops: float    # the same without the recomputed forwards
    bytes: float          # the norm's memory-bound passes, recomputed forwards included
    fp32_flops: float = 0.0   # of ``flops``, the re-run matmuls that run in fp32 on a 16-bit step (see fp32_rerun)


NONE = DoraCost(0.0, 0.0, 0.0)


def dora_cost(spec: ModelSpec, setup: Setup, tokens: float, recompute: float) -> DoraCost:
    """DoRA's extra work over ``tokens`` matmul tokens, ``recompute`` forwards re-run in backward; nothing without DoRA."""
    led = ledger(spec, setup)
    if setup.lora is None or not led.dora_weights_per_layer:
        return NONE
    weights, layers = led.dora_weights_per_layer, spec.total_layers
    # before peft 0.12 the delta is lora_B.weight @ lora_A.weight: 2 r in out, no identity (DORA_IDENTITY)
    through_identity = dora_identity(setup)
    identity = 2.0 * setup.lora.r * (led.dora_identity_per_layer if through_identity else weights)
    rerun = 2.0 * tokens * weights if dora_reruns_base(setup) else 0.0   # forward; its input gradient as many
    forward, backward = identity + rerun, rerun
    a = adapter_dtype_bytes(setup)
    w = DTYPE_BYTES[setup.weights_dtype]
    if setup.weights_dtype in ("int8", "nf4"):   # dequantized to 16 bits every forward, then cast to the adapters'
        cast = w + 2 + (2 + a if a != 2 else 0)
    else:
        cast = 0 if w == a else w + a
    moved = weights * (NORM_PASSES * a + cast) + (2 * (led.dora_identity_per_layer - weights) * a if through_identity else 0)
    runs = 1 + recompute
    fp32 = layers * (runs * rerun + rerun) if fp32_rerun(setup) else 0.0
    scaled = layers * tokens * led.dora_outputs_per_layer * token_bytes(setup, recompute)
    return DoraCost(layers * (runs * forward + backward), layers * (forward + backward), layers * runs * moved + scaled, fp32)


def token_bytes(setup: Setup, recompute: float) -> float:
    """Bytes per token and adapted output unit of DoRA's magnitude scalings, forward and backward (counted on CPU
    tensors: efficiency.json ``dora_token_bytes``); a checkpointed forward adds its ``recompute_share``."""
    table = constant("dora_token_bytes")
    key = ("autocast" if setup.autocast is not None else "plain") + ("_dropout" if setup.lora and setup.lora.dropout > 0 else "")
    return float(table[key]) * (1 + float(table["recompute_share"]) * recompute)


def fp32_rerun(setup: Setup) -> bool:
    """The re-run matmul runs in fp32 although the step computes in 16 bits: peft casts x to fp32 adapters' dtype and
    the weight to x's (``weight.to(x.dtype)``), and without autocast nothing casts them back (a pure-bf16 step with
    peft's default autocast_adapter_dtype). torch runs fp32 matmuls in full fp32 by default
    (``torch.backends.cuda.matmul.allow_tf32 = False`` since 1.12)."""
    return (setup.autocast is None and adapter_dtype_bytes(setup) == 4 and setup.compute_dtype not in ("fp32", "tf32")
            and dora_reruns_base(setup))
