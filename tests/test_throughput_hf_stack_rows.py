"""The HF-stack full fine-tuning throughput rows (issue 24, rows 422-430) are read as their publishers ran them.

Checked against the publishers' own columns and a hand count of parameters; no test compares a predicted speed.
"""

from __future__ import annotations

import csv
from types import ModuleType

import pytest
from helpers import load_bench

FMS = "foundation-model-stack/fms-acceleration"


@pytest.fixture(scope="module")
def rows() -> ModuleType:
    return load_bench("throughput_rows")


def _published(rows: ModuleType, source: str) -> list[dict[str, str]]:
    with rows.CSV.open(newline="", encoding="utf-8") as f:
        return [r for r in csv.DictReader(f) if r["source"] == source]


def test_fms_acceleration_tokens_per_second_is_per_device(rows: ModuleType) -> None:
    """transformers' train_tokens_per_second counts the local dataloader's tokens: divided by the per-device share
    of train_samples_per_second (which counts the global batch) it gives the packed sample length the launcher set
    (max_seq_len 4096; santacoder's n_positions 2048 caps it). A total reading would give 2x the length on 2 GPUs."""
    fms = _published(rows, FMS)
    assert len(fms) == 8
    for r in fms:
        per_device_samples = float(r["samples_per_s"]) / int(r["num_gpus"])
        tokens_per_sample = float(r["tokens_per_s_per_gpu"]) / per_device_samples
        assert tokens_per_sample == pytest.approx(int(r["seq_len"]), rel=5e-3), r["row_id"]


def test_fms_acceleration_rows_keep_the_launcher_setup(rows: ModuleType) -> None:
    """benchmark.py: per_device_train_batch_size = effective batch // GPUs, no accumulation; defaults.yaml: checkpointing,
    FlashAttention-2, max_steps 100 timed by train_runtime; torch_dtype bfloat16 with no Trainer bf16 flag and accelerate
    mixed_precision 'no' (bf16 weights, no autocast); 1 GPU plain python, 2 GPUs accelerate FSDP."""
    cases, _ = rows.load()
    fms = [c for c in cases if c.group == "fms-acceleration"]
    assert len(fms) == 8
    for c in fms:
        s = c.setup
        assert (s.weights_dtype, s.autocast, s.gradient_checkpointing, s.attn_implementation) == ("bf16", None, True, "flash_attention_2")
        assert s.gradient_accumulation_steps == 1 and s.micro_batch_size * s.world_size in (4, 8) and c.steps == 100
        assert s.strategy == ("fsdp" if s.world_size == 2 else "single") and c.framework == "hf_trainer"


def test_santacoder_shape_matches_a_hand_count(rows: ModuleType) -> None:
    """GPTBigCode santacoder: per layer c_attn 2048 x (2048 + 2 x 128) + bias, c_proj 2048^2 + bias, MLP 2 x 2048 x 8192
    + biases, two LayerNorms; plus wte 49280 x 2048, wpe 2048 x 2048 and ln_f; the head is tied."""
    per_layer = (2048 * 2304 + 2304) + (2048 * 2048 + 2048) + (2048 * 8192 + 8192) + (8192 * 2048 + 2048) + 2 * 2 * 2048
    total = 24 * per_layer + 49280 * 2048 + 2048 * 2048 + 2 * 2048
    specs = load_bench("throughput_specs")
    spec = specs.ModelSpec.from_any(specs.SANTACODER)
    assert spec.total_params == total == 1_124_886_528
    assert spec.num_key_value_heads == 1   # multi-query attention


def test_accelerate_fsdp2_row_keeps_the_script_setup(rows: ModuleType) -> None:
    """examples/fsdp2/fsdp2_fp8.py in bf16: batch 1 x 8192 per device on 8 H100, FSDP2, regional compile, no
    checkpointing, model and AdamW in bf16 (from_config torch_dtype bfloat16)."""
    cases, _ = rows.load()
    (c,) = [c for c in cases if c.group == "accelerate-fsdp2"]
    s = c.setup
    assert (s.seq_len, s.micro_batch_size, s.world_size, s.strategy) == (8192, 1, 8, "fsdp")
    assert (s.weights_dtype, s.autocast, s.gradient_checkpointing, s.torch_compile) == ("bf16", None, False, True)
    assert c.hardware.name == "h100-80gb:8" and c.published == 8000
