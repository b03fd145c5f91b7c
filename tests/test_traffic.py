"""The tracer's traffic count (bytes memory-bound ops read and write) against hand counts, and data/traffic.json
against a fresh trace of the real transformers modules.

Hand counts: an elementwise op reads its tensor inputs and writes its output (numel x element size each); a GEMM is
compute-bound and is not counted; a view moves nothing. No wall-clock time is asserted.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from perfguide._data import load

ROOT = Path(__file__).resolve().parents[1]


def _traffic_of(fn, *tensors):
    from perfguide.memory.tracing.tracker import make_tracker

    tracker = make_tracker(1)
    with tracker:
        fn(*tensors)
    return tracker.traffic.get("forward", 0)


def test_elementwise_ops_are_counted_read_plus_write_and_gemms_and_views_are_not() -> None:
    import torch

    x = torch.randn(64, 32)                      # 2048 fp32 elements = 8 KiB
    w = torch.randn(32, 16)
    nbytes = x.numel() * 4
    assert _traffic_of(lambda a: a * 2, x) == 2 * nbytes                       # read x, write the product
    assert _traffic_of(lambda a: (a * 2) + 1, x) == 4 * nbytes                 # two passes
    assert _traffic_of(lambda a, b: a + b, x, x) == 3 * nbytes                 # two reads, one write
    assert _traffic_of(lambda a: a.to(torch.bfloat16), x) == nbytes + nbytes // 2  # read fp32, write bf16
    assert _traffic_of(lambda a, b: a @ b, x, w) == 0                           # a GEMM: priced by FLOPs
    assert _traffic_of(lambda a: a.view(32, 64).t(), x) == 0                    # views move nothing


@pytest.mark.parametrize(("family", "regime"), [("gpt2", "half"), ("mpt", "half")])
def test_data_file_matches_a_fresh_trace(family: str, regime: str) -> None:
    """scripts/fit_traffic.py's numbers for one family and regime, re-traced now (fake tensors, seconds)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import fit_traffic
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    kw = fit_traffic.REGIMES[regime]
    per_token, s2 = fit_traffic.block_form(family, kw)
    if fit_traffic.TRAFFIC_FAMILIES[family][2] == "sdpa":
        s2 = fit_traffic.eager_s2(family, kw)                   # eager minus SDPA at two lengths
    stored = load("traffic")["families"][family]["regimes"][regime]
    assert per_token == pytest.approx(stored["per_token"])
    assert s2 == pytest.approx(stored["eager_per_head_s2"])


def test_llama_components_match_a_fresh_trace() -> None:
    """The eager chains Liger replaces, traced in isolation now (real CPU tensors, CUDA autocast lists emulated)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import fit_traffic
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    for regime in ("half", "amp"):
        stored = load("traffic")["families"]["llama"]["regimes"][regime]["components"]
        assert fit_traffic.llama_components(fit_traffic.REGIMES[regime]) == pytest.approx(stored)
