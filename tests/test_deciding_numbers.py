"""Every decision carries the number that decided it: pinning (the bytes it locks), the CPU dtype (the 16-bit matmul
rate over fp32), a forward-only cache choice, the 4-bit storage dtype. Each number is checked against a reference
built outside the decision: the real TRL collator's batch, torch's own DataLoader default, FLOPs per cycle by hand."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

import perfguide
from perfguide.hardware.types import CPU
from perfguide.scenarios.rules_precision import cpu_bf16_speedup

FRACTION = json.loads((Path(perfguide.__file__).parent / "data" / "efficiency.json").read_text())["cpu_peak_fraction"]["value"]


def _rec(model: str, scenario: str, hardware: str, **kw: object) -> perfguide.Recommendation:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return perfguide.recommend(model, scenario, hardware=hardware, **kw)


def _decision(rec: perfguide.Recommendation, setting: str) -> perfguide.Decision:
    return next(d for d in rec.decisions if d.setting == setting)


def _collated_bytes(micro: int, seq: int) -> int:
    """Bytes of one micro-batch as TRL's SFT collator builds it (input_ids, attention_mask, labels)."""
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    batch = DataCollatorForLanguageModeling(pad_token_id=0)([{"input_ids": list(range(1, seq + 1))} for _ in range(micro)])
    return sum(t.numel() * t.element_size() for t in batch.values())


def _prefetched(workers: int) -> int:
    """Batches a DataLoader holds in flight: torch's own prefetch_factor default per worker, or the main process's one."""
    from torch.utils.data import DataLoader

    return DataLoader(list(range(4)), num_workers=workers).prefetch_factor * workers if workers else 1


def test_gpu_pinning_states_the_bytes_it_locks() -> None:
    rec = _rec("meta-llama/Llama-3.2-1B", "train_gpu_one", "rtx4090")
    s, d = rec.setup, _decision(rec, "dataloader_pin_memory")
    assert d.value is True and s.dataloader_num_workers > 0
    assert d.number == _prefetched(s.dataloader_num_workers) * _collated_bytes(s.micro_batch_size, s.seq_len)
    assert "bytes" in (d.unit or "") and d.source


def test_dpo_pinning_counts_the_chosen_and_rejected_rows() -> None:
    """TRL's preference collator stacks each pair's chosen and rejected sequences: twice the rows of the micro-batch."""
    from trl.trainer.dpo_trainer import DataCollatorForPreference

    rec = _rec("Qwen/Qwen2.5-0.5B", "train_gpu_one", "h100", objective="dpo")
    s, d = rec.setup, _decision(rec, "dataloader_pin_memory")
    half = s.seq_len // 2   # prompt + completion fill the sequence
    pair = {"prompt_ids": list(range(1, half + 1)), "chosen_ids": list(range(1, half + 1)), "rejected_ids": list(range(1, half + 1))}
    batch = DataCollatorForPreference(pad_token_id=0)([pair] * s.micro_batch_size)
    assert d.number == _prefetched(s.dataloader_num_workers) * sum(t.numel() * t.element_size() for t in batch.values())


def test_cpu_training_does_not_pin_and_says_it_locks_nothing() -> None:
    rec = _rec("meta-llama/Llama-3.2-1B", "train_cpu", "cpu")
    d = _decision(rec, "dataloader_pin_memory")
    assert d.value is False and d.number == 0


def test_cpu_bf16_rate_by_hand() -> None:
    """FLOPs per cycle per core: AVX-512 fp32 64, AMX bf16 1024, AVX512-BF16 twice fp32; emulated bf16 at half fp32."""
    common = dict(physical_cores=8, logical_cores=16, ram_total=2**36, ram_available=2**36)
    amx = CPU(flags=("avx512f", "amx_bf16", "amx_tile"), fp32_gflops=8 * 2.0 * 64, bf16_gflops=8 * 2.0 * 1024, **common)
    vnni = CPU(flags=("avx512f", "avx512_bf16"), fp32_gflops=8 * 2.0 * 64, bf16_gflops=8 * 2.0 * 128, **common)
    plain = CPU(flags=("avx2", "fma"), fp32_gflops=8 * 2.0 * 32, bf16_gflops=8 * 2.0 * 32, **common)
    assert cpu_bf16_speedup(amx) == round(16 * FRACTION["bf16_amx"] / FRACTION["fp32"], 2)
    assert cpu_bf16_speedup(vnni) == round(2 * FRACTION["bf16_avx512"] / FRACTION["fp32"], 2)
    assert cpu_bf16_speedup(plain) == 0.5


@pytest.mark.parametrize(("scenario", "setting"), [("train_cpu", "mixed_precision"), ("infer_cpu", "dtype")])
def test_cpu_dtype_decisions_carry_the_rate_that_decided_them(scenario: str, setting: str) -> None:
    rec = _rec("meta-llama/Llama-3.2-1B", scenario, "cpu")
    d = _decision(rec, setting)
    assert d.number == cpu_bf16_speedup(rec.hardware.cpu)
    assert (d.number < 1) == (d.value in ("no", "fp32"))   # the named generic CPU has no AVX512-BF16/AMX


