"""The report's headline: the answer first (plan, verdict with the binding limit, memory, speed, what to run),
the same in text, Markdown, rich and ``--json``'s ``summary``; ``--brief`` prints only it.

Limits are checked against numbers derived here from the hardware table (capacity x (1 - headroom)), not against
the headline's own helpers; the Python lines it prints are executed on a tiny model on CPU."""

from __future__ import annotations

import json
import re

import pytest
from helpers import TINY_LLAMA, tiny_config

import perfguide
from perfguide.cli import main
from perfguide.render.units import fmt_bytes

GiB = 1024**3
README_JOB = ("recommend", "meta-llama/Llama-3.1-8B", "--scenario", "train_gpu_one", "--hardware", "a100-80gb",
              "--seq-len", "2048", "--global-batch-size", "64")


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def readme_rec() -> perfguide.Recommendation:
    return perfguide.recommend("meta-llama/Llama-3.1-8B", "train_gpu_one", hardware="a100-80gb", seq_len=2048, global_batch_size=64)


def _section(text: str, title: str) -> list[str]:
    lines = text.splitlines()
    start = lines.index(title) + 2
    end = next((i for i in range(start, len(lines)) if lines[i] == "" ), len(lines))
    return lines[start:end]


def test_headline_comes_first_and_names_plan_verdict_memory_speed_and_code(capsys, readme_rec):
    code, out, _ = run(capsys, *README_JOB)
    assert code == 0
    lines = out.splitlines()
    assert lines[3] == "In short", lines[:5]   # title, underline, blank, then the headline
    head = _section(out, "In short")
    assert head[0].startswith("- plan: full fine-tune of meta-llama/Llama-3.1-8B on 1x a100-80gb: ")
    assert readme_rec.setup.label in head[0]
    # the A100-80GB offers CUDA 79.14 of its 80 GiB (torch's printed total capacity); the plan keeps 10% free: 71.2 GiB
    usable = int(79.14 * GiB * 0.9)
    assert f"- verdict: fits; binding limit: GPU memory per device, {fmt_bytes(readme_rec.memory.needed)} of {fmt_bytes(usable)} usable" in out
    m = readme_rec.memory   # 1.116 x allocated kept while running, 1.011 x allocated needed before an OOM
    assert m.needed < m.device_total
    assert (f"- memory: {fmt_bytes(m.device_total)} per GPU (nvidia-smi while running; {fmt_bytes(m.needed)} needed not to "
            "OOM); host RAM: no offload") in head
    assert head[3].startswith(f"- speed: {readme_rec.throughput.step_time_s:.2f} s/step")
    assert head[4] == "- train with:"
    code_lines = head[5:]
    # TrainingArguments before from_pretrained: ZeRO-3 must see its config before the weights load
    args_at = next(i for i, line in enumerate(code_lines) if "rec.training_args(" in line)
    load_at = next(i for i, line in enumerate(code_lines) if ".from_pretrained(" in line)
    assert args_at < load_at
    assert "AutoModelForCausalLM" in code_lines[1] and code_lines[-1].startswith("Trainer(")


def test_brief_prints_only_the_headline_and_is_much_shorter(capsys):
    _, full, _ = run(capsys, *README_JOB)
    code, brief, _ = run(capsys, *README_JOB, "--brief")
    assert code == 0
    assert brief.splitlines()[:3] == full.splitlines()[:3]
    assert "Decisions" not in brief and "Candidates considered" not in brief
    assert len(brief.splitlines()) <= 16 < len(full.splitlines()) // 5


def test_python_brief_equals_the_cli_brief(capsys, readme_rec):
    _, brief, _ = run(capsys, *README_JOB, "--brief")
    assert readme_rec.report(brief=True) == brief


def test_json_carries_the_headline_as_summary_and_reads_back(capsys, readme_rec):
    code, out, _ = run(capsys, *README_JOB, "--json")
    data = json.loads(out)
    assert code == 0 and next(iter(data)) == "summary"
    s = data["summary"]
    assert s["fits"] is True and s["binding_limit"] == "GPU memory per device"
    assert s["gpu_memory"] == readme_rec.memory.device_total and s["host_ram"] == 0
    assert s["run_kind"] == "trainer" and any("rec.training_args(" in line for line in s["run"])
    assert perfguide.Recommendation.model_validate_json(out) == readme_rec   # summary is derived, so dropped
    _, brief_json, _ = run(capsys, *README_JOB, "--json", "--brief")
    assert json.loads(brief_json) == s


def test_markdown_and_rich_show_the_same_headline(readme_rec):
    md = readme_rec.report("markdown", brief=True)
    assert "#### In short" in md and "```python" in md and "- **verdict**: fits; binding limit" in md
    rich = readme_rec.report("rich", brief=True)
    assert "In short" in rich and "binding limit" in rich and "rec.training_args(" in rich


