"""A stack's own eager block bytes (framework_eager_block_traffic) and the compiled block's (compile_elementwise_factor).

Checks against counts made independently of the code under test: the transformers row of
framework_eager_block_traffic (one block traced by bench/throughput_traffic.py) against data/traffic.json's Llama
form (scripts/fit_traffic.py: two-minus-one-block traces at other widths); the compile prior against the fused
kernels' bytes counted by hand. No wall-clock time is asserted.
"""

from __future__ import annotations

import pytest
from helpers import load_bench
from test_speed import llama7b

from perfguide._data import load
from perfguide.setup import Setup
from perfguide.speed import terms, traffic

#: the widths the traced rows were counted at (Llama 3.2 3B) and Llama 3 8B's
LLAMA_3B = {"h": 3072, "i": 8192, "q": 3072, "kv": 1024, "1": 1}
LLAMA_8B = {"h": 4096, "i": 14336, "q": 4096, "kv": 1024, "1": 1}


def _row(name: str):
    return load("efficiency")[name]["value"]


def _hf_llama_half(widths: dict[str, int]) -> float:
    row = load("traffic")["families"]["llama"]["regimes"]["half"]["per_token"]
    return sum(v * widths[k] for k, v in row.items())


def test_transformers_row_matches_the_traced_llama_form() -> None:
    """Two tracing paths over transformers' Llama block agree: bench/throughput_traffic.py (one block, 3B widths)
    and data/traffic.json's linear form (fitted on small widths) evaluated at 3B's widths, within 0.5%."""
    assert _row("framework_eager_block_traffic")["transformers"] == pytest.approx(_hf_llama_half(LLAMA_3B), rel=0.005)


def test_torchtune_eager_blocks_move_their_traced_bytes_compiled_ones_do_not() -> None:
    """Eager under torchtune: the traced bytes x torchtune's row over transformers' row (1,790,072 / 1,391,504);
    compiled: the same bytes as transformers' compiled block (Inductor fuses whatever the eager spelling); a stack
    without a row (HF Trainer) is priced as transformers' modules."""
    spec = llama7b()
    eager = Setup(micro_batch_size=2, seq_len=2048, weights_dtype="bf16")
    blocks = traffic.block_bytes(spec, eager, 2 * 2048)
    ratio = 1790072 / 1391504
    hf = terms.elementwise_bytes(spec, eager)
    assert terms.elementwise_bytes(spec, eager, "torchtune") - hf == pytest.approx(
        traffic.priced(blocks * (ratio - 1)), rel=1e-9)
    assert terms.elementwise_bytes(spec, eager, "hf_trainer") == hf
    assert terms.elementwise_bytes(spec, eager, "composer") == hf
    compiled = eager.model_copy(update={"torch_compile": True})
    assert terms.elementwise_bytes(spec, compiled, "torchtune") == terms.elementwise_bytes(spec, compiled)


def test_compile_prior_is_the_fused_bytes_over_the_eager_traced_bytes() -> None:
    """The fused Llama block by hand: forward 4h (RMSNorm) + 4(q+kv) (RoPE) + 8h (add + RMSNorm) + 6i (SwiGLU) +
    6h (add); backward 10i (SwiGLU) + 2 x (10h + 6h) (RMSNorm input and weight grads) + 4(q+kv) (RoPE):
    at Llama 3 8B 204,800 + 229,376 + 32,768 + 8,192 = 475,136 bytes per token, 0.246 of transformers' eager
    1,933,432 (data/traffic.json), the prior the fit starts from (0.25)."""
    fit = load_bench("throughput_fit")
    h, i, q, kv = (LLAMA_8B[k] for k in ("h", "i", "q", "kv"))
    assert fit.fused_block_bytes(h, i, q, kv) == 50 * h + 16 * i + 8 * q + 8 * kv == 475136
    assert fit.COMPILE_PRIOR == pytest.approx(475136 / _hf_llama_half(LLAMA_8B), rel=0.05)
    prior = next(p.prior for p in fit.PARAMS if p.key == ("compile_elementwise_factor",))
    assert prior == fit.COMPILE_PRIOR


def test_fit_trials_reach_the_compiled_rows() -> None:
    """The techniques' kernel factors are cached per Setup: a trial compile_elementwise_factor must still re-price a
    compiled row (it never did before the fit cleared that cache, so the factor sat at its prior in every fold)."""
    fit = load_bench("throughput_fit")
    bench = load_bench("throughput")
    rows = load_bench("throughput_rows")
    cases, _ = rows.load()
    compiled = next(c for c in cases if c.row_id == "405")
    assert compiled.setup.torch_compile and compiled.framework == "torchtune"
    base = bench.predict(compiled)
    with fit.constants({("compile_elementwise_factor",): 0.9}):
        slower = bench.predict(compiled)
    assert slower < base
    assert bench.predict(compiled) == pytest.approx(base, rel=1e-12)
