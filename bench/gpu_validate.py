"""Measure real peak memory and throughput on a CUDA GPU and write rows in the groundtruth CSV format.

Run on a machine with a CUDA GPU (no downloads: models are built from the bundled catalog configs with random
weights, which have the same memory footprint and speed as trained ones):

    python bench/gpu_validate.py --out bench/results/gpu_measurements.csv [--quick]

Each row: model, setup, GPU, torch.cuda.max_memory_allocated (MiB), max_memory_reserved in peak_mem_alt, NVML used
memory in notes, tokens/s; plus perfguide's analytic prediction for the same setup, so bench/accuracy.py can
score them like the published rows. On a machine without CUDA it says so and exits 0 without writing.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import sys
import time
from pathlib import Path

COLUMNS = ("row_id,source_group,source,commit_or_date,model_hf_id,params,task,method,seq_len,micro_batch,grad_accum,"
           "precision,optimizer,grad_checkpointing,lora_rank,lora_alpha,lora_targets,quantization,attn_impl,parallelism,"
           "num_gpus,gpu_type,value_kind,peak_mem_value,peak_mem_unit,mem_metric,peak_mem_alt,cpu_mem,throughput,"
           "throughput_unit,time,trust,notes").split(",")

MODELS_FULL = ("gpt2-medium", "Qwen/Qwen2.5-0.5B", "meta-llama/Llama-3.2-1B")
MODELS_QUICK = ("gpt2-medium", "Qwen/Qwen2.5-0.5B")
PRECISIONS = {"amp-bf16": ("fp32", "bf16"), "pure-bf16": ("bf16", "bf16")}
OPTIMIZERS = ("adamw_torch_fused", "adamw_bnb_8bit")


def measure_one(model_id: str, precision: str, optim: str, ckpt: bool, micro: int, seq: int, steps: int = 3) -> dict:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, Trainer, TrainingArguments

    import perfguide
    from perfguide.measure.meter import cuda_device_used

    weights_dtype, autocast = PRECISIONS[precision]
    setup = perfguide.Setup(micro_batch_size=micro, seq_len=seq, weights_dtype=weights_dtype, autocast=autocast,
                            optimizer=optim, gradient_checkpointing=ckpt, tf32=True)
    spec = perfguide.ModelSpec.from_any(model_id)
    predicted = perfguide.estimate(spec, setup, hardware=perfguide.probe())
    config = AutoConfig.for_model(**spec.config)
    dtype = torch.float32 if weights_dtype == "fp32" else torch.bfloat16
    model = AutoModelForCausalLM.from_config(config, dtype=dtype).cuda()
    if ckpt:
        model.gradient_checkpointing_enable()
    ids = torch.randint(0, spec.vocab_size, (micro * steps, seq))
    data = [{"input_ids": r, "labels": r} for r in ids]
    args = TrainingArguments(output_dir="/tmp/pg-gpu-validate", per_device_train_batch_size=micro, max_steps=steps,
                             bf16=True, tf32=True, optim=optim, report_to="none", save_strategy="no",
                             logging_strategy="no", disable_tqdm=True)
    torch.cuda.reset_peak_memory_stats()
    trainer = Trainer(model=model, args=args, train_dataset=data)
    t0 = time.perf_counter()
    row: dict = {}
    try:
        trainer.train()
        elapsed = time.perf_counter() - t0
        row.update(value_kind="measured", peak_mem_value=round(torch.cuda.max_memory_allocated() / 2**20, 1),
                   peak_mem_alt=f"reserved {torch.cuda.max_memory_reserved() / 2**20:.1f} MiB",
                   throughput=round(micro * seq * steps / elapsed, 1))
        used = cuda_device_used()
        row["notes"] = f"nvml used {used / 2**20:.1f} MiB; " if used else ""
    except torch.OutOfMemoryError:
        row.update(value_kind="oom", peak_mem_value="", notes="")
    row["notes"] += (f"perfguide analytic predicted allocated {predicted.peak_allocated / 2**20:.1f} MiB, "
                     f"reserved {predicted.peak_reserved / 2**20:.1f} MiB, total {predicted.device_total / 2**20:.1f} MiB")
    del trainer, model
    torch.cuda.empty_cache()
    return row | {"params": spec.total_params}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="bench/results/gpu_measurements.csv")
    p.add_argument("--quick", action="store_true", help="a smaller grid (fits a ~5 minute device slot)")
    p.add_argument("--seq-len", type=int, default=1024)
    a = p.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("torch is not installed", file=sys.stderr)
        return 0
    if not torch.cuda.is_available():
        print("no CUDA device: nothing measured (run this on a GPU machine)")
        return 0
    import transformers

    gpu = torch.cuda.get_device_name(0)
    models = MODELS_QUICK if a.quick else MODELS_FULL
    grid = itertools.product(models, PRECISIONS, OPTIMIZERS, (False, True), (1, 4) if a.quick else (1, 4, 8))
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for i, (model_id, prec, optim, ckpt, micro) in enumerate(grid, 1):
            row = measure_one(model_id, prec, optim, ckpt, micro, a.seq_len)
            row.update(row_id=f"pg{i}", source_group="perfguide_gpu_validate", source="bench/gpu_validate.py",
                       commit_or_date=time.strftime("%Y-%m-%d"), model_hf_id=model_id, task="train",
                       method="HF Trainer, random weights from config", seq_len=a.seq_len, micro_batch=micro,
                       grad_accum=1, precision=("bf16 AMP (fp32 weights)" if prec == "amp-bf16" else "bf16-true (pure bf16)"),
                       optimizer=optim, grad_checkpointing="yes" if ckpt else "no", attn_impl="sdpa",
                       parallelism="single GPU", num_gpus=1, gpu_type=gpu, peak_mem_unit="MiB",
                       mem_metric="torch.cuda.max_memory_allocated", throughput_unit="tokens/s", trust="A",
                       notes=row["notes"] + f"; torch {torch.__version__}, transformers {transformers.__version__}")
            w.writerow(row)
            f.flush()
            print(model_id, prec, optim, ckpt, micro, row.get("peak_mem_value"), row.get("throughput"), flush=True)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
