"""bitsandbytes is chosen only where the target's capability flags say it runs.

QLoRA's NF4 base, LLM.int8() weights and the bnb optimizers (8-bit, paged) are kernels of one library whose
support is a fact of (card, bitsandbytes release), written per GPU row in data/gpus.json
(``capabilities.bitsandbytes``: NF4/FP4 and 8-bit optimizers; ``capabilities.llm_int8``: LLM.int8()). Rules read
the flags, never the vendor or the compute capability: a card whose flag is off never gets a bnb rung or a bnb
quantization, and a user who asks for one gets one line naming the flag and what runs instead.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..errors import ConflictingConstraintsError
from ..hardware.types import GPU, Hardware
from ..optimizer_facts import rows as optimizer_rows
from ..setup import Setup
from ..techniques import Rung

SOURCE = "https://huggingface.co/docs/bitsandbytes/v0.50.2/en/installation"


def bnb_optimizers() -> tuple[str, ...]:
    """Every ``optim`` name that runs on bitsandbytes kernels (8-bit, paged): data/optimizers.json ``package``."""
    return tuple(name for name, row in optimizer_rows().items() if row.package == "bitsandbytes")


def _lacking(hardware: Hardware, flag: str) -> GPU | None:
    """The first GPU of the target whose capability ``flag`` is off (every rank runs the same kernels)."""
    return next((g for g in hardware.gpus if not getattr(g.capabilities, flag)), None)


def _flag_for(weights_dtype: str | None) -> str | None:
    return {"int8": "llm_int8", "nf4": "bitsandbytes"}.get(weights_dtype or "")


def needs_missing_flag(setup: Setup, hardware: Hardware) -> str | None:
    """The capability flag ``setup`` needs and some GPU of ``hardware`` lacks (None: it can run there)."""
    if setup.device != "cuda":
        return None
    flags = [f for f in (_flag_for(setup.weights_dtype),
                         "bitsandbytes" if setup.optimizer in bnb_optimizers() else None) if f]
    return next((f for f in flags if _lacking(hardware, f) is not None), None)


def runnable_rungs(rungs: Iterable[Rung], hardware: Hardware) -> list[Rung]:
    """The ladder without the templates the target's bnb flags rule out; a rung left with none is dropped."""
    out = []
    for rung in rungs:
        kept = tuple(t for t in rung.templates if needs_missing_flag(t, hardware) is None)
        if kept:
            out.append(rung if len(kept) == len(rung.templates) else Rung(rung.name, rung.tradeoff, kept))
    return out


def quantization_runs(weights_dtype: str, hardware: Hardware) -> bool:
    """Whether bitsandbytes ``weights_dtype`` ('int8' / 'nf4') runs on every GPU of the target."""
    flag = _flag_for(weights_dtype)
    return flag is None or not hardware.gpus or _lacking(hardware, flag) is None


def _refusal(what: str, flag: str, gpu: GPU, instead: str) -> ConflictingConstraintsError:
    return ConflictingConstraintsError(f"{what} needs bitsandbytes, and {gpu.name} has capabilities.{flag}=false "
                                       f"(data/gpus.json, per {SOURCE}); {instead}")


def check_bnb_constraints(finetune: str | None, optimizer: str | None, quantization: str | None,
                          hardware: Hardware) -> None:
    """Refuse, in one line, a bitsandbytes constraint the target's flags say cannot run on its GPUs."""
    if not hardware.gpus:
        return  # CPU scenarios refuse QLoRA on their own (applicable.py)
    gpu = _lacking(hardware, "bitsandbytes")
    if gpu is not None and finetune == "qlora":
        raise _refusal("finetune='qlora' (a 4-bit NF4 base)", "bitsandbytes", gpu, "use finetune='lora' or 'full'")
    if gpu is not None and optimizer in bnb_optimizers():
        others = "'adamw_torch_fused', 'adafactor'"
        raise _refusal(f"optimizer={optimizer!r}", "bitsandbytes", gpu, f"use a torch optimizer ({others}) or leave optimizer unset")
    flag = _flag_for(quantization)
    lacking = _lacking(hardware, flag) if flag else None
    if flag and lacking is not None:
        other = "nf4" if quantization == "int8" else "int8"
        instead = (f"use quantization={other!r}, or none (16-bit weights)" if quantization_runs(other, hardware) else
                   "use no quantization (16-bit weights), or engine='vllm' with quantization='fp8', 'awq' or 'gptq'")
        raise _refusal(f"quantization={quantization!r}", flag, lacking, instead)
