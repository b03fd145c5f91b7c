"""Three ms-swift example scripts whose header comments state per-GPU memory of Qwen2.5-7B full fine-tuning at 8K-16K
tokens under ZeRO-3 on 4 GPUs (rows 2400-2421): examples/train/liger/sft.sh (7b709960f), examples/train/flash_attention_3/
transformers.sh (710553d85) and examples/train/padding_free/sft.sh (9dc1071aa). Each header line is one row, as
published; the padding-free line cannot be stated as a batch x length and is listed with why. The FA3 line is priced as
flash-attention 2 (the hopper kernel saves the same tensors) and the H20 as the H100's spec with 96 GB."""

from __future__ import annotations

import csv
import re
from pathlib import Path

from helpers import load_bench

ROOT = Path(__file__).resolve().parents[1]
#: the header lines as the scripts print them, per source group
HEADERS = {
    "swift_liger_example": ["Using use_liger_kernel and packing: 4 * 42GB", "Not using use_liger_kernel: 4 * 54GB",
                            "Not using use_liger_kernel and packing: 4 * 52GB"],
    "swift_fa3_example": ["fa2: 4 * 43GiB", "fa3: 4 * 43GiB"],
    "swift_padding_free_example": ["without padding_free: 4 * 60GiB", "padding_free: 4 * 44GiB"],
}


def _rows(group: str) -> list[dict[str, str]]:
    with (ROOT / "bench" / "data" / "published_measurements.csv").open(encoding="utf-8") as fh:
        return [r for r in csv.DictReader(fh) if r["source_group"] == group]


def test_every_header_line_is_one_row_with_its_number() -> None:
    for group, lines in HEADERS.items():
        rows = _rows(group)
        assert len(rows) == len(lines), group
        for row, line in zip(rows, lines, strict=True):
            assert line in row["source"] and f"'{line.split(':')[0]}" in row["notes"] + row["source"]
            printed = re.search(r"4 \* (\d+)", line).group(1)  # type: ignore[union-attr]
            assert f"'4 * {printed}G" in row["peak_mem_unit"], row["row_id"]
            if row["value_kind"] == "measured":
                assert row["peak_mem_value"] == printed
            assert 2400 <= int(row["row_id"]) <= 2499


def test_liger_rows_read_the_switches_the_header_names() -> None:
    acc = load_bench("accuracy")
    on, off, off_unpacked = _rows("swift_liger_example")
    spec = acc._spec(on["model_hf_id"])
    setups = [acc._train_setup(r, spec) for r in (on, off, off_unpacked)]
    assert [s.liger_kernel for s in setups] == [True, False, False]
    assert {(s.seq_len, s.micro_batch_size, s.strategy, s.num_gpus) for s in setups} == {(8192, 1, "zero3", 4)}


def test_fa3_row_differs_from_the_fa2_row_in_its_kernel_only() -> None:
    """The two header lines differ only in the kernel, so their Setups differ only in attn_implementation."""
    acc = load_bench("accuracy")
    fa2, fa3 = _rows("swift_fa3_example")
    assert fa3["attn_impl"].startswith("flash_attention_3")
    spec = acc._spec(fa2["model_hf_id"])
    s2, s3 = acc._train_setup(fa2, spec), acc._train_setup(fa3, spec)
    assert s3.attn_implementation == "flash_attention_3" and s3 == s2.replace(attn_implementation="flash_attention_3")
    assert s2.seq_len == 16384 and s2.gradient_accumulation_steps == 4


def test_h20_is_a_96_gib_hopper_and_no_h200_row_reads_as_one() -> None:
    acc = load_bench("accuracy")
    (fa2, _) = _rows("swift_fa3_example")
    h20 = acc._hardware(fa2["gpu_type"], 4).smallest_gpu
    assert h20.memory_total == 96 * 2**30 and tuple(h20.compute_capability) == (9, 0)
    h200 = acc._hardware("H200 141GB", 1).smallest_gpu
    assert h200.memory_total != 96 * 2**30


def test_padding_free_line_is_listed_with_why() -> None:
    acc = load_bench("accuracy")
    padded, flat = _rows("swift_padding_free_example")
    assert acc._train_setup(padded, acc._spec(padded["model_hf_id"])).micro_batch_size == 8
    result = acc.evaluate(flat, [])
    assert result.kind == "skip" and "not expressible" in result.reason
