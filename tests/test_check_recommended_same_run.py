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


def test_a_cut_cross_entropy_config_is_compared_with_a_cce_plan(tmp_path: Path) -> None:
    """CCE is never searched and its gradient filtering is not priced, so a plan without it would tell a CCE user to
    switch on a slow reading: the plan keeps it, and the edits leave the plugin alone. Where perfguide's plans cannot
    emit it (a model type apple/ml-cross-entropy's cce_patch lacks, which axolotl's fork patches), no plan is
    compared, and the note says why."""
    y = {**yaml.safe_load((DATA / "axolotl_qlora-1b.yml").read_text()),
         "plugins": ["axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin"]}
    path = tmp_path / "cce.yml"
    path.write_text(yaml.safe_dump(y), encoding="utf-8")
    rec = _recommended(perfguide.check("meta-llama/Llama-3.2-1B", path, hardware="rtx4090"))
    assert "cut_cross_entropy" not in rec.setup
    assert all("cut_cross_entropy" not in edit.keys for edit in rec.edits)
    qwen3 = perfguide.check("Qwen/Qwen3-0.6B", path, hardware="rtx4090")
    assert qwen3.setup.cut_cross_entropy and not [c for c in qwen3.changes if c.kind == "recommended"]
    assert any("no recommended plan to compare with" in n and "'qwen3'" in n for n in qwen3.notes)
