"""Accuracy of perfguide's analytic memory model against published measurements.

Run: ``.venv/bin/python bench/accuracy.py`` (writes bench/results/accuracy.md). Every row of
bench/data/published_measurements.csv is either compared (in the metric and unit it reports), judged on its
fits / does-not-fit verdict (OOM and max-fit rows), checked as an anchor formula (tool outputs), or listed
with the reason it cannot be expressed. Anchors computed in the same run: accelerate estimate-memory's
formula and DeepSpeed's ZeRO model-states formula, each on the same rows.
"""

from __future__ import annotations

import csv
import os
import re
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from perfguide.errors import PerfGuideError
from perfguide.hardware.types import Hardware
from perfguide.memory.analytic import training_memory as estimate_memory
from perfguide.memory.sharding import deepspeed_zero2_estimate, deepspeed_zero3_estimate
from perfguide.model.types import ModelSpec
from perfguide.setup import LoraSpec, Setup

CSV = ROOT / "bench" / "data" / "published_measurements.csv"
OUT = ROOT / "bench" / "results" / "accuracy.md"

UNITS = {"GB": 1e9, "MB": 1e6, "GiB": 2**30, "MiB": 2**20}
GPUS = [("a100-sxm4-80gb", "a100-80gb"), ("a100-80gb", "a100-80gb"), ("a100", "a100-40gb"), ("a10g", "a10g"),
        ("h100", "h100-80gb"), ("h200", "h200"), ("l40s", "l40s"), ("titan rtx", "t4"), ("rtx3080ti", "rtx3090"),
        ("rtx 2060", "t4")]
# TITAN RTX is Turing (TU102, compute capability 7.5) like the T4: same CUDA context class (calibration by_cc_major)
GPU_MEMORY = {"rtx3080ti": 16 * 2**30, "rtx 2060": 8 * 2**30, "titan rtx": 24 * 2**30, "h100 96gb": 96 * 2**30}


class Skip(Exception):
    """A row perfguide's Setup cannot express; the message is the reason shown in the report."""


@dataclass
class Result:
    row: dict[str, str]
    kind: str                       # "value", "verdict", "skip"
    reason: str = ""
    predicted: float | None = None  # in the row's unit
    published: float | None = None
    err_pct: float | None = None
    verdict_ok: bool | None = None
    anchors: dict[str, float] = field(default_factory=dict)  # anchor name -> abs % error


def _int(text: str, default: int | None = None) -> int:
    m = re.search(r"\d+", text or "")
    if m:
        return int(m.group())
    if default is None:
        raise Skip(f"no number in {text!r}")
    return default


def _unit(unit: str) -> float:
    if "MiB*1.048576" in unit:
        return 1e6
    for key in ("GiB", "MiB", "GB", "MB"):
        if key in unit:
            return UNITS[key]
    raise Skip(f"unit {unit!r} not understood")


def _metric(metric: str) -> str:
    if "nvidia-smi" in metric:
        return "device_total"
    if "reserved" in metric:
        return "peak_reserved"
    if "allocated" in metric or "Max GPU RAM" in metric:
        return "peak_allocated"
    raise Skip(f"metric {metric!r} is not a torch/nvidia-smi peak")


def _hardware(gpu_type: str, num_gpus: int) -> Hardware | None:
    low = gpu_type.lower()
    name = next((n for key, n in GPUS if key in low), None)
    if name is None:
        return None
    hw = Hardware.from_name(f"{name}:{num_gpus}")
    mem = next((v for k, v in GPU_MEMORY.items() if k in low), None)
    if mem is not None:  # GPUs without an entry in gpus.json: borrow a same-generation spec, fix the memory
        gpus = tuple(g.model_copy(update={"memory_total": mem, "memory_free": mem}) for g in hw.gpus)
        hw = hw.model_copy(update={"gpus": gpus})
    return hw


def _precision(p: str) -> dict[str, object]:
    low = p.lower()
    if "float8" in low:
        raise Skip("Float8 linears are not expressible")
    if "mixed" in low and "bf16" in low and "fsdp" not in low:
        return {"weights_dtype": "fp32", "autocast": "bf16"}
    if "fsdp mixed precision" in low:
        return {"weights_dtype": "fp32", "autocast": "bf16"}
    if "fp16 amp" in low:
        return {"weights_dtype": "fp32", "autocast": "fp16"}
    if "bf16" in low:
        return {"weights_dtype": "bf16"}
    if "16-true" in low or "fp16" in low or "float16" in low:
        return {"weights_dtype": "fp16"}
    if "32" in low:
        return {"weights_dtype": "fp32"}
    raise Skip(f"precision {p!r} not expressible")


