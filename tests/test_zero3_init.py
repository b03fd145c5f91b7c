"""ZeRO-3 without zero.Init: deepspeed.initialize casts the loaded model to its engine dtype and moves it whole onto
every GPU before partitioning it (runtime/engine.py _configure_distributed_model), so the load is a floor of the peak.
Setup.zero3_init=False says the script loads the model before any ZeRO-3 config exists."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import perfguide
from perfguide import ModelSpec, Setup
from perfguide.memory.analytic import zero3_load_bytes

# google/flan-t5-xxl (T5 v1.1 XXL) by hand: d_model 4096, d_ff 10240 (gated: wi_0, wi_1, wo), 64 heads x d_kv 64,
# 24 encoder blocks (self-attention q k v o, FF, 2 RMS norms) and 24 decoder blocks (self + cross attention, FF, 3
# norms), a 32128-token shared embedding and an untied LM head, one relative-position bias (32 buckets x 64 heads) per
# stack, a final norm per stack
D, FF, V = 4096, 10240, 32128
ENC = 24 * (4 * D * D + 3 * D * FF + 2 * D)
DEC = 24 * (8 * D * D + 3 * D * FF + 3 * D)
T5_XXL = ENC + DEC + 2 * V * D + 2 * 32 * 64 + 2 * D   # 11,135,332,352


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _xxl(**kw: object) -> Setup:
    # philschmid's flan-t5 rows: ZeRO-3 + CPU offload of params and optimizer, fp32 on V100s (no bf16 there)
    base = dict(strategy="zero3", num_gpus=4, seq_len=500, target_len=129, gradient_checkpointing=True,
                offload_optimizer=True, offload_params=True, zero3_init=False)
    return Setup(**{**base, **kw})


def test_the_load_is_every_parameter_at_the_engine_dtype() -> None:
    spec = ModelSpec.from_any("google/flan-t5-xxl")
    assert zero3_load_bytes(spec, _xxl()) == T5_XXL * 4                    # fp32 engine: the loaded fp32 weights
    assert zero3_load_bytes(spec, _xxl(autocast="bf16")) == T5_XXL * 2     # bf16 engine: module cast before the move
    assert zero3_load_bytes(spec, _xxl(zero3_init=True)) == 0              # built partitioned: nothing whole
    assert zero3_load_bytes(spec, _xxl(strategy="zero2", offload_params=False)) == 0   # only ZeRO-3 reads the field


def test_the_verdict_counts_the_load() -> None:
    # 11.1B fp32 parameters (44.5 GB) on a 16 GB V100: philschmid's published OOM, whatever the offload of the step
    whole = perfguide.estimate("google/flan-t5-xxl", _xxl(), hardware="v100-16gb:4")
    assert not whole.fits and whole.fit_total >= T5_XXL * 4 and whole.peak_allocated >= T5_XXL * 4
    assert any("create TrainingArguments(deepspeed=...)" in n for n in whole.notes)
    built = perfguide.estimate("google/flan-t5-xxl", _xxl(zero3_init=True), hardware="v100-16gb:4")
    assert built.fits and built.fit_total < T5_XXL * 4 / 2


DS_ENGINE = """
import os, torch
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29517", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
import deepspeed
deepspeed.init_distributed(dist_backend="gloo")
cfg = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}, "bf16": {"enabled": True},
       "zero_allow_untested_optimizer": True}
def net():
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64))
plain = net()
with deepspeed.zero.Init(config_dict_or_path=cfg):
    built = net()
moves, to = [], torch.nn.Module.to
def spy(self, *a, **k):
    if self is plain or self is built:
        moves.append(("plain" if self is plain else "built", str(next(self.parameters()).dtype)))
    return to(self, *a, **k)
torch.nn.Module.to = spy
before = {"plain": any(hasattr(p, "ds_id") for p in plain.parameters()), "built": any(hasattr(p, "ds_id") for p in built.parameters())}
for m in (plain, built):
    deepspeed.initialize(model=m, config=cfg, optimizer=torch.optim.SGD(m.parameters(), lr=0.1))
