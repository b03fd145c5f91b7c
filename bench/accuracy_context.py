"""The CUDA context a row's process held: by the module-loading era of the torch release it ran
(perfguide/memory/overhead.py module_loading) and out of sample by source (bench/context_figures.py).

A row states its torch release in its notes ("PyTorch 1.7.1", "PyTorch nightly ~1.12", "torch 2.1.2"); a row that
states none but is dated before November 2022 (torch 1.13.0, the first release that turns lazy loading on, came out
2022-10-28), or only by a year up to 2022, ran an eager release; other rows are priced as the installed torch (lazy).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

from context_figures import by_era, figures

#: the last torch minor before lazy loading (overhead.LAZY_LOADING_SINCE_TORCH is 1.13.0): what an undated-release row
#: of the eager era is priced as
EAGER_RELEASE = "1.12"
#: a stated release; "no SDPA before PyTorch 2.0" names a boundary, not the release a row ran
_STATED = re.compile(r"(?<!before )(?:PyTorch|torch)[ =]+(?:nightly ~)?v?(\d+\.\d+(?:\.\d+)?)")


def row_torch_release(row: dict[str, str]) -> str | None:
    """The torch release a row ran: stated, else EAGER_RELEASE for a row dated before 2022-11, else None."""
    stated = _STATED.search(f"{row['notes']} {row['gpu_type']} {row['commit_or_date']}")
    if stated:
        return stated.group(1)
    dated = re.search(r"(20\d\d)-(\d\d)", row["commit_or_date"])
    if dated:
        return EAGER_RELEASE if (int(dated.group(1)), int(dated.group(2))) < (2022, 11) else None
    year = re.search(r"\b(20\d\d)\b", row["commit_or_date"])
    return EAGER_RELEASE if year and int(year.group(1)) <= 2022 else None


@contextmanager
def torch_era(row: dict[str, str]) -> Iterator[None]:
    """Price the row's CUDA context with its torch release's era, and, for a source that gave a context figure, with
    the medians of the other sources' figures (out of sample by source, as HELD_OUT does for calibration.json)."""
    import perfguide.memory.overhead as overhead
    from perfguide._data import load

    release = row_torch_release(row)
    entry = load("calibration")["cuda_context_bytes"]
    saved_release, saved_table = overhead.installed_torch, entry["by_era"]
    if release is not None:
        overhead.installed_torch = lambda: release
    if row["source_group"] in {f["source_group"] for f in figures()}:
        entry["by_era"] = by_era(exclude_source=row["source_group"])
    try:
        yield
    finally:
        overhead.installed_torch = saved_release
        entry["by_era"] = saved_table
