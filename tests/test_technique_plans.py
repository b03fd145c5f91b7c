"""Issue 11's three cases come out as fitting full fine-tuning plans, and each runs on a tiny model in a real Trainer.

References: torchtune's published recipe (Llama-3.1-8B full fine-tune, batch 2 x 2048: 18.9 GiB on one RTX 4090,
README at 0031bfb), ZeRO-Offload's headline (13B on one V100-32GB, arXiv:2101.06840); the CUDA-only parts are
checked against the libraries' own parsers (TrainingArguments / SFTConfig fields, DeepSpeed's config classes,
accelerate's precision enum). The plan's Setup is moved to the CPU with only the CUDA-only techniques dropped.
"""

from __future__ import annotations

import dataclasses

import pytest

try:
    from helpers import GiB, make_rec, tiny_model, token_dataset
except ImportError:  # run from the repo root
    from tests.helpers import GiB, make_rec, tiny_model, token_dataset

import perfguide as pg

torch = pytest.importorskip("torch")
EIGHT_B = "meta-llama/Llama-3.1-8B"
TORCHTUNE_4090_GIB = 18.9   # pytorch/torchtune README.md @ 0031bfb080bd35ec533c412df883cf2bf7bf7fe4


def _plan(model: str, hw: str, **kw: object) -> pg.Recommendation:
    return pg.recommend(model, "train_gpu_one", hardware=hw, seq_len=2048, **kw)


@pytest.fixture(scope="module")
def plans() -> dict[str, pg.Recommendation]:
    return {
        "4090": _plan(EIGHT_B, "rtx4090", global_batch_size=2),       # torchtune's batch: 2, no accumulation
        # perfguide's default global batch (32): ZeRO-Offload needs ~165 GiB of host RAM, more than the typical 64 GiB
        # desktop a bare 'rtx4090' is planned on (data/hosts.json), so the host is given
        "4090_default": _plan(EIGHT_B, "rtx4090", host_ram="256GiB"),
        "a6000": _plan(EIGHT_B, "a6000", global_batch_size=2),
        # ZeRO-Offload's headline ran on a DGX-2 (1.5 TB of host RAM); a bare 'v100-32gb' is planned on a 1/8 share
        # of AWS p3dn.24xlarge (96 GiB), too little for 13B's fp32 masters and Adam states
        "v100": _plan("13b", "v100-32gb", host_ram="1536GiB"),
    }


def test_all_three_cases_fit_as_full_fine_tunes(plans):
    for name, rec in plans.items():
        assert rec.fits, name
        assert rec.setup.lora is None and rec.decision("finetune").value == "full", name


def test_8b_on_a_4090_is_torchtunes_recipe_and_its_memory(plans):
    s, m = plans["4090"].setup, plans["4090"].memory
    assert s.weights_dtype == "bf16" and s.optimizer_in_backward and s.liger_kernel
    # activations leave the GPU either way: recomputed (torchtune's checkpointing) or all sent to pinned host RAM, which
    # the step-time model prices faster here once fp8's eager casts are paid on the recomputed forward too
    assert s.gradient_checkpointing or s.activation_offloading
    assert s.optimizer.startswith("paged_") and (s.micro_batch_size, s.gradient_accumulation_steps) == (2, 1)
    # torch's peak (the paged state lives in unified memory, outside the allocator), vs the published 18.9 GiB
    assert abs(m.peak_allocated / GiB / TORCHTUNE_4090_GIB - 1) < 0.15
    report = plans["4090"].report()
    for word in ("optimizer_in_backward", "liger_kernel", "paged"):
        assert word in report


def test_default_batch_on_a_4090_and_13b_on_a_v100_offload_to_the_cpu(plans):
    for name in ("4090_default", "v100"):
        rec = plans[name]
        assert rec.setup.strategy in ("zero2", "zero3") and rec.setup.offload_optimizer and rec.setup.num_gpus == 1
        assert rec.memory.cpu_ram > 0 and rec.throughput.offload_time_s > 0     # host RAM and PCIe priced
        d = rec.decision("cpu_offload")
        assert d is not None and "host RAM" in d.reason and d.number and d.number > 0
    assert plans["v100"].setup.autocast == "fp16"           # no bf16 on a V100; Llama-2 checkpoints are fp16


