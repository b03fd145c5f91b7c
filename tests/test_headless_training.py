"""A checkpoint whose config names a base module (BART base / large: BartModel; BGE: XLMRobertaModel; Qwen3-Embedding:
Qwen3Model) returns no loss, so the Trainer lines a training plan writes stop at the first step. The plan says so and
names the task that plans a head; the claim itself is checked on a real Trainer."""

from __future__ import annotations

import pytest
from helpers import reset_accelerate_state

import perfguide
from perfguide.model.tasks import headless_training_note

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def _headless(rec: perfguide.Recommendation) -> list[str]:
    return [w for w in rec.warnings if "returns no loss" in w]


def test_a_trainer_on_a_base_module_stops_at_its_first_step(tmp_path) -> None:
    """What the note says, on a real Trainer: a tiny BartModel given labels still returns no loss."""
    config = transformers.BartConfig(vocab_size=64, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                                     decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32)
    model = transformers.BartModel(config)
    rows = [{"input_ids": torch.arange(1, 9), "labels": torch.arange(1, 9)} for _ in range(4)]
    reset_accelerate_state()
    args = transformers.TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=2, max_steps=1,
                                          report_to=[], use_cpu=True)
    with pytest.raises(ValueError, match="did not return a loss"):
        transformers.Trainer(model=model, args=args, train_dataset=rows).train()


def test_bart_large_plan_names_the_seq2seq_head() -> None:
    rec = perfguide.recommend("facebook/bart-large", "train_gpu_one", hardware="a10g")
    [note] = _headless(rec)
    assert "BartModel" in note and "task='seq2seq'" in note


def test_the_seq2seq_task_plans_the_head_and_says_nothing() -> None:
    rec = perfguide.recommend("facebook/bart-large", "train_gpu_one", hardware="a10g", task="seq2seq")
    assert _headless(rec) == []
    assert rec.model.head == "lm" and rec.model.is_encoder_decoder


def test_an_encoder_is_offered_classification_first() -> None:
    """XLM-R has a causal-LM head too (a decoder mode), but an encoder is fine-tuned as a classifier first."""
    note = headless_training_note(perfguide.ModelSpec.from_any("BAAI/bge-m3"))
    assert note is not None and "task='seq-cls'" in note and "causal-lm" not in note


def test_a_decoder_base_is_offered_the_causal_lm_head() -> None:
    note = headless_training_note(perfguide.ModelSpec.from_any("Qwen/Qwen3-Embedding-0.6B"))
    assert note is not None and "Qwen3Model" in note and "task='causal-lm'" in note


def test_a_model_with_a_head_gets_no_note() -> None:
    assert headless_training_note(perfguide.ModelSpec.from_any("gpt2")) is None
    rec = perfguide.recommend("gpt2", "train_gpu_one", hardware="a10g")
    assert _headless(rec) == []
