"""What perfguide tells a torchtune user must run in torchtune: a recipe trains in its ``dtype`` with no autocast, runs
neither Liger nor Cut Cross-Entropy nor HF's padding-free collator, and imports its optimizer by the class path the
config names. Before this, ``perfguide check`` on torchtune's own configs proposed ``dtype: fp32`` with a
TrainingArguments edit (bf16 autocast, TF32, Liger) no recipe reads, and wrote ``bitsandbytes.optim.adamw8bit``,
which no import finds. The configs are torchtune's (tests/data/check/, each citing its commit)."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import with_keys

import perfguide
from perfguide.integrations.readers import torchtune as reader

DATA = Path(__file__).parent / "data" / "check"
SFT = ("torchtune_llama3_2_1B_lora_single_device.yaml", "torchtune_llama3_2_1B_qlora_single_device.yaml",
       "torchtune_llama3_2_3B_full.yaml", "torchtune_llama3_1_8B_full_single_device.yaml",
       "torchtune_gemma2_2B_qlora_single_device.yaml")


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def load(name: str) -> dict[str, Any]:
    return yaml.safe_load((DATA / name).read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", SFT)
def test_the_recommended_change_is_torchtune_keys_that_reprice_to_the_plan(name: str, tmp_path: Path) -> None:
    """Every edit of the fit and recommended changes is a key of the torchtune config (none for the user's
    TrainingArguments or a perfguide.Setup), and the config with those keys applied reads back as the plan perfguide
    priced: the same peak, which a change torchtune cannot express (bf16 autocast over fp32 weights) would miss."""
    c = perfguide.check(config=DATA / name, hardware="a100-80gb", seq_len=2048)
    assert c.setup.trainer == "torchtune" and c.setup.autocast is None   # the premise: a recipe's dtype, no AMP
    for change in c.changes:
        assert all(e.format == "torchtune" for e in change.edits), (change.kind, [e.format for e in change.edits])
        assert change.setup.get("autocast") is None and "liger_kernel" not in change.setup and "tf32" not in change.setup
        if not change.edits:
            continue
        keys = {k: v for e in change.edits for k, v in e.keys.items()}
        path = tmp_path / name
        path.write_text(yaml.safe_dump(with_keys(load(name), keys)), encoding="utf-8")
        again = perfguide.check(config=path, hardware="a100-80gb", seq_len=2048)
        assert again.memory.device_total / 2**30 == pytest.approx(change.peak_gib, rel=1e-9), change.kind


def test_every_optimizer_class_written_is_importable() -> None:
    """torchtune instantiates ``optimizer._component_`` by importing the dotted path (config._utils
    _get_component_from_path): each class the writer names must import from the installed torch, bitsandbytes and
    torchao; a lower-cased path (``bitsandbytes.optim.adamw8bit``) does not."""
    base = perfguide.Setup(weights_dtype="bf16", trainer="torchtune")
    for name in sorted(set(reader.OPTIMIZER_CLASSES.values()) | {"adamw_torch_fused", "adamw_8bit"}):
        keys, rest = reader.write({"optimizer": name}, base.replace(optimizer=name))
        assert not rest
        module, _, cls = keys["optimizer._component_"].rpartition(".")
        assert isinstance(getattr(importlib.import_module(module), cls), type), keys
        if "optimizer.fused" in keys:   # only torch's AdamW takes it
            assert keys["optimizer._component_"] == "torch.optim.AdamW"


def test_a_config_naming_its_optimizer_in_lower_case_is_still_read(tmp_path: Path) -> None:
    y = with_keys(load("torchtune_llama3_2_3B_full.yaml"), {"optimizer._component_": "bitsandbytes.optim.adamw8bit"})
    path = tmp_path / "lower.yaml"
    path.write_text(yaml.safe_dump(y), encoding="utf-8")
    assert perfguide.check(config=path, hardware="a100-80gb").setup.optimizer == "adamw_bnb_8bit"


@pytest.mark.parametrize("finetune", [None, "lora", "qlora"])
def test_a_torchtune_plan_is_one_a_recipe_runs(finetune: str | None) -> None:
    """recommend(trainer='torchtune'): the recipe's dtype as compute (no autocast), adapters in it, no Liger or Cut
    Cross-Entropy (HF patches), TF32 off and the main-process loader, as the recipes run."""
    rec = perfguide.recommend("meta-llama/Llama-3.2-3B", "train_gpu_one", hardware="a100-80gb", seq_len=2048,
                              global_batch_size=16, trainer="torchtune", finetune=finetune)
    s = rec.setup
    assert (s.autocast, s.liger_kernel, s.cut_cross_entropy, s.padding_free, s.tf32) == (None, False, False, False, False)
    assert (s.dataloader_num_workers, s.dataloader_pin_memory) == (0, False)
    assert s.weights_dtype == ("nf4" if finetune == "qlora" else "bf16")
    if finetune:
        assert s.lora is not None and s.lora.adapter_dtype == "bf16"
        assert "16-bit adapters" in next(d.reason for d in rec.decisions if d.setting == "weights_dtype")
    else:
        assert "no autocast, no fp32 master copy" in next(d.reason for d in rec.decisions if d.setting == "master_weights")


def test_liger_under_torchtune_is_refused_in_one_line() -> None:
    with pytest.raises(perfguide.PerfGuideError, match=r"liger_kernel=True cannot .*not trainer='torchtune'") as exc:
        perfguide.recommend("meta-llama/Llama-3.2-3B", "train_gpu_one", hardware="a100-80gb", trainer="torchtune", liger_kernel=True)
    assert "\n" not in str(exc.value)


def test_enable_fp8_training_is_priced_as_fp8(tmp_path: Path) -> None:
    """full_finetune_distributed converts the model with torchao's convert_to_float8_training when the config sets
    enable_fp8_training: it was listed as 'read, not priced'. Read as fp8 GEMMs over the bf16 model, it is refused on
    an A100 (no fp8 tensor cores) and priced on an H100."""
    path = tmp_path / "fp8.yaml"
    path.write_text(yaml.safe_dump({**load("torchtune_llama3_2_3B_full.yaml"), "enable_fp8_training": True}), encoding="utf-8")
    c = perfguide.check(config=path, hardware="h100-80gb:2", num_gpus=2, seq_len=2048)
    assert (c.setup.autocast, c.setup.weights_dtype) == ("fp8", "bf16")
    plain = perfguide.check(config=DATA / "torchtune_llama3_2_3B_full.yaml", hardware="h100-80gb:2", num_gpus=2, seq_len=2048)
    assert c.throughput.step_time_s != plain.throughput.step_time_s
    with pytest.raises(perfguide.PerfGuideError, match="fp8"):
        perfguide.check(config=path, hardware="a100-80gb:2", num_gpus=2, seq_len=2048)


@pytest.mark.parametrize(("name", "what"), [
    ("torchtune_llama3_1_8B_full_dpo.yaml", "a DPO recipe's"),
    ("torchtune_dev_3B_full_grpo.yaml", "a GRPO recipe's"),
    ("torchtune_llama3_2_8B_to_1B_KD_lora_single_device.yaml", "a knowledge-distillation recipe's"),
])
def test_recipes_that_run_more_than_one_model_are_refused(name: str, what: str) -> None:
    """DPO (a reference model and two rows per pair), GRPO (generation and a reference) and distillation (a teacher)
    were priced as one model's SFT step: 8B_full_dpo read 'fits' on one 80 GB card with no reference model counted."""
    y = load(name)
    assert "optimizer" in y and ("loss" in y or "kd_loss" in y)   # the premise: each is a training config
    with pytest.raises(perfguide.PerfGuideError, match=f"this is {what}") as exc:
        perfguide.check(config=DATA / name, hardware="a100-80gb")
    assert "\n" not in str(exc.value)


