"""The CUDA context by module-loading era (issue 24): eager loading (torch < 1.13, or a CUDA < 11.7 wheel) holds
every kernel of torch's fat binary for the arch, lazy loading only those a run uses. Each era x compute-capability
value is the median of published figures (bench/data/cuda_context_figures.csv, each with its URL); the tests read
them against the OOM messages they come from and check the era rule against PyTorch's and NVIDIA's stated releases."""

from __future__ import annotations

import csv
import json
import re
import statistics
from pathlib import Path

import pytest
from helpers import load_bench

from perfguide import Hardware
from perfguide.memory.overhead import cuda_context_bytes, module_loading

ROOT = Path(__file__).resolve().parents[1]
GiB = 2**30
CAL = json.loads((ROOT / "perfguide" / "data" / "calibration.json").read_text(encoding="utf-8"))["cuda_context_bytes"]


def _rows() -> dict[str, dict[str, str]]:
    with (ROOT / "bench" / "data" / "published_measurements.csv").open(encoding="utf-8") as fh:
        return {r["row_id"]: r for r in csv.DictReader(fh)}


def test_each_era_and_cc_is_the_median_of_its_figures() -> None:
    """calibration.json by_era is what bench/context_figures.py computes from the CSV: per era and cc major the
    median of the folded figures, "any" the era's median over all of them. The spread is wide (lazy cc 7: 0.12-1.01
    GiB over seven figures; eager cc 7: 0.86-1.31 over five), which the median, not a mean, absorbs."""
    figures = load_bench("context_figures")
    assert figures.by_era() == CAL["by_era"]
    assert CAL["value"] == CAL["by_era"]["lazy"]["any"]
    lazy7 = [figures.context_bytes(f) / GiB for f in figures.figures()
             if f["era"] == "lazy" and f["cc_major"] == "7" and f["use"] == "fold"]
    assert len(lazy7) == 7 and min(lazy7) < 0.13 < 1.0 < max(lazy7)
    assert statistics.median(lazy7) == pytest.approx(CAL["by_era"]["lazy"]["7"] / GiB, abs=1e-6)


def test_the_figures_cover_both_eras_and_cc_7_8_9_from_many_sources() -> None:
    figures = load_bench("context_figures").figures()
    folded = [f for f in figures if f["use"] == "fold"]
    assert len(folded) >= 12 and len({f["source_group"] for f in folded}) >= 6
    assert all(f["url"].startswith("https://") for f in figures)
    for era in ("eager", "lazy"):
        assert {"7", "8"} <= {f["cc_major"] for f in folded if f["era"] == era}
    assert "9" in {f["cc_major"] for f in folded if f["era"] == "lazy"}


def test_a_stated_release_puts_its_figure_in_the_era_module_loading_gives() -> None:
    """Where a figure states its torch release as a number, perfguide's own era rule agrees with the CSV's era."""
    for f in load_bench("context_figures").figures():
        stated = re.match(r"(\d+\.\d+(?:\.\d+)?(?:\+cu\d+)?)\s*(?:\(|$|stated)", f["torch"])
        if stated and "DEFAULT" not in f["torch"]:
            assert module_loading(stated.group(1)) == f["era"], f["fig_id"]


def test_hand_check_of_the_zero_blog_oom_message() -> None:
    """Row 765's message, read off the row's own notes: 23.70 GiB total, 22.05 GiB reserved, 45.69 MiB free: 1.605
    GiB outside the allocator on an RTX 3090 under torch 1.7.1 (eager), 3.3x the lazy cc-8 median (0.49 GiB)."""
    notes = _rows()["765"]["notes"]
    total, free, reserved = (float(x) for x in re.search(
        r"([\d.]+) GiB total capacity; [\d.]+ GiB already allocated; ([\d.]+) MiB free; ([\d.]+) GiB reserved", notes).groups())  # type: ignore[union-attr]
    by_hand = total - reserved - free / 1024
    assert by_hand == pytest.approx(1.605, abs=5e-4)
    fig = next(f for f in load_bench("context_figures").figures() if f["fig_id"] == "E1")
    assert load_bench("context_figures").context_bytes(fig) / GiB == pytest.approx(by_hand, abs=1e-5)
    assert CAL["by_era"]["eager"]["8"] / GiB == pytest.approx(by_hand, abs=1e-5)   # the only eager cc-8 figure
    assert by_hand / (CAL["by_era"]["lazy"]["8"] / GiB) > 3


