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
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from accuracy_anchors import accelerate_anchor, deepspeed_anchor
from accuracy_configs import CONFIGS
from accuracy_litgpt import litgpt_inference
from accuracy_prefill import with_prompt_logits
from accuracy_report import Result, report
from accuracy_reserved import RESERVED_LINE, reserved_line_fits

from perfguide._data import load
from perfguide.errors import PerfGuideError
from perfguide.hardware.types import Hardware
from perfguide.memory.analytic import training_memory
from perfguide.memory.inference import estimate_inference
from perfguide.memory.loss_path import hf_loss_bytes
from perfguide.memory.types import MemoryEstimate
from perfguide.model.types import ModelSpec
from perfguide.setup import LoraSpec, Setup

CSV = ROOT / "bench" / "data" / "published_measurements.csv"
OUT = ROOT / "bench" / "results" / "accuracy.md"

UNITS = {"GB": 1e9, "MB": 1e6, "GiB": 2**30, "MiB": 2**20}
GPUS = [("a100-sxm4-80gb", "a100-80gb"), ("a100-80gb", "a100-80gb"), ("a100 80gb", "a100-80gb"), ("a100", "a100-40gb"),
        ("v100-sxm2-16gb", "v100-16gb"), ("rtx 3090", "rtx3090"), ("rtx 4090", "rtx4090"), ("a10g", "a10g"),
        ("h100", "h100-80gb"), ("h200", "h200"), ("l40s", "l40s"), ("titan rtx", "t4"), ("rtx3080ti", "rtx3090"),
        ("rtx 2060", "t4")]
# TITAN RTX is Turing (TU102, compute capability 7.5) like the T4: same CUDA context class (calibration by_cc_major)
# TITAN RTX: the card's total as the hf_blog_pytorch_fsdp source's own OOM message prints it ("GPU 0; 23.65 GiB total
# capacity"), the cudaMemGetInfo total that nvidia-smi also shows (24220 MiB), not the nominal 24 GiB
GPU_MEMORY = {"rtx3080ti": 16 * 2**30, "rtx 2060": 8 * 2**30, "titan rtx": int(23.65 * 2**30), "h100 96gb": 96 * 2**30}


class Skip(Exception):
    """A row perfguide's Setup cannot express; the message is the reason shown in the report."""


def estimate_memory(spec: ModelSpec, setup: Setup, hw: Hardware | None, *, loss_bytes: int | None = None,
                    bnb_version: str | None = None, grads_persist: bool = False,
                    nf4_library: str = "bitsandbytes") -> MemoryEstimate:
    """The memory model for a row: training with the row's loss path, bitsandbytes release, zero_grad
    behaviour and 4-bit library, or inference."""
    if setup.task == "infer":
        return estimate_inference(spec, setup, hw)
    return training_memory(spec, setup, hw, loss_bytes=loss_bytes, bnb_version=bnb_version, grads_persist=grads_persist,
                           nf4_library=nf4_library)


def _nf4_library(row: dict[str, str]) -> str:
    """torchtune's rows quantize with torchao's NF4Tensor (the quantization field says so); every other nf4 row is bnb."""
    return "torchao" if row["quantization"].startswith("torchao") else "bitsandbytes"


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


#: a row that states only the card's memory ("24 GB GPU (model not stated)"): an Ampere datacenter spec with that
#: memory (read as GiB, as boards are sized), so the CUDA context is cc-8's
UNSTATED_GPU = re.compile(r"(\d+) GB GPU \(model not stated\)")


