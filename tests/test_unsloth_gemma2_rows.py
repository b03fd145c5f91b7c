"""Unsloth's Gemma 2 blog rows (801-803) read as the blog states them, and their loss path counted by hand from
transformers 4.42.3's Gemma2ForCausalLM (the release of 2024-07-03)."""

from __future__ import annotations

from types import ModuleType


def test_rows_read_as_stated(acc: ModuleType, rows: dict[str, dict[str, str]]) -> None:
    """Batch 2, rank 32 on q/k/v/o/gate/up/down, bnb nf4 with peft's upcast, bf16 autocast, FA2, checkpointing."""
    for row_id, model in (("801", "google/gemma-2-9b"), ("802", "google/gemma-2-27b"), ("803", "google/gemma-2-9b")):
        row = rows[row_id]
        assert row["source_group"] == "unsloth_gemma2" and row["model_hf_id"] == model
        setup = acc._train_setup(row, acc._spec(model))
        assert (setup.micro_batch_size, setup.weights_dtype, setup.kbit_upcast, setup.autocast) == (2, "nf4", True, "bf16")
        assert setup.attn_implementation == "flash_attention_2" and setup.gradient_checkpointing
        assert setup.lora is not None and setup.lora.r == 32
        assert {n.rsplit(".", 1)[-1] for n in setup.lora.target_modules} == {"q_proj", "k_proj", "v_proj", "o_proj",
                                                                            "gate_proj", "up_proj", "down_proj"}
        assert acc._transformers_version(row) == "4.42.3" and acc._bnb_version(row) == "0.43.1"
    l4 = acc._hardware(rows["801"]["gpu_type"], 1)
    assert l4 is not None
    assert l4.gpus[0].memory_total == 23034 * 2**20   # NVIDIA L4


def test_row_801_loss_path_by_hand(acc: ModuleType, rows: dict[str, dict[str, str]]) -> None:
    """4.42.3: logits = lm_head(h) (bf16 under autocast); / 30, tanh (saves its bf16 output: 2 B), * 30;
    logits.float() returned in the output (4); logits[..., :-1, :].contiguous() copies at batch 2 (4);
    log_softmax's fp32 output (4): 14 B per logit at the cross-entropy's forward; at its backward the output is
    dropped (Trainer) and log-softmax output + its gradient + the input gradient (12) + the tanh output (2) = 14."""
    row = rows["801"]
    spec = acc._spec(row["model_hf_id"])
    setup = acc._train_setup(row, spec)
    assert acc._loss_bytes(row, spec, setup) == 2 * 2600 * 256000 * 14