def test_multi_gpu_fsdp_plan_headline_is_the_launch_command_and_title_keeps_nodes(capsys):
    code, out, _ = run(capsys, "recommend", "meta-llama/Llama-3.1-8B", "--scenario", "train_gpu_many",
                       "--hardware", "a100-80gb:8", "--nodes", "2", "--brief")
    assert code == 0
    assert re.fullmatch(r"perfguide train_gpu_many: meta-llama/Llama-3\.1-8B on a100-80gb:8(x2| x 2 nodes)", out.splitlines()[0])
    head = _section(out, "In short")
    assert "on 8x a100-80gb x 2 nodes" in head[0]
    assert head[4] == "- launch with:"
    assert head[5].startswith("accelerate launch ") and "--num_processes 16" in head[5] and "--num_machines 2" in head[5]
    rec = perfguide.recommend("meta-llama/Llama-3.1-8B", "train_gpu_many", hardware="a100-80gb:8", nodes=2)
    assert head[5] == rec.launch_command("train.py")


def test_deepspeed_plan_headline_launches_with_deepspeed():
    rec = perfguide.recommend("meta-llama/Llama-3.1-8B", "train_gpu_many", hardware="a100-80gb:8", strategy="zero3")
    s = rec.summary()
    assert s.run_kind == "launch" and "--use_deepspeed" in s.run[0] and s.run[0].endswith(" train.py")


def test_serving_plan_headline_is_the_serve_command_and_the_kv_cache_binds():
    rec = perfguide.recommend("meta-llama/Llama-3.1-8B", "infer_gpu_one", hardware="h100-80gb", engine="vllm")
    s = rec.summary()
    assert s.run_kind == "serve" and s.run == (rec.serve_command(),)
    assert s.binding_limit == "KV cache"
    assert f"{rec.kv_cache_tokens:,} tokens" in s.verdict


def test_serving_weights_over_the_budget_are_the_binding_limit_not_an_empty_cache():
    """Llama-3.1-8B in fp16 on an RTX 2080 Ti (no bf16, 10.76 GiB): 8.03e9 x 2 B = 16.1 GB (15.0 GiB) of weights are
    over what vLLM may use (0.9 of the card) before any KV cache, so the verdict names the weights and their size."""
    rec = perfguide.recommend("meta-llama/Llama-3.1-8B", "infer_gpu_one", hardware="rtx2080ti", engine="vllm",
                              quantization="none")
    s = rec.summary()
    e = rec.engine_memory
    assert not rec.fits and e is not None
    assert e.weights == pytest.approx(8.03e9 * 2, rel=0.01) and e.budget < e.weights
    assert s.binding_limit == "weights" and "binding limit: weights, 15.0 GiB per GPU" in s.verdict


def test_nothing_fits_headline_names_the_binding_limit_and_what_would_fit(capsys):
    code, out, _ = run(capsys, "recommend", "meta-llama/Llama-3.1-70B", "--hardware", "rtx4090", "--brief")
    assert code == 3
    head = _section(out, "In short")
    rec = perfguide.recommend("meta-llama/Llama-3.1-70B", hardware="rtx4090")
    assert head[1].startswith("- verdict: DOES NOT FIT; binding limit: ")
    if rec.memory.cpu_ram > rec.hardware.cpu.ram_available:   # offloaded states beyond the host: RAM binds, not the GPU
        assert "host RAM per node, needs " in head[1] and fmt_bytes(rec.memory.cpu_ram) in head[1]
    assert "- what would fit:" in head and rec.summary().run == ()
    assert "accelerate launch" not in out.split("Request")[0]


def test_the_printed_python_lines_train_a_tiny_model_on_cpu(tmp_path, monkeypatch):
    """The headline's code is complete: run as printed (plus a dataset) on a tiny local model, it trains."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model_dir = tmp_path / "tiny"
    AutoModelForCausalLM.from_config(tiny_config()).save_pretrained(model_dir)
    monkeypatch.chdir(tmp_path)
    rec = perfguide.recommend(str(model_dir), "train_cpu", hardware="cpu", seq_len=16, global_batch_size=4, max_steps=1)
    s = rec.summary()
    assert s.run_kind == "trainer"
    ids = torch.randint(0, TINY_LLAMA["vocab_size"], (4, 16))
    namespace = {"train_dataset": [{"input_ids": row, "labels": row.clone()} for row in ids]}
    exec(compile("\n".join(s.run), "headline", "exec"), namespace)
    assert namespace["model"].training is not None
    assert (tmp_path / "out").is_dir()


def test_a_one_gpu_deepspeed_plan_shows_its_launch_command_in_the_report_too():
    rec = perfguide.recommend("meta-llama/Llama-3.1-8B", hardware="rtx4090", strategy="zero3", allow_offload=True,
                               host_ram="256GiB")
    assert rec.setup.world_size == 1 and rec.setup.is_deepspeed and rec.fits
    launch = rec.launch_command("train.py")
    assert launch.startswith("accelerate launch --use_deepspeed")
    text = rec.report()
    assert text.count(launch) == 2   # the headline and the Launch section
    assert "nn.DataParallel" not in text.split("Launch\n------")[1]


def test_rich_keeps_a_long_launch_command_on_one_line_for_copying():
    rec = perfguide.recommend("meta-llama/Llama-3.1-8B", "train_gpu_many", hardware="a100-80gb:8")
    command = rec.launch_command("train.py")
    assert len(command) > 110   # longer than the rich report's width
    plain = re.sub(r"\x1b\[[0-9;]*m", "", rec.report("rich", brief=True))
    assert command in plain.splitlines()
