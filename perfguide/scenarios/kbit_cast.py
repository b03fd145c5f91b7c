"""What a QLoRA plan does with the parameters bitsandbytes leaves unquantized (embeddings, LM head, norms).

peft's ``prepare_model_for_kbit_training`` casts every one of them to fp32. That was the QLoRA tutorials' first step,
but the trainers users run now skip it: TRL's SFTTrainer (0.26 on) leaves them in the load dtype. An
fp32 embedding and head cost 2 more bytes per vocabulary row x hidden each, and the fp32 norms turn the residual
stream fp32 (twice the checkpointed block inputs), so on a Llama-3-8B the upcast costs ~3 GiB at any length and
about a quarter of the context a 24 GB card holds. perfguide's plans keep them 16-bit (the QLoRA rung's template);
this decision says so, with the bytes the upcast would add on the same plan.

The adapters are the other cast: SFTTrainer (0.26 on) trains them in bf16 on a quantized base, where PEFT alone leaves
them fp32; a bf16 plan prices them so (``techniques.qlora.trl_adapters``) and says what fp32 adapters would add.
"""

from __future__ import annotations

from ..decisions import Alternative, Decision
from ..techniques.qlora import ADAPTER_CAST_SOURCE, PLAN_CAST_SOURCE
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


def adapter_dtype_decision(request: Request, chosen: Priced) -> tuple[Decision, ...]:
    """The bf16 adapters of a quantized plan against PEFT's fp32 ones, priced on the same Setup; none where the plan's
    adapters are not the bf16 TRL casts (a 16-bit base, fp16 autocast, DoRA, a reader's setup)."""
    s = chosen.setup
    if not s.quantized or s.lora is None or s.lora.adapter_dtype != "bf16":
        return ()
    fp32 = price(request.model, s.replace(lora=s.lora.model_copy(update={"adapter_dtype": None})), request.hardware,
                 request.calibration)
    more = fp32.memory.needed - chosen.memory.needed
    host = fp32.memory.cpu_ram - chosen.memory.cpu_ram   # offloaded adapter states weigh on the host instead
    where = f"{gib(more)} more per GPU" + (f" and {gib(host)} more host RAM" if host > 0 else "")
    reason = (f"LoRA adapters train in bf16, as TRL's SFTTrainer casts them on a quantized base (prepare_model does the "
              f"same): parameters, gradients and AdamW moments take 2 bytes; PEFT's fp32 adapters would need {where}")
    why_not = f"PEFT's default fp32 adapters: {where} on this plan, where the QLoRA paper trains its adapters in bf16"
    return (Decision(setting="adapter_dtype", value="bf16", reason=reason, number=more, unit="bytes saved",
                     source=ADAPTER_CAST_SOURCE, alternatives=(Alternative(value="fp32", why_not=why_not, number=more, unit="bytes"),)),)
