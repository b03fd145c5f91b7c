"""The PEFT method comparison suite's MetaMathQA results (huggingface/peft method_comparison/MetaMathQA/results, one
row per result file, rows 1200-1262): every file is a row, the LoRA / DoRA / full fine-tuning rows read back as the
Setup their train_config and peft_config state, and every other PEFT method or LoRA variant is skipped with its name.
The trainable-parameter counts the result files print are checked against perfguide's adapter ledger (a hand count
of r x (in + out) per adapted Linear); perfguide's memory errors on these rows are reported by bench/accuracy.py."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest
from helpers import load_bench

from perfguide.memory.ledger import ledger

ROOT = Path(__file__).resolve().parents[1]
GROUP = "peft_method_comparison_metamathqa"


def _rows() -> list[dict[str, str]]:
    with (ROOT / "bench" / "data" / "published_measurements.csv").open(encoding="utf-8") as fh:
        return [r for r in csv.DictReader(fh) if r["source_group"] == GROUP]


def _trainable(row: dict[str, str]) -> int:
    """The result file's num_trainable_params, as the row's notes carry it."""
    found = re.search(r"trainable params ([\d,]+) of", row["notes"])
    assert found, row["notes"]
    return int(found.group(1).replace(",", ""))


def test_every_result_file_is_one_row_in_the_reserved_block() -> None:
    rows = _rows()
    assert len(rows) == 63 and [int(r["row_id"]) for r in rows] == list(range(1200, 1263))
    assert len({re.search(r"results/(\S+)\.json", r["source"]).group(1) for r in rows}) == 63  # type: ignore[union-attr]
    for r in rows:  # the value is the file's accelerator_memory_max in bytes, written in GB
        published = int(re.search(r"accelerator_memory_max (\d+) bytes", r["notes"]).group(1))  # type: ignore[union-attr]
        assert float(r["peak_mem_value"]) * 1e9 == pytest.approx(published, abs=1e3)


def _expressible() -> list[dict[str, str]]:
    return [r for r in _rows() if "not expressible" not in r["method"]]


@pytest.mark.parametrize("row", _expressible(), ids=lambda r: r["row_id"])
def test_lora_and_full_rows_read_as_their_config(row: dict[str, str]) -> None:
    setup_mod = load_bench("accuracy_setup")
    spec = load_bench("accuracy_spec")._spec(row["model_hf_id"])
    setup = setup_mod._train_setup(row, spec)
    assert (setup.micro_batch_size, setup.seq_len, setup.gradient_checkpointing) == (4, 768, False)
    assert (setup.weights_dtype, setup.autocast, setup.optimizer, setup.attn_implementation) == ("bf16", None, "adamw_torch", "sdpa")
    hw = load_bench("accuracy_hardware")._hardware(row["gpu_type"], 1)
    assert hw is not None and hw.gpus[0].name == "l40s"
    if setup.lora is not None:
        assert setup.lora.use_dora == ("use_dora True" in row["method"])
        assert setup.lora.r == int(row["lora_rank"]) and setup.lora.autocast_adapter_dtype


@pytest.mark.parametrize("row", [r for r in _expressible() if r["lora_rank"]], ids=lambda r: r["row_id"])
def test_lora_trainable_counts_match_the_result_files(row: dict[str, str]) -> None:
    """Llama-3.2-3B: q 3072->3072, v 3072->1024, gate/up 3072->8192, down 8192->3072, 28 blocks; r x (in + out) each.
    rank 32 on q,v: 28 x 32 x (6144 + 4096) = 9,175,040, the file's count; DoRA adds 28 x (3072 + 1024) magnitudes."""
    spec = load_bench("accuracy_spec")._spec(row["model_hf_id"])
    setup = load_bench("accuracy_setup")._train_setup(row, spec)
    assert ledger(spec, setup).trainable_params == _trainable(row)


@pytest.mark.parametrize(("method", "reason"), [
    ("PEFT BOFT (not expressible: ...)", "BOFT"),
    ("swift tuner LLAMAPRO (swift sft llamapro: num_blocks=4; ...)", "LLAMAPRO"),
    ("LoRA (..., not expressible: block-diagonal LoRA (use_bdlora {'nblocks': 2}); loop)", "use_bdlora"),
    ("LoRA (..., not expressible: init_lora_weights 'mica' (trains 5,505,024 ...); loop)", "'mica'"),
    ("LoRA (..., not expressible: optimizer_type 'lora-fa' (LoRA-FA ...); loop)", "lora-fa"),
])
def test_other_peft_methods_are_skipped_by_name(method: str, reason: str) -> None:
    setup_mod = load_bench("accuracy_setup")
    with pytest.raises(setup_mod.Skip, match=re.escape(reason)):
        setup_mod._peft_not_lora(method)
    setup_mod._peft_not_lora("LoRA (peft get_peft_model(autocast_adapter_dtype=True), lora_dropout 0.0, use_dora True)")


def test_every_row_is_priced_or_skipped_with_its_method() -> None:
    rows = _rows()
    skipped = [r for r in rows if "not expressible" in r["method"]]
    assert len(rows) - len(skipped) == 6   # full fine-tuning, LoRA rank 32 / 64 / 64 rsLoRA / 10 on the MLP, DoRA rank 32
    for r in skipped:
        with pytest.raises(load_bench("accuracy_setup").Skip):
            load_bench("accuracy_setup")._peft_not_lora(r["method"])
