"""Setup.overlap_comm: ZeRO-1/2 hold a second reduce_bucket_size ipg buffer only with overlap_comm. A DeepSpeed config
that leaves the key out runs DeepSpeed's own default, stage == 3 (zero/config.py overlap_comm_valid), and the readers
fill that; perfguide's emitted config writes the field it priced."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import make_rec

import perfguide


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _ds(tmp_path: Path, zero: dict) -> str:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "zero_optimization": zero}), encoding="utf-8")
    return str(path)


def _deepspeed_default(zero: dict) -> bool:
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    return bool(DeepSpeedZeroConfig(**zero).overlap_comm)


@pytest.mark.parametrize("zero", [{"stage": 2}, {"stage": 1}, {"stage": 2, "overlap_comm": True}, {"stage": 2, "overlap_comm": False},
                                  {"stage": 3}])
def test_deepspeed_json_reads_overlap_comm_as_deepspeed_resolves_it(tmp_path: Path, zero: dict) -> None:
    c = perfguide.check("gpt2", _ds(tmp_path, zero), hardware="a100-80gb:2", seq_len=512)
    want = _deepspeed_default(zero)   # the installed DeepSpeed's own validator
    if zero["stage"] < 3:
        assert c.setup.overlap_comm is want
    else:
        assert want is True and c.setup.overlap_comm is True


def test_accelerate_inline_plugin_writes_no_overlap_comm(tmp_path: Path) -> None:
    from accelerate.utils import DeepSpeedPlugin

    plugin = DeepSpeedPlugin(zero_stage=2, gradient_accumulation_steps=1)
    assert "overlap_comm" not in plugin.deepspeed_config["zero_optimization"]
    assert _deepspeed_default(plugin.deepspeed_config["zero_optimization"]) is False
    import yaml

    path = tmp_path / "acc.yaml"
    path.write_text(yaml.safe_dump({"distributed_type": "DEEPSPEED", "num_processes": 2, "deepspeed_config": {"zero_stage": 2}}), encoding="utf-8")
    assert perfguide.check("gpt2", str(path), hardware="a100-80gb:2", seq_len=512).setup.overlap_comm is False
    argv = ["accelerate", "launch", "--num_processes", "2", "--use_deepspeed", "--zero_stage", "2", "train.py"]
    assert perfguide.check("gpt2", argv, hardware="a100-80gb:2", seq_len=512).setup.overlap_comm is False


def test_emitted_config_writes_the_priced_field() -> None:
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    for overlap in (True, False):
        rec = make_rec({"micro_batch_size": 4, "autocast": "bf16", "num_gpus": 8, "strategy": "zero2", "overlap_comm": overlap})
        zero = rec.deepspeed_config()["zero_optimization"]
        assert zero["overlap_comm"] is overlap and DeepSpeedZeroConfig(**zero).overlap_comm is overlap
    plan = perfguide.recommend("gpt2", "train_gpu_many", hardware="a100-80gb:2", strategy="zero2", seq_len=512)
    assert plan.setup.overlap_comm is True and plan.deepspeed_config()["zero_optimization"]["overlap_comm"] is True
