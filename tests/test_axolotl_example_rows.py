"""Rows 3100-3102: axolotl's example READMEs' memory figures for Mistral Small 3.1 fine-tunes (issue 24; out of
sample, docs/validation.md 75), two of them with the Cut Cross-Entropy plugin.

The values checked are the READMEs' and yamls' own (at the commit that wrote each figure) and counts by hand from
Mistral Small's config, not perfguide's output.
"""

from __future__ import annotations

from helpers import published_rows, read_row

from perfguide.memory.ledger import ledger

ROWS = published_rows()
#: row -> (README, the figure, optimizer, the CCE plugin listed in the yaml, lora_dropout)
READMES = {
    "3100": ("examples/devstral/README.md @8c6a6ea6e", "21", "adamw_torch", True, 0.0),
    "3101": ("examples/magistral/README.md @eac4a61f5", "24", "adamw_bnb_8bit", False, 0.05),
    "3102": ("examples/magistral/think/README.md @09959fac7", "19.1", "adamw_bnb_8bit", True, 0.05),
}
#: Mistral Small 3 by hand: 5120 wide, 40 blocks, q / o 5120 <-> 4096 (32 heads of 128), k / v 5120 -> 1024 (8 heads),
#: FFN 32768; vocabulary 131072 with an untied head
BLOCK_LINEARS = ((5120, 4096), (5120, 1024), (5120, 1024), (4096, 5120), (5120, 32768), (5120, 32768), (32768, 5120))
#: LoRA r=32 on every block Linear: r x (in + out) each
ADAPTERS = 40 * 32 * sum(i + o for i, o in BLOCK_LINEARS)


def test_rows_are_the_readmes_figures() -> None:
    assert sorted(r for r, row in ROWS.items() if row["source_group"] == "axolotl_example_readmes") == sorted(READMES)
    for row_id, (readme, value, optimizer, _, _) in READMES.items():
        row = ROWS[row_id]
        assert readme in row["source"] and row["peak_mem_value"] == value and row["optimizer"].startswith(optimizer), row_id
        assert row["value_kind"] == "measured" and "reserved" in row["mem_metric"] and row["trust"] == "B"


def test_rows_read_as_the_yamls_ran() -> None:
    """axolotl's QLoRA: nf4 Linears, the norms, embedding and head cast back to bf16, LoRA r 32 / alpha 16 on every
    Linear, checkpointing, 2 x 2048 packed tokens; the plugin's loss where the yaml lists it."""
    for row_id, (_, _, optimizer, cce, dropout) in READMES.items():
        _, spec, setup = read_row(row_id)
        assert setup.weights_dtype == "nf4" and not setup.kbit_upcast and setup.autocast == "bf16", row_id
        assert setup.lora is not None and (setup.lora.r, setup.lora.alpha, setup.lora.dropout) == (32, 16, dropout), row_id
        assert (setup.micro_batch_size, setup.seq_len, setup.gradient_accumulation_steps) == (2, 2048, 4), row_id
        assert setup.gradient_checkpointing and setup.optimizer == optimizer and setup.cut_cross_entropy is cce, row_id
        assert ledger(spec, setup).trainable_params == ADAPTERS == 184_811_520


def test_mistral_small_is_its_config() -> None:
    _, spec, _ = read_row("3100")
    blocks = 40 * (sum(i * o for i, o in BLOCK_LINEARS) + 2 * 5120)
    assert spec.total_params == 2 * 131072 * 5120 + blocks + 5120 == 23_572_403_200
