"""Unsloth's long-context gpt-oss post (https://unsloth.ai/blog/gpt-oss-context, 2025-08-28; rows 2430-2433): every
context length it states for gpt-oss-20b on one 80GB H100. The other implementations' 9K (eager: transformers' GptOss
has no SDPA path) and FA3's 15K are priced with Unsloth's notebook settings (LoRA r=8 on the attention, batch 1); its
own 60K / 81K need Unsloth's kernels and are listed with why."""

from __future__ import annotations

import csv
from pathlib import Path

from helpers import load_bench

ROOT = Path(__file__).resolve().parents[1]
GROUP = "unsloth_gpt_oss_long_context"
#: the blog's figures, tokens ('9K' read as 9,000), in row order
LENGTHS = {"9K": 9000, "15K": 15000, "60K": 60000, "81K": 81000}


def _rows() -> list[dict[str, str]]:
    with (ROOT / "bench" / "data" / "published_measurements.csv").open(encoding="utf-8") as fh:
        return [r for r in csv.DictReader(fh) if r["source_group"] == GROUP]


def test_every_figure_of_the_post_is_one_row() -> None:
    rows = _rows()
    assert [int(r["row_id"]) for r in rows] == [2430, 2431, 2432, 2433]
    for row, (printed, tokens) in zip(rows, LENGTHS.items(), strict=True):
        assert f"{printed} context" in row["source"] and printed in row["notes"] + row["peak_mem_unit"]
        assert int(row["seq_len"]) == tokens
        assert row["peak_mem_value"] == (str(tokens) if row["value_kind"] == "max_seq_fit" else "")


def test_the_priced_rows_read_as_the_notebook_setup() -> None:
    acc = load_bench("accuracy")
    eager, fa3, *_ = _rows()
    spec = acc._spec(eager["model_hf_id"])
    s_eager, s_fa3 = acc._train_setup(eager, spec), acc._train_setup(fa3, spec)
    assert s_eager.attn_implementation == "eager" and s_fa3.attn_implementation == "flash_attention_3"
    assert s_eager.replace(attn_implementation="flash_attention_3", seq_len=15000) == s_fa3
    assert s_eager.lora is not None and s_eager.lora.r == 8
    assert set(s_eager.lora.target_modules) == {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"}
    assert (s_eager.micro_batch_size, s_eager.weights_dtype, s_eager.gradient_checkpointing) == (1, "bf16", True)


def test_unsloth_own_lengths_are_listed_with_why() -> None:
    acc = load_bench("accuracy")
    for row in _rows()[2:]:
        result = acc.evaluate(row, [])
        assert result.kind == "skip" and "no Unsloth technique" in result.reason
