"""bitsandbytes 4-bit serving: which engine quantizes a 16-bit checkpoint to nf4 at load, and what its weights cost.

vLLM took ``--quantization bitsandbytes`` up to at least v0.15 (docs.vllm.ai/en/v0.15.1/features/quantization/), but
the pinned 0.33.0 wheel has no bitsandbytes quantization or loader and refuses the value at start ('Unknown
quantization method'), so a vLLM plan never emits it and ``perfguide check`` names why. SGLang 0.5.23 still does it
(srt/model_loader/loader.py: ``quantize_4bit(compress_statistics=True, quant_type='nf4')``, bitsandbytes' default
64-weight blocks), which the byte counts below follow.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from helpers import one_line

import perfguide
from perfguide import PerfGuideError
from perfguide.memory.serving import rank_weight_bytes
from perfguide.model import spec_from_any

MODEL = "meta-llama/Llama-3.1-8B"
# Llama-3.1-8B config.json: hidden 4096, intermediate 14336, 32 layers, 32 query / 8 KV heads of 128, vocab 128256,
# untied lm_head
H, I, L, KV, V = 4096, 14336, 32, 8 * 128, 128256


def _nf4_weight_bytes() -> int:
    """By hand: every block Linear at 4 bits with bitsandbytes' double-quantized absmax (one uint8 per 64 weights,
    one fp32 per 256 of those; every Llama-3.1-8B matrix divides evenly, so no block is padded); embeddings,
    lm_head and RMSNorms stay 16-bit (the engines quantize Linear layers only)."""
    linear = L * (2 * H * H + 2 * H * KV + 3 * H * I)        # q, o, k, v, gate, up, down
    blocks = linear // 64
    return linear // 2 + blocks + blocks // 256 * 4 + 2 * V * H * 2 + (2 * L + 1) * H * 2


def test_nf4_bytes_are_nibbles_plus_double_quantized_absmax() -> None:
    assert _nf4_weight_bytes() == 5_702_295_552            # 5.31 GiB, against 16.06 GB in 16-bit
    r = perfguide.recommend(MODEL, "infer_gpu_one", hardware="t4", engine="sglang")
    assert r.fits and r.setup.serving is not None and r.setup.serving.weight_format == "nf4"
    assert rank_weight_bytes(spec_from_any(MODEL), r.setup.serving) == _nf4_weight_bytes()
    assert r.engine_memory is not None and r.engine_memory.weights > _nf4_weight_bytes()   # + the fp32 rotary table


def test_t4_8b_under_vllm_does_not_quantize_with_bitsandbytes() -> None:
    """16 GB of fp16 weights cannot fit a 15 GB T4; vLLM 0.33 has nothing to quantize them with at load but FP8,
    which needs cc >= 8.0, so the plan says it does not fit and points at a pre-quantized checkpoint."""
    r = perfguide.recommend(MODEL, "infer_gpu_one", hardware="t4", engine="vllm")
    assert not r.fits and r.setup.serving is not None and r.setup.serving.weight_format == "fp16"
    assert "bitsandbytes" not in r.serve_command() and any("quantized_model=" in s for s in r.suggestions)
    with pytest.raises(PerfGuideError) as e:
        perfguide.recommend(MODEL, "infer_gpu_one", hardware="t4", engine="vllm", quantization="nf4")
    one_line(e, "sglang")


def test_pinned_vllm_parser_has_no_bitsandbytes() -> None:
    """The refusal rests on the names vLLM 0.33.0's own sources register (scripts/engine_flags.py)."""
    flags = json.loads((Path(__file__).parent / "data" / "engine_flags.json").read_text())["vllm"]
    assert flags["version"] == "0.33.0" and "bitsandbytes" not in flags["quantization"]
    assert "--quantization" in flags["flags"] and "--load-format" in flags["flags"]


def test_check_names_why_a_vllm_bitsandbytes_command_will_not_start() -> None:
    for extra in ("", " --load-format bitsandbytes"):         # the pre-0.8 spelling too
        with pytest.raises(PerfGuideError) as e:
            perfguide.check(MODEL, f"vllm serve {MODEL} --dtype float16 --quantization bitsandbytes{extra}", hardware="t4")
        one_line(e, "0.33.0", "Unknown quantization method", "sglang")


def test_sglang_bitsandbytes_command_is_emitted_and_read_back() -> None:
    r = perfguide.recommend(MODEL, "infer_gpu_one", hardware="t4", engine="sglang")
    words = shlex.split(r.serve_command())
    assert words[words.index("--quantization") + 1] == "bitsandbytes" and words[words.index("--dtype") + 1] == "float16"
    c = perfguide.check(MODEL, r.serve_command(), hardware="t4")
    assert c.setup.serving is not None and c.setup.serving.weight_format == "nf4" and c.fits
    assert r.engine_memory is not None and c.memory.weights == r.engine_memory.weights
    with pytest.raises(PerfGuideError) as e:                 # no bitsandbytes kernels on AMD (vendors: nvidia)
        perfguide.recommend(MODEL, "infer_gpu_one", hardware="mi300x", engine="sglang", quantization="nf4")
    one_line(e, "nf4")
