"""Rows 2610-2612: axolotl PR #602 ('more sane defaults for openllama 3b used for quickstarts'), adopted whole (issue 24).

The maintainer's only figures: 'verified on single gpu. vram usage recorded: lora - 7gb vram, qlora - 4.5gb vram, full ft
- 21gb vram', for the three example yamls at the merge (674c5769). The card and the reading are not stated (trust C).
The counts checked here are derived by hand from OpenLLaMA 3B v2's config.json and axolotl's code at 674c5769, not
perfguide's output; perfguide's errors on the rows are reported by bench/accuracy.py.
"""

from __future__ import annotations

from helpers import assert_evaluated_as_values, load_bench, published_rows, read_row

from perfguide.memory.ledger import ledger

ROWS = published_rows()
IDS = ("2610", "2611", "2612")

#: OpenLLaMA 3B v2 by hand (3200 x 26 layers, FFN 8640, vocab 32000, untied head, two RMSNorms a block, a final one)
OPEN_LLAMA_3B = 26 * (4 * 3200**2 + 3 * 3200 * 8640 + 2 * 3200) + 2 * 32000 * 3200 + 3200
#: r=8 on q,k,v,o (3200 -> 3200), gate and up (3200 -> 8640) and down (8640 -> 3200) of 26 blocks: r x (in + out) each
ADAPTERS = 26 * 8 * (4 * (3200 + 3200) + 3 * (3200 + 8640))



def test_rows_are_the_thread_whole_and_quote_its_figures() -> None:
    group = [r for r in ROWS.values() if r["source_group"] == "axolotl_pr_602"]
    assert sorted(r["row_id"] for r in group) == list(IDS)
    assert all("https://github.com/axolotl-ai-cloud/axolotl/pull/602" in r["source"] and "@674c5769" in r["source"]
               for r in group)
    assert [ROWS[i]["peak_mem_value"] for i in IDS] == ["7", "4.5", "21"]
    quote = "lora - 7gb vram / qlora - 4.5gb vram / full ft - 21gb vram"
    for r in group:
        assert quote in r["notes"] and r["trust"] == "C" and r["value_kind"] == "measured"
        assert r["mem_metric"].startswith("not stated: read as the device total in use (nvidia-smi")


def test_open_llama_3b_v2_has_its_hand_derived_size() -> None:
    _, spec, _ = read_row("2610")
    assert OPEN_LLAMA_3B == 3_426_473_600 and spec.total_params == OPEN_LLAMA_3B


def test_lora_and_qlora_rows_read_as_the_yamls_ran() -> None:
    """One packed row of micro_batch_size x sequence_len = 2 x 1024 tokens (sample_packing_seq_len_multiplier); the base's
    norms, embeddings and head cast back to float16 after prepare_model_for_kbit_training; fp16 autocast."""
    for row_id, weights, optimizer, dropout in (("2610", "int8", "adamw_bnb_8bit", 0.0),
                                                ("2611", "nf4", "paged_adamw_32bit", 0.05)):
        _, spec, setup = read_row(row_id)
        assert setup.weights_dtype == weights and setup.autocast == "fp16" and not setup.kbit_upcast
        assert setup.optimizer == optimizer and setup.gradient_checkpointing
        assert (setup.micro_batch_size, setup.seq_len) == (1, 2048) and setup.attn_implementation == "flash_attention_2"
        assert setup.lora is not None and setup.lora.r == 8 and len(setup.lora.target_modules) == 7
        assert setup.lora.dropout == dropout
        assert ledger(spec, setup).trainable_params == ADAPTERS
    _, _, qlora = read_row("2611")
    assert qlora.nf4_double_quant and qlora.lora is not None and qlora.lora.alpha == 32


def test_full_row_is_pure_fp16_with_its_states_by_hand() -> None:
    """float16: true with fp16 and bf16 false: fp16 weights and gradients, no autocast (2 + 2 bytes a parameter)."""
    _, spec, setup = read_row("2612")
    assert setup.weights_dtype == "fp16" and setup.autocast is None and setup.lora is None
    assert (setup.micro_batch_size, setup.seq_len, setup.optimizer) == (1, 1024, "adamw_bnb_8bit")
    est = load_bench("accuracy").estimate_memory(spec, setup, None)
    assert est.weights == est.gradients == 2 * OPEN_LLAMA_3B


def test_rows_are_evaluated_as_values() -> None:
    assert_evaluated_as_values(IDS)
