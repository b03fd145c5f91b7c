"""Report wording that must not mislead: communication as total and exposed, no LoRA advice on adapter plans,
the batch-size Decision counted in tokens, the title naming the nodes asked for."""

from __future__ import annotations

import re

import pytest

import perfguide
from perfguide.cli import main


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _pcie_warning(rec: perfguide.Recommendation) -> str:
    return next(w for w in rec.warnings if "no NVLink" in w)


def test_collectives_are_said_as_total_and_exposed():
    rec = perfguide.recommend("meta-llama/Llama-3.1-8B", "train_gpu_many", hardware="rtx4090:4")
    t = rec.throughput
    assert rec.setup.strategy != "ddp" and t.comm_total_s > 0 and t.comm_total_s >= t.comm_time_s
    warning = _pcie_warning(rec)
    assert f"take {t.comm_total_s:.3g} s per step, {t.comm_time_s:.3g} s of it exposed" in warning
    assert not re.search(r"take [\d.]+ s of the [\d.]+ s step", warning)
    assert "communication: " in rec.report() and "exposed (not hidden by compute)" in rec.report()


def test_a_qlora_plan_is_not_told_to_use_lora():
    rec = perfguide.recommend("meta-llama/Llama-3.1-70B", "train_gpu_many", hardware="rtx4090:2", finetune="qlora")
    assert rec.setup.lora is not None
    warning = _pcie_warning(rec)
    assert "LoRA" not in warning and "DDP" in warning
    full = perfguide.recommend("meta-llama/Llama-3.1-8B", "train_gpu_many", hardware="rtx4090:4")
    assert "or LoRA to make DDP fit" in _pcie_warning(full)


def test_the_batch_size_decision_is_decided_by_tokens_not_bytes():
    rec = perfguide.recommend("gpt2", hardware="a100-80gb", seq_len=1024)
    d = rec.decision("per_device_train_batch_size")
    assert d.unit == "tokens per micro-batch" and d.number == rec.setup.micro_batch_size * 1024
    assert f"decided by: {rec.setup.micro_batch_size * 1024:,} tokens per micro-batch" in rec.report()


def test_the_title_keeps_the_nodes_asked_for(capsys):
    code = main(["recommend", "meta-llama/Llama-3.1-8B", "--scenario", "train_gpu_many", "--hardware", "h100-80gb:8",
                 "--nodes", "2", "--brief"])
    out, _ = capsys.readouterr()
    assert code == 0 and re.search(r"on h100-80gb:8(x2| x 2 nodes)$", out.splitlines()[0]), out.splitlines()[0]
    code = main(["recommend", "meta-llama/Llama-3.1-8B", "--scenario", "train_gpu_many", "--hardware", "h100-80gb:8x2", "--brief"])
    out, _ = capsys.readouterr()
    assert code == 0 and out.splitlines()[0].endswith("on h100-80gb:8x2")
