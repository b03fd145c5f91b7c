"""Rows 3400-3412: Whisper fine-tuning as published (issue 24; out of sample: nothing was fitted to them, docs/validation.md 96).

The HF Whisper fine-tuning event's notebook and README, a whisper-large-v3 notebook's saved run, Whisper-Finetune
issue #30's per-GPU readings, PEFT's int8 notebook, the fast-whisper-finetuning README and transformers issue #20348.
The values checked here are the sources' own and counts by hand from Whisper's config, not perfguide's output; the
notebook's own print of its trainable and total parameters checks both.
"""

from __future__ import annotations

from helpers import assert_evaluated_as_values, published_rows, read_row

from perfguide.memory.ledger import ledger

ROWS = published_rows()
#: row -> (source group, model, micro-batch, GPUs, published value or verdict)
EXPECTED = {
    "3400": ("whisper_event_notebook", "openai/whisper-small", "64", "1", "36"),
    "3401": ("whisper_event_readme", "openai/whisper-small", "16", "1", "fits"),
    "3402": ("whisper_event_readme", "openai/whisper-medium", "2", "1", "fits"),
    "3403": ("whisper_event_readme", "openai/whisper-small", "64", "1", "fits"),
    "3404": ("whisper_event_readme", "openai/whisper-medium", "32", "1", "fits"),
    "3405": ("whisper_large_v3_persian_notebook", "openai/whisper-large-v3", "16", "1", "38.5"),
    "3406": ("whisper_finetune_issue_30", "openai/whisper-large-v2", "4", "8", "63"),
    "3407": ("whisper_finetune_issue_30", "openai/whisper-large-v2", "2", "8", "37"),
    "3408": ("peft_whisper_int8_notebook", "openai/whisper-large-v2", "8", "1", "fits"),
    "3409": ("fast_whisper_finetuning", "openai/whisper-large-v2", "8", "1", "8"),
    "3410": ("fast_whisper_finetuning", "openai/whisper-large-v2", "24", "1", "fits"),
    "3411": ("fast_whisper_finetuning", "openai/whisper-large-v2", "1", "1", "oom"),
    "3412": ("transformers_issue_20348", "openai/whisper-large", "1", "1", "oom"),
}

#: whisper-large(-v2) by hand: d 1280, 32 + 32 blocks, FFN 5120, 80 mel bins, 1500 / 448 positions, vocabulary 51865,
#: the head tied to the decoder's embedding; attention q, v and out_proj with a bias, k_proj without
D, F, V = 1280, 5120, 51865
ATTENTION = 4 * D * D + 3 * D
BLOCK = ATTENTION + (D * F + F) + (F * D + D) + 2 * (2 * D)           # self-attention, FFN, two LayerNorms
ENCODER = (80 * D * 3 + D) + (D * D * 3 + D) + 1500 * D + 32 * BLOCK + 2 * D   # conv1, conv2, positions, final norm
DECODER = V * D + 448 * D + 32 * (BLOCK + ATTENTION + 2 * D) + 2 * D        # + cross-attention and its norm
#: LoRA r 32 on q_proj and v_proj: the encoder's self-attention, the decoder's self- and cross-attention
ADAPTERS = 32 * (2 + 4) * 32 * (D + D)


def test_rows_are_the_sources_figures() -> None:
    groups = {g for g, *_ in EXPECTED.values()}
    assert sorted(r for r, row in ROWS.items() if row["source_group"] in groups) == sorted(EXPECTED)
    for row_id, (group, model, batch, gpus, value) in EXPECTED.items():
        row = ROWS[row_id]
        assert (row["source_group"], row["model_hf_id"], row["micro_batch"], row["num_gpus"]) == (group, model, batch, gpus)
        assert (row["peak_mem_value"] or row["value_kind"]) == value, row_id
        assert row["trust"] == "B" and row["task"] == "train"
    assert "approximately 36GB" in ROWS["3400"]["source"] and "approximately 38.5GB" in ROWS["3405"]["source"]
    assert "batch_size=4 （63G）" in ROWS["3406"]["source"] and "37G左右" in ROWS["3407"]["source"]
    assert "| LoRA | <1% | 8GB | 24 |" in ROWS["3409"]["source"] and "OOM on T4" in ROWS["3411"]["source"]
    assert "batch size set to 1" in ROWS["3412"]["source"]


def test_rows_read_as_the_code_ran_them() -> None:
    """The encoder at its 1500 positions, labels at the row's reading; eager attention in the 2022-2023 runs (Whisper
    had no SDPA path in transformers then), SDPA in the 2025 one; int8 + LoRA on q/v for PEFT's notebooks."""
    for row_id in EXPECTED:
        _, spec, setup = read_row(row_id)
        assert setup.seq_len == 1500 and spec.audio_input is not None
        assert setup.attn_implementation == ("sdpa" if row_id == "3405" else "eager"), row_id
        assert (setup.weights_dtype, setup.autocast) == ("int8" if row_id in ("3408", "3409", "3410") else "fp32", "fp16")
    _, _, event = read_row("3400")
    assert (event.micro_batch_size, event.target_len, event.gradient_checkpointing) == (64, 64, True)
    _, _, issue = read_row("3406")
    assert (issue.strategy, issue.num_gpus, issue.gradient_checkpointing, issue.target_len) == ("ddp", 8, False, 32)
    assert issue.lora is not None and issue.lora.r == 12
    _, _, peft = read_row("3408")
    assert peft.lora is not None and (peft.lora.r, peft.lora.alpha, peft.lora.dropout) == (32, 64, 0.05)
    assert peft.gradient_checkpointing


def test_counts_are_the_notebooks_own() -> None:
    """PEFT's notebook prints 'trainable params: 15728640 || all params: 1559033600' for this adapter on this model."""
    _, spec, setup = read_row("3408")
    assert spec.total_params == ENCODER + DECODER == 1_543_304_960
    assert ledger(spec, setup).trainable_params == ADAPTERS == 15_728_640
    assert spec.total_params + ADAPTERS == 1_559_033_600


def test_measured_rows_are_compared_as_values() -> None:
    assert_evaluated_as_values(("3400", "3405", "3406", "3407", "3409"))
