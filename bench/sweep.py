"""What a user hits in the first hour: ``recommend()`` across real models x scenarios x targets, every output
writer run and handed to the library that reads it -> bench/results/sweep.md.

Run: ``.venv/bin/python bench/sweep.py [--quick]``. Each (model, scenario, target) cell calls ``recommend`` with
defaults, then a few forced constraints per scenario; every plan is checked for:

* an exception that is not a one-line PerfGuideError (a traceback a user would see);
* a plan that contradicts itself: ``fits`` vs its own memory (need above the usable capacity, or the reverse), vs its
  report's headline and its candidates table, a printed "A > B" the numbers contradict, a forced constraint the
  setup does not carry, a global batch that micro-batch x accumulation x world does not give, SFTConfig and
  TrainingArguments kwargs that disagree on batch / precision / optimizer / checkpointing;
* a switch that changes nothing: FSDP gradient sync on every accumulation micro-step with one micro-step a step;
* kwargs the target cannot run (bf16 or TF32 before Ampere, FlashAttention 2, bitsandbytes where unsupported);
* a "what would fit" suggestion that names a scenario and a target, run as written, that does not fit;
* nonsense numbers: negative / NaN / infinite bytes or times, tokens/s whose FLOPs exceed the hardware's peak, a
  time per output token for a model that generates none;
* a decision without a reason, the deciding number or a source;
* outputs the libraries' own parsers reject: ``TrainingArguments`` / ``trl.SFTConfig`` / ``peft.LoraConfig``
  construction, accelerate's ``ClusterConfig`` loading of the YAML written to disk, DeepSpeed's
  ``DeepSpeedConfig`` parsing of the JSON, the launch / serve command read back by ``perfguide check``'s readers.

A finding is a defect to fix (tests/test_sweep_*.py holds each fix's regression test); the table lists what is
left. Offline: models come from perfguide's own catalogue.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import os
import sys
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _report import publish
from sweep_outputs import (
    Tally,
    _accelerate_loads,
    _classify,
    _cpu_standin,
    _writer,
    check_serving_outputs,
    check_training_outputs,
)

import perfguide

OUT = ROOT / "bench" / "results" / "sweep.md"

MODELS = (
    "meta-llama/Llama-3.2-1B", "meta-llama/Llama-3.2-3B", "meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-70B",
    "Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-7B", "Qwen/Qwen2.5-14B", "Qwen/Qwen2.5-72B",
    "Qwen/Qwen3-0.6B", "Qwen/Qwen3-8B", "Qwen/Qwen3-32B", "Qwen/Qwen3-30B-A3B",
    "mistralai/Mistral-7B-v0.3", "mistralai/Mixtral-8x7B-v0.1", "mistralai/Mistral-Small-24B-Base-2501",
    "google/gemma-2-2b", "google/gemma-2-9b", "google/gemma-3-1b-pt", "google/gemma-3-12b-pt",
    "microsoft/Phi-3-mini-4k-instruct", "microsoft/phi-4", "deepseek-ai/DeepSeek-V3", "openai/gpt-oss-20b",
    "openai-community/gpt2", "google-bert/bert-base-uncased", "google-t5/t5-base",
    # hybrids: linear-attention / Mamba-2 layers that keep a fixed state (model/recurrent.py)
    "Qwen/Qwen3.5-35B-A3B", "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
)
SCENARIOS = ("train_gpu_one", "train_gpu_many", "train_cpu", "infer_gpu_one", "infer_gpu_many", "infer_cpu")
TARGETS = ("cpu", "t4", "rtx3090", "rtx4090:2", "l4", "a10g", "a100-40gb:8", "a100-80gb:8", "h100:8", "h200", "h100:8x2")

#: forced constraints per scenario family: each must survive into the plan's setup (or be refused in one line)
FORCED_TRAIN: tuple[dict[str, Any], ...] = (
    {"finetune": "lora"}, {"finetune": "qlora"}, {"micro_batch_size": 2}, {"precision": "fp16"},
    {"gradient_checkpointing": False}, {"optimizer": "adamw_8bit"}, {"cut_cross_entropy": True},
)
FORCED_MANY: tuple[dict[str, Any], ...] = ({"strategy": "fsdp"}, {"strategy": "zero3"}, {"strategy": "ddp"}, {"num_gpus": 2})
FORCED_ONE: tuple[dict[str, Any], ...] = ({"strategy": "zero3"},)   # DeepSpeed on one GPU: its on-GPU and offloaded layouts
FORCED_INFER: tuple[dict[str, Any], ...] = ({"batch_size": 8}, {"engine": "vllm"}, {"engine": "sglang"}, {"quantization": "nf4"})


#: workload shapes beyond the defaults: long context, tiny / odd / large global batches, long generations
SHAPES_TRAIN: tuple[dict[str, Any], ...] = ({"seq_len": 8192}, {"seq_len": 32768, "finetune": "qlora"}, {"global_batch_size": 1},
                                            {"global_batch_size": 7}, {"global_batch_size": 256, "seq_len": 512})
SHAPES_INFER: tuple[dict[str, Any], ...] = ({"prompt_len": 4096, "max_new_tokens": 1024}, {"batch_size": 64, "prefer": "latency"},
                                            {"engine": "vllm", "max_model_len": 32768})


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x >= 0


# --- the plan's own consistency -------------------------------------------------------------------------------------

def _peak_flops(rec: Any) -> float:
    """The hardware's best dense peak over every dtype it lists (FLOP/s, all devices): nothing runs faster."""
    hw = rec.hardware
    if rec.setup.device == "cpu" or not hw.gpus:
        per = max((hw.cpu.bf16_gflops or 0), (hw.cpu.fp32_gflops or 0)) * 1e9
        return per if per > 0 else float("inf")
    g = hw.gpus[0]
    per = max(x or 0 for x in (g.bf16_tflops, g.fp16_tflops, g.fp8_tflops, g.fp32_tflops, g.tf32_tflops)) * 1e12
    return per * rec.setup.num_gpus * rec.setup.nodes if per > 0 else float("inf")


