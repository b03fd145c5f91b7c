"""A row's parallelism words read as Setup fields (ZeRO stage and offload, FSDP version and offload, DDP), and the
Skip every row reader raises for what perfguide's Setup cannot express. Split from bench/accuracy_setup.py, which
re-exports these names."""

from __future__ import annotations

import re


class Skip(Exception):
    """A row perfguide's Setup cannot express; the message is the reason shown in the report."""


def _int(text: str, default: int | None = None) -> int:
    m = re.search(r"\d+", text or "")
    if m:
        return int(m.group())
    if default is None:
        raise Skip(f"no number in {text!r}")
    return default


def offloads(par: str) -> bool:
    """An FSDP row's CPU offload, said as "+ CPU offload" or a CPUOffload / offload_params setting; "no offload" and
    "without CPU offload" say the opposite."""
    low = par.lower()
    return "offload" in re.sub(r"\b(no|without)( cpu)? offload\b", "", low)


def sequence_parallel(par: str) -> int:
    """The ranks that split each sequence: DeepSpeed Ulysses (ALST, ms-swift, the HF blog: "sequence parallel N"),
    torchtitan's context parallelism ("CP N"); 1 where the row names none (Setup.sequence_parallel)."""
    m = re.search(r"sequence parallel (\d+)|\bCP (\d+)", par)
    return int(m.group(1) or m.group(2)) if m else 1


def _strategy(row: dict[str, str]) -> dict[str, object]:
    sp = sequence_parallel(row["parallelism"])
    out = _data_parallel(row)
    return {**out, "sequence_parallel": sp} if sp > 1 else out


def _data_parallel(row: dict[str, str]) -> dict[str, object]:
    par = row["parallelism"]
    zero = re.search(r"DeepSpeed ZeRO-([123])", par)
    if zero:  # "+ optimizer offload" (offload_optimizer) / "+ CPU offload of params and optimizer" (ZeRO-3 offload_param)
        added = par.lower().partition("+")[2]  # what follows the stage; "(no CPU offload)" before it adds nothing
        # a script that loads the model before its ZeRO-3 config exists (the row's notes say "no zero.Init", read in
        # its code): deepspeed.initialize moves the whole model onto every GPU first (Setup.zero3_init)
        # overlap_comm as the notes state it ("overlap_comm false": one ipg buffer); unstated: perfguide's own true
        overlap = re.search(r"overlap_comm (true|false)", row["notes"])
        return {"strategy": f"zero{zero.group(1)}", "offload_optimizer": "offload" in added,
                "offload_params": "offload of params" in added, "zero3_init": "no zero.Init" not in row["notes"],
                "overlap_comm": overlap is None or overlap.group(1) == "true"}
    if par.startswith("DDP"):
        return {"strategy": "ddp"}  # fsdp_qlora's "ddp" sharding: FSDP NO_SHARD, every GPU holds the whole model
    if any(k in par for k in ("TP", "PP", "tensor parallel", "pipeline")):
        raise Skip(f"parallelism {par!r} (TP/PP or pipeline) is not priced for training")
    if "SHARD_GRAD_OP" in par:  # FSDP1 unless the row says FSDP2 (the 2022 blog's accelerate 0.7 wrapped with torch's FSDP1)
        return {"strategy": "fsdp_shard_grad_op", "fsdp_version": 2 if "FSDP2" in par else 1}
    if "FSDP" in par:
        n = _int(row["num_gpus"], 1)
        offload = offloads(par)
        out: dict[str, object] = {"strategy": "fsdp" if n > 1 or offload else "single"}  # 1-GPU FSDP still offloads
        # FSDP2 (fully_shard) only where the row says so; litgpt/Lightning and the older HF rows ran FSDP1.
        # fsdp_qlora's FSDP1 is priced as FSDP2 (per-parameter): its llama-recipes policy wraps every leaf whose weight
        # requires grad as its own unit and uses use_orig_params=False (train.py lambda_policy_fn), so frozen weights
        # sit in FlatParameters that need no gradient, and a quantized unit is gathered as stored (quant_storage)
        # HF Trainer + PEFT under FSDP1 uses peft's fsdp_auto_wrap_policy (each trainable leaf its own unit): the same
        per_param = ("FSDP2" in par or any(k in row["source"] for k in ("torchtitan", "torchtune", "fsdp_qlora"))
                     or "fsdp_auto_wrap_policy" in row["method"])
        out["fsdp_version"] = 2 if per_param else 1
        if offload:
            out.update(offload_params=True, offload_optimizer=True)
        return out
    if par == "DDP":
        return {"strategy": "ddp"}
    return {"strategy": "single"}
