"""Row 2500: a PEFT example script's TorchTracemalloc log pasted in huggingface/peft issue #76 (issue 24's field sources).

A user ran examples/causal_language_modeling/peft_lora_clm_accelerate_ds_zero3_offload.py (bloomz-7b1, LoRA r=8 on
query_key_value, fp32, batch 8 x 64 tokens) on one A100 40GB without DeepSpeed and pasted epoch 15's log. The script's
TorchTracemalloc prints, in int(bytes / 2**20) units, memory_allocated at the epoch's start ('before entering the
train'), max_memory_allocated minus that start ('max-begin') and their sum ('(max)'). The row reports the '(max)' figure
as torch.cuda.max_memory_allocated; the checks below hold it and the starting figure against the post's numbers and
against model states derived by hand from bloomz-7b1's config, not against perfguide's own output.
"""

from __future__ import annotations

import re

from helpers import load_bench, published_rows

ROWS = published_rows()
MiB = 2**20

#: bloomz-7b1 by hand from its config.json (BloomForCausalLM: hidden 4096, 30 blocks, 32 heads, vocab 250880, biased
#: Linears, fused query_key_value 4096 -> 3 x 4096, FFN 4 x 4096, two LayerNorms a block, a LayerNorm after the word
#: embeddings and one at the end, head tied to the word embeddings)
H, LAYERS, VOCAB = 4096, 30, 250880
BLOCK = (H * 3 * H + 3 * H) + (H * H + H) + (H * 4 * H + 4 * H) + (4 * H * H + H) + 2 * 2 * H
BLOOMZ_7B1 = LAYERS * BLOCK + VOCAB * H + 2 * H + 2 * H
#: LoraConfig(r=8) on each block's query_key_value (peft's bloom default): A is 8 x 4096, B is 12288 x 8
ADAPTERS = LAYERS * 8 * (H + 3 * H)

#: the post's log, epoch 15
BEGIN, PEAK_OVER_BEGIN, PEAK = 27026, 5011, 32037


def _row() -> dict[str, str]:
    return ROWS["2500"]


def test_the_row_is_the_posts_log_in_its_range() -> None:
    row = _row()
    assert [r for r in ROWS if 2500 <= int(r) <= 2599] == ["2500"]
    assert row["source_group"] == "peft_issue_76_tracemalloc" and "https://github.com/huggingface/peft/issues/76" in row["source"]
    assert row["value_kind"] == "measured" and row["trust"] == "B" and row["notes"]
    assert float(row["peak_mem_value"]) == PEAK and row["peak_mem_unit"].startswith("MiB")
    assert "max_memory_allocated" in row["mem_metric"] and "(max)" in row["mem_metric"]
    assert re.findall(r"(\d+) MiB", row["peak_mem_alt"])[:2] == [str(BEGIN), str(PEAK_OVER_BEGIN)]
    assert BEGIN + PEAK_OVER_BEGIN == PEAK   # the script's '(max)' is the sum of the two printed figures


def test_bloomz_config_has_its_published_size() -> None:
    spec = load_bench("accuracy_spec")._spec(_row()["model_hf_id"])
    assert BLOOMZ_7B1 == 7_069_016_064 and spec.total_params == BLOOMZ_7B1


def test_setup_reads_the_scripts_defaults_before_pytorch_2() -> None:
    row = _row()
    spec = load_bench("accuracy_spec")._spec(row["model_hf_id"])
    setup = load_bench("accuracy_setup")._train_setup(row, spec)
    assert (setup.micro_batch_size, setup.seq_len, setup.gradient_accumulation_steps) == (8, 64, 1)
    assert setup.weights_dtype == "fp32" and setup.autocast is None and setup.strategy == "single" and setup.num_gpus == 1
    assert not setup.gradient_checkpointing and setup.attn_implementation == "eager"
    assert setup.lora is not None and setup.lora.r == 8 and setup.lora.target_modules == ("self_attention.query_key_value",)
    assert load_bench("accuracy_setup")._pre_torch2(row)             # zero_grad() keeps the adapters' gradients
    assert load_bench("accuracy_loss")._transformers_version(row) == "4.26.1"


def test_the_epochs_starting_figure_is_the_model_states_by_hand() -> None:
    """'GPU Memory before entering the train : 27026' = the fp32 weights, the adapters, their gradients (kept by
    zero_grad before PyTorch 2.0) and AdamW's two moments, to the MiB; perfguide's state terms must give the same."""
    by_hand = BLOOMZ_7B1 * 4 + ADAPTERS * 4 * (1 + 1 + 2)
    assert ADAPTERS == 3_932_160 and by_hand // MiB == BEGIN
    row = _row()
    accuracy = load_bench("accuracy")
    spec = load_bench("accuracy_spec")._spec(row["model_hf_id"])
    setup = load_bench("accuracy_setup")._train_setup(row, spec)
    est = accuracy.estimate_memory(spec, setup, None, grads_persist=True)
    assert (est.weights + est.gradients + est.optimizer_states) // MiB == BEGIN


def test_the_row_is_compared_in_its_metric() -> None:
    accuracy = load_bench("accuracy")
    (result,) = accuracy.evaluate_all([_row()], [])
    assert result.kind == "value" and result.published == PEAK
    assert result.predicted is not None and result.predicted > BEGIN   # the step's transient on top of the states
