"""What a QLoRA plan does with the parameters bitsandbytes leaves unquantized (embeddings, LM head, norms).

peft's ``prepare_model_for_kbit_training`` casts every one of them to fp32. That was the QLoRA tutorials' first step,
but the trainers users run now skip it: TRL's SFTTrainer (0.26 on) leaves them in the load dtype. An
fp32 embedding and head cost 2 more bytes per vocabulary row x hidden each, and the fp32 norms turn the residual
stream fp32 (twice the checkpointed block inputs), so on a Llama-3-8B the upcast costs ~3 GiB at any length and
about a quarter of the context a 24 GB card holds. perfguide's plans keep them 16-bit (the QLoRA rung's template);
this decision says so, with the bytes the upcast would add on the same plan.
"""

from __future__ import annotations

from ..decisions import Alternative, Decision
from ..techniques.qlora import PLAN_CAST_SOURCE
from .search import Priced, gib, price
from .types import Request


def kbit_cast_decision(request: Request, chosen: Priced) -> tuple[Decision, ...]:
    """The upcast left out of a quantized plan, priced on the same Setup; none for a plan that upcasts (a reader's
    setup as the user wrote it) or has no quantized base."""
    s = chosen.setup
    if not s.quantized or s.kbit_upcast:   # a quantized training Setup always carries LoRA (Setup validation)
        return ()
    upcast = price(request.model, s.replace(kbit_upcast=True), request.hardware, request.calibration)
    more = upcast.memory.needed - chosen.memory.needed
    reason = (f"embeddings, LM head and norms stay in their 16-bit load dtype (no peft prepare_model_for_kbit_training), "
              f"as TRL's SFTTrainer leaves them: its fp32 upcast would need {gib(more)} more on this plan "
              f"({gib(upcast.memory.needed)} against {gib(chosen.memory.needed)})")
    why_not = (f"peft's fp32 embeddings, head and norms make the residual stream fp32: +{gib(more)}, "
               "for numerics the norms already compute in fp32 inside transformers' RMSNorm")
    return (Decision(setting="kbit_upcast", value=False, reason=reason, number=more, unit="bytes saved",
                     source=PLAN_CAST_SOURCE, alternatives=(Alternative(value=True, why_not=why_not, number=more, unit="bytes"),)),)