_TARGET_WORDS = {
    "query": ("q_proj", "query", ".q", "qkv_proj", "c_attn", "query_key_value"),
    "key": ("k_proj", "key", ".k", "qkv_proj", "c_attn", "query_key_value"),
    "value": ("v_proj", "value", ".v", "qkv_proj", "c_attn", "query_key_value"),
    "projection": ("o_proj", "out_proj", "attention.output.dense", "attn.c_proj", "dense"),
    "mlp": ("gate_proj", "up_proj", "down_proj", "fc1", "fc2", "mlp.", "intermediate.dense", "dense_h_to_4h", "dense_4h_to_h"),
}


def _lora(row: dict[str, str], spec: ModelSpec) -> LoraSpec | None:
    if not row["lora_rank"]:
        if "adapter" in row["method"].lower():
            raise Skip("litgpt Adapter v1/v2 is not expressible (only LoRA)")
        return None
    words = [w.strip() for w in row["lora_targets"].split("(")[0].split(",") if w.strip()]
    names = [n for n in spec.block_linears if any(n.endswith(t) or t in n for w in words if w in _TARGET_WORDS for t in _TARGET_WORDS[w])]
    if not names:
        raise Skip(f"LoRA targets {words} do not map onto {spec.name}'s Linears")
    return LoraSpec(r=int(row["lora_rank"]), alpha=_int(row["lora_alpha"], 16), target_modules=tuple(sorted(set(names))))


def _strategy(row: dict[str, str]) -> dict[str, object]:
    par = row["parallelism"]
    if any(k in par for k in ("TP", "PP", "CP 2", "CP 4", "CP 8", "tensor parallel", "pipeline")):
        raise Skip(f"parallelism {par!r} (TP/PP/CP or pipeline) is not priced for training")
    if "SHARD_GRAD_OP" in par:
        return {"strategy": "fsdp_shard_grad_op"}
    if "FSDP" in par:
        n = _int(row["num_gpus"], 1)
        offload = "offload" in par.lower()
        out: dict[str, object] = {"strategy": "fsdp" if n > 1 or offload else "single"}  # 1-GPU FSDP still offloads
        # FSDP2 (fully_shard) only where the row says so; litgpt/Lightning and the older HF rows ran FSDP1
        out["fsdp_version"] = 2 if "FSDP2" in par or any(k in row["source"] for k in ("torchtitan", "torchtune")) else 1
        if offload:
            out.update(offload_params=True, offload_optimizer=True)
        return out
    if par == "DDP":
        return {"strategy": "ddp"}
    return {"strategy": "single"}


def _pre_torch2(row: dict[str, str]) -> bool:
    return re.search(r"PyTorch (nightly ~)?1\.", row["notes"] + row["gpu_type"]) is not None


def _attn(row: dict[str, str]) -> str:
    """The row's attention; before PyTorch 2.0 there was no scaled_dot_product_attention, so HF ran eager."""
    return row["attn_impl"] or ("eager" if _pre_torch2(row) else "sdpa")


def _optimizer(row: dict[str, str]) -> str | None:
    opt = row["optimizer"].lower()
    if opt in ("none", ""):
        return None
    if "paged" in opt and row["quantization"]:
        return "paged_adamw_32bit"
    if _pre_torch2(row):
        # before PyTorch 2.0 torch.optim.AdamW ran the per-tensor loop (foreach became the CUDA default in 2.0):
        # no parameter-sized temporary, the same memory as perfguide's per-tensor fused AdamW
        return "adamw_torch_fused"
    return "adamw_torch"  # torch.optim.AdamW default since PyTorch 2.0: foreach on CUDA


def _seq_len(text: str) -> int:
    """Padded-per-batch rows peak at their longest sample; a value the source marks as truncated in print
    ("'12' as printed (probably truncated 128)") is read as the value the source gives for it."""
    for marker in ("probably truncated", "longest sample"):
        if marker in text:
            return _int(text.split(marker)[-1])
    return _int(text)


