"""Rows 3000-3008: ms-swift 3.x example scripts' memory comments (issue 24; out of sample, docs/validation.md 74).

Each script's first line is a memory figure ('# 17.2GiB', '# 27.5GiB * 2'); the rows take the script as it was at the
commit that wrote the figure (later commits changed models, data and lengths and kept the comment). The values checked
here are the scripts' own and counts by hand from Qwen2-7B's config, not perfguide's output.
"""

from __future__ import annotations

from helpers import published_rows, read_row

from perfguide.memory.ledger import ledger

ROWS = published_rows()
#: row -> (script, the comment's figure per GPU, number of GPUs)
SCRIPTS = {
    "3000": ("examples/train/tuners/lora/train.sh", "17.2", "1"),
    "3001": ("examples/train/tuners/dora/train.sh", "17.2", "1"),
    "3002": ("examples/train/full/train.sh", "76", "1"),
    "3003": ("examples/train/ddp/train.sh", "27.5", "2"),
    "3004": ("examples/train/deepspeed/train_zero2.sh", "18", "2"),
    "3005": ("examples/train/deepspeed/train_zero3.sh", "16", "2"),
    "3006": ("examples/train/demo.sh", "22", "1"),
    "3007": ("examples/train/qlora/bnb.sh", "10", "1"),
    "3008": ("examples/train/multi-gpu/fsdp2_lora/train.sh", "14.7", "2"),
}
#: Qwen2-7B by hand: vocabulary 152064 (untied head), h 3584, 28 blocks; q 3584 -> 3584 and k, v 3584 -> 512 with
#: biases, o without; FFN 18944; two RMSNorms a block and a final one
QWEN2_7B = 2 * 152064 * 3584 + 28 * (3584 * 3584 + 3584 + 2 * (3584 * 512 + 512) + 3584 * 3584 + 3 * 3584 * 18944
                                     + 2 * 3584) + 3584
#: swift's default LoRA, r 8 on every block Linear: r x (in + out) for q, k, v, o, gate, up, down
QWEN2_7B_ADAPTERS = 28 * 8 * ((3584 + 3584) + 2 * (3584 + 512) + (3584 + 3584) + 3 * (3584 + 18944))


def test_rows_are_the_scripts_comments() -> None:
    assert sorted(r for r, row in ROWS.items() if row["source_group"] == "swift_v3_example_headers") == sorted(SCRIPTS)
    for row_id, (script, value, gpus) in SCRIPTS.items():
        row = ROWS[row_id]
        assert script in row["source"] and row["peak_mem_value"] == value and row["num_gpus"] == gpus, row_id
        assert row["value_kind"] == "measured" and "max_memory_reserved" in row["mem_metric"]
    # the two runs over alpaca-gpt4 data: their longest sample is not known offline, so they stay out of the summary
    assert [r for r in SCRIPTS if ROWS[r]["trust"] == "C"] == ["3006", "3007"]


def test_rows_read_as_the_scripts_ran() -> None:
    """swift 3.0's defaults: LoRA r 8 / alpha 32 / dropout 0.05 on every Linear, bf16 weights under bf16 autocast,
    checkpointing on, batch 1; the QLoRA script's base stays bf16 outside its Linears (no kbit preparation)."""
    for row_id in ("3000", "3001", "3003", "3004", "3005", "3006", "3007", "3008"):
        _, _, setup = read_row(row_id)
        assert setup.lora is not None and (setup.lora.r, setup.lora.alpha, setup.lora.dropout) == (8, 32, 0.05), row_id
        assert setup.gradient_checkpointing and setup.micro_batch_size == 1 and setup.autocast == "bf16", row_id
    assert read_row("3001")[2].lora.use_dora  # type: ignore[union-attr]
    _, _, full = read_row("3002")
    assert full.lora is None and full.weights_dtype == "bf16" and full.optimizer == "adamw_torch"
    _, _, qlora = read_row("3007")
    assert qlora.weights_dtype == "nf4" and not qlora.kbit_upcast
    assert [read_row(r)[2].strategy for r in ("3003", "3004", "3005")] == ["ddp", "zero2", "zero3"]
    _, _, fsdp = read_row("3008")
    assert fsdp.is_fsdp and fsdp.fsdp_version == 2 and fsdp.num_gpus == 2


def test_qwen2_7b_is_its_config() -> None:
    _, spec, setup = read_row("3000")
    assert spec.total_params == QWEN2_7B == 7_615_616_512
    assert ledger(spec, setup).trainable_params == QWEN2_7B_ADAPTERS == 20_185_088
    assert read_row("3000")[2].seq_len == read_row("3008")[2].seq_len == 160   # self-cognition's longest, with the template
