"""One verdict: rec.fits, rec.memory.fits, the report and the Decisions agree; a refusal names the limit that binds
(host RAM when that is it) with its real numbers; a verdict resting on an assumed host says so."""

from __future__ import annotations

import pytest

from perfguide import recommend

GiB = 1024**3


@pytest.mark.parametrize("model,scenario,hardware,kw", [
    ("meta-llama/Llama-3.1-70B", "train_gpu_one", "rtx4090", {}),
    ("meta-llama/Llama-3.1-8B", "train_gpu_one", "a100-80gb", {"seq_len": 2048, "global_batch_size": 64}),
    ("meta-llama/Llama-3.1-70B", "train_gpu_many", "rtx4090:2", {"finetune": "qlora"}),
    ("meta-llama/Llama-3.1-70B", "infer_gpu_one", "rtx4090", {"quantization": "int8"}),
])
def test_fits_is_said_once(model: str, scenario: str, hardware: str, kw: dict) -> None:
    rec = recommend(model, scenario, hardware=hardware, **kw)
    assert rec.memory.fits == rec.fits
    memory_rows = [line for line in rec.report().splitlines() if line.strip().lstrip("- ").startswith("fits:")]
    assert memory_rows and all(("yes" in r) == rec.fits for r in memory_rows)


def test_a_host_ram_refusal_names_host_ram_with_its_numbers() -> None:
    """70B full fine-tune on one 24 GB card: only ZeRO-Offload could run it, and its states are 16 B per parameter
    on the host (fp32 master, gradient and AdamW's two moments): 70.6e9 x 16 B = 1,052 GiB > the 256 GiB host."""
    rec = recommend("meta-llama/Llama-3.1-70B", "train_gpu_one", hardware="rtx4090")
    assert not rec.fits
    reason = next(d.reason for d in rec.decisions if d.setting == "per_device_train_batch_size")
    assert "host RAM" in reason
    needed = float(reason.split("needs ")[1].split(" GiB")[0])
    assert needed >= 70.6e9 * 16 / GiB * 0.95


def test_a_verdict_on_an_assumed_host_says_so_and_names_the_flag() -> None:
    rec = recommend("meta-llama/Llama-2-13b-hf", "train_gpu_one", hardware="a10g")
    said = [w for w in rec.warnings if "host RAM is assumed" in w]
    # a bare a10g is planned on the smallest AWS instance that carries one: g5.xlarge, 4 vCPUs and 16 GiB (AWS's table)
    assert said and "host_ram=" in said[0] and "g5.xlarge (16 GiB" in said[0]
    host = rec.decision("host")
    assert host.number == 16 * GiB and "https://docs.aws.amazon.com" in host.source and "--host-ram" in host.reason
    roomy = recommend("meta-llama/Llama-2-13b-hf", "train_gpu_one", hardware="a10g", host_ram="512GiB")
    assert roomy.fits != rec.fits and not any("host RAM is assumed" in w for w in roomy.warnings)


def test_idle_gpus_are_named_with_the_scenario_that_uses_them() -> None:
    one = recommend("meta-llama/Llama-3.1-8B", "train_gpu_one", hardware="a100-80gb:8", seq_len=2048, global_batch_size=64)
    said = [w for w in one.warnings if "sit idle" in w]
    assert said and "7 of the 8 GPUs" in said[0] and "scenario='train_gpu_many'" in said[0]
    many = recommend("meta-llama/Llama-3.1-8B", "train_gpu_many", hardware="a100-80gb:8", seq_len=2048, global_batch_size=64)
    assert f"{many.throughput.step_time_s:.3g} s/step" in said[0]
    assert not any("sit idle" in w for w in recommend("gpt2", "train_gpu_one", hardware="a100-80gb").warnings)
