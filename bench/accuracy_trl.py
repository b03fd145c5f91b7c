"""Rows that name the TRL release they ran (``trl==X`` in their method): which trainer and loss path priced them.

A row's TRL trainer is read from its method (SFTTrainer, DPOTrainer; KTO, GRPO and RLOO are steps perfguide does not
price), its loss path from the release (perfguide/memory/fused_head.py eras, data/trl.json), which is patched in
for the row while it is priced (``trl_release``), as accuracy_runtime does for transformers' releases. Rows that
name no TRL release are priced as before (HF Trainer's loss path), whatever trainer their source used: every such
row predates TRL 1.7, the first release whose SFTTrainer builds no full logits.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

from _releases import release_as
from accuracy_setup import Skip

from perfguide.integrations.readers.training_args import TRL_NO_KBIT_PREP
from perfguide.memory import fused_head
from perfguide.memory.loss_path import version_tuple
from perfguide.techniques.qlora import trl_casts_adapters

TRL_RELEASE = re.compile(r"\btrl==(\d+\.\d+(?:\.\d+)?)")
UNPRICED = ("KTOTrainer", "GRPOTrainer", "RLOOTrainer")


def row_trl_release(row: dict[str, str]) -> str | None:
    m = TRL_RELEASE.search(row["method"])
    return m.group(1) if m else None


def trl_fields(row: dict[str, str]) -> dict[str, object]:
    """The Setup fields of a row that ran a TRL trainer at a stated release; Skip for a step perfguide cannot price."""
    release = row_trl_release(row)
    if release is None:
        return {}
    method = row["method"]
    for name in UNPRICED:
        if name in method:
            raise Skip(f"not expressible: TRL's {name} step (its own objective, rollouts or scoring passes) is not one "
                       "perfguide prices (objective sft or dpo)")
    if "DPOTrainer" in method:
        if fused_head.trl_era(release).dpo_loss == "unpriced":
            raise Skip(f"not expressible: TRL {release}'s DPOTrainer (0.x concatenated_forward, its reference pass first) "
                       "is not priced; perfguide prices DPOTrainer from TRL 1.0 (data/trl.json eras)")
        fields: dict[str, object] = {"objective": "dpo", "trainer": "trl"}
        if "bf16=True" in row.get("precision", ""):
            # the trainer's bf16=True makes accelerate return the model's outputs through convert_outputs_to_fp32 on
            # bf16 weights too (autocast changes no matmul there): DPOTrainer reads fp32 logits (memory/dpo_logits.py)
            fields["autocast"] = "bf16"
        return fields
    if "loss_type='nll'" in method and fused_head.trl_era(release).sft_loss == "chunked":
        return {"trainer": "transformers"}   # 1.7-1.14's 'nll': the model's own loss on full logits, as HF Trainer
    return {"trainer": "trl"}


@contextmanager
def trl_release(row: dict[str, str]) -> Iterator[None]:
    """Price the row with the TRL release it names (the installed one otherwise)."""
    release = row_trl_release(row)
    if release is None:
        yield
        return
    with release_as(fused_head, "installed_trl", release):
        yield


def trl_kbit_fields(row: dict[str, str], fields: dict[str, object]) -> dict[str, object]:
    """A quantized LoRA row's dtypes as the TRL release it names leaves them: from 0.26 no peft k-bit preparation
    (embedding, head and norms in the load dtype) and, from 0.26 for SFT and 0.29 for DPO, every trainable parameter
    but DoRA's magnitude cast to bf16 (the thresholds perfguide's config reader uses, read in the trainers' code)."""
    release = row_trl_release(row)
    lora = fields.get("lora")
    if release is None or lora is None or fields.get("weights_dtype") not in ("nf4", "int8"):
        return {}
    at = version_tuple(release)[:2]
    out: dict[str, object] = {"kbit_upcast": False, "kbit_recast_bf16": False} if at >= TRL_NO_KBIT_PREP else {}
    if trl_casts_adapters(release, dpo=fields.get("objective") == "dpo", use_dora=lora.use_dora):  # type: ignore[attr-defined]
        out["lora"] = lora.model_copy(update={"adapter_dtype": "bf16"})  # type: ignore[attr-defined]
    return out
