"""The price of bitsandbytes' 4-bit dequantization in training, against published QLoRA-vs-16-bit pairs.

perfguide prices a bnb 4-bit base as the 16-bit step plus ``terms.dequant_bytes``: before each matmul bnb's
``MatMul4Bit`` dequantizes the whole weight (reads the 0.5 B/param packed codes, writes a 16-bit copy), once in
forward and once for the input gradient (and once more on recompute), at the streaming rate times
``dequant_traffic_factor``. That cost is per matmul call, not per token: the difference between a 4-bit and a 16-bit
run of the same model, batch and data is a fixed time per iteration, whatever the sample lengths.

The only published same-GPU, same-data pairs of a bnb 4-bit base and its 16-bit base we hold are litgpt's resource
tables (Lightning-AI/litgpt tutorials/resource-tables.md, measured at Lit-GPT 8641822b, 2023-10, A100-SXM4-40GB, micro
batch 1, Alpaca, no checkpointing; rows of bench/data/published_measurements.csv, source_group
litgpt_resource_tables). No speed constant was fitted on them (bench/throughput_fit.py reads only
published_throughput.csv). Their Alpaca sample lengths are not published, so they cannot enter the tokens/s bench;
the per-iteration difference does not need them.

litgpt's path moves more bytes than HF + PEFT: Lightning's ``BitsandbytesPrecision`` quantizes the weight after a cast
to fp16 (bench/accuracy_litgpt.py), so ``dequantize_4bit`` returns fp16 and ``MatMul4Bit`` casts it to the bf16
input (``.to(A.dtype)``): 2 B read + 2 B written more per call. It also quantizes lm_head (HF keeps it 16-bit).
The test adds that cast to perfguide's term and compares with the published differences. The HF + PEFT path has casts of
its own instead (peft's kbit preparation makes the residual stream fp32; ``terms.kbit_cast_bytes``), checked by hand below.
"""

from __future__ import annotations

import csv
import re
import statistics
from pathlib import Path

import pytest

from perfguide.hardware.types import Hardware
from perfguide.model.types import ModelSpec
from perfguide.setup import LoraSpec, Setup
from perfguide.speed import terms
from perfguide.speed.rates import constant, matmul_params

ROOT = Path(__file__).resolve().parents[1]
ROWS = ROOT / "bench" / "data" / "published_measurements.csv"
LITGPT_CAST = 2 + 2   # fp16 -> bf16 .to(A.dtype) of the dequantized weight: read 2 B, write 2 B per element per call


def _pairs() -> list[tuple[str, str, float]]:
    """(model, method, published 4-bit minus 16-bit seconds per iteration) for each litgpt single-GPU, micro batch 1
    row pair (plain bnb.nf4 against no quantization, same model and method)."""
    with ROWS.open(newline="", encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f) if r["source_group"] == "litgpt_resource_tables" and r["time"]
                and r["parallelism"] == "single GPU" and r["micro_batch"] == "1" and r["optimizer"]]
    minutes = {(r["model_hf_id"], r["method"], r["quantization"]): float(re.match(r"([\d.]+) min per 1k", r["time"]).group(1))  # type: ignore[union-attr]
               for r in rows}
    return [(model, method, (minutes[(model, method, "bnb.nf4")] - base) * 60 / 1000)
            for (model, method, quant), base in minutes.items() if quant == "" and (model, method, "bnb.nf4") in minutes]


def _priced_difference(model: str) -> float:
    """perfguide's dequant seconds per iteration for litgpt's step (two calls per Linear, lm_head included) plus the
    fp16 -> bf16 cast litgpt adds, at the A100-40GB's streaming rate."""
    spec = ModelSpec.from_any(model)
    setup = Setup(micro_batch_size=1, seq_len=256, weights_dtype="nf4", lora=LoraSpec(r=8, alpha=16, target_modules=("q_proj", "v_proj")),
                  optimizer="adamw_torch", gradient_checkpointing=False)
    params = matmul_params(spec)   # every Linear, lm_head included: litgpt quantizes all of them
    dequant = terms.dequant_bytes(spec, setup, params)
    gpu = Hardware.from_name("a100-40gb:1").smallest_gpu
    assert gpu is not None and gpu.memory_bandwidth_gbps
    rate = gpu.memory_bandwidth_gbps * 1e9 * float(constant("memory_bandwidth_fraction"))
    return (dequant + 2 * params * LITGPT_CAST) / rate