def _hardware(gpu_type: str, num_gpus: int) -> Hardware | None:
    low = gpu_type.lower()
    unstated = UNSTATED_GPU.search(gpu_type)
    name = "a100-80gb" if unstated else next((n for key, n in GPUS if key in low), None)
    if name is None:
        return None
    hw = Hardware.from_name(f"{name}:{num_gpus}")
    mem = int(unstated.group(1)) * 2**30 if unstated else next((v for k, v in GPU_MEMORY.items() if k in low), None)
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
    if par.startswith("DDP"):
        return {"strategy": "ddp"}  # fsdp_qlora's "ddp" sharding: FSDP NO_SHARD, every GPU holds the whole model
    if any(k in par for k in ("TP", "PP", "CP 2", "CP 4", "CP 8", "tensor parallel", "pipeline")):
        raise Skip(f"parallelism {par!r} (TP/PP/CP or pipeline) is not priced for training")
    if "SHARD_GRAD_OP" in par:
        return {"strategy": "fsdp_shard_grad_op"}
    if "FSDP" in par:
        n = _int(row["num_gpus"], 1)
        offload = "offload" in par.lower()
        out: dict[str, object] = {"strategy": "fsdp" if n > 1 or offload else "single"}  # 1-GPU FSDP still offloads
        # FSDP2 (fully_shard) only where the row says so; litgpt/Lightning and the older HF rows ran FSDP1.
        # fsdp_qlora's FSDP1 is priced as FSDP2 (per-parameter): its llama-recipes policy wraps every leaf whose weight
        # requires grad as its own unit and uses use_orig_params=False (train.py lambda_policy_fn), so frozen weights
        # sit in FlatParameters that need no gradient, and a quantized unit is gathered as stored (quant_storage)
        # HF Trainer + PEFT under FSDP1 uses peft's fsdp_auto_wrap_policy (each trainable leaf its own unit): the same
        per_param = ("FSDP2" in par or any(k in row["source"] for k in ("torchtitan", "torchtune", "fsdp_qlora"))
                     or "fsdp_auto_wrap_policy" in row["method"])
        out["fsdp_version"] = 2 if per_param else 1
        if offload:
            out.update(offload_params=True, offload_optimizer=True)
        return out
    if par == "DDP":
        return {"strategy": "ddp"}
    return {"strategy": "single"}


def _pre_torch2(row: dict[str, str]) -> bool:
    """Run before PyTorch 2.0: eager attention only, per-tensor AdamW, and zero_grad(set_to_none=False) by default
    (2.0 release notes: "set_to_none=True by default" for Optimizer.zero_grad and Module.zero_grad)."""
    return re.search(r"PyTorch (nightly ~)?1\.", row["notes"] + row["gpu_type"]) is not None


def _attn(row: dict[str, str]) -> str:
    """The row's attention; before PyTorch 2.0 there was no scaled_dot_product_attention, so HF ran eager."""
    return row["attn_impl"] or ("eager" if _pre_torch2(row) else "sdpa")


#: optimizers whose state lives in CUDA unified memory (bitsandbytes paged_* ; data/optimizers.json "paged")
PAGED = ("paged_adamw_8bit", "paged_adamw_32bit", "paged_lion_8bit", "paged_lion_32bit")


def _optimizer(row: dict[str, str]) -> str | None:
    opt = row["optimizer"].lower()
    if opt in ("none", ""):
        return None
    if opt.startswith("adafactor"):
        return "adafactor"
    eight_bit = "8bit" in opt or "8-bit" in opt
    if "paged" in opt:  # bnb PagedAdamW / PagedAdamW8bit: states in CUDA unified memory (see PAGED)
        return "paged_adamw_8bit" if eight_bit else "paged_adamw_32bit"
    if eight_bit:
        return "adamw_bnb_8bit"  # bnb Adam8bit / TrainingArguments adamw_8bit: both moments in 8-bit blocks
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


def _kbit_upcast(row: dict[str, str]) -> bool:
    """litgpt, Answer.AI's fsdp_qlora and torchtune quantize the Linears themselves and never run peft's
    prepare_model_for_kbit_training, so nothing is cast to fp32; HF + PEFT rows do."""
    if "skips prepare_model_for_kbit_training" in row["method"]:  # TRL's SFTTrainer on FSDP-sharded QLoRA
        return False
    return not any(k in row["source"].lower() for k in ("litgpt", "fsdp_qlora", "torchtune"))


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
                                     num_gpus=_int(row["num_gpus"], 1),
                                     optimizer_in_backward="optimizer_in_bwd True" in row["method"],
                                     torch_compile="torch.compile enabled" in row["method"])
    fields.update(_precision(row["precision"]))
    fields.update(_strategy(row))
    if q:
        fields["weights_dtype"] = "int8" if "int8" in q else "nf4"
        fields["kbit_upcast"] = _kbit_upcast(row)
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
        fields["kbit_upcast"] = _kbit_upcast(row)
    return Setup(**fields)  # type: ignore[arg-type]


