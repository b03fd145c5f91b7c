"""Printing a plan is light: its report (text, markdown, JSON) and the CLI's output import no torch, transformers,
accelerate or torchao, for every kind of plan (FSDP and ZeRO layouts with their launch lines, QLoRA, CPU,
inference, a serving engine). Checked in a fresh process, where nothing else has imported them first."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers", "accelerate", "torchao", "peft", "trl", "bitsandbytes", "deepspeed")

SCRIPT = r'''
import contextlib, io, json, sys, warnings
warnings.simplefilter("ignore")
import perfguide
from perfguide.cli import main
plans = [
    ("meta-llama/Llama-3.1-8B", "train_gpu_many", "a100-80gb:8", {}),
    ("meta-llama/Llama-3.1-70B", "train_gpu_many", "h100-80gb:8", {"strategy": "zero3"}),
    ("meta-llama/Llama-3.1-70B", "train_gpu_many", "h100-80gb:8", {"nodes": 2}),
    ("meta-llama/Llama-3.1-8B", "train_gpu_one", "t4", {"finetune": "qlora"}),
    ("openai-community/gpt2", "train_cpu", None, {}),
    ("meta-llama/Llama-3.1-8B", "infer_gpu_one", "a100-80gb", {}),
    ("meta-llama/Llama-3.1-70B", "infer_gpu_many", "a100-80gb:4", {"engine": "vllm"}),
]
for model, scenario, hardware, extra in plans:
    rec = perfguide.recommend(model, scenario, hardware=hardware, **extra)
    rec.report(); rec.report("markdown"); rec.to_json(); str(rec)
for argv in (["recommend", "meta-llama/Llama-3.1-8B", "--scenario", "train_gpu_many", "--hardware", "a100-80gb:8"],
             ["recommend", "meta-llama/Llama-3.1-8B", "--scenario", "train_gpu_many", "--hardware", "a100-80gb:8", "--json"],
             ["recommend", "meta-llama/Llama-3.1-8B", "--scenario", "train_gpu_many", "--hardware", "a100-80gb:8", "--markdown"],
             ["recommend", "meta-llama/Llama-3.1-8B", "--hardware", "a100-80gb", "--training-args"]):
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(argv) == 0, argv
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in HEAVY)))
'''


def test_printing_plans_imports_no_heavy_library() -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", f"HEAVY = {HEAVY!r}\n" + SCRIPT], capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert loaded == [], f"printing a plan imported {loaded}"


def test_the_block_class_table_is_transformers_own() -> None:
    """data/architectures.json block_classes (what FSDP wraps) is each class's ``_no_split_modules[0]``."""
    transformers = pytest.importorskip("transformers")
    from perfguide._data import validated
    from perfguide.model.catalog import CatalogFile

    table = validated("architectures", CatalogFile).block_classes.value
    assert len(table) >= 20
    for arch, block in table.items():
        cls = getattr(transformers, arch)
        assert next(iter(cls._no_split_modules)) == block, arch
