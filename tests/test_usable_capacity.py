"""Plans judge "fits" against what CUDA can allocate (cudaMemGetInfo's total, torch's "total capacity"), not the
nvidia-smi board total: the gpus.json figures against the published prints they quote, the derivation rule of the
[I] rows, the verdict flipping at the right byte, the loader refusing a bad row, and the probe reading NVML v2."""

from __future__ import annotations

import copy
import math
import re

import pytest

from perfguide._data import load, validated
from perfguide.errors import DataFileError
from perfguide.hardware import specs
from perfguide.hardware.specs import GpusFile
from perfguide.hardware.types import Hardware
from perfguide.memory.overhead import capacity_bytes, cuda_context_bytes, oom_footprint, to_estimate
from perfguide.setup import Setup

GiB, MiB = 2**30, 2**20
# torch's two OOM formats ("GPU 0; X GiB total capacity", "GPU 0 has a total capacity of X GiB", 2.1 spelling
# "capacty") and vLLM's start-up line "Free memory on device (free/total GiB)"
PRINTED = re.compile(r"(\d+\.\d\d) GiB total capacity|total capac?i?ty of (\d+\.\d\d) GiB|\(\d+\.\d\d/(\d+\.\d\d) GiB\)")


def _rows() -> dict[str, dict]:
    return dict(load("gpus")["gpus"])


def _printed(source: str) -> list[float]:
    return [float(next(g for g in m.groups() if g)) for m in PRINTED.finditer(source)]


def test_published_rows_carry_the_lowest_figure_their_quotes_print() -> None:
    """Each published row's number is the lowest total its quoted prints show (newer drivers hold back more)."""
    published = {k: r for k, r in _rows().items() if not r["cuda_total_source"].startswith("[I]")}
    assert len(published) >= 14
    for key, row in published.items():
        figures = _printed(row["cuda_total_source"])
        assert figures, f"{key}: no torch/vLLM total quoted in its source"
        assert row["cuda_total_gib"] == min(figures), key
        assert "https://github.com/" in row["cuda_total_source"], key


def test_published_figures_match_the_hand_read_messages() -> None:
    """Independent of the rows: the numbers as read off the messages (A100 80GB 79.14, H100 79.11, T4 14.56, RTX 4090
    23.64, RTX 3090 23.56 GiB), each below the board's nvidia-smi total by 0.3-0.9 GiB."""
    hand = {"a100-80gb": (79.14, 81920), "h100-80gb": (79.11, 81559), "t4": (14.56, 15360), "rtx4090": (23.64, 24564),
            "rtx3090": (23.56, 24576), "l4": (22.03, 23034), "rtx5090": (31.37, 32607)}
    for key, (gib, board_mib) in hand.items():
        row = specs.entry(key)
        assert (row.cuda_total_gib, row.memory_mib) == (gib, board_mib)
        held_mib = board_mib - gib * 1024
        assert 300 < held_mib < 900, (key, held_mib)


def _derived(key: str, rows: dict[str, dict]) -> float:
    """The _doc's rule, re-done here: (1) same board total and cc -> that board's figure; else the board total less
    the most a published card holds back, of (2) the same cc, (3) the same cc major, (4) any card; floor to 0.01."""
    pub = {k: r for k, r in rows.items() if not r["cuda_total_source"].startswith("[I]")}
    row, cc = rows[key], tuple(rows[key]["compute_capability"])
    twins = [r["cuda_total_gib"] for r in pub.values() if r["memory_mib"] == row["memory_mib"] and tuple(r["compute_capability"]) == cc]
    if twins:
        return min(twins)
    held = {k: r["memory_mib"] - r["cuda_total_gib"] * 1024 for k, r in pub.items()}
    for pool in ([k for k in pub if tuple(pub[k]["compute_capability"]) == cc],
                 [k for k in pub if pub[k]["compute_capability"][0] == cc[0]], list(pub)):
        if pool:
            return math.floor((row["memory_mib"] - max(held[k] for k in pool)) / 1024 * 100 + 1e-9) / 100
    raise AssertionError("no published row at all")


def test_inferred_nvidia_rows_follow_the_stated_rule() -> None:
    rows = _rows()
    inferred = [k for k, r in rows.items() if r["cuda_total_source"].startswith("[I]") and r["vendor"] == "nvidia"]
    assert {"h200", "b200", "a6000", "a100-80gb-pcie"} <= set(inferred)
    for key in inferred:
        assert rows[key]["cuda_total_gib"] == _derived(key, rows), key
    # H200: the H100's 550 MiB reserve off its 143,771 MiB -> 139.86 GiB
    assert rows["h200"]["cuda_total_gib"] == pytest.approx((143771 - (81559 - 79.11 * 1024)) / 1024, abs=0.01)


def test_named_target_judges_fits_against_cuda_total_at_the_byte() -> None:
    """A hand-built plan: the footprint that decides an OOM + CUDA context exactly at 79.14 GiB fits an a100-80gb;
    one byte more does not, although both are ~0.86 GiB under nvidia-smi's 80 GiB."""
    hw = Hardware.from_name("a100-80gb:1")
    setup = Setup(num_gpus=1)
    usable = round(79.14 * GiB)
    assert capacity_bytes(hw, setup) == usable
    context = cuda_context_bytes(hw)
    lo, hi = 0, usable
    while lo < hi:  # largest allocated peak whose OOM footprint + context fits in the usable bytes
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if oom_footprint(mid) + context <= usable else (lo, mid - 1)
    common = {"setup": setup, "hardware": hw, "weights": 0, "gradients": 0, "optimizer_states": 0, "activations": 0}
    at = to_estimate(**common, peak_allocated=lo)
    over = to_estimate(**common, peak_allocated=lo + 1)
    assert at.fits and at.needed <= usable
    assert not over.fits and usable < over.needed < 80 * GiB


def test_report_names_the_usable_capacity_and_its_source() -> None:
    gpu = Hardware.from_name("a100-80gb:8").gpus[0]
    assert gpu.memory_total == 81920 * MiB and gpu.allocatable == round(79.14 * GiB)
    assert gpu.memory_usable_source is not None
    assert gpu.memory_usable_source.startswith("79.14 GiB usable of the 80.00 GiB board (https://github.com/")


@pytest.mark.parametrize(("field", "value", "says"), [
    ("cuda_total_gib", 80.5, "cuda_total_gib 80.5 is not within"),       # more than the board has
    ("cuda_total_gib", 70.0, "cuda_total_gib 70.0 is not within"),       # a typo: 12% gone
    ("cuda_total_source", "measured somewhere once", "cuda_total_source needs the URL"),
])
def test_loader_refuses_a_bad_row_in_one_line(monkeypatch: pytest.MonkeyPatch, field: str, value: object, says: str) -> None:
    import perfguide._data as data_module

    damaged = copy.deepcopy(load("gpus"))
    damaged["gpus"]["a100-80gb"][field] = value
    real = data_module.load
    monkeypatch.setattr(data_module, "load", lambda name: damaged if name == "gpus" else real(name))
    validated.cache_clear()
    try:
        with pytest.raises(DataFileError) as err:
            validated("gpus", GpusFile)
    finally:
        validated.cache_clear()  # the next reader gets the real table back
    text = str(err.value)
    assert "\n" not in text and "gpus.a100-80gb" in text and says in text
