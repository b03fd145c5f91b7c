"""task= / --task: the head to plan for, spelled as PEFT's task types (or transformers' pipeline names), the
head class taken from transformers' own Auto mapping, priced and emitted as that head (logits width, parameter
count, the LoraConfig task type, the Auto class in the report's code)."""

from __future__ import annotations

import pytest
from helpers import one_line

import perfguide
from perfguide import PerfGuideError
from perfguide.cli import main

MiB = 1024**2


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def meta_count(arch: str, config: dict, **update: object) -> int:
    """Parameters of the real transformers class, built on the meta device (no weights)."""
    import torch
    import transformers

    cfg = transformers.AutoConfig.for_model(config["model_type"], **{k: v for k, v in config.items() if k != "model_type"})
    for k, v in update.items():
        setattr(cfg, k, v)
    with torch.device("meta"):
        model = getattr(transformers, arch)(cfg)
    return sum(p.numel() for p in model.parameters())


def test_seq_cls_head_is_priced_as_the_real_classifier():
    rec = perfguide.recommend("bert-base-uncased", hardware="t4", task="seq-cls", num_labels=3)
    spec = rec.model
    assert spec.architecture == "BertForSequenceClassification" and spec.head == "sequence_classification"
    assert spec.num_labels == 3 and spec.logits_width == 3
    assert spec.total_params == meta_count("BertForSequenceClassification", perfguide.ModelSpec.from_any("bert-base-uncased").config,
                                           num_labels=3)


def test_the_classifier_head_shrinks_the_logits_the_memory_model_counts():
    mlm = perfguide.recommend("bert-base-uncased", hardware="t4", micro_batch_size=8, seq_len=512, global_batch_size=8)
    cls = perfguide.recommend("bert-base-uncased", hardware="t4", micro_batch_size=8, seq_len=512, global_batch_size=8, task="seq-cls")
    # masked LM: 8 x 512 positions x 30,522 vocabulary logits (at least one 2-byte copy); seq-cls: 8 x 2 scores
    assert mlm.memory.logits >= 8 * 512 * 30522 * 2
    assert cls.memory.logits < 1 * MiB


@pytest.mark.parametrize(("model", "task", "peft_type", "auto"), [
    ("bert-base-uncased", "seq-cls", "SEQ_CLS", "AutoModelForSequenceClassification"),
    ("bert-base-uncased", "token-cls", "TOKEN_CLS", "AutoModelForTokenClassification"),
    ("bert-base-uncased", "qa", "QUESTION_ANS", "AutoModelForQuestionAnswering"),
    ("bert-base-uncased", "feature-extraction", "FEATURE_EXTRACTION", "AutoModel"),
    ("t5-small", "seq2seq", "SEQ_2_SEQ_LM", "AutoModelForSeq2SeqLM"),
    ("gpt2", "causal-lm", "CAUSAL_LM", "AutoModelForCausalLM"),
    ("Qwen/Qwen2.5-0.5B", "seq-cls", "SEQ_CLS", "AutoModelForSequenceClassification"),
])
def test_lora_config_and_code_follow_the_task(model, task, peft_type, auto):
    from peft import LoraConfig, TaskType

    rec = perfguide.recommend(model, hardware="a100-80gb", finetune="lora", task=task)
    config = rec.lora_config()
    assert isinstance(config, LoraConfig) and config.task_type == TaskType[peft_type]
    assert rec.summary().run[1] == f"from transformers import {auto}, Trainer"


@pytest.mark.parametrize("spelling", ["SEQ_CLS", "Seq-Cls", "text-classification", "sequence_classification"])
def test_peft_and_pipeline_spellings_name_the_same_task(spelling):
    assert perfguide.recommend("bert-base-uncased", hardware="t4", task=spelling).model.head == "sequence_classification"


def test_cli_task_flag(capsys):
    code = main(["recommend", "bert-base-uncased", "--hardware", "t4", "--task", "seq-cls", "--num-labels", "5", "--brief"])
    out, _ = capsys.readouterr()
    assert code == 0
    assert 'AutoModelForSequenceClassification.from_pretrained("google-bert/bert-base-uncased", num_labels=5' in out
    assert 'task="seq-cls", num_labels=5' in out


@pytest.mark.parametrize(("argv", "named"), [
    (["--task", "bogus"], "task"),
    (["--task", "seq2seq"], "no seq2seq head"),
    (["--num-labels", "3"], "num_labels"),
])
def test_cli_refuses_a_task_the_model_cannot_have_in_one_line(capsys, argv, named):
    code = main(["recommend", "bert-base-uncased", "--hardware", "t4", *argv])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.startswith("error: ") and err.count("\n") == 1
    assert named in err


def test_a_size_has_its_config_and_a_task_refusal_is_one_line():
    with pytest.raises(PerfGuideError) as exc:
        perfguide.recommend("gpt2", hardware="t4", task="seq-cls", num_labels=0)
    one_line(exc, "num_labels")


def test_an_inference_classifier_runs_a_forward_not_generate():
    rec = perfguide.recommend("bert-base-uncased", "infer_gpu_one", hardware="t4", task="seq-cls")
    assert not rec.model.generates
    assert rec.summary().run[-1] == "outputs = model(**inputs)"


def test_recommend_help_explains_the_task_flag(capsys):
    assert main(["recommend", "--help"]) == 0
    out = " ".join(capsys.readouterr()[0].split())
    assert "--task TASK the model's head: causal-lm, seq-cls" in out