def _active_params(spec: Any) -> float:
    """Parameters one token runs through: a MoE's routed experts counted at top-k of n."""
    total = float(spec.total_params)
    if spec.num_experts and spec.expert_params:
        total -= spec.expert_params * (1 - (spec.num_experts_per_tok or 1) / spec.num_experts)
    return total - float(spec.embedding_params or 0)


def check_plan(rec: Any, case: str, forced: dict[str, Any], t: Tally) -> None:
    mem, thr, s = rec.memory, rec.throughput, rec.setup
    for name in ("weights", "gradients", "optimizer_states", "activations", "logits", "kv_cache", "peak_allocated", "device_total", "cpu_ram"):
        if not _finite(getattr(mem, name)):
            t.flag("nonsense number", case, f"memory.{name}={getattr(mem, name)!r}")
    for name in ("step_time_s", "tokens_per_s", "mfu"):
        if not _finite(getattr(thr, name)):
            t.flag("nonsense number", case, f"throughput.{name}={getattr(thr, name)!r}")
    if s.task == "infer" and not rec.model.generates and thr.time_per_output_token_ms is not None:
        t.flag("nonsense number", case, f"{thr.time_per_output_token_ms:.3g} ms per output token for {rec.model.architecture}, which generates none")
    if rec.fits and thr.tokens_per_s <= 0:
        t.flag("nonsense number", case, f"a plan that fits runs at {thr.tokens_per_s} tokens/s")
    # tokens/s bound: a training token costs >= 4 x active params FLOPs (forward + the input-gradient backward,
    # LoRA included); a served token >= 2 x active params. Above the hardware's peak is impossible.
    per_token = (4 if s.task == "train" else 2) * _active_params(rec.model)
    peak = _peak_flops(rec)
    if thr.tokens_per_s * per_token > peak * 1.0001:
        t.flag("above hardware peak", case, f"{thr.tokens_per_s:.4g} tokens/s x {per_token:.3g} FLOP/token = "
               f"{thr.tokens_per_s * per_token / 1e12:.4g} TFLOP/s > peak {peak / 1e12:.4g} TFLOP/s")
    need, cap = mem.fit_total, mem.capacity
    if rec.fits and need is not None and cap is not None and need > cap:
        t.flag("fits vs its own memory", case, f"fits=True but needs {need / 2**30:.2f} GiB > usable {cap / 2**30:.2f} GiB")
    chosen = [c for c in rec.candidates if c.verdict == "chosen"]
    if (rec.fits and rec.candidates and len(chosen) != 1) or (not rec.fits and chosen):
        t.flag("fits vs its own candidates", case, f"fits={rec.fits} with {len(chosen)} candidate(s) marked 'chosen'")
    if rec.fits != mem.fits:
        t.flag("fits vs its own memory", case, f"plan fits={rec.fits}, memory.fits={mem.fits}")
    brief = rec.report(brief=True).lower()
    says_no = "does not fit" in brief or "nothing fits" in brief
    if says_no == rec.fits:
        t.flag("fits vs its own report", case, f"fits={rec.fits} but the headline says {brief.splitlines()[5][:120] if len(brief.splitlines()) > 5 else brief[:120]!r}")
    for bad in false_comparisons(rec.report()):
        t.flag("false comparison in the report", case, bad)
    if s.sync_grads_each_micro_step and s.gradient_accumulation_steps == 1:
        t.flag("switch that changes nothing", case, "sync_grads_each_micro_step=True with one micro-step per optimizer step")
    # the ranks that split one sequence share its samples (Setup.global_batch_size, as transformers' Trainer counts it)
    if s.task == "train" and s.global_batch_size != rec.request.global_batch_size:
        t.flag("global batch", case, f"mb {s.micro_batch_size} x ga {s.gradient_accumulation_steps} x world {s.world_size} "
               f"/ sequence ranks {s.sequence_ranks} != global {rec.request.global_batch_size}")
    for key, value in forced.items():
        got = _forced_value(rec, key)
        if got is not _SKIP and got != value:
            t.flag("forced constraint changed", case, f"{key}={value!r} asked, plan has {got!r}")
    for d in rec.decisions:
        if not d.reason.strip():
            t.flag("decision without reason", case, f"{d.setting}={d.value!r}")
    t.outcomes["decisions"] += len(rec.decisions)
    t.outcomes["decisions with a number"] += sum(d.number is not None for d in rec.decisions)
    t.outcomes["decisions with a source"] += sum(bool(d.source) for d in rec.decisions)
    t.numberless.update(f"{rec.request.scenario}: {d.setting}" for d in rec.decisions if d.number is None)


