"""Rows 2900-2901: OOM verdicts from two public threads that state a training setup in full (issue 24).

- lit-gpt issue #781: ``finetune/lora.py`` on Mistral-7B-Instruct-v0.1 with ``--precision bf16-true`` and every other
  hyperparameter the script's default (Lit-GPT 2647dbda: micro-batch 4, LoRA r 8 / alpha 16 on query and value), one
  A100 40GB: out of memory. The maintainer reads it off the resource table's Llama 2 7B rows (micro-batch 4 does not
  fit an A100 40GB).
- axolotl PR #2412, the author's 'Quick test for OOM alleviation' on 1 x H100 SXM: SmolLM2-1.7B, every weight
  trained, 16384 packed tokens, micro-batch 1, adamw_8bit, no gradient checkpointing, flash attention: OOM in the
  backward of step 2.

The values checked here are the threads' own and byte counts derived by hand from the models' configs, not
perfguide's output. perfguide's verdicts on the rows are in docs/validation.md.
"""

from __future__ import annotations

from helpers import load_bench, published_rows, read_row

from perfguide.memory.ledger import ledger

ROWS = published_rows()
GROUPS = {"2900": "litgpt_issue_781", "2901": "axolotl_pr_2412"}

#: Mistral 7B by hand (vocab 32000, h 4096, 32 blocks, 32 query heads and 8 key/value heads of 128, FFN 14336, untied
#: head, two RMSNorms a block and a final one)
MISTRAL_PARAMS = 2 * 32000 * 4096 + 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096) + 4096
#: LoRA r 8 on query (4096 -> 4096) and value (4096 -> 1024): r x (in + out) each, 32 blocks
MISTRAL_ADAPTERS = 32 * 8 * ((4096 + 4096) + (4096 + 1024))
#: SmolLM2-1.7B by hand (vocab 49152 tied, h 2048, 24 blocks, 32 heads without GQA, FFN 8192)
SMOLLM2_PARAMS = 49152 * 2048 + 24 * (4 * 2048 * 2048 + 3 * 2048 * 8192 + 2 * 2048) + 2048



def test_rows_are_the_threads_whole_as_posted() -> None:
    for group in GROUPS.values():
        assert sorted(r["row_id"] for r in ROWS.values() if r["source_group"] == group) == [
            k for k, g in GROUPS.items() if g == group]
    lit = ROWS["2900"]
    assert "https://github.com/Lightning-AI/litgpt/issues/781" in lit["source"] and "2647dbda" in lit["source"]
    assert (lit["model_hf_id"], lit["micro_batch"], lit["lora_rank"], lit["lora_alpha"]) == (
        "mistralai/Mistral-7B-Instruct-v0.1", "4", "8", "16")
    assert lit["precision"].startswith("bf16-true") and lit["gpu_type"] == "A100 40GB" and lit["num_gpus"] == "1"
    assert "--precision bf16-true" in lit["notes"] and "micro_batch_size 4" in lit["notes"]
    axo = ROWS["2901"]
    assert "https://github.com/axolotl-ai-cloud/axolotl/pull/2412" in axo["source"]
    assert (axo["model_hf_id"], axo["micro_batch"], axo["grad_accum"], axo["num_gpus"]) == (
        "HuggingFaceTB/SmolLM2-1.7B", "1", "1", "1")
    assert axo["seq_len"].startswith("16384 (sequence_len 16384") and axo["grad_checkpointing"] == "no"
    assert axo["optimizer"].startswith("adamw_8bit") and axo["attn_impl"] == "flash_attention_2"
    assert "OOMs during the backward pass on the" in axo["notes"] and "second step of training" in axo["notes"]
    for row in (lit, axo):
        assert row["value_kind"] == "oom" and row["mem_metric"] == "fit/OOM" and row["peak_mem_value"] == ""
        assert row["trust"] == "B" and row["task"] == "train"


def test_rows_read_as_the_code_ran_them() -> None:
    """lit-gpt: micro-batch 4 at the longest Alpaca sample (forced into the first training step), pure bf16, LoRA on
    query and value, no checkpointing; axolotl: one packed 16384-token row, bf16 weights, bnb 8-bit AdamW."""
    _, _, lit = read_row("2900")
    assert (lit.micro_batch_size, lit.seq_len, lit.weights_dtype, lit.autocast) == (4, 1304, "bf16", None)
    assert lit.model_code == "litgpt" and not lit.gradient_checkpointing and lit.optimizer == "adamw_torch"
    assert lit.lora is not None and (lit.lora.r, lit.lora.alpha, lit.lora.dropout) == (8, 16, 0.05)
    assert set(lit.lora.target_modules) == {"self_attn.q_proj", "self_attn.v_proj"}
    _, _, axo = read_row("2901")
    assert (axo.micro_batch_size, axo.seq_len, axo.weights_dtype, axo.lora) == (1, 16384, "bf16", None)
    assert axo.optimizer == "adamw_bnb_8bit" and not axo.gradient_checkpointing
    assert axo.attn_implementation == "flash_attention_2" and axo.strategy == "single"


def test_model_shapes_are_the_configs() -> None:
    """The Instruct checkpoint is priced as the base's shape; SmolLM2-1.7B's dict gives the 1.71 B of its config."""
    _, mistral, lit = read_row("2900")
    assert (mistral.hidden_size, mistral.num_layers, mistral.num_key_value_heads, mistral.intermediate_size) == (4096, 32, 8, 14336)
    assert mistral.total_params == MISTRAL_PARAMS == 7_241_732_096
    book = ledger(mistral, lit)
    assert book.trainable_params == MISTRAL_ADAPTERS == 3_407_872
    assert book.weight_bytes == 2 * (MISTRAL_PARAMS + MISTRAL_ADAPTERS)
    _, smol, axo = read_row("2901")
    assert smol.total_params == SMOLLM2_PARAMS == 1_711_376_384
    assert ledger(smol, axo).trainable_params == SMOLLM2_PARAMS
    assert ledger(smol, axo).weight_bytes == 2 * SMOLLM2_PARAMS


def test_rows_are_evaluated() -> None:
    accuracy = load_bench("accuracy")
    for row_id in GROUPS:
        result = accuracy.evaluate(ROWS[row_id], [])
        assert result.kind == "verdict" and result.verdict_ok is not None, result
