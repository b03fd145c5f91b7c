"""Smoke tests for bench/cpu_train.py and bench/recommend_speed.py: each runs a tiny subset and the report renders.

Only structure is asserted (rows, keys, the regenerate command at the top): timings depend on the machine and
on who else is using it, so no test compares a duration with anything.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
from helpers import load_bench

from perfguide import CPU, Hardware

ROOT = Path(__file__).resolve().parents[1]
GiB = 1024**3
TINY = dict(model_type="llama", architectures=["LlamaForCausalLM"], vocab_size=128, hidden_size=32, intermediate_size=64,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)


_bench = load_bench


def _cpu_box(native_bf16: bool, cores: int = 2) -> Hardware:
    flags = ("avx512f", "avx512_bf16") if native_bf16 else ("avx2", "fma")
    cpu = CPU(model_name="test-cpu", physical_cores=cores, logical_cores=cores, ram_total=16 * GiB, ram_available=12 * GiB, flags=flags)
    return Hardware(cpu=cpu)


@pytest.fixture(scope="module")
def cpu_train() -> ModuleType:
    return _bench("cpu_train")


@pytest.fixture(scope="module")
def recommend_speed() -> ModuleType:
    return _bench("recommend_speed")


def _rec(hw: Hardware, global_batch: int = 8):
    import perfguide

    return perfguide.recommend(TINY, scenario="train_cpu", hardware=hw, seq_len=16, global_batch_size=global_batch)


def test_grid_is_threads_by_precision_by_micro_batch(cpu_train: ModuleType) -> None:
    points, skipped = cpu_train.grid(_rec(_cpu_box(native_bf16=True, cores=4)))
    assert {p.threads for p in points} == {1, 4}
    assert {p.precision for p in points} == {"fp32", "bf16"}
    assert {p.micro_batch for p in points} == {1, 2, 4, 8}
    assert len(points) == 2 * 2 * 4 and skipped == []


def test_grid_skips_bf16_without_native_support_and_says_why(cpu_train: ModuleType) -> None:
    points, skipped = cpu_train.grid(_rec(_cpu_box(native_bf16=False), global_batch=4))
    assert {p.precision for p in points} == {"fp32"}
    assert {p.micro_batch for p in points} == {1, 2, 4}       # 8 does not divide a global batch of 4
    assert any("bf16" in s and "native_bf16" in s for s in skipped)
    assert any(s.startswith("micro-batch 8") for s in skipped)


def test_cpu_train_runs_one_grid_point_and_renders(cpu_train: ModuleType) -> None:
    import torch

    threads = torch.get_num_threads()
    result = cpu_train.run(warmup=1, steps=1, micro_batches=(2,), max_points=1, seq_len=16, global_batch=4,
                           config=TINY, hardware=_cpu_box(native_bf16=False), log=lambda _: None)
    assert torch.get_num_threads() == threads   # each setup's thread count is undone afterwards
    rows = result["rows"]
    assert [r.name for r in rows] == ["recommended", "grid"]
    assert rows[0].recommended and not rows[1].recommended
    assert rows[1].point.micro_batch * rows[1].accumulation == 4   # global batch kept by accumulation
    for r in rows:
        assert len(r.step_times) == 1 and r.tokens_per_s > 0 and r.predicted_tokens_per_s > 0
    s = cpu_train.summary(result)
    assert 0 < s["ratio"] <= 1
    text = cpu_train.render(result)
    assert text.splitlines()[2].startswith(f"Regenerate: `{cpu_train.COMMAND}`")
    assert "recommended / best measured throughput" in text and "predicted step time" in text
    table = [line for line in text.splitlines() if line.startswith(("| **recommended**", "| grid"))]
    assert len(table) == len(rows)
    assert any("bf16" in line for line in text.splitlines() if line.startswith("- bf16 autocast"))


def test_cpu_train_refuses_zero_warmup(cpu_train: ModuleType) -> None:
    with pytest.raises(ValueError, match="warmup"):
        cpu_train.train_steps(_rec(_cpu_box(native_bf16=False)), TINY, {}, 1, warmup=0, steps=1)


def test_recommend_speed_times_one_model_and_runs_accelerate_offline(recommend_speed: ModuleType) -> None:
    scenarios = (("infer_gpu_one", "a100-80gb"),)
    rows = recommend_speed.speed_rows(("openai-community/gpt2",), scenarios, repeats=1, log=lambda _: None)
    (row,) = rows
    assert set(row["recommend"]) == {"infer_gpu_one"}
    for part in (row["recommend"]["infer_gpu_one"], row["estimate"], row["accelerate"]):
        assert part["first"] > 0 and part["median"] > 0
    # accelerate's real code sized GPT2Model (no head): 124,439,808 parameters in fp32 (the figure the GPT-2
    # model card and `sum(p.numel())` give for the base model)
    assert row["accelerate"]["total_fp32"] == 4 * 124_439_808
    assert row["accelerate"]["training"] == 4 * row["accelerate"]["total_fp32"]   # fp32 Adam: 4x the model, batch 1
    mem = recommend_speed.memory_error(max_rows=40)
    assert mem["rows"] == 40 and "perfguide" in mem["stats"]
    for st in mem["stats"].values():
        assert st["n"] > 0 and 0 <= st["median"] <= st["p90"]
    text = recommend_speed.render(rows, None, mem, 1, scenarios)
    assert text.splitlines()[2] == f"Regenerate: `{recommend_speed.COMMAND}`"
    assert "accelerate / recommend" in text and "| perfguide |" in text


def test_p90_matches_the_index_rule() -> None:
    p90 = _bench("recommend_speed").p90
    assert p90([float(i) for i in range(1, 11)]) == 9.0   # index round(0.9 * 9) = 8 -> the 9th value
    assert p90([5.0]) == 5.0


def test_cpu_train_flags_a_disturbed_run(cpu_train: ModuleType) -> None:
    rec = _rec(_cpu_box(native_bf16=False))
    point = cpu_train.Point(threads=1, micro_batch=1, precision="fp32")

    def result(times: tuple[float, ...], load: float) -> dict:
        row = cpu_train.Row(name="grid", point=point, accumulation=8, tokens_per_s=1.0, step_times=times, predicted_tokens_per_s=1.0)
        return {"rec": rec, "rows": [row] * 10, "load": (load, load)}

    assert cpu_train.busy_machine(result((1.0, 1.05, 1.02), load=0.1)) is None
    assert "disturbed" in cpu_train.busy_machine(result((1.0, 3.0, 1.02), load=0.1))   # steps 200% apart
    mild = cpu_train.busy_machine(result((1.0, 1.05, 1.02), load=4.0))                # busy, yet steps agree
    assert "Other processes were running" in mild and "disturbed" not in mild