_SKIP = object()


def _forced_value(rec: Any, key: str) -> Any:
    """The plan's value of a forced constraint, in the constraint's own spelling (_SKIP: not a setup field)."""
    s = rec.setup
    if key == "finetune":
        return "full" if s.lora is None else ("qlora" if s.quantized else "lora")
    if key == "precision":
        return s.autocast or s.weights_dtype
    if key == "num_gpus":
        return s.num_gpus
    if key == "strategy":
        return s.strategy
    if key == "engine":
        return s.serving.engine if s.serving is not None else "transformers"
    if key == "batch_size":
        return s.micro_batch_size * (s.serving.data_parallel_size if s.serving is not None else 1) if s.task == "infer" else _SKIP
    if key == "quantization":
        return (s.serving.weight_format if s.serving is not None else s.weights_dtype)
    if key == "optimizer":
        return s.optimizer
    if key == "max_model_len":
        return s.serving.max_model_len if s.serving is not None else _SKIP
    if key == "max_new_tokens":
        return s.new_tokens
    return getattr(s, key, _SKIP)


def false_comparisons(text: str) -> list[str]:
    sys.path.insert(0, str(ROOT / "tests"))
    from fuzz_inputs import false_comparisons as fc

    return fc(text)


# --- the sweep ------------------------------------------------------------------------------------------------------

def cases(quick: bool) -> list[tuple[str, str, str, dict[str, Any]]]:
    models = MODELS[::4] if quick else MODELS
    out: list[tuple[str, str, str, dict[str, Any]]] = []
    for j, m in enumerate(models):
        for sc in SCENARIOS:
            for hw in TARGETS:
                cpu = sc.endswith("cpu")
                if cpu != (hw == "cpu"):
                    continue
                if sc.endswith("many") and ":" not in hw:
                    continue
                out.append((m, sc, hw, {}))
            extra = FORCED_MANY if sc.endswith("many") else FORCED_ONE if sc == "train_gpu_one" else ()
            forced = FORCED_TRAIN + extra if sc.startswith("train") else FORCED_INFER
            hw = {"train_gpu_one": "rtx3090", "train_gpu_many": "a100-80gb:8", "infer_gpu_one": "l4", "infer_gpu_many": "h100:8"}.get(sc, "cpu")
            if sc.endswith("cpu"):
                forced = forced[:3] if sc.startswith("train") else forced[:1]
            variants = (*forced, *(SHAPES_TRAIN if sc.startswith("train") else SHAPES_INFER))
            # each variant on every other model (alternating), so every one still meets every family, in half the time
            out += [(m, sc, hw, v) for i, v in enumerate(variants) if quick or (i + j) % 2 == 0]
    return out


