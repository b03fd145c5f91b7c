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

from accuracy_setup import Skip

from perfguide.memory import fused_head
from perfguide.memory.loss_path import version_tuple

TRL_RELEASE = re.compile(r"\btrl==(\d+\.\d+(?:\.\d+)?)")
UNPRICED = ("KTOTrainer", "GRPOTrainer", "RLOOTrainer")
FUSED_DPO = (1, 15)   # DPOTrainer's fused LM head, the only DPO loss path techniques/dpo.py prices


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
        if version_tuple(release) < FUSED_DPO:
            raise Skip(f"not expressible: TRL {release}'s DPOTrainer scores on full [2b, s, V] logits (dpo_trainer.py: "
                       "selective_log_softmax_and_entropy without Liger); perfguide prices DPOTrainer's fused LM head "
                       "(TRL >= 1.15)")
        return {"objective": "dpo", "trainer": "trl"}
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
    saved = fused_head.installed_trl
    fused_head.installed_trl = lambda: release   # type: ignore[assignment]
    try:
        yield
    finally:
        fused_head.installed_trl = saved   # type: ignore[assignment]