def test_forward_only_cache_decision_counts_the_tokens_it_decodes() -> None:
    d = _decision(_rec("google-bert/bert-base-uncased", "infer_gpu_one", "t4"), "cache_implementation")
    assert d.value == "dynamic" and d.number == 0


def test_forced_fp32_and_forced_inference_dtype_carry_numbers() -> None:
    t4 = _rec("meta-llama/Llama-3.2-1B", "train_gpu_one", "t4", precision="fp32")
    gpu = t4.hardware.gpus[0]
    assert _decision(t4, "mixed_precision").number == round(gpu.fp16_tflops / gpu.fp32_tflops, 2)
    served = _rec("meta-llama/Llama-3.2-1B", "infer_gpu_one", "a10g", precision="fp16")
    assert _decision(served, "dtype").number == served.hardware.gpus[0].fp16_tflops
    emulated = _rec("meta-llama/Llama-3.2-1B", "infer_gpu_one", "t4", precision="bf16")   # no bf16 tensor cores on a T4
    fraction = json.loads((Path(perfguide.__file__).parent / "data" / "efficiency.json").read_text())["bf16_emulation_fraction"]["value"]
    assert _decision(emulated, "dtype").number == pytest.approx(emulated.hardware.gpus[0].fp32_tflops * fraction)


def test_emulated_bf16_and_tf32_off_nvidia_carry_numbers() -> None:
    fraction = json.loads((Path(perfguide.__file__).parent / "data" / "efficiency.json").read_text())["bf16_emulation_fraction"]["value"]
    t4 = _rec("Qwen/Qwen2.5-0.5B", "train_gpu_one", "t4", precision="bf16")   # bf16 emulated through fp32
    assert _decision(t4, "mixed_precision").number == fraction
    amd = _rec("Qwen/Qwen2.5-0.5B", "train_gpu_one", "mi300x")
    tf32 = _decision(amd, "tf32")
    assert tf32.value is False and tf32.number == amd.hardware.gpus[0].fp32_tflops


def test_four_bit_storage_decision_states_the_weight_bytes_it_decides() -> None:
    sharded = _rec("meta-llama/Llama-3.1-8B", "train_gpu_many", "a100-80gb:8", finetune="qlora", strategy="zero3")
    whole = _rec("meta-llama/Llama-3.1-8B", "train_gpu_many", "a100-80gb:8", finetune="qlora", strategy="zero2")
    z3, z2 = _decision(sharded, "bnb_4bit_quant_storage"), _decision(whole, "bnb_4bit_quant_storage")
    assert (z3.value, z2.value) == ("bf16", "uint8")
    assert z3.number == sharded.memory.weights and z2.number == whole.memory.weights
    assert z3.number < z2.number / 4   # sharded over 8 ranks vs whole on every GPU


def test_offloaded_and_unservable_inference_plans_carry_numbers() -> None:
    off = _rec("meta-llama/Llama-3.1-70B", "infer_gpu_one", "t4", allow_offload=True, host_ram="512GiB")
    assert off.setup.offload_params
    budget = _decision(off, "max_memory")
    assert budget.number is not None and int(budget.number) // 2**20 == int(budget.value[0].removesuffix("MiB"))
    quant = _decision(off, "quantization_config")   # even the leanest on-GPU layout (4-bit) is over the T4
    assert quant.value is None and quant.number > off.hardware.gpus[0].memory_total * 0.9
    served = _rec("meta-llama/Llama-3.1-8B", "infer_gpu_one", "t4", engine="vllm")
    engine = _decision(served, "engine")
    assert not served.fits and engine.number == served.engine_memory.max_concurrency < 1
    many = _rec("meta-llama/Llama-3.1-70B", "infer_gpu_many", "a100-80gb:2", strategy="device_map")
    assert _decision(many, "launcher").number == 1


@pytest.mark.parametrize(("model", "scenario", "hardware"), [
    ("meta-llama/Llama-3.2-1B", "train_gpu_one", "rtx4090"), ("meta-llama/Llama-3.2-1B", "train_gpu_many", "a100-80gb:8"),
    ("Qwen/Qwen2.5-0.5B", "train_cpu", "cpu"), ("Qwen/Qwen2.5-0.5B", "infer_cpu", "cpu"),
    ("google-bert/bert-base-uncased", "infer_gpu_many", "a10g:2"), ("Qwen/Qwen2.5-0.5B", "train_gpu_many", "mi300x:8"),
])
def test_no_decision_without_its_number(model: str, scenario: str, hardware: str) -> None:
    rec = _rec(model, scenario, hardware)
    assert [d.setting for d in rec.decisions if d.number is None] == []