def run(quick: bool) -> tuple[Tally, int, float]:
    t = Tally()
    followed: dict[tuple[Any, ...], bool | str] = {}
    todo = cases(quick)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        for m, sc, hw, forced in todo:
            extra = "".join(f" {k}={v!r}" for k, v in forced.items())
            case = f"{m} {sc} {hw}{extra}"
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    rec = perfguide.recommend(m, scenario=sc, hardware=hw, **forced)
            except Exception as exc:  # noqa: BLE001 - any escape is a finding
                kind, detail = _classify(exc)
                t.outcomes[kind] += 1
                if detail is not None:
                    t.flag("recommend raised", case, detail)
                continue
            t.outcomes["plan (fits)" if rec.fits else "plan (does not fit)"] += 1
            try:
                check_plan(rec, case, forced, t)
            except Exception as exc:  # noqa: BLE001 - any escape is a finding
                t.flag("checking the plan raised", case, _classify(exc)[1] or str(exc))
            if not rec.fits and not forced:
                check_suggestions(m, rec, case, t, followed)
            tmp = Path(tempfile.mkdtemp(dir=d))
            if rec.setup.task == "train":
                check_training_outputs(rec, case, tmp, t)
            else:
                check_serving_outputs(rec, case, t)
        n_cli = run_cli(MODELS[::3] if quick else MODELS, t, Path(d))
    return t, len(todo) + n_cli, time.perf_counter() - start


def check_suggestions(model: str, rec: Any, case: str, t: Tally, followed: dict[tuple[Any, ...], bool | str]) -> None:
    """Every 'what would fit' line that names a scenario and a hardware target, run as written, must fit."""
    import re

    for line in rec.suggestions:
        hw, sc = re.search(r"hardware='([^']+)'", line), re.search(r"scenario='([^']+)'", line)
        if not hw:
            continue
        # the constraints the line names, as the user would pass them
        named = {k: (int(v) if v.isdigit() else v.strip("'")) for k, v in
                 re.findall(r"\b(finetune|global_batch_size|quantization|engine)=('[^']*'|\d+)", line)}
        key = (model, sc.group(1) if sc else rec.scenario, hw.group(1), tuple(sorted(named.items())))
        if key not in followed:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    followed[key] = perfguide.recommend(model, key[1], hardware=key[2], **named).fits
            except Exception as exc:  # noqa: BLE001 - any escape is a finding
                followed[key] = f"{type(exc).__name__}: {exc}"
        t.outcomes["suggestions followed"] += 1
        if followed[key] is not True:
            t.flag("suggestion does not hold", case, f"{line[:160]} -> recommend({key[1]!r}, hardware={key[2]!r}, {named}): {followed[key]}")


CLI_TARGET = {"train_gpu_one": "rtx4090", "train_gpu_many": "a100-80gb:8", "train_cpu": "cpu", "infer_gpu_one": "a10g",
              "infer_gpu_many": "a100-80gb:8", "infer_cpu": "cpu"}