_SPECS: dict[str, ModelSpec] = {}

# Community re-uploads of a catalog model (same config.json, same weights); the catalog deliberately does not
# resolve unknown organisations, so the bench names the original here.
REUPLOADS = {"daryl149/llama-2-13b-chat-hf": "meta-llama/Llama-2-13b-hf",
             "unsloth/Mistral-7B-v0.2": "mistralai/Mistral-7B-v0.2",
             # Llama 3.3 70B reuses Llama 3.1 70B's config.json shape (80 x 8192, FFN 28672, 128256 vocab, GQA 8)
             "meta-llama/Llama-3.3-70B-Instruct": "meta-llama/Llama-3.1-70B"}


def _spec(hub_id: str) -> ModelSpec:
    if hub_id not in _SPECS:
        try:
            _SPECS[hub_id] = ModelSpec.from_any(CONFIGS.get(hub_id) or REUPLOADS.get(hub_id, hub_id))
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
    if "loss=logits.sum()" in row["method"]:
        return 4 * setup.micro_batch_size * setup.seq_len * spec.vocab_size + _held_cache_bytes(spec, setup)
    if row["source_group"].startswith("litgpt"):
        return 4 * setup.micro_batch_size * setup.seq_len * spec.vocab_size
    if "CEWithChunkedOutputLoss" in row["method"]:
        # torchtune: every chunk's 16-bit logits (2) live until the recipe's `del logits`. Eager: each chunk's fp32
        # log-softmax output (4) is saved for backward and one chunk's fp32 upcast (4 / 8 chunks) is transient.
        # Compiled (torch.compile of the loss): the graph saves only the 16-bit logits and per-row statistics
        # (saved_tensors_hooks on the chunked loss: 4.0 B per logit saved eager, 0.004 compiled; torch 2.13 CPU
        # inductor), recomputing one chunk's fp32 upcast, softmax and gradient (12 / 8 chunks) in backward
        per_logit = 2 + 12 / TORCHTUNE_CHUNKS if setup.torch_compile else 2 + 4 + 4 / TORCHTUNE_CHUNKS
        return int(per_logit * setup.micro_batch_size * setup.seq_len * spec.vocab_size)
    version = _transformers_version(row)
    if version is not None and spec.generates and not spec.is_encoder_decoder:
        return hf_loss_bytes(spec, setup, version, row["source_group"] in LOOP_KEEPS_OUTPUTS)
    return None


def _held_cache_bytes(spec: ModelSpec, setup: Setup) -> int:
    """The benchmark loop's previous output, alive until the next forward returns (``outputs = model(...)``).

    Its logits are the 2 B per b*s*V the logits.sum() path already counts (old logits at the end of the next
    forward stand where the gradient stands in backward). transformers of 2024 also returned the KV cache from a
    training forward whenever ``config.use_cache`` was true (the default of these checkpoints), and that cache
    keeps storages alive through the next step's forward (HELD_CACHE_BYTES_PER_H, per layer per token).
    """
    return HELD_CACHE_BYTES_PER_H.get(spec.model_type, 0) * spec.hidden_size * spec.num_layers * setup.micro_batch_size * setup.seq_len


