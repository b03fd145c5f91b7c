"""`perfguide check`'s "toward the recommended plan" keeps what the config states about the run itself.

The plan it compares with is recommend()'s for the same model, machine, length and global batch; it once dropped the
way of training and the data's shape: a DPO config was compared with an SFT plan, and a config that packs (axolotl
``sample_packing``) was told to stop packing, because with no ``avg_seq_len`` perfguide prices full rows, where packing
gains nothing. Packing on short samples is the user's reason to pack; only the user can say it does not pay.
"""
from __future__ import annotations

from pathlib import Path

import yaml

import perfguide
from perfguide.integrations.readers.verdict import Change
from perfguide.techniques.effects import StepShape
from perfguide.techniques.padding_free import PaddingFree

DATA = Path(__file__).parent / "data" / "check"


def _recommended(check: perfguide.Check) -> Change:
    found = [c for c in check.changes if c.kind == "recommended"]
    assert len(found) == 1
    return found[0]


def test_a_packing_config_is_compared_with_a_packing_plan() -> None:
    name = "axolotl_qlora-1b.yml"
    assert yaml.safe_load((DATA / name).read_text())["sample_packing"] is True   # the premise: the example packs
    check = perfguide.check("meta-llama/Llama-3.2-1B", DATA / name, hardware="rtx4090")
    rec = _recommended(check)
    assert "padding_free" not in rec.setup   # the plan packs too: no change of it to write back
    assert all("sample_packing" not in edit.keys for edit in rec.edits)


def test_a_dpo_config_is_compared_with_a_dpo_plan() -> None:
    check = perfguide.check("gpt2", {"beta": 0.1, "per_device_train_batch_size": 4}, hardware="a100-80gb", device="cuda")
    assert check.setup.objective == "dpo"
    assert "objective" not in _recommended(check).setup


def test_padding_free_without_avg_seq_len_attends_over_full_rows() -> None:
    """Without avg_seq_len every sample fills seq_len (real_tokens, and the packed mask's bytes, already read it so):
    SDPA runs one flattened row of mb x seq_len tokens under a block mask, FlashAttention-2 each sample alone."""
    base = perfguide.Setup(task="train", micro_batch_size=4, seq_len=4096, padding_free=True)
    shape = StepShape(4 * 4096, (4, 4096), 4 * 4096)
    for impl, attention in (("sdpa", (1, 16384)), ("flash_attention_2", (4, 4096))):
        out = PaddingFree().step_shape(base.model_copy(update={"attn_implementation": impl}), shape)
        assert (out.matmul_tokens, out.attention) == (16384, attention)
    stated = base.model_copy(update={"attn_implementation": "sdpa", "avg_seq_len": 4096})
    assert PaddingFree().step_shape(stated, shape) == PaddingFree().step_shape(base.model_copy(update={"attn_implementation": "sdpa"}), shape)
