"""The 'Chosen setup' section shows the knobs of the plan's own task, and a nested engine config does not widen the
two-pair table off the screen."""

from __future__ import annotations

import perfguide


def _setup_lines(text: str) -> list[str]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Chosen setup"))
    end = next(i for i in range(start + 2, len(lines)) if not lines[i].strip())
    return lines[start + 2:end]


def test_serving_plan_setup_fits_a_screen_and_names_no_training_knob() -> None:
    rec = perfguide.recommend("meta-llama/Llama-3.1-8B", "infer_gpu_one", hardware="a100-80gb", engine="vllm")
    section = _setup_lines(rec.report())
    table = [line for line in section if not line.startswith("- ")]
    assert max(len(line) for line in table) <= 100, table[0]
    assert any(line.startswith("- serving: engine=vllm") for line in section)
    words = {w for line in table for w in line.split()}
    assert not words & {"liger_kernel", "optimizer_in_backward", "zero3_init", "objective", "trainer", "overlap_comm"}
    assert {"new_tokens", "cache_implementation"} <= words


def test_training_plan_setup_names_no_serving_config() -> None:
    rec = perfguide.recommend("meta-llama/Llama-3.1-8B", "train_gpu_one", hardware="a100-80gb", finetune="lora")
    words = {w for line in _setup_lines(rec.report()) for w in line.split()}
    assert "serving" not in words and "new_tokens" not in words
    assert {"gradient_accumulation_steps", "liger_kernel", "objective"} <= words