def _train_setup(row: dict[str, str], spec: ModelSpec) -> Setup:
    if row["grad_checkpointing"].startswith("selective"):
        raise Skip("selective (per-op) activation checkpointing is not expressible")
    q = row["quantization"]
    if q.startswith("GPTQ"):
        raise Skip("GPTQ weights are not expressible")
    fields: dict[str, object] = dict(task="train", micro_batch_size=_int(row["micro_batch"], 1),
                                     seq_len=_seq_len(row["seq_len"]),
                                     gradient_accumulation_steps=_int(row["grad_accum"], 1),
                                     optimizer=_optimizer(row),
                                     gradient_checkpointing=row["grad_checkpointing"] not in ("", "no"),
                                     attn_implementation=_attn(row),
                                     num_gpus=_int(row["num_gpus"], 1))
    fields.update(_precision(row["precision"]))
    fields.update(_strategy(row))
    if q:
        fields["weights_dtype"] = "int8" if "int8" in q else "nf4"
        # litgpt quantizes the Linears only and never runs peft's prepare_model_for_kbit_training (no fp32 cast)
        fields["kbit_upcast"] = "litgpt" not in row["source"].lower()
    fields["lora"] = _lora(row, spec)
    return Setup(**fields)  # type: ignore[arg-type]


def _infer_setup(row: dict[str, str], spec: ModelSpec | None = None) -> Setup:
    if row["quantization"].startswith("GPTQ"):
        raise Skip("GPTQ weights are not expressible")
    text = row["seq_len"]
    nums = [int(x) for x in re.findall(r"\d+", text)]
    if spec is not None and not spec.generates and text.strip().isdigit():
        seq, new = nums[0], 0  # an encoder is served by one forward pass over the stated length: nothing is generated
    elif "short prompt" in text:
        seq, new = 8, nums[0]
    elif "generated" in text:
        seq, new = nums[0], nums[1]
    elif "prompt" in text:
        seq, new = nums[0], 1
    else:
        raise Skip(f"inference rows without a stated prompt/generation length ({text!r}) are not compared")
    par = row["parallelism"]
    n = _int(row["num_gpus"], 1)
    strat = "tp" if "tensor parallel" in par else ("device_map" if n > 1 else "single")
    fields: dict[str, object] = dict(task="infer", micro_batch_size=_int(row["micro_batch"], 1), seq_len=seq,
                                     new_tokens=new, optimizer=None, strategy=strat, num_gpus=n,
                                     attn_implementation=_attn(row))
    fields.update(_precision(row["precision"]))
    if fields.get("autocast"):
        fields.pop("autocast")
    q = row["quantization"]
    if q:
        fields["weights_dtype"] = "int8" if "int8" in q else "nf4"
        # litgpt quantizes the Linears only and never runs peft's prepare_model_for_kbit_training (no fp32 cast)
        fields["kbit_upcast"] = "litgpt" not in row["source"].lower()
    return Setup(**fields)  # type: ignore[arg-type]


_SPECS: dict[str, ModelSpec] = {}

# Community re-uploads of a catalog model (same config.json, same weights); the catalog deliberately does not
# resolve unknown organisations, so the bench names the original here.
REUPLOADS = {"daryl149/llama-2-13b-chat-hf": "meta-llama/Llama-2-13b-hf",
             "unsloth/Mistral-7B-v0.2": "mistralai/Mistral-7B-v0.2"}


def _spec(hub_id: str) -> ModelSpec:
    if hub_id not in _SPECS:
        try:
            _SPECS[hub_id] = ModelSpec.from_any(REUPLOADS.get(hub_id, hub_id))
        except PerfGuideError as exc:
            raise Skip(f"model not in the offline catalog ({type(exc).__name__})") from None
    return _SPECS[hub_id]


def _loss_bytes(row: dict[str, str], spec: ModelSpec, setup: Setup) -> int | None:
    """Rows whose loss is not HF's fp32 cross-entropy: the framework's loss-path bytes (None = perfguide's).

    The transformers SDPA tables use ``loss=logits.sum()`` on 16-bit logits: the logits the script keeps plus
    their gradient, which SumBackward hands over as a stride-0 expand that the head's matmul backward makes
    contiguous (2 + 2 bytes per b*s*V). litgpt uses chunked cross-entropy on 16-bit logits (logits + their
    gradient; fp32 only per 128-token chunk): also 4 bytes per b*s*V.
    """
    if setup.task != "train":
        return None
    if "loss=logits.sum()" in row["method"] or row["source_group"].startswith("litgpt"):
        return 4 * setup.micro_batch_size * setup.seq_len * spec.vocab_size
    return None


BNB_RELEASES = (("2024-07-16", "0.43.2"),)  # bitsandbytes 0.43.2 (PyPI, 2024-07-16): MatMul4Bit stops saving inputs


