"""The CUDA context a process holds outside PyTorch's allocator, read off published figures
(bench/data/cuda_context_figures.csv, each with its URL, GPU, torch release and era), and the per-era,
per-compute-capability medians perfguide/data/calibration.json ``cuda_context_bytes.by_era`` stores.

Each figure's context follows from what its message prints (messages of different torch releases print different
fields; only what one prints is used):

- ``total_reserved_free`` (torch < 2.1: "X total capacity; ... Z free; W reserved in total by PyTorch"):
  X - W - Z, the card's memory neither torch's allocator holds nor CUDA reports free: the context and kernels, and
  anything else on the card (a display, another process), so an upper bound where the card is shared;
- ``process_minus_reserved`` (torch >= 2.1: "this process has P memory in use. Of the allocated memory A is
  allocated by PyTorch, and U is reserved by PyTorch but unallocated"): P - A - U, this process alone;
- ``used_minus_segment`` (cudaMemGetInfo total - free, or NVML's used, after one small tensor): the used bytes less
  the allocator's segment for that tensor.

Distributed runs (``use`` = distributed) also hold NCCL's buffers, which perfguide prices apart (memory/nccl.py);
a ``total_reserved_free`` figure over SHARED_ABOVE had another process on the card (no context figure comes near it)
(``use`` = shared): both are listed, not folded. Era: eager module loading before torch 1.13 (or with CUDA < 11.7), lazy since.
"""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

CSV = Path(__file__).resolve().parent / "data" / "cuda_context_figures.csv"
GiB = 2**30
#: a pre-2.1 message leaving more than this neither torch's nor free: another process shared the card
SHARED_ABOVE = 2 * GiB
ERAS = ("eager", "lazy")


def figures() -> list[dict[str, str]]:
    with CSV.open(encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def context_bytes(fig: dict[str, str]) -> int:
    """One figure's bytes outside the allocator, by the formula its message allows (module docstring)."""
    def gib(key: str) -> float:
        return float(fig[key]) * GiB

    kind = fig["kind"]
    if kind == "total_reserved_free":
        return int(gib("total_gib") - gib("reserved_gib") - gib("free_gib"))
    if kind == "process_minus_reserved":
        return int(gib("in_use_gib") - gib("allocated_gib") - gib("unallocated_gib"))
    if kind == "used_minus_segment":
        return int(fig["used_bytes"]) - int(fig["tensor_bytes"])
    raise ValueError(f"figure {fig['fig_id']}: unknown kind {kind!r}")


def by_era(exclude_source: str | None = None) -> dict[str, dict[str, int]]:
    """{era: {cc major: median bytes, ..., "any": median over the era}} of the folded figures, without
    ``exclude_source``'s own (out of sample by source). A cc with no figure left is absent (the caller takes "any")."""
    folded = [f for f in figures() if f["use"] == "fold" and f["source_group"] != exclude_source]
    table: dict[str, dict[str, int]] = {}
    for era in ERAS:
        mine = [f for f in folded if f["era"] == era]
        ccs = sorted({f["cc_major"] for f in mine if f["cc_major"]}, key=int)
        table[era] = {cc: int(statistics.median(context_bytes(f) for f in mine if f["cc_major"] == cc)) for cc in ccs}
        table[era]["any"] = int(statistics.median(context_bytes(f) for f in mine))
    return table


if __name__ == "__main__":
    for f in figures():
        print(f"{f['fig_id']:4} {f['era']:5} cc{f['cc_major'] or '?':2} {f['use']:11} {context_bytes(f) / GiB:6.3f} GiB  {f['gpu']}")
    for era, row in by_era().items():
        print(era, {k: round(v / GiB, 3) for k, v in row.items()})
    print(by_era())
