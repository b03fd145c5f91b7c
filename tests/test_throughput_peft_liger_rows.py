"""The PEFT method comparison and Liger example-log throughput rows (published_throughput.csv 500-594) keep the setups
their sources state, and each published rate is the one its source's own counters give.

PEFT (method_comparison/MetaMathQA/results/*.json): run.py's 'train total tokens' over the summed per-step 'train
time' chunks, at the mean sample length; Liger (examples/huggingface/results/*.log): EfficiencyCallback's
avg_tokens_per_second over the 4 ranks, per GPU, at the mean padded length per rank. Both are re-derived here from the
counters each row's notes quote, never from what perfguide predicts.
"""

from __future__ import annotations

import re
from types import ModuleType

import pytest
from helpers import load_bench


@pytest.fixture(scope="module")
def rows() -> ModuleType:
    return load_bench("throughput_rows")


@pytest.fixture(scope="module")
def loaded(rows: ModuleType) -> tuple[dict, dict[str, str], list[dict[str, str]]]:
    cases, skipped = rows.load()
    import csv

    with rows.CSV.open(newline="", encoding="utf-8") as f:
        raw = [r for r in csv.DictReader(f) if 500 <= int(r["row_id"]) <= 599]
    return {c.row_id: c for c in cases}, {r["row_id"]: why for r, why in skipped}, raw


def test_peft_rates_are_the_logged_tokens_over_the_logged_step_time(loaded) -> None:
    """tokens/s = 'train total tokens' / the sum of the 20 'train time' chunks; seq_len = total tokens / samples."""
    by_id, _, raw = loaded
    peft = [r for r in raw if r["source"] == "huggingface/peft"]
    assert len(peft) == 63   # every result file of the suite at 5d602fdb (its .gitkeep aside)
    for r in peft:
        m = re.search(r"train total tokens (\d+) / the sum of the 20 logged 'train time' chunks \(([\d.]+) s", r["notes"])
        n = re.search(r"(\d+) over (\d+) samples", r["notes"])
        assert m and n, r["row_id"]
        assert float(r["tokens_per_s_per_gpu"]) == pytest.approx(int(m.group(1)) / float(m.group(2)), rel=1e-4), r["row_id"]
        assert int(r["seq_len"].split()[0]) == round(int(n.group(1)) / int(n.group(2))) == 210
    lora = by_id["532"]      # lora--llama-3.2-3B-rank32: 4198051 tokens over 585.191 s of steps
    assert lora.published == pytest.approx(4198051 / 585.191, rel=1e-4)
    assert lora.group == "peft-method-comparison" and lora.framework == "plain_pytorch" and lora.steps is None
    s = lora.setup
    assert (s.micro_batch_size, s.seq_len, s.gradient_accumulation_steps, s.world_size) == (4, 210, 1, 1)
    assert (s.weights_dtype, s.autocast, s.optimizer, s.gradient_checkpointing) == ("bf16", None, "adamw_torch", False)
    assert s.lora is not None and (s.lora.r, s.lora.alpha, s.lora.target_modules, s.lora.use_dora) == (32, 64, ("q_proj", "v_proj"), False)
    assert lora.hardware.name == "l40s" and lora.spec.total_params == pytest.approx(3.21e9, rel=0.01)


def test_peft_rows_priced_are_lora_dora_and_full_fine_tuning_only(loaded) -> None:
    by_id, why, _ = loaded
    priced = sorted(k for k in by_id if 500 <= int(k) <= 562)
    assert priced == ["514", "527", "529", "532", "533", "534"]
    assert by_id["514"].setup.lora is None                                       # full fine-tuning
    assert by_id["529"].setup.lora.use_dora and by_id["533"].setup.lora.use_rslora
    assert by_id["527"].setup.lora.target_modules == ("down_proj", "gate_proj", "up_proj") and by_id["527"].setup.lora.r == 10
    assert "IA3" in why["519"] and "use_bdlora" in why["528"] and "lora-fa" in why["530"] and "mica" in why["531"]
    assert len([k for k in why if 500 <= int(k) <= 562]) == 57


def test_liger_log_rates_are_the_callbacks_average_per_gpu(loaded) -> None:
    """avg_tokens_per_second counts padded input_ids over 4 ranks: per GPU it is a quarter; the length priced is
    the timed steps' tokens over (steps x 4 ranks x micro-batch); the notes' step-time sum reproduces the average."""
    by_id, _, raw = loaded
    logs = [r for r in raw if r["source"] == "linkedin/Liger-Kernel"]
    assert len(logs) == 32   # every log of examples/huggingface/results before 99f801c2 deleted the folder
    for r in logs:
        if not r["tokens_per_s_total"]:
            continue
        m = re.search(r"num_input_tokens_seen (\d+) -> (\d+) over steps 2-(\d+), / \((\d+) steps x 4 ranks x (\d+)\)", r["seq_len"])
        t = re.search(r"rank 0's summed step_time_sec \(([\d.]+) s", r["notes"])
        assert m and t, r["row_id"]
        first, last, final, steps, mb = map(int, m.groups())
        assert steps == final - 1 and int(r["micro_batch"]) == mb
        assert int(r["seq_len"].split()[0]) == round((last - first) / (steps * 4 * mb))
        # step times are printed to 2 decimals: their sum reproduces the callback's average within 0.5%
        assert (last - first) / float(t.group(1)) == pytest.approx(float(r["tokens_per_s_total"]), rel=5e-3), r["row_id"]
    plain = by_id["575"]     # mistral, no Liger: 10976.85 tokens/s over 4 ranks; 40960 -> 396800 tokens over steps 2-10
    assert plain.published == pytest.approx(10976.85 / 4)
    assert plain.group == "liger-hf-example-logs" and plain.framework == "hf_trainer"
    s = plain.setup
    assert (s.micro_batch_size, s.world_size, s.strategy) == (32, 4, "fsdp")
    # priced at the slowest rank's padded length, rescaled to the ranks' mean (bench/throughput_padding.py)
    assert s.seq_len * plain.rank_share == pytest.approx((396800 - 40960) / (9 * 4 * 32))
    assert (s.weights_dtype, s.autocast, s.gradient_checkpointing, s.liger_kernel) == ("fp32", "bf16", True, False)
    assert plain.hardware.name.startswith("a100-80gb")
    assert by_id["578"].setup.liger_kernel and by_id["569"].setup.liger_kernel   # pre_init / post_init_instance: all kernels


def test_liger_rows_perfguide_cannot_state_say_why(loaded) -> None:
    by_id, why, _ = loaded
    assert "partially applied" in why["576"]                      # post_init_class: FusedLinearCrossEntropy + RoPE only
    assert "without fused linear cross-entropy" in why["566"]     # Liger's gemma2 patch of September 2024
    assert "no training step" in why["579"] and "no training step" in why["591"]   # Mixtral, Qwen2-VL: nothing logged
    assert len([k for k in by_id if 563 <= int(k) <= 594]) == 19