def _bnb_version(row: dict[str, str]) -> str | None:
    """The bitsandbytes release of a quantized row: as the row states it, else the one current at its date."""
    if not row["quantization"].startswith("bnb"):
        return None
    m = re.search(r"bitsandbytes (\d+\.\d+\.\d+)", row["notes"] + " " + row["method"])
    if m:
        return m.group(1)
    date = re.search(r"\d{4}-\d{2}(-\d{2})?", row["commit_or_date"])
    if date and all(date.group() < day for day, _ in BNB_RELEASES):
        return "0.43.1"
    return None


def accelerate_anchor(spec: ModelSpec, setup: Setup) -> int:
    """accelerate estimate-memory: fp32 size S (AutoModel, no untied head), training = max stage = 4S (fp32)
    or 2S ("float16" mixed); inference = S / k."""
    s = 4 * (spec.total_params - spec.lm_head_params)
    if setup.task == "infer":
        return s // {"fp32": 1, "bf16": 2, "fp16": 2, "int8": 4, "nf4": 8}[setup.weights_dtype]
    return 4 * s if setup.weights_dtype == "fp32" and not setup.autocast else 2 * s


def deepspeed_anchor(spec: ModelSpec, setup: Setup) -> int:
    """DeepSpeed model-states estimator (no activations): ZeRO-3 for sharded runs, ZeRO-2 formula otherwise."""
    n = setup.world_size
    if setup.strategy in ("zero3", "fsdp"):
        largest = max(spec.embedding_params, spec.lm_head_params, max((i * o for i, o in spec.block_linears.values()), default=0))
        return deepspeed_zero3_estimate(spec.total_params, largest, n, 1, setup.offload_optimizer, setup.offload_params)[1]
    return deepspeed_zero2_estimate(spec.total_params, n, 1, setup.offload_optimizer)[1]


def _pct(pred: float, pub: float) -> float:
    return abs(pred - pub) / pub * 100


def evaluate(row: dict[str, str], timings: list[float]) -> Result:
    kind = row["value_kind"]
    if kind == "estimate_tool_output":
        return Result(row, "skip", "tool output: checked as a formula in tests/test_sharding.py and the anchor table")
    if kind in ("not_supported", "error"):
        return Result(row, "skip", f"value_kind={kind}: no memory number ({row['notes'] or row['value_kind']})")
    try:
        spec = _spec(row["model_hf_id"])
        task = row["task"]
        if task.startswith("load"):
            raise Skip("load-only rows are not a training/inference step")
        setup = _infer_setup(row, spec) if task.startswith("infer") else _train_setup(row, spec)
        hw = _hardware(row["gpu_type"], setup.num_gpus)
        loss, bnb = _loss_bytes(row, spec, setup), _bnb_version(row)
        t0 = time.perf_counter()
        est = estimate_memory(spec, setup, hw, loss_bytes=loss, bnb_version=bnb)
        timings.append(time.perf_counter() - t0)
    except Skip as exc:
        return Result(row, "skip", str(exc))
    except (PerfGuideError, NotImplementedError, ValueError) as exc:
        return Result(row, "skip", f"not expressible: {str(exc).splitlines()[0][:120]}")
    if kind in ("oom", "max_batch_fit"):
        if hw is None:
            return Result(row, "skip", f"verdict row without a known GPU ({row['gpu_type']!r})")
        if kind == "oom":
            return Result(row, "verdict", verdict_ok=not est.fits, reason="published OOM")
        up = setup.replace(micro_batch_size=setup.micro_batch_size + 1)
        bigger = estimate_memory(spec, up, hw, loss_bytes=_loss_bytes(row, spec, up), bnb_version=bnb)
        return Result(row, "verdict", verdict_ok=est.fits and not bigger.fits, reason="published max batch that fits")
    try:
        scale, metric = _unit(row["peak_mem_unit"]), _metric(row["mem_metric"])
        published = float(re.match(r"[\d.]+", row["peak_mem_value"]).group())  # type: ignore[union-attr]
    except (Skip, AttributeError) as exc:
        return Result(row, "skip", str(exc) or "value not a number")
    states = est.weights + est.gradients + est.optimizer_states
    if setup.task == "train" and metric == "peak_allocated" and published * scale < states:
        return Result(row, "skip", f"published {published:g} is below the model states of the stated setup "
                                   f"({states / scale:.2f}: weights + grads + optimizer state, no activations); "
                                   "the setup fields cannot be what ran")
    pred = getattr(est, metric) / scale
    anchors = {}
    if setup.task == "train" or metric == "peak_allocated":
        anchors["accelerate"] = _pct(accelerate_anchor(spec, setup) / scale, published)
        if setup.task == "train":
            anchors["deepspeed"] = _pct(deepspeed_anchor(spec, setup) / scale, published)
    return Result(row, "value", predicted=pred, published=published, err_pct=_pct(pred, published), anchors=anchors)


