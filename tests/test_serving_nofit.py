"""A vLLM plan that does not fit names SGLang's at-load nf4 where it fits (vLLM 0.33 has no bitsandbytes), with the bytes
per weight that price it, and the line holds when followed as written."""

from __future__ import annotations

import re
import warnings

import pytest

import perfguide

MODEL = "meta-llama/Llama-3.1-8B"


def _rec(**kw: object) -> perfguide.Recommendation:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return perfguide.recommend(MODEL, "infer_gpu_one", hardware="t4", **kw)


def test_16bit_8b_on_a_t4_under_vllm_names_sglang_nf4_and_it_holds() -> None:
    rec = _rec(engine="vllm")
    assert not rec.fits
    line = next(s for s in rec.suggestions if s.startswith("engine='sglang'"))
    # bitsandbytes nf4, double-quantized: 4 bits + a uint8 absmax per 64 weights + an fp32 per 256 absmax blocks
    per_weight = 4 / 8 + (1 + 4 / 256) / 64
    assert f"{per_weight:.4g} B per weight" in line and "quantization='nf4'" in line and "hardware='t4'" in line
    followed = _rec(engine="sglang", quantization="nf4")
    assert followed.fits and followed.setup.serving is not None and followed.setup.serving.weight_format == "nf4"
    kv = int(re.search(r"KV ([\d,]+) tokens", line).group(1).replace(",", ""))
    assert kv == followed.kv_cache_tokens


@pytest.mark.parametrize("quantization", ["none"])
def test_no_other_engine_quantizes_when_quantization_is_refused(quantization: str) -> None:
    rec = _rec(engine="vllm", quantization=quantization)
    assert not rec.fits and not any(s.startswith("engine=") for s in rec.suggestions)