def run_cli(models: tuple[str, ...], t: Tally, tmp: Path) -> int:
    """``perfguide recommend MODEL --scenario S --hardware H --json`` (and ``--write-configs DIR`` for training):
    exit 0 (a plan), 3 (nothing fits, the JSON still printed) or 2 (one ``error:`` line on stderr); the JSON reads
    back as a Recommendation; the files written load in TrainingArguments / SFTConfig / accelerate."""
    import json

    from perfguide.cli import main as cli

    n = 0
    for m in models:
        for sc, hw in CLI_TARGET.items():
            n += 1
            case = f"CLI {m} {sc} {hw}"
            out_dir = Path(tempfile.mkdtemp(dir=tmp))
            argv = ["recommend", m, "--scenario", sc, "--hardware", hw, "--json"]
            if sc.startswith("train"):
                argv += ["--write-configs", str(out_dir / "cfg")]
            out, err = io.StringIO(), io.StringIO()
            try:
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    code = cli(argv)
            except BaseException as exc:   # noqa: BLE001 - the CLI must catch everything itself
                t.flag("CLI raised", case, _classify(exc)[1] or repr(exc))
                continue
            t.outcomes[f"CLI exit {code}"] += 1
            errs = [ln for ln in err.getvalue().splitlines() if ln.startswith("error:")]
            if code not in (0, 2, 3):
                t.flag("CLI exit status", case, f"exit {code}: {err.getvalue()[-200:]}")
            if code == 2 and len(errs) != 1:
                t.flag("CLI error not one line", case, err.getvalue()[-300:])
            if code in (0, 3):
                try:
                    data = json.loads(out.getvalue())
                    perfguide.Recommendation.model_validate(data)
                except Exception as exc:  # noqa: BLE001 - any escape is a finding
                    t.flag("CLI --json does not read back", case, _classify(exc)[1] or str(exc))
            cfg = out_dir / "cfg"
            if code in (0, 3) and sc.startswith("train"):
                _cli_files(cfg, case, t)
    return n


def _cli_files(cfg: Path, case: str, t: Tally) -> None:
    import json

    from transformers import TrainingArguments
    from trl import SFTConfig

    names = sorted(p.name for p in cfg.iterdir()) if cfg.is_dir() else []
    if "training_args.json" not in names:
        t.flag("CLI --write-configs", case, f"wrote {names}")
        return
    _writer(t, case, "CLI training_args.json -> TrainingArguments",
            lambda: TrainingArguments(**_cpu_standin(json.loads((cfg / "training_args.json").read_text()))))
    if "sft_config.json" in names:
        _writer(t, case, "CLI sft_config.json -> SFTConfig", lambda: SFTConfig(**_cpu_standin(json.loads((cfg / "sft_config.json").read_text()))))
    if "accelerate.yaml" in names:
        _writer(t, case, "CLI accelerate.yaml -> load_config_from_file", lambda: _accelerate_loads(cfg / "accelerate.yaml"))


def render(t: Tally, n: int, seconds: float) -> str:
    kinds = Counter(f.kind for f in t.findings)
    lines = ["# Sweep: recommend() across real models x scenarios x targets", "",
             f"{n} cases ({len(MODELS)} catalogued models x {len(SCENARIOS)} scenarios x {len(TARGETS)} targets, plus forced constraints and "
             f"workload shapes per scenario, each on every other model, plus the CLI per model and scenario) in {seconds:.0f} s. Generated by `bench/sweep.py`; what each check means is its docstring.", "",
             "## Outcomes of recommend()", "", "| outcome | cases |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in sorted(t.outcomes.items()) if not k.startswith("decisions")]
    d = t.outcomes
    lines += ["", f"Decisions: {d['decisions']}; with the deciding number {d['decisions with a number']}, with a source "
              f"{d['decisions with a source']}.", ""]
    if t.numberless:
        lines += ["Decisions without the deciding number (scenario: setting):", "", "| decision | count |", "|---|---|"]
        lines += [f"| {k} | {v} |" for k, v in sorted(t.numberless.items())] + [""]
    lines += ["## Outputs, parsed by their libraries", "", "| writer: outcome | cases |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in sorted(t.writers.items())]
    lines += ["", "## Findings", "", "| kind | count |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in sorted(kinds.items())] or ["| none | 0 |"]
    if t.findings:
        lines += ["", "First cases of each kind:", ""]
        for k in sorted(kinds):
            for f in [f for f in t.findings if f.kind == k][:5]:
                lines.append(f"- **{k}**: `{f.case}`: {f.detail}")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="every fourth model, not written to bench/results")
    args = ap.parse_args()
    t, n, seconds = run(args.quick)
    text = render(t, n, seconds)
    if args.quick:
        print(text)
        return 0
    return publish(text, OUT)


if __name__ == "__main__":
    raise SystemExit(main())