def test_the_read_setup_is_the_recipe_loop() -> None:
    """The dataloader torchtune builds (no num_workers, no pin_memory) is what the config is priced with."""
    c = perfguide.check(config=DATA / "torchtune_llama3_2_3B_full.yaml", hardware="a100-80gb")
    assert (c.setup.dataloader_num_workers, c.setup.dataloader_pin_memory) == (0, False)


def test_a_distributed_recipe_read_as_one_process_is_told_to_launch_on_every_gpu() -> None:
    """llama3_2/3B_full (full_finetune_distributed, FSDP2) checked as a file is one process: 34 GiB on a 24 GB card.
    On a 4-GPU machine the smallest change is to launch it on all four, sharded as the recipe shards, which fits."""
    c = perfguide.check(config=DATA / "torchtune_llama3_2_3B_full.yaml", hardware="rtx4090:4", seq_len=2048)
    assert not c.fits and c.setup.num_gpus == 1
    fit = next(ch for ch in c.changes if ch.kind == "fit")
    assert fit.setup == {"num_gpus": 4, "strategy": "fsdp"} and fit.fits
    launched = perfguide.check(config=DATA / "torchtune_llama3_2_3B_full.yaml", hardware="rtx4090:4", seq_len=2048, num_gpus=4)
    assert launched.fits and launched.setup.strategy == "fsdp"
    assert launched.memory.device_total / 2**30 == pytest.approx(fit.peak_gib, rel=1e-9)


def test_a_plan_that_does_not_fit_is_no_change_to_make() -> None:
    """llama3_1/70B_full on one process fits by offloading to the CPU (fsdp_cpu_offload); perfguide's own one-GPU
    search finds nothing that fits, and its best was offered as the change to make (fsdp_cpu_offload: false among
    its edits), which would have broken a run that fits."""
    c = perfguide.check(config=DATA / "torchtune_llama3_1_70B_full.yaml", hardware="a100-80gb:8")
    assert c.fits
    rec = next(ch for ch in c.changes if ch.kind == "recommended")
    assert not rec.fits and not rec.edits and not rec.setup
    assert "keep it" in rec.reason