def test_dequant_bytes_match_the_hand_count() -> None:
    """Llama-2-7B under bnb nf4: per call 0.5 B read + 2 B written per weight; forward and input-gradient calls (2),
    plus the recompute under checkpointing (3), times dequant_traffic_factor."""
    spec = ModelSpec.from_any("meta-llama/Llama-2-7b-hf")
    linear = 32 * (4 * 4096 * 4096 + 3 * 4096 * 11008) + 32000 * 4096   # q,k,v,o + gate,up,down per layer + lm_head
    assert abs(matmul_params(spec) - linear) / linear < 1e-4            # the rest: RMSNorm weights (65 x 4096)
    factor = float(constant("dequant_traffic_factor"))
    for ckpt, passes in ((False, 2), (True, 3)):
        setup = Setup(micro_batch_size=1, seq_len=256, weights_dtype="nf4", gradient_checkpointing=ckpt,
                      lora=LoraSpec(r=8, alpha=16), optimizer="adamw_torch")
        assert terms.dequant_bytes(spec, setup, linear) == pytest.approx(passes * linear * 2.5 * factor)


def test_dequant_price_against_litgpt_pairs() -> None:
    """Published (4-bit - 16-bit) per iteration vs perfguide's term + litgpt's cast. phi-1_5 is left out: its 9 ms
    difference is below the 11 ms its bytes take even at the full 1,555 GB/s, so its 16-bit step was host-bound
    (launch gaps the dequant kernels fill) and the difference does not show the dequant time."""
    pairs = [p for p in _pairs() if p[0] != "microsoft/phi-1_5"]
    assert len(pairs) == 7, pairs   # LoRA x 3 models, Adapter v1 / v2 x 2 models
    errors = [(_priced_difference(model) - published) / published for model, _, published in pairs]
    # 7B: published 79-86 ms vs 70 priced; 13B: 191 vs 136; 3B: 35-43 vs 36
    assert all(abs(e) < 0.35 for e in errors), list(zip(pairs, errors, strict=True))
    assert abs(statistics.median(errors)) < 0.2, errors


def _llama8b_setup(weights: str, **kw: object) -> Setup:
    return Setup(micro_batch_size=4, seq_len=2048, weights_dtype=weights, lora=LoraSpec(r=16, alpha=32),
                 optimizer="adamw_torch", gradient_checkpointing=True, **kw)


def test_kbit_upcast_casts_match_the_hand_count() -> None:
    """HF + PEFT QLoRA after prepare_model_for_kbit_training: fp32 embeddings and norms make the residual stream fp32,
    and every bnb Linear4bit casts its input to bf16 and its output back to fp32 (6 B per element per cast). By hand,
    Llama-3.1-8B (h 4096, i 14336, q 4096, kv 1024): inputs 5h + i = 34,816, outputs q + 2kv + 2i + h = 38,912 elements
    per token and layer; forward, backward, recompute; 8192 tokens x 32 layers x 3 passes x 73,728 x 6 B = 348 GB,
    priced like the other memory-bound kernels (elementwise_traffic_factor)."""
    from perfguide.speed import traffic

    spec = ModelSpec.from_any("meta-llama/Llama-3.1-8B")
    elements = (5 * 4096 + 14336) + (4096 + 2 * 1024 + 2 * 14336 + 4096)
    assert elements == 73728
    raw = 3 * 8192 * 32 * elements * 6
    assert terms.kbit_cast_bytes(spec, _llama8b_setup("nf4"), "hf_trainer") == pytest.approx(traffic.priced(raw))
    # no upcast (a 16-bit rest), a 16-bit base, or a stack that never runs peft's kbit preparation: no casts
    assert terms.kbit_cast_bytes(spec, _llama8b_setup("nf4", kbit_upcast=False), "hf_trainer") == 0.0
    assert terms.kbit_cast_bytes(spec, _llama8b_setup("bf16"), "hf_trainer") == 0.0
    assert terms.kbit_cast_bytes(spec, _llama8b_setup("nf4"), "plain_pytorch") == 0.0


def test_hf_qlora_step_pays_dequant_and_casts_over_lora() -> None:
    """The QLoRA - LoRA step difference is the dequant bytes plus the casts, at the streaming rate, when the step is
    bandwidth-and-compute priced (not launch-bound): Llama-3.1-8B mb4 s2048 checkpointed on one A100-80GB."""
    from perfguide.speed.training import training_speed

    spec = ModelSpec.from_any("meta-llama/Llama-3.1-8B")
    hw = Hardware.from_name("a100-80gb:1")
    gpu = hw.smallest_gpu
    assert gpu is not None and gpu.memory_bandwidth_gbps
    rate = gpu.memory_bandwidth_gbps * 1e9 * float(constant("memory_bandwidth_fraction"))
    lora = training_speed(spec, _llama8b_setup("bf16"), hw).step_time_s
    qlora = training_speed(spec, _llama8b_setup("nf4"), hw).step_time_s
    no_upcast = training_speed(spec, _llama8b_setup("nf4", kbit_upcast=False), hw).step_time_s
    setup = _llama8b_setup("nf4")
    casts = terms.kbit_cast_bytes(spec, setup, "hf_trainer") / rate
    assert qlora - no_upcast == pytest.approx(casts, rel=0.02)
    assert qlora - lora == pytest.approx(casts + terms.dequant_bytes(spec, setup, matmul_params(spec)) / rate, rel=0.05)
