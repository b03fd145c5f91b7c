"""train_cpu rules: bf16 only on CPUs with AVX512-BF16/AMX, never fp16, threads = physical cores, RAM as the limit."""

from __future__ import annotations

import pytest
from test_speed import LLAMA_TOTAL, GiB, gpt2, llama7b

from perfguide.errors import ConflictingConstraintsError
from perfguide.hardware.types import CPU, Hardware
from perfguide.scenarios.train_cpu import plan
from perfguide.scenarios.types import Constraints, Request

AVX2 = CPU(model_name="EPYC 7B13", physical_cores=16, logical_cores=32, ram_total=128 * GiB, ram_available=120 * GiB, flags=("avx2", "fma"))
SPR = CPU(model_name="Xeon 8480", physical_cores=56, logical_cores=112, ram_total=512 * GiB, ram_available=500 * GiB,
          flags=("avx512f", "avx512_bf16", "amx_bf16", "amx_tile"))


def run(cpu: CPU, spec=None, seq: int = 256, batch: int = 16, **cons):
    return plan(Request(scenario="train_cpu", model=spec or gpt2(), hardware=Hardware(cpu=cpu), seq_len=seq,
                        global_batch_size=batch, constraints=Constraints(**cons)))


def test_plain_cpu_trains_fp32_with_physical_core_threads() -> None:
    p = run(AVX2)
    s = p.setup
    assert p.fits and s.device == "cpu"
    assert s.autocast is None and s.tf32 is False
    assert s.cpu_threads == 16
    assert s.dataloader_pin_memory is False
    assert s.micro_batch_size * s.gradient_accumulation_steps == 16


def test_amx_cpu_uses_bf16_autocast() -> None:
    p = run(SPR)
    assert p.setup.autocast == "bf16" and p.setup.weights_dtype == "fp32"
    assert p.setup.cpu_threads == 56


def test_fp16_is_refused_on_cpu() -> None:
    with pytest.raises(ConflictingConstraintsError, match="fp16"):
        run(AVX2, precision="fp16")


def test_bf16_forced_on_plain_cpu_is_honoured_with_a_warning() -> None:
    p = run(AVX2, precision="bf16")
    assert p.setup.autocast == "bf16"
    assert any("emulated" in w for w in p.warnings)


def test_flash_attention_is_refused_on_cpu() -> None:
    with pytest.raises(ConflictingConstraintsError):
        run(AVX2, attn_implementation="flash_attention_2")


def test_ram_limits_the_plan() -> None:
    # fp32 weights, grads and AdamW states: 16 B/param * 6.74e9 = 107.8 GB, far over 30 GiB of free RAM;
    # even pure bf16 + 8-bit states (6 B/param = 40.4 GB) is over
    small = AVX2.model_copy(update={"ram_total": 32 * GiB, "ram_available": 30 * GiB})
    assert 6 * LLAMA_TOTAL > 30 * GiB
    p = run(small, llama7b(), seq=512, batch=8)
    assert p.fits is False
    assert any("RAM" in s for s in p.suggestions)
    assert p.setup.micro_batch_size * p.setup.gradient_accumulation_steps == 8


def _two_socket_xeon():
    from perfguide import CPU, Hardware

    cpu = CPU(model_name="2x Xeon", physical_cores=112, logical_cores=224, sockets=2, ram_total=512 * 2**30,
              ram_available=480 * 2**30, flags=("avx512f", "avx512_bf16", "amx_bf16"))
    return Hardware(cpu=cpu, source="named", name="xeon-2s")


def test_one_process_per_socket_with_ddp_over_gloo():
    import perfguide

    rec = perfguide.recommend("gpt2", scenario="train_cpu", hardware=_two_socket_xeon(), seq_len=256, global_batch_size=32)
    s = rec.setup
    assert (s.num_gpus, s.strategy, s.cpu_threads) == (2, "ddp", 56)  # 112 cores / 2 sockets
    assert s.micro_batch_size * s.gradient_accumulation_steps * s.world_size == 32
    args = rec.training_args_dict(output_dir="o")
    assert args["use_cpu"] is True and args["ddp_backend"] == "gloo" and "fp16" not in args
    cmd = rec.launch_command("train.py")
    assert cmd.startswith("OMP_NUM_THREADS=56 accelerate launch") and "--num_processes 2" in cmd
    # each process holds a full replica in its half of the RAM
    assert rec.memory.capacity == 480 * 2**30 // 2


def test_cpu_process_count_must_split_the_global_batch():
    import pytest

    import perfguide
    from perfguide.errors import ConflictingConstraintsError

    with pytest.raises(ConflictingConstraintsError, match="does not split over 3 CPU processes"):
        perfguide.recommend("gpt2", scenario="train_cpu", hardware=_two_socket_xeon(), global_batch_size=32, num_gpus=3)