def _stats(errs: list[float]) -> str:
    if not errs:
        return "n=0 | - | -"
    s = sorted(errs)
    p90 = s[min(len(s) - 1, round(0.9 * (len(s) - 1)))]
    return f"n={len(s)} | {statistics.median(s):.1f}% | {p90:.1f}%"


def report(results: list[Result], timings: list[float]) -> str:
    values = [r for r in results if r.kind == "value"]
    ab = [r for r in values if r.row["trust"] in ("A", "B")]
    lines = ["# perfguide memory accuracy vs published measurements", "",
             f"Generated by `bench/accuracy.py` from `{CSV.relative_to(ROOT)}` ({len(results)} rows).", "",
             "Error = |predicted - published| / published in the metric the row reports (torch allocated, reserved, "
             "or nvidia-smi device total) and in its unit. Anchors: accelerate estimate-memory's formula and "
             "DeepSpeed's ZeRO model-states formula on the same rows.", "",
             "Row reading: padded-per-batch rows use their longest sample; community re-uploads map to the original "
             "(REUPLOADS); rows run before PyTorch 2.0 use eager attention and per-tensor AdamW (no SDPA, no foreach "
             "default then); framework loss paths (logits.sum(), litgpt chunked CE) replace HF's fp32 CE buffers via "
             "estimate_memory(loss_bytes=...); a training row whose published peak is below the model states of its "
             "stated setup is listed as not comparable, with both numbers.", "",
             "## Summary (trust A/B measured rows, absolute % error)", "",
             "| source | n | perfguide median | perfguide p90 | accelerate median | accelerate p90 | deepspeed median | deepspeed p90 |",
             "|---|---|---|---|---|---|---|---|"]
    groups = [*sorted({r.row["source_group"] for r in ab}), "ALL"]
    for g in groups:
        rs = ab if g == "ALL" else [r for r in ab if r.row["source_group"] == g]
        acc = [r.anchors["accelerate"] for r in rs if "accelerate" in r.anchors]
        ds = [r.anchors["deepspeed"] for r in rs if "deepspeed" in r.anchors]
        lines.append(f"| {g} | {_stats([r.err_pct for r in rs]).removeprefix('n=')} | {_stats(acc).split(' | ', 1)[1]} | {_stats(ds).split(' | ', 1)[1]} |")
    verdicts = [r for r in results if r.kind == "verdict"]
    ok = sum(1 for r in verdicts if r.verdict_ok)
    lines += ["", f"Fits / does-not-fit verdicts (OOM and max-batch rows): {ok}/{len(verdicts)} correct.", ""]
    if timings:
        lines.append(f"Estimate latency: median {statistics.median(timings) * 1e3:.3f} ms, max {max(timings) * 1e3:.3f} ms "
                     f"over {len(timings)} calls.")
    lines += ["", "## Compared rows", "", "| row | model | setup | metric | published | perfguide | err % |", "|---|---|---|---|---|---|---|"]
    for r in values:
        row = r.row
        desc = f"{row['task'][:18]} b={row['micro_batch']} s={row['seq_len'][:24]} {row['precision'][:20]} {row['parallelism'][:20]}"
        lines.append(f"| {row['row_id']} | {row['model_hf_id']} | {desc} | {row['mem_metric'][:28]} | {r.published:g} | {r.predicted:.2f} | {r.err_pct:.1f} |")
    lines += ["", "## Verdict rows", "", "| row | model | kind | correct |", "|---|---|---|---|"]
    lines += [f"| {r.row['row_id']} | {r.row['model_hf_id']} | {r.reason} | {'yes' if r.verdict_ok else 'NO'} |" for r in verdicts]
    skips = [r for r in results if r.kind == "skip"]
    lines += ["", f"## Rows not compared ({len(skips)})", "", "| row | model | reason |", "|---|---|---|"]
    lines += [f"| {r.row['row_id']} | {r.row['model_hf_id']} | {r.reason} |" for r in skips]
    return "\n".join(lines) + "\n"


def main() -> int:
    with CSV.open(encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    timings: list[float] = []
    results = [evaluate(r, timings) for r in rows]
    text = report(results, timings)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text, encoding="utf-8")
    print("\n".join(text.splitlines()[:20]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
