"""Rows 2620-2621: litgpt issue #1112 'Higher memory use with QLoRA', adopted whole (issue 24).

The issue's two runs print their resolved configs (TinyLlama 1.1B, LoRA r=32 on query and value, bf16-true, micro-batch
8, max_seq_length 512) and their 'Memory used' lines: 14.49 GB without quantization, 18.15 GB with ``quantize:
bnb.nf4``. The counts checked here are derived by hand from TinyLlama's config.json and litgpt at a54cb4e3, not
perfguide's output; perfguide's errors on the rows (and the publisher's own same-day table that disagrees with them)
are in docs/validation.md.
"""

from __future__ import annotations

from helpers import assert_evaluated_as_values, published_rows, read_row

from perfguide.memory.ledger import ledger

ROWS = published_rows()
IDS = ("2620", "2621")

#: TinyLlama 1.1B by hand from its config.json (2048 x 22 layers, 32 query heads of 64 and 4 key/value heads, FFN 5632,
#: vocab 32000, untied head, two RMSNorms a block and a final one): 1,100,048,384
TINYLLAMA = 22 * (2 * 2048**2 + 2 * 2048 * 256 + 3 * 2048 * 5632 + 2 * 2048) + 2 * 32000 * 2048 + 2048
#: r=32 on query (2048 -> 2048) and value (2048 -> 256) of 22 blocks: r x (in + out) each
ADAPTERS = 22 * 32 * ((2048 + 2048) + (2048 + 256))



def test_rows_are_the_issue_whole_and_quote_its_logs() -> None:
    group = [r for r in ROWS.values() if r["source_group"] == "litgpt_issue_1112"]
    assert sorted(r["row_id"] for r in group) == list(IDS)
    assert all("https://github.com/Lightning-AI/litgpt/issues/1112" in r["source"] for r in group)
    assert [ROWS[i]["peak_mem_value"] for i in IDS] == ["14.49", "18.15"]
    assert "Memory used: 14.49 GB" in ROWS["2620"]["notes"] and "Memory used: 18.15 GB" in ROWS["2621"]["notes"]
    for r in group:
        assert r["trust"] == "B" and r["value_kind"] == "measured" and r["peak_mem_unit"] == "GB (1e9 bytes)"
        assert r["mem_metric"].startswith("torch.cuda.max_memory_allocated()/1e9")


def test_rows_read_as_the_printed_configs() -> None:
    """The two resolved configs differ only in ``quantize``: litgpt's own GPT, pure bf16, no checkpointing, batch 8 x 512,
    LoRA r=32 on query and value with dropout 0.05; the quantized run steps bitsandbytes' PagedAdamW."""
    for row_id, weights, optimizer in (("2620", "bf16", "adamw_torch"), ("2621", "nf4", "paged_adamw_32bit")):
        _, spec, setup = read_row(row_id)
        assert spec.total_params == TINYLLAMA
        assert setup.model_code == "litgpt" and setup.weights_dtype == weights and setup.optimizer == optimizer
        assert (setup.micro_batch_size, setup.seq_len, setup.gradient_checkpointing) == (8, 512, False)
        assert setup.lora is not None and setup.lora.r == 32 and setup.lora.alpha == 16 and setup.lora.dropout == 0.05
        assert ledger(spec, setup).trainable_params == ADAPTERS
    _, _, qlora = read_row("2621")
    assert not qlora.nf4_double_quant and not qlora.kbit_upcast   # bnb.nf4 (not -dq), Fabric's own quantizer


def test_rows_are_evaluated_as_values() -> None:
    assert_evaluated_as_values(IDS)