#: Bytes per h per layer per token a 2024 training forward's returned cache keeps alive, read from the released
#: wheels of the tables' time and checked by a live-bytes trace of the benchmark loop (forward, logits.sum(),
#: backward, three steps) on real CPU fp16 tensors, use_cache=True minus False, 1- and 2-layer models, b 2/4 x s 128.
#: transformers 5.24 keeps none (same trace); a family not listed was not traced with its 2024 code, or held none.
HELD_CACHE_BYTES_PER_H = {
    # 4.42.4 GPTNeoXAttention: present = (key, value): the rotated key is a new 16-bit tensor (2 B per h) and value
    # a view of the fused query_key_value output, keeping its whole storage (2 B per 3h). Trace: +8.0
    "gpt_neox": 8,
    # 4.45.2 BioGptAttention: past_key_value = (key_states, value_states), two contiguous 16-bit copies (2 + 2). Trace:
    # +3.8 (sdpa and eager)
    "biogpt": 4,
    # opt (4.46.3, the table's PR #33298 era): the same trace holds no more with use_cache=True (eager +0.0, sdpa
    # -4.0: the cache tensors are ones attention saves anyway), so opt is not listed
}


#: torchtune's CEWithChunkedOutputLoss default (torchtune/modules/loss/ce_chunked_output_loss.py: num_output_chunks=8)
TORCHTUNE_CHUNKS = 8
#: hand-written loops that hold the model output (its logits) while calling backward, as their scripts read
LOOP_KEEPS_OUTPUTS = {
    "hf_blog_pytorch_fsdp": "blog assets/62_pytorch_fsdp/run_clm_no_trainer.py: outputs = model(**batch); "
                            "loss = outputs.loss; ... accelerator.backward(loss)",
    "answerai_fsdp_qlora": "fsdp_qlora train.py: output = model(...); loss = output.loss; ... loss.backward(); "
                           "'output = None' only after the optimizer step",
}
#: transformers release current when a pre-PyTorch-2.0 row ran (hf_blog_pytorch_fsdp, 2022-04-29: 4.18.0 of 2022-04-06)
PRE_TORCH2_TRANSFORMERS = "4.18.0"


def _transformers_version(row: dict[str, str]) -> str | None:
    """The transformers release of an HF-loss row, as its notes state or infer it ("transformers ~4.47",
    "transformers' default SDPA (4.38, inferred)"); rows run before PyTorch 2.0 get the release of their time."""
    m = re.search(r"transformers\b[^0-9;]{0,30}(\d+\.\d+(?:\.\d+)?)", row["notes"] + " " + row["method"])
    if m:
        return m.group(1)
    return PRE_TORCH2_TRANSFORMERS if _pre_torch2(row) else None


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
        if "SequenceClassification" in row["method"]:  # a 2-label classifier on the pooled token, not the MLM head
            spec = spec.model_copy(update={"head": "sequence_classification", "num_labels": 2})
        task = row["task"]
        if task.startswith("load"):
            raise Skip("load-only rows are not a training/inference step")
        setup = _infer_setup(row, spec) if task.startswith("infer") else _train_setup(row, spec)
        hw = _hardware(row["gpu_type"], setup.num_gpus)
        loss, bnb = _loss_bytes(row, spec, setup), _bnb_version(row)
        t0 = time.perf_counter()
        est = estimate_memory(spec, setup, hw, loss_bytes=loss, bnb_version=bnb, grads_persist=_pre_torch2(row),
                              nf4_library=_nf4_library(row))
        timings.append(time.perf_counter() - t0)
        if setup.task == "infer" and setup.num_gpus == 1 and row["source_group"].startswith("litgpt"):  # litgpt layout
            compute = str(_precision(row["precision"])["weights_dtype"])
            est = litgpt_inference(spec, est, row["quantization"], compute)
        release = _transformers_version(row)
        if setup.task == "infer" and release is not None:  # generate's prefill logits as the row's release ran it
            est = with_prompt_logits(est, spec, setup, release)
    except Skip as exc:
        return Result(row, "skip", str(exc))
    except (PerfGuideError, NotImplementedError, ValueError) as exc:
        return Result(row, "skip", f"not expressible: {str(exc).splitlines()[0][:120]}")
    if kind in ("oom", "max_batch_fit", "max_seq_fit"):
        if hw is None:
            return Result(row, "skip", f"verdict row without a known GPU ({row['gpu_type']!r})")
        return _boundary(row, spec, setup, hw, _fits(row, spec, setup, hw))
    try:
        scale, metric = _unit(row["peak_mem_unit"]), _metric(row["mem_metric"])
        published = float(re.match(r"[\d.]+", row["peak_mem_value"]).group())  # type: ignore[union-attr]
    except (Skip, AttributeError) as exc:
        return Result(row, "skip", str(exc) or "value not a number")
    # bitsandbytes' paged optimizers allocate their state with cudaMallocManaged, outside PyTorch's caching
    # allocator (the model keeps only a working set on the device): the allocator's peak may be below the states
    paged = est.optimizer_states if setup.optimizer in PAGED else 0
    states = est.weights + est.gradients + est.optimizer_states - paged
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