@pytest.mark.parametrize(("release", "era"), [("1.7.1", "eager"), ("1.12.1", "eager"), ("1.12.0.dev20220420", "eager"),
                                              ("1.13.0+cu116", "eager"), ("1.13", "lazy"), ("1.13.0", "lazy"), ("2.1.2+cu121", "lazy"),
                                              ("2.13.0+cpu", "lazy")])
def test_module_loading_follows_torch_1_13_and_cuda_11_7(release: str, era: str) -> None:
    """pytorch PR 85692 (1.13: PR 86509) sets CUDA_MODULE_LOADING=LAZY; CUDA runtimes before 11.7 load eagerly."""
    assert module_loading(release) == era


def test_an_old_release_prices_the_eager_context_on_the_same_card() -> None:
    a100 = Hardware.from_name("a100-80gb")
    v100 = Hardware.from_name("v100-32gb")
    assert cuda_context_bytes(a100, "1.10.0") == CAL["by_era"]["eager"]["8"]
    assert cuda_context_bytes(a100, "2.4.0") == CAL["by_era"]["lazy"]["8"]
    assert cuda_context_bytes(v100, "1.10.0") > 5 * cuda_context_bytes(v100, "2.4.0")
    assert cuda_context_bytes(None, "1.10.0") == CAL["by_era"]["eager"]["any"]


def test_a_source_with_a_figure_is_priced_without_it() -> None:
    """Out of sample by source: the ZeRO blog's rows (its message is the only eager cc-8 figure) take the eager median
    of the other sources' figures, and the row's torch 1.7.1 puts them in the eager era."""
    ctx = load_bench("accuracy_context")
    row = _rows()["765"]
    assert ctx.row_torch_release(row) == "1.7.1" and ctx.row_torch_release(_rows()["647"]) == "1.12"
    assert ctx.row_torch_release(_rows()["653"]) == "1.10"   # its notes also say "no SDPA before PyTorch 2.0"
    hw = Hardware.from_name("rtx3090")
    with ctx.torch_era(row):
        held = cuda_context_bytes(hw)
    others = load_bench("context_figures").by_era(exclude_source="hf_blog_zero_deepspeed_fairscale")
    assert "8" not in others["eager"] and held == others["eager"]["any"] != CAL["by_era"]["eager"]["8"]
    assert cuda_context_bytes(hw, "1.7.1") == CAL["by_era"]["eager"]["8"]   # restored after the row


def test_only_shared_cards_leave_more_than_two_gib_outside_the_allocator() -> None:
    """The inclusion rule, stated in the CSV's ``use``: a pre-2.1 message (total - reserved - free) counts everything
    else on the card, so one over 2 GiB (T4 3.4, RTX 3090 4.3 and 22.5 GiB) had another process and is not folded;
    every folded figure of that kind is under it. The new-format figures count this process alone and all fold."""
    figures = load_bench("context_figures")
    old = [f for f in figures.figures() if f["kind"] == "total_reserved_free" and f["use"] != "distributed"]
    assert all((figures.context_bytes(f) > figures.SHARED_ABOVE) == (f["use"] == "shared") for f in old)
    assert sum(f["use"] == "shared" for f in old) == 3


def test_the_installed_torch_is_read_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan prices hundreds of setups and each asks for the context: the installed release must come from a cache,
    not from an importlib.metadata scan of sys.path per call (which tripled recommend()'s latency when it did)."""
    from importlib import metadata

    from perfguide._packages import installed_release
    from perfguide.memory import overhead

    calls = []
    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: calls.append(name) or real(name))
    installed_release.cache_clear()
    try:
        for _ in range(50):
            overhead.cuda_context_bytes(None)
        assert calls == ["torch"]
    finally:
        installed_release.cache_clear()