torch.nn.Module.to = to
print(json.dumps({"before": before, "moves": moves}))
"""


def test_the_installed_engine_moves_a_model_not_built_under_zero_init() -> None:
    # the real DeepSpeed engine on its CPU accelerator: a model built outside zero.Init has no ds_id, and
    # deepspeed.initialize casts it to bf16 and calls module.to(device) on it whole; a zero.Init model is left in place
    pytest.importorskip("deepspeed")
    run = subprocess.run([sys.executable, "-c", "import json\n" + DS_ENGINE], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["before"] == {"plain": False, "built": True}
    assert out["moves"] == [["plain", "torch.bfloat16"]]


# --- readers: accelerate's zero3_init_flag ---------------------------------------------------------------------------

def _yaml(path: Path, data: dict) -> str:
    import yaml

    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return str(path)


def test_accelerate_zero3_init_flag_false_is_read(tmp_path: Path) -> None:
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"zero_optimization": {"stage": 3}, "bf16": {"enabled": "auto"}}), encoding="utf-8")
    for deepspeed_config in ({"deepspeed_config_file": "ds.json", "zero3_init_flag": False}, {"zero_stage": 3, "zero3_init_flag": False}):
        path = _yaml(tmp_path / "acc.yaml", {"distributed_type": "DEEPSPEED", "num_processes": 4, "mixed_precision": "bf16",
                                             "deepspeed_config": deepspeed_config})
        from accelerate.commands.config.config_args import load_config_from_file

        assert load_config_from_file(path).deepspeed_config["zero3_init_flag"] is False   # accelerate's own loader agrees
        c = perfguide.check("google/flan-t5-xxl", path, hardware="a10g:4", seq_len=512, micro_batch_size=1)
        # the installed accelerate (>= 1.0) builds the HfDeepSpeedConfig whatever the flag: still zero.Init, said so
        assert c.setup.strategy == "zero3" and c.setup.zero3_init is True
        assert any("zero3_init_flag is false, but accelerate" in n for n in c.notes)
        assert "deepspeed_config.zero3_init_flag" not in " ".join(c.ignored)


def test_a_false_flag_means_no_zero_init_only_before_accelerate_1_0() -> None:
    """accelerate 0.34's DeepSpeedPlugin.set_deepspeed_weakref builds the HfDeepSpeedConfig only under
    ``if self.zero3_init_flag``; the installed one builds it unconditionally (read here, not assumed)."""
    import inspect

    from accelerate.utils import DeepSpeedPlugin

    from perfguide.integrations.readers import accelerate as acc_reader
    from perfguide.integrations.readers.base import Collector

    body = inspect.getsource(DeepSpeedPlugin.set_deepspeed_weakref)
    assert "self.dschf = HfDeepSpeedConfig(ds_config)" in body   # the installed release's unconditional build
    for release, expected in (("0.34.2", False), ("1.0.0", None), ("1.15.0", None)):
        col = Collector("accelerate", "acc.yaml")
        acc_reader.zero3_init(False, col, "deepspeed_config.zero3_init_flag", "zero3", release=release)
        assert next((x.value for x in col.settings if x.field == "zero3_init"), None) is expected, release
        assert col.notes and release in col.notes[0]


def test_accelerate_launch_zero3_init_flag_takes_a_value(tmp_path: Path) -> None:
    argv = ["accelerate", "launch", "--num_processes", "4", "--use_deepspeed", "--zero_stage", "3", "--zero3_init_flag", "false",
            "train.py", "--per_device_train_batch_size", "1"]
    c = perfguide.check("google/flan-t5-xxl", argv, hardware="a10g:4", seq_len=512)
    assert c.setup.strategy == "zero3" and any("--zero3_init_flag is false" in n for n in c.notes)
    on = perfguide.check("google/flan-t5-xxl", [*argv[:7], "--zero3_init_flag", "true", *argv[9:]], hardware="a10g:4", seq_len=512)
    assert on.setup.zero3_init is True and not any("zero3_init_flag" in n for n in on.notes)
    # the stage from the --config_file it names; under ZeRO-2 accelerate drops the flag (DeepSpeedPlugin) and so does the read
    config = _yaml(tmp_path / "z3.yaml", {"distributed_type": "DEEPSPEED", "num_processes": 4, "deepspeed_config": {"zero_stage": 3}})
    filed = ["accelerate", "launch", "--config_file", config, "--zero3_init_flag", "false", "train.py", "--per_device_train_batch_size", "1"]
    assert any("--zero3_init_flag is false" in n for n in perfguide.check("google/flan-t5-xxl", filed, hardware="a10g:4", seq_len=512).notes)
    zero2 = [*argv[:6], "2", *argv[7:]]
    assert not any("zero3_init_flag" in n for n in perfguide.check("google/flan-t5-xxl", zero2, hardware="a10g:4", seq_len=512).notes)


def test_emitted_accelerate_config_reads_back_with_zero_init(tmp_path: Path) -> None:
    rec = perfguide.recommend("google/flan-t5-xl", "train_gpu_many", hardware="a100-40gb:8", strategy="zero3", seq_len=512)
    path = rec.write_accelerate_config(tmp_path / "acc.yaml")
    from accelerate.commands.config.config_args import load_config_from_file

    assert load_config_from_file(str(path)).deepspeed_config["zero3_init_flag"] is True
    assert perfguide.check("google/flan-t5-xl", str(path), hardware="a100-40gb:8", seq_len=512).setup.zero3_init is True


def test_the_fix_is_written_as_the_flag_only_for_a_zero3_target() -> None:
    from perfguide.integrations.readers import accelerate as acc_reader
    from perfguide.integrations.readers import launcher

    zero3, fsdp = Setup(strategy="zero3", num_gpus=4), Setup(strategy="fsdp", num_gpus=4)
    assert acc_reader.write({"zero3_init": True}, zero3) == ({"deepspeed_config.zero3_init_flag": True}, {})
    assert "zero3_init_flag" in acc_reader.DS_KEYS   # a key of accelerate's own config (checked in test_check)
    assert acc_reader.write({"zero3_init": True}, fsdp) == ({}, {})   # an FSDP plan reads no zero.Init flag
    assert launcher.write({"zero3_init": True}, zero3) == ({"--zero3_init_flag": "true"}, {})
