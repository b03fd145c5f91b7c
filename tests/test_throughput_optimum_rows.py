"""optimum-benchmark's Llama-2-7B PEFT training reports (published_throughput.csv 653-667): both report tables at
74cdf473 (RTX 4090 and A100-SXM4-80GB, single GPU, HF Trainer), every row, and each rate is the report's own counter.

The report's training.throughput(samples/s) is MeasurementCallback's (max_steps - warmup_steps) x batch over the
seconds from the begin of step 40 to on_train_end; the tokens are 256 per sample (random ids, no padding). The run
calls get_peft_model only, so the bnb base keeps its 16-bit embeddings and norms (no prepare_model_for_kbit_training).
Re-derived here from the counters the notes quote, never from what perfguide predicts.
"""

from __future__ import annotations

import re
from types import ModuleType

import pytest
from helpers import load_bench, throughput_rows_in

OPTIMUM = range(653, 668)


@pytest.fixture(scope="module")
def rows() -> ModuleType:
    return load_bench("throughput_rows")


@pytest.fixture(scope="module")
def loaded(rows: ModuleType) -> tuple[dict, dict[str, str], list[dict[str, str]], list[dict[str, str]]]:
    return throughput_rows_in(rows, OPTIMUM)


def test_both_reports_are_whole_and_each_rate_is_its_counter(loaded) -> None:
    """RTX 4090: bnb at batch 4/2/1, GPTQ at 2/1; A100: bnb and GPTQ at 16/8/4/2/1 (the reports' 15 rows)."""
    _, _, raw, _ = loaded
    assert len(raw) == 15
    tables = {t: sorted(int(r["micro_batch"]) for r in raw if f"table '{t}'" in r["notes"]) for t in ("RTX4090-24GB", "A100-80GB")}
    assert tables == {"RTX4090-24GB": [1, 1, 2, 2, 4], "A100-80GB": [1, 1, 2, 2, 4, 4, 8, 8, 16, 16]}
    for r in raw:
        m = re.search(r"training.throughput\(samples/s\) ([\d.]+) = \(max_steps 100 - warmup_steps 40\) x (\d+) samples "
                      r"/ training.runtime\(s\) ([\d.]+)", r["notes"])
        assert m, r["row_id"]
        assert float(m.group(1)) == pytest.approx(60 * int(m.group(2)) / float(m.group(3)), rel=2e-4), r["row_id"]
        assert float(r["samples_per_s"]) == float(m.group(1)) and int(m.group(2)) == int(r["micro_batch"])


def test_a_4090_row_reads_as_single_gpu_hf_trainer_qlora_without_the_kbit_upcast(loaded) -> None:
    """Row 653: batch 4 x 256 tokens at 14.167 samples/s -> 3627 tokens/s on one RTX 4090."""
    by_id, _, _, _ = loaded
    row = by_id["653"]
    assert row.published == pytest.approx(14.167353782876267 * 256)
    assert (row.group, row.table, row.framework) == ("optimum-benchmark-llama-peft", "optimum-benchmark-llama-peft: RTX4090-24GB", "hf_trainer")
    s = row.setup
    assert (s.micro_batch_size, s.seq_len, s.gradient_accumulation_steps, s.world_size, s.strategy) == (4, 256, 1, 1, "single")
    assert (s.weights_dtype, s.autocast, s.optimizer, s.gradient_checkpointing, s.kbit_upcast) == ("nf4", None, "adamw_torch", False, False)
    assert s.lora is not None and (s.lora.r, s.lora.alpha, s.lora.target_modules) == (8, 8, ("q_proj", "v_proj"))
    assert s.attn_implementation == "eager" and row.optimizer_impl is None and row.steps is None
    assert row.hardware.smallest_gpu is not None and row.hardware.smallest_gpu.name == "rtx4090"
    assert by_id["658"].hardware.smallest_gpu.name == "a100-80gb" and by_id["658"].setup.micro_batch_size == 16


def test_gptq_rows_are_listed_and_only_these_rows_skip_the_upcast(loaded) -> None:
    by_id, why, raw, every = loaded
    gptq = sorted(r["row_id"] for r in raw if r["model"] == "TheBloke/Llama-2-7B-GPTQ")
    assert gptq == ["656", "657", "660", "662", "664", "665", "667"] and all("GPTQ" in why[k] for k in gptq)
    assert sorted(k for k in by_id if int(k) in OPTIMUM) == ["653", "654", "655", "658", "659", "661", "663", "666"]
    skipping = {r["row_id"] for r in every if "skips prepare_model_for_kbit_training" in r["notes"]}
    assert skipping == {r["row_id"] for r in raw}
    assert all(c.setup.kbit_upcast for k, c in by_id.items() if k not in skipping)
