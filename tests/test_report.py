"""The report shows every decision with its reason and number, memory as bars, and the right sections.

Recommendations are built by hand here (no rules engine needed); expected strings are written out from
the inputs (e.g. 12 GiB out of 80 GiB on a 24-cell bar is 3.6 cells), never read back from the code.
"""

from __future__ import annotations

import pytest

from perfguide import CPU, GPU, Alternative, Decision, Hardware, MemoryEstimate, ModelSpec, Recommendation, Setup, Throughput
from perfguide._base import GiB, MiB
from perfguide.errors import PerfGuideError
from perfguide.render.bars import text_bar
from perfguide.render.units import fmt_bytes, fmt_count, fmt_number, fmt_seconds
from perfguide.scenarios.types import Candidate, Request

A100 = GPU(name="NVIDIA A100-SXM4-80GB", memory_total=80 * GiB, memory_free=79 * GiB, compute_capability=(8, 0), bf16_tflops=312.0)
HOST = CPU(physical_cores=64, logical_cores=128, ram_total=1024 * GiB, ram_available=900 * GiB)
LLAMA_8B = ModelSpec(
    name="llama-3-8b", model_type="llama", hidden_size=4096, num_layers=32, num_attention_heads=32, num_key_value_heads=8,
    head_dim=128, intermediate_size=14336, vocab_size=128256, total_params=8_030_261_248,
    embedding_params=525_336_576, lm_head_params=525_336_576,
)
BATCH_DECISION = Decision(
    setting="per_device_train_batch_size", value=4, reason="the largest micro-batch whose peak stays under 72 GiB",
    number=34 * GiB, unit="bytes", source="memory model",
    alternatives=(Alternative(value=8, why_not="its peak exceeds the 72 GiB limit", number=81 * GiB, unit="bytes"),),
)
CKPT_DECISION = Decision(setting="gradient_checkpointing", value=True, reason="activations would not fit otherwise",
                         number=1.33, unit="x")


def hardware(gpus: int = 1) -> Hardware:
    return Hardware(gpus=(A100,) * gpus, cpu=HOST, interconnect="nvlink" if gpus > 1 else "none", source="named",
                    name=f"a100-80gb:{gpus}")


def memory(activations: int = 12 * GiB, fits: bool = True) -> MemoryEstimate:
    total = 16 * GiB + activations + 2 * GiB
    return MemoryEstimate(weights=16 * GiB, gradients=0, optimizer_states=0, activations=activations, cuda_context=512 * MiB,
                          peak_allocated=total - 2 * GiB, peak_reserved=total - GiB, device_total=total,
                          capacity=80 * GiB, fits=fits)


