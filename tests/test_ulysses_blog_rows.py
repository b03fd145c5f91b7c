"""Rows 2800-2805: the Hugging Face 'Ulysses Sequence Parallelism' blog's memory table, adopted whole (issue 24).

The blog (2026-03-09) trains Qwen3-4B with TRL's SFTTrainer on H100 80GB GPUs under DeepSpeed ZeRO-3 with CPU optimizer
offload, gradient checkpointing and FA2, and publishes a per-rank 'Peak Memory' for a one-GPU baseline at 8K and for
Ulysses SP=4 at 8K-96K, with an OOM at 128K. The SP=4 rows are priced per rank since stop 58 (Setup.sequence_parallel;
docs/validation.md 82); the counts checked here are derived by hand from Qwen3-4B's config.json, not perfguide's
output. perfguide's error on row 2800 and the evidence on it are in docs/validation.md.
"""

from __future__ import annotations

from helpers import load_bench, published_rows, read_row

ROWS = published_rows()
IDS = ("2800", "2801", "2802", "2803", "2804", "2805")
#: the blog's 'Memory Reduction' table as printed: (GPUs, sequence length, Peak Memory)
TABLE = {"2800": (1, 8192, "76.4"), "2801": (4, 8192, "23.4"), "2802": (4, 32768, "35.0"), "2803": (4, 65536, "50.5"),
         "2804": (4, 98304, "66.0"), "2805": (4, 131072, "OOM")}

#: Qwen3-4B by hand from its config.json (2560 x 36 layers, 32 query heads and 8 key/value heads of 128, FFN 9728, vocab
#: 151936 tied, no attention bias, two RMSNorms a block plus the per-head q_norm and k_norm of 128, a final norm)
QWEN3_4B = 36 * (2560 * 4096 + 2 * 2560 * 1024 + 4096 * 2560 + 3 * 2560 * 9728 + 2 * 2560 + 2 * 128) + 151936 * 2560 + 2560


def test_rows_are_the_blog_table_whole() -> None:
    group = {r["row_id"]: r for r in ROWS.values() if r["source_group"] == "hf_blog_ulysses_sp"}
    assert sorted(group) == list(IDS)
    for row_id, (gpus, seq, value) in TABLE.items():
        row = group[row_id]
        assert "https://huggingface.co/blog/ulysses-sp" in row["source"]
        assert (int(row["num_gpus"]), int(row["seq_len"]), row["peak_mem_value"]) == (gpus, seq, value)
        assert row["trust"] == "C" and row["model_hf_id"] == "Qwen/Qwen3-4B" and row["gpu_type"] == "H100 80GB"
        assert ("Ulysses sequence parallel 4" in row["parallelism"]) == (gpus == 4)
    assert [group[i]["throughput"] for i in IDS] == ["2436", "2315", "7872", "13396", "", ""]
    assert "'Baseline (1 GPU) | 8K | 76.4 GB | Near H100 limit'" in group["2800"]["notes"]
    assert group["2805"]["value_kind"] == "oom" and "requires ~81 GB and OOMs" in group["2805"]["mem_metric"]


def test_baseline_reads_as_the_blog_states_it() -> None:
    """One H100, ZeRO-3 with the optimizer (not the parameters) offloaded, batch 1 x 8,192 packed tokens, grad acc 8,
    checkpointing and FA2, TRL's SFTTrainer of the day (0.29: the model's own loss on full logits)."""
    _, spec, setup = read_row("2800")
    assert spec.total_params == QWEN3_4B
    assert (setup.strategy, setup.num_gpus, setup.offload_optimizer, setup.offload_params) == ("zero3", 1, True, False)
    assert (setup.micro_batch_size, setup.seq_len, setup.gradient_accumulation_steps) == (1, 8192, 8)
    assert setup.gradient_checkpointing and setup.attn_implementation == "flash_attention_2" and setup.trainer == "trl"
    assert load_bench("accuracy_trl").row_trl_release(ROWS["2800"]) == "0.29.0"


def test_rows_are_evaluated() -> None:
    accuracy = load_bench("accuracy")
    result = accuracy.evaluate(ROWS["2800"], [])
    assert result.kind == "value", result
    assert result.published == 76.4
    for row_id in IDS[1:]:   # Ulysses over 4 GPUs, priced per rank (Setup.sequence_parallel)
        priced = accuracy.evaluate(ROWS[row_id], [])
        assert priced.kind in ("value", "verdict"), priced
