"""Rows 3300-3301: DeepSpeed-Chat's step-1 LoRA on a 7B BLOOM over four A100 80GB (deepspeedai/DeepSpeedExamples
issue #411, 2023-04-24), out of sample: the posted command (batch 4) runs out of memory, and batch 1 is the largest
that trains.

The values checked are the thread's own and counts by hand from BLOOM-7b1's config.json and DeepSpeed-Chat's code
at 76c16f1cc (its LinearLayer_LoRA: ``lora_right_weight`` [in, r] and ``lora_left_weight`` [r, out] on every
nn.Linear under ``transformer.h.``), not perfguide's output. perfguide's verdicts are in bench/results/accuracy.md.
"""

from __future__ import annotations

from helpers import published_rows, read_row

from perfguide.memory.ledger import ledger

ROWS = published_rows()
#: BLOOM-7b1's block Linears (hidden 4096): query_key_value 4096 -> 12288, dense 4096 -> 4096, dense_h_to_4h
#: 4096 -> 16384, dense_4h_to_h 16384 -> 4096; 30 blocks, LoRA rank 128, r x (in + out) per Linear
LINEARS = ((4096, 12288), (4096, 4096), (4096, 16384), (16384, 4096))
ADAPTERS = 30 * 128 * sum(i + o for i, o in LINEARS)


def test_rows_are_the_thread_as_posted() -> None:
    assert sorted(r for r, row in ROWS.items() if row["source_group"] == "deepspeed_chat_issue_411") == ["3300", "3301"]
    oom, fits = ROWS["3300"], ROWS["3301"]
    for row in (oom, fits):
        assert "https://github.com/deepspeedai/DeepSpeedExamples/issues/411" in row["source"] and "76c16f1cc" in row["source"]
        assert "--per_device_train_batch_size 4 --per_device_eval_batch_size 4 --max_seq_len 2048" in row["notes"]
        assert "--zero_stage 0 --lora_dim 128 --lora_module_name transformer.h. --only_optimize_lora" in row["notes"]
        assert (row["num_gpus"], row["gpu_type"], row["lora_rank"], row["mem_metric"]) == ("4", "A100 80GB", "128", "fit/OOM")
    assert (oom["micro_batch"], oom["value_kind"], fits["micro_batch"], fits["value_kind"]) == ("4", "oom", "1", "fits")


def test_rows_read_as_the_script_ran() -> None:
    """fp16 weights (DeepSpeed's fp16 engine casts the model) without autocast, rank-128 adapters on every block Linear
    and nothing else trained, 2,048 tokens padded to max_length, no checkpointing (main.py forbids it with
    --only_optimize_lora), plain data parallel over four GPUs (ZeRO stage 0), eager attention."""
    for row_id, batch in (("3300", 4), ("3301", 1)):
        _, spec, setup = read_row(row_id)
        assert (spec.hidden_size, spec.num_layers) == (4096, 30)
        assert (setup.weights_dtype, setup.autocast, setup.strategy, setup.num_gpus) == ("fp16", None, "ddp", 4)
        assert (setup.micro_batch_size, setup.seq_len, setup.gradient_checkpointing) == (batch, 2048, False)
        assert setup.attn_implementation == "eager" and setup.lora is not None and setup.lora.r == 128
        assert ledger(spec, setup).trainable_params == ADAPTERS == 251_658_240