def _fits(row: dict[str, str], spec: ModelSpec, setup: Setup, hw: Hardware) -> bool:
    est = estimate_memory(spec, setup, hw, loss_bytes=_loss_bytes(row, spec, setup), bnb_version=_bnb_version(row),
                          grads_persist=_pre_torch2(row), nf4_library=_nf4_library(row))
    return reserved_line_fits(est, spec, setup, hw) if RESERVED_LINE in row["mem_metric"] else est.fits


def max_context(row: dict[str, str], spec: ModelSpec, setup: Setup, hw: Hardware) -> int:
    """The longest sequence (to 16 tokens) the model says fits at the row's batch; 0 when none of 64 does."""
    lo, hi = 64, 1 << 21
    if not _fits(row, spec, setup.replace(seq_len=lo), hw):
        return 0
    while hi - lo > 16:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if _fits(row, spec, setup.replace(seq_len=mid), hw) else (lo, mid)
    return lo


def _boundary(row: dict[str, str], spec: ModelSpec, setup: Setup, hw: Hardware, fits: bool) -> Result:
    """Fit boundaries: an OOM must not fit; a max batch must fit and one more must not; a max context is
    compared as a number (the longest sequence that fits), and its fits / does-not-fit verdict at the
    published length is judged like any other."""
    kind = row["value_kind"]
    if kind == "oom":
        return Result(row, "verdict", verdict_ok=not fits, reason="published OOM")
    if kind == "max_batch_fit":
        bigger = _fits(row, spec, setup.replace(micro_batch_size=setup.micro_batch_size + 1), hw)
        return Result(row, "verdict", verdict_ok=fits and not bigger, reason="published max batch that fits")
    longest = max_context(row, spec, setup, hw)
    return Result(row, "context", predicted=longest, published=setup.seq_len, err_pct=_pct(longest, setup.seq_len),
                  verdict_ok=fits, reason="published max context (fits at that length)")


#: calibration.json constants read off rows of this CSV, and the value the OTHER sources' rows give for each: a
#: source's rows are priced with that value (out of sample by source). reserved_over_allocated's source lists both:
#: optimum GPTQ rows 562-575 give 1.037-1.052 (median 1.040), hf_blog_pytorch_fsdp row 647 gives 1.022.
HELD_OUT: dict[str, dict[str, float]] = {
    "optimum_gptq_benchmark": {"reserved_over_allocated": 1.022},
    "hf_blog_pytorch_fsdp": {"reserved_over_allocated": 1.040},
}


@contextmanager
def held_out(group: str) -> Iterator[None]:
    """Price ``group``'s rows with the calibration constants the other sources give (HELD_OUT)."""
    table = load("calibration")
    values = HELD_OUT.get(group, {})
    saved = {k: table[k]["value"] for k in values}
    try:
        for k, v in values.items():
            table[k]["value"] = v
        yield
    finally:
        for k, v in saved.items():
            table[k]["value"] = v


def evaluate_all(rows: list[dict[str, str]], timings: list[float]) -> list[Result]:
    out = []
    for row in rows:
        with held_out(row["source_group"]):
            out.append(evaluate(row, timings))
    return out


def main() -> int:
    with CSV.open(encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    timings: list[float] = []
    results = evaluate_all(rows, timings)
    text = report(results, timings)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text, encoding="utf-8")
    print("\n".join(text.splitlines()[:20]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
