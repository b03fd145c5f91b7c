"""fp32 master weights or pure bf16: the trade a full fine-tune makes, stated with its numbers and sources.

AMP keeps an fp32 copy of every weight (plus fp32 grads and optimizer states); pure bf16 stores all of them in
bf16, saving roughly half of the model states, at the risk that updates smaller than bf16's resolution
(8 bits of mantissa: ~0.4% of the weight) round away. Zamirai et al. (arXiv:2010.06192) measure that loss with
nearest rounding and recover fp32 accuracy with stochastic rounding or Kahan summation; public recipes
(torchtune's full fine-tunes, dtype: bf16) run pure bf16 at fine-tuning learning rates. The ladder keeps fp32
masters first (the reference semantics); this decision shows what the other choice would have cost or saved.
"""

from __future__ import annotations

from ..decisions import Alternative, Decision
from ..errors import ConflictingConstraintsError
from ..setup import Setup
from ..techniques.precision import BF16_RECIPE, BF16_UPDATE_PAPER, FSDP2_UPCAST, pure_half
from ..techniques.torchtune_loss import TORCHTUNE_DTYPE
from .search import Priced, gib, price, usable_bytes
from .strategies import layout_of, pure_half_unsupported
from .types import Request

RISK = ("bf16 weights round away updates below ~1/256 of a weight (8-bit mantissa): nearest rounding can stall "
        "convergence at small learning rates; stochastic rounding or Kahan summation close the gap (arXiv:2010.06192)")


def _states(p: Priced) -> int:
    """Weights, grads and optimizer states wherever they live: an offloading plan keeps them in host RAM, where the
    GPU-side fields read ~0, so the host bytes count too (else the trade reads "0.0 GiB less")."""
    m = p.memory
    offloads = p.setup.offload_params or p.setup.offload_optimizer
    return m.weights + m.gradients + m.optimizer_states + (m.cpu_ram if offloads else 0)


def _other(s: Setup) -> tuple[Setup | None, str | None]:
    """The same plan with the other master-weights choice, or why it cannot run."""
    if pure_half(s):
        return s.replace(weights_dtype="fp32"), None
    if s.autocast != "bf16":
        return None, "pure bf16 needs bf16 compute (a GPU with bf16 tensor cores)"
    other = s.replace(weights_dtype="bf16")
    if s.strategy not in ("ddp", "single"):
        why = pure_half_unsupported(other, layout_of(other))
        if why:
            return None, why
    return other, None


def master_weights_decision(request: Request, chosen: Priced) -> list[Decision]:
    """A full fine-tune's master-weights choice with the memory, speed and convergence trade (none for LoRA)."""
    s = chosen.setup
    if s.task != "train" or s.lora is not None:
        return []
    value = "bf16" if pure_half(s) else "fp32"
    other_setup, why = _other(s)
    other = price(request.model, other_setup, request.hardware, request.calibration) if other_setup is not None else None
    asked = request.constraints.master_weights
    head = f"master_weights={asked!r} was requested" if asked else TORCHTUNE_DTYPE if s.trainer == "torchtune" else (
        "fp32 masters are the reference semantics and fit" if value == "fp32" else
        "no fp32-master setup of the rungs before pure bf16 fits")  # a later rung's may: the ladder tries pure bf16 first
    alts: tuple[Alternative, ...] = ()
    if other is None:
        reason = f"{head}; the other choice cannot run here: {why}"
    else:
        usable = usable_bytes(other.memory, request.constraints.headroom) or 0
        fits = "fits" if other.memory.needed <= usable else f"does not fit ({gib(usable)} usable)"
        saved = _states(other) - _states(chosen) if value == "bf16" else _states(chosen) - _states(other)
        speed = other.step_time / chosen.step_time if chosen.step_time else 1.0
        where = " (GPU and host RAM)" if s.offload_params or s.offload_optimizer else ""
        reason = (f"{head}; pure bf16 holds {gib(abs(saved))} less of weights, grads and optimizer states{where} "
                  f"({gib(_states(chosen))} here vs {gib(_states(other))} with master_weights={_flip(value)!r}, which {fits} at "
                  f"{gib(other.memory.device_total)} per device and {speed:.2f}x this step time); risk: {RISK}")
        alts = (Alternative(value=_flip(value), number=other.memory.device_total, unit="bytes",
                            why_not=(f"{gib(other.memory.device_total)} per device, {other.step_time:.3g} s/step; "
                                     + ("keeps fp32 masters but does not fit or is not needed" if value == "bf16" else
                                        "lossy updates; used only when fp32 masters do not fit or when asked"))),)
    sources = f"{BF16_UPDATE_PAPER}; {BF16_RECIPE}" + (f"; {FSDP2_UPCAST}" if s.is_fsdp else "")
    return [Decision(setting="master_weights", value=value, reason=reason, number=_states(chosen), unit="bytes",
                     source=sources, alternatives=alts)]


def _flip(value: str) -> str:
    return "fp32" if value == "bf16" else "bf16"


def check_master_weights(value: str | None, finetune: str) -> None:
    """``master_weights`` steers full fine-tunes; LoRA adapters always train over fp32 masters of their own."""
    if value == "bf16" and finetune != "full":
        raise ConflictingConstraintsError(f"master_weights='bf16' applies to full fine-tuning, not finetune={finetune!r} "
                                          "(LoRA/QLoRA adapters train in fp32 over a frozen 16-bit base); use master_weights=None or 'fp32'")