def make_recommendation(gpus: int = 1, fits: bool = True, **update) -> Recommendation:
    setup = Setup(micro_batch_size=4, gradient_accumulation_steps=8 // gpus, seq_len=2048, weights_dtype="bf16",
                  gradient_checkpointing=True, num_gpus=gpus, strategy="fsdp" if gpus > 1 else "single")
    scenario = "train_gpu_many" if gpus > 1 else "train_gpu_one"
    request = Request(scenario=scenario, model=LLAMA_8B, hardware=hardware(gpus), seq_len=2048, global_batch_size=32)
    mem = memory(fits=fits)
    speed = Throughput(step_time_s=1.7, tokens_per_s=38_554, mfu=0.42, bound="compute")
    big = setup.replace(micro_batch_size=8, gradient_accumulation_steps=max(1, 4 // gpus))
    candidates = (
        Candidate(setup=setup, memory=mem, throughput=speed, verdict="chosen", why="fastest that fits"),
        Candidate(setup=big, memory=memory(activations=60 * GiB, fits=False), throughput=speed, verdict="does-not-fit",
                  why="peak above the limit"),
    )
    values = dict(request=request, setup=setup, memory=mem, throughput=speed, decisions=(BATCH_DECISION, CKPT_DECISION),
                  candidates=candidates, warnings=("fp16 would overflow on this model",), fits=fits)
    return Recommendation(**(values | update))


@pytest.fixture(scope="module")
def rec() -> Recommendation:
    return make_recommendation()


# --- units and bars ---------------------------------------------------------------------------

@pytest.mark.parametrize("n, text", [(int(13.4 * GiB), "13.4 GiB"), (80 * GiB, "80.0 GiB"), (512 * MiB, "512 MiB"), (3000, "3 KiB")])
def test_bytes_read_in_binary_units(n, text):
    assert fmt_bytes(n) == text


@pytest.mark.parametrize("s, text", [(1.7, "1.70 s"), (0.0425, "42.5 ms"), (300, "5.0 min"), (5e-5, "50 us")])
def test_seconds_pick_a_readable_unit(s, text):
    assert fmt_seconds(s) == text


def test_counts_and_decision_numbers():
    assert fmt_count(8_030_261_248, " params") == "8.03B params"
    assert fmt_number(1.333, "x") == "1.33x"
    assert fmt_number(0.42, "fraction") == "42.0%"
    assert fmt_number(512, "tokens") == "512 tokens"
    assert fmt_number(160 * MiB, "bytes KV cache per sequence") == "160 MiB KV cache per sequence"
    assert fmt_number(8.9, "compute capability") == "8.9 compute capability"


def test_ratios_print_compactly_and_compute_capability_keeps_its_minor_digit():
    # bf16 tensor cores at 312 TFLOP/s over fp32 at 19.5: a 16x ratio, not "16.00x"
    assert fmt_number(312 / 19.5, "x fp32 peak") == "16x fp32 peak"
    assert fmt_number(2.5, "x") == "2.5x"
    # compute capability (8, 0) is the version "8.0"; printed as "8" it reads like a count
    assert fmt_number(8.0, "compute capability") == "8.0 compute capability"
    cc = Decision(setting="dtype", value="bf16", reason="native bf16", number=8.0, unit="compute capability")
    text = make_recommendation(decisions=(cc,)).report("text")
    assert "decided by: 8.0 compute capability" in text


def test_text_bar_cells():
    assert text_bar(0.5, 8) == "████░░░░"
    assert text_bar(0.0, 4) == "░░░░"
    assert text_bar(1.0, 4) == "████"
    assert text_bar(1 / 16, 4) == "▎░░░"      # a quarter cell is the 2/8 block
    assert text_bar(1.5, 4) == "███▶"         # over capacity: full, with an arrow


# --- report content ---------------------------------------------------------------------------

def test_text_report_has_header_with_batch_arithmetic(rec):
    text = rec.report("text")
    assert "llama-3-8b (8.03B params" in text
    assert "1x NVIDIA A100-SXM4-80GB (80.0 GiB)" in text
    assert "80.0 GiB per device, planned to 72.0 GiB (10.0% kept free)" in text
    assert "global batch: 32 = 4 micro-batch x 8 accumulation x 1 process(es)" in text
    assert "train_gpu_one" in text and "sequence length: 2048" in text


def test_every_decision_with_reason_number_and_rejected_alternative(rec):
    text = rec.report("text")
    assert "per_device_train_batch_size = 4" in text
    assert BATCH_DECISION.reason in text
    assert "decided by: 34.0 GiB" in text
    assert "rejected 8: its peak exceeds the 72 GiB limit (81.0 GiB)" in text
    assert "gradient_checkpointing = on" in text and CKPT_DECISION.reason in text and "decided by: 1.33x" in text
    assert "source: memory model" in text


def test_memory_bars_against_usable_memory(rec):
    lines = rec.report("text").splitlines()
    activations = next(line for line in lines if line.startswith("activations"))
    # 12 / 80 of 24 cells = 3.6 cells: three full cells, a 5/8 block, then empty cells
    assert "███▋" + "░" * 20 + " 12.0 GiB (15.0%)" in activations
    weights = next(line for line in lines if line.startswith("weights "))
    assert "████▊" in weights and "16.0 GiB (20.0%)" in weights   # 16/80*24 = 4.8 cells
    device_total = next(line for line in lines if line.startswith("device total (nvidia-smi)"))
    assert "30.0 GiB (37.5%)" in device_total   # 16 + 12 + 2 GiB
    assert not any(line.startswith("gradients") for line in lines)   # zero components are left out
    assert "headroom: 50.0 GiB left after device total" in "\n".join(lines)


def test_throughput_candidates_and_warnings(rec):
    text = rec.report("text")
    for fragment in ("step time: 1.70 s", "38.6K tokens/s", "MFU: 42.0%", "bound by: compute",
                     "fp16 would overflow on this model"):
        assert fragment in text
    not_fit = next(line for line in text.splitlines() if line.startswith("does-not-fit"))
    assert "mb=8 ga=4" in not_fit and "78.0 GiB" in not_fit and "peak above the limit" in not_fit


def test_single_gpu_has_no_launch_section_but_multi_gpu_warns_about_dataparallel(rec):
    assert "python train.py" not in rec.report("text")
    many = make_recommendation(gpus=8).report("text")
    assert "plain `python train.py`" in many and "nn.DataParallel" in many
    assert "global batch: 32 = 4 micro-batch x 1 accumulation x 8 process(es)" in many


def test_multi_gpu_report_shows_the_launch_command():
    many = make_recommendation(gpus=8).report("text")
    command = many.split("launch with:")[1].splitlines()[1]
    assert "train.py" in command and "8" in command


def test_nothing_fits_lists_suggestions():
    rec = make_recommendation(fits=False, suggestions=("use QLoRA (about 6 GiB of weights)", "use 2 GPUs with FSDP"))
    text = rec.report("text")
    assert "DOES NOT FIT" in text and "Nothing fits: what would" in text
    assert "- use QLoRA (about 6 GiB of weights)" in text and "- use 2 GPUs with FSDP" in text


def test_markdown_renders_tables_and_bars(rec):
    md = rec.report("markdown")
    assert md.startswith("### perfguide train_gpu_one: llama-3-8b")
    assert "| setting | value | setting | value |" in md and "|---|---|---|---|" in md
    assert "| verdict | setup | memory/device | step time | throughput | why |" in md
    assert "```text\n" in md and "████" in md
    assert f"  - {BATCH_DECISION.reason}" in md and "**per_device_train_batch_size = 4**" in md
    assert rec._repr_markdown_() == md
    assert str(rec) == rec.report("text")


def test_rich_report_is_ansi_with_the_same_content(rec):
    out = rec.report("rich")
    assert "\x1b[" in out
    for fragment in (BATCH_DECISION.reason, "decided by: 34.0 GiB", "12.0 GiB (15.0%)", "Candidates considered"):
        assert fragment in out


def test_unknown_format_is_one_line_error(rec):
    with pytest.raises(PerfGuideError, match="unknown report format 'html'.*Accepted: markdown, rich, text"):
        rec.report("html")


def test_report_without_device_scales_to_the_largest_total():
    rec = make_recommendation(memory=memory().model_copy(update={"capacity": None}))
    text = rec.report("text")
    assert "usable memory: unknown (no device)" in text
    total = next(line for line in text.splitlines() if line.startswith("device total"))
    assert "█" * 24 in total and "(100.0%)" in total


def test_inference_header_counts_sequences_not_accumulation():
    base = make_recommendation()
    setup = Setup(task="infer", micro_batch_size=8, seq_len=1024, new_tokens=256, weights_dtype="bf16")
    rec = make_recommendation(setup=setup, request=base.request.model_copy(update={"scenario": "infer_gpu_one"}))
    text = rec.report("text")
    assert "- batch: 8 concurrent sequence(s) per process x 1 process(es), 256 new tokens each" in text
    assert "gradient_accumulation_steps" not in text and "new_tokens" in text


def test_hardware_render_lists_each_gpu_with_its_abilities():
    from perfguide.render.hardware import render_hardware

    v100 = GPU(name="Tesla V100-SXM2-16GB", index=1, memory_total=16 * GiB, memory_free=15 * GiB, compute_capability=(7, 0))
    mixed = Hardware(gpus=(A100, v100), cpu=HOST, interconnect="nvlink", source="probe", warnings=("MIG state unknown",))
    text = render_hardware(mixed, "text")
    assert "2x mixed (NVIDIA A100-SXM4-80GB / Tesla V100-SXM2-16GB), smallest (16.0 GiB, nvlink)" in text
    a100_row = next(line for line in text.splitlines() if "A100-SXM4" in line and line.startswith("0"))
    assert "8.0" in a100_row and "80.0 GiB (85.9 GB)" in a100_row and "bf16 tf32" in a100_row and "312" in a100_row
    v100_row = next(line for line in text.splitlines() if line.startswith("1 "))
    assert "7.0" in v100_row and "bf16" not in v100_row      # Volta has no bf16 tensor cores
    assert "- MIG state unknown" in text
    assert "| # | name | cc |" in render_hardware(mixed, "markdown")


def test_tensor_parallel_inference_has_no_dataparallel_warning():
    base = make_recommendation(gpus=2)
    setup = Setup(task="infer", micro_batch_size=4, new_tokens=64, weights_dtype="bf16", strategy="tp", num_gpus=2)
    rec = make_recommendation(gpus=2, setup=setup, request=base.request.model_copy(update={"scenario": "infer_gpu_many"}))
    text = rec.report("text")
    assert "nn.DataParallel" not in text
    assert "launch with:" in text


def cpu_recommendation() -> Recommendation:
    """A CPU plan: the fixed 1 GiB is the Python + torch process, reserved equals allocated, RAM is the limit."""
    host = Hardware(cpu=HOST, source="named", name="cpu")
    setup = Setup(device="cpu", micro_batch_size=2, seq_len=512, weights_dtype="fp32", cpu_threads=64)
    mem = MemoryEstimate(weights=4 * GiB, gradients=4 * GiB, optimizer_states=8 * GiB, activations=2 * GiB, cuda_context=GiB,
                         peak_allocated=18 * GiB, peak_reserved=18 * GiB, device_total=19 * GiB, capacity=900 * GiB)
    request = Request(scenario="train_cpu", model=LLAMA_8B, hardware=host, seq_len=512, global_batch_size=2)
    return make_recommendation(request=request, setup=setup, memory=mem, candidates=())


@pytest.mark.parametrize("fmt", ["text", "markdown", "rich"])
def test_cpu_report_speaks_of_the_process_not_of_cuda(fmt):
    out = cpu_recommendation().report(fmt)
    assert "process baseline" in out and "process total (RSS)" in out and "host RAM" in out
    for gpu_word in ("cuda context", "nvidia-smi", "device total", "peak reserved", "per device"):
        assert gpu_word not in out
    if fmt == "text":
        lines = out.splitlines()
        baseline = next(line for line in lines if line.startswith("process baseline"))
        assert "1.0 GiB (0.1%)" in baseline                      # 1 / 900 GiB
        total = next(line for line in lines if line.startswith("process total (RSS)"))
        assert "19.0 GiB (2.1%)" in total                        # 18 GiB of tensors + the 1 GiB process
        assert "headroom: 881.0 GiB left after process total" in out


def test_cpu_estimate_uses_process_words_too():
    from perfguide.render.report import render_estimate

    rec = cpu_recommendation()
    out = render_estimate("llama-3-8b", rec.setup, rec.memory)
    assert "process total (RSS)" in out and "nvidia-smi" not in out and "cuda context" not in out
