"""bench/kernels.py: Liger-Kernel's kernel memory rows, stored whole and validated, priced with perfguide's components.

The rows' own numbers are not the reference here: the hand counts below come from the benchmark scripts (what they
allocate) and from the ops (what autograd keeps), and the per-logit bytes of the two cross-entropy references are
measured with perfguide's live-bytes tracker on real CPU tensors, running the benchmark's ``full()`` twice (from the
second call on, the first call's ``.grad`` is alive, as in the published median of ten).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from helpers import load_bench

from perfguide import Setup
from perfguide.memory.loss_path import loss_path_units

MiB = 2**20


def _rows() -> list[Any]:
    return load_bench("kernels_rows").load()


def test_the_csv_holds_every_row_of_the_priced_kernels_from_one_commit() -> None:
    """Taken whole: each priced kernel's full grid of provider x mode x swept value, as the scripts' __main__ sweep
    it (cross_entropy V 2^12..2^17, fused_linear_cross_entropy BT 2^12..2^15, geglu T 2^10..2^13)."""
    rows = _rows()
    assert len(rows) == 108 and {r.commit for r in rows} == {"ead96b618e5c67bddc6a6e9bcb99bfe6b5ab661c"}
    sweeps = {"cross_entropy": [2**i for i in range(12, 18)], "fused_linear_cross_entropy": [2**i for i in range(12, 16)],
              "geglu": [2**i for i in range(10, 14)]}
    modes = {("cross_entropy", "speed"): {"forward", "full"}, ("cross_entropy", "memory"): {"full"},
             ("fused_linear_cross_entropy", "speed"): {"forward", "full"}, ("fused_linear_cross_entropy", "memory"): {"full"},
             ("geglu", "speed"): {"forward", "backward", "full"}, ("geglu", "memory"): {"forward", "backward", "full"}}
    for (kernel, metric), wanted in modes.items():
        for provider in ("liger", "huggingface"):
            for mode in wanted:
                xs = sorted(r.x_value for r in rows if (r.kernel_name, r.metric_name, r.kernel_provider,
                                                         r.kernel_operation_mode) == (kernel, metric, provider, mode))
                assert xs == sweeps[kernel], (kernel, metric, provider, mode)


@pytest.mark.parametrize(("old", "new", "named"), [
    (",memory,MB,", ",memory,ms,", "metric_unit"),
    ('"{""B"": 8, ""T"": 2048}"', '"{""B"": 8}"', "extra_benchmark_config_str lacks T"),
    ('"{""B"": 8, ""T"": 2048}"', '"{B: 8}"', "not JSON"),
    (",liger,", ",triton,", "kernel_provider"),
])
def test_a_damaged_row_is_one_line_naming_the_column(tmp_path: Path, old: str, new: str, named: str) -> None:
    kr = load_bench("kernels_rows")
    text = kr.CSV.read_text(encoding="utf-8")
    assert old in text
    bad = tmp_path / kr.CSV.name
    bad.write_text(text.replace(old, new, 1), encoding="utf-8")
    with pytest.raises(ValueError) as err:
        kr.load(bad)
    msg = str(err.value)
    assert "\n" not in msg and bad.name in msg and "line " in msg and named in msg, msg


def test_the_missing_file_is_not_silently_empty(tmp_path: Path) -> None:
    kr = load_bench("kernels_rows")
    empty = tmp_path / "empty.csv"
    shutil.copy(kr.CSV, empty)
    empty.write_text(kr.CSV.read_text(encoding="utf-8").splitlines()[0] + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match="no rows"):
        kr.load(empty)


def test_torch_cross_entropy_row_is_the_hand_count() -> None:
    """cross_entropy, huggingface, V=4096, B=8, T=2048: ``CrossEntropyLoss()(x, y).backward()`` on an fp32 [BT, V]
    leaf. At the peak (log_softmax's backward writing x's new gradient) five fp32 [BT, V] tensors are alive: x, the
    previous call's x.grad, log_softmax's output (saved for its backward), nll_loss's gradient (its input's shape),
    and the new gradient of x; plus the int64 targets. 20 B per logit + 8 B per row."""
    kernels = load_bench("kernels")
    row = next(r for r in _rows() if r.label == "cross_entropy huggingface full V=4096" and r.metric_name == "memory")
    bt, v = 8 * 2048, 4096
    hand = 5 * 4 * bt * v + 8 * bt
    priced = kernels.cross_entropy(row)
    assert priced.script + priced.op == hand
    assert hand / MiB == pytest.approx(row.y_value_50, abs=0.01)   # and the row agrees (1280.126 MiB)


def _traced_peak(dtype: Any, bt: int, v: int, h: int | None) -> tuple[int, int]:
    """(peak live bytes of the benchmark's second ``full()`` call, live bytes before it) on CPU tensors: CE on a
    [bt, v] leaf when ``h`` is None, else a bias-free Linear(h, v) + CE on a [bt, h] leaf (FLCE's reference)."""
    import torch

    from perfguide.memory.tracing.tracker import make_tracker

    tracker = make_tracker(1)
    with tracker:
        ce = torch.nn.CrossEntropyLoss()
        target = torch.randint(v, (bt, 1)).squeeze(1)
        if h is None:
            x = torch.randn(bt, v, dtype=dtype, requires_grad=True)

            def full() -> None:
                ce(x, target).backward()
        else:
            lin = torch.nn.Linear(h, v, bias=False, dtype=dtype)
            x = torch.randn(bt, h, dtype=dtype, requires_grad=True)

            def full() -> None:
                ce(lin(x), target).backward()
        full()
        tracker.peaks.clear()
        tracker.set_phase("forward")
        before = tracker.total
        full()
    return max(total for total, _ in tracker.peaks.values()), before


def test_fp32_cross_entropy_traced_is_what_the_bench_prices() -> None:
    """The script's x, its previous gradient and the targets are alive before the call; the loss path adds
    ``loss_path_units`` with the input held through backward minus the held input itself (16 - 4 = 12 B)."""
    import torch

    bt, v = 64, 512
    peak, before = _traced_peak(torch.float32, bt, v, None)
    assert before == 2 * 4 * bt * v + 8 * bt
    units = loss_path_units(Setup(weights_dtype="fp32"), "5.24.0", loop_keeps_outputs=True)
    assert peak - before == pytest.approx((units - 4) * bt * v, abs=64)   # + the loss and total_weight scalars


def test_16bit_reference_of_fused_linear_cross_entropy_is_6_bytes_per_logit() -> None:
    """Liger's FLCE reference: torch's CE straight on the bf16 logits (no fp32 upcast). Traced, the peak above the
    weights, inputs and previous gradients is 6 B per logit (log-softmax output, its gradient, the logits'
    gradient); ``loss_path_units(..., ce_bytes=2)`` says 6, HF's own upcasting loss 12."""
    import torch

    bt, v, h = 64, 512, 32
    peak, before = _traced_peak(torch.bfloat16, bt, v, h)
    assert before == 2 * (v * h * 2) + 2 * (bt * h * 2) + 8 * bt   # weight + its grad, x + its grad, targets
    setup = Setup(weights_dtype="bf16")
    assert loss_path_units(setup, "5.24.0", loop_keeps_outputs=False, ce_bytes=2) == 6
    assert loss_path_units(setup, "5.24.0", loop_keeps_outputs=False) == 12
    assert peak - before == pytest.approx(6 * bt * v, abs=64)


def test_geglu_forward_rows_differ_by_the_saved_less_constant() -> None:
    """HF minus Liger at the same T is act(gate) alone, one 16-bit [B*T, I] tensor: 2 B per token per FFN unit, the
    data/techniques.json row the Liger technique prices with."""
    from perfguide.data.techniques import constant

    rows = [r for r in _rows() if r.kernel_name == "geglu" and r.metric_name == "memory" and r.kernel_operation_mode == "forward"]
    for t in (1024, 2048, 4096, 8192):
        hf, lg = (next(r for r in rows if r.x_value == t and r.kernel_provider == p) for p in ("huggingface", "liger"))
        per = (hf.y_value_50 - lg.y_value_50) * MiB / (8 * t * 11008)
        assert per == pytest.approx(constant("liger_saved_less_half_per_ffn_unit"), abs=1e-9)


def test_report_names_every_priced_group_and_the_liger_release_gap() -> None:
    kernels = load_bench("kernels")
    priced, skipped = kernels.price_all(_rows())
    assert len(priced) == 28 and sum(r.metric_name == "memory" for r, _ in skipped) == 16
    text = kernels.report(priced, skipped)
    for group in ("| cross_entropy | liger |", "| cross_entropy | huggingface |", "| fused_linear_cross_entropy | liger |",
                  "| fused_linear_cross_entropy | huggingface |", "| geglu | liger | forward |", "| geglu | huggingface | forward |"):
        assert group in text
    liger_flce = [p for p in priced if p.row.kernel_name == "fused_linear_cross_entropy" and p.row.kernel_provider == "liger"]
    for p in liger_flce:   # v0.4.2 held two [chunk, V] tiles more than the two perfguide counts for >= 0.5.3
        assert (p.row.y_value_50 * MiB - p.script - p.op) / kernels.tile_bytes(p.row) == pytest.approx(2.0, abs=0.01)