def test_cuda_only_settings_pass_their_libraries_parsers(plans):
    from transformers import TrainingArguments
    from trl import SFTConfig

    fields = {f.name for f in dataclasses.fields(TrainingArguments)}
    sft_fields = {f.name for f in dataclasses.fields(SFTConfig)}
    for name, rec in plans.items():
        kw = rec.training_args_dict(output_dir="out")
        assert set(kw) <= fields, (name, set(kw) - fields)
        assert set(rec.sft_config_dict(output_dir="out")) <= sft_fields, name
    assert plans["4090"].training_args_dict()["use_liger_kernel"] is True
    assert plans["4090"].training_args_dict()["max_grad_norm"] == 0.0


def test_one_gpu_offload_config_loads_in_deepspeed(plans):
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    from perfguide.integrations.deepspeed import resolved_deepspeed_config

    rec = plans["v100"]
    cfg = rec.deepspeed_config()
    zero = DeepSpeedZeroConfig(**cfg["zero_optimization"])     # extra="forbid": misspelt keys fail
    assert zero.offload_optimizer is not None and zero.offload_optimizer.device == "cpu"
    resolved = DeepSpeedConfig(resolved_deepspeed_config(rec))
    assert resolved.train_batch_size == rec.setup.global_batch_size and resolved.float16_config.enabled


def _loads_in_accelerate(cfg: dict, tmp_path: object) -> None:
    import yaml
    from accelerate.commands.config.config_args import ClusterConfig

    path = tmp_path / "accelerate.yaml"
    path.write_text(yaml.safe_dump(cfg))
    loaded = ClusterConfig.from_yaml_file(str(path))
    assert str(loaded.mixed_precision) in ("fp8", "PrecisionType.FP8") and loaded.fp8_config == {"backend": "AO"}


def test_fp8_plan_speaks_accelerates_words(plans, tmp_path):
    from accelerate.utils import PrecisionType

    for rec in plans.values():
        if rec.setup.autocast == "fp8":
            cfg = rec.accelerate_config()
            assert PrecisionType(cfg["mixed_precision"]) == PrecisionType.FP8 and cfg["fp8_config"] == {"backend": "AO"}
            assert rec.training_args_dict()["bf16"] is True
            _loads_in_accelerate(cfg, tmp_path)


def _on_cpu(rec: pg.Recommendation) -> pg.Recommendation:
    """The plan's Setup on this CPU: every technique that runs here is kept, the CUDA-only ones dropped."""
    s = rec.setup
    cpu = dict(device="cpu", seq_len=16, micro_batch_size=4, gradient_accumulation_steps=s.gradient_accumulation_steps if not s.optimizer_in_backward else 1,
               optimizer=s.optimizer, optimizer_in_backward=s.optimizer_in_backward, gradient_checkpointing=s.gradient_checkpointing,
               weights_dtype="fp32", padding_free=s.padding_free, avg_seq_len=8 if s.padding_free else None)
    return make_rec(cpu)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["4090", "a6000", "v100"])
def test_each_plan_trains_a_tiny_model_in_a_real_trainer_on_cpu(plans, name, tmp_path):
    from transformers import Trainer

    rec = _on_cpu(plans[name])
    args = rec.training_args(output_dir=str(tmp_path), max_steps=2, report_to=[], save_strategy="no")
    model = rec.prepare_model(tiny_model())
    before = [p.detach().clone() for p in model.parameters()]
    Trainer(model=model, args=args, train_dataset=token_dataset(16), optimizers=rec.optimizers(model, args),
            data_collator=rec.data_collator()).train()
    assert any(not torch.equal(b, p.detach()) for b, p in zip(before, model.parameters()))
