"""What every benchmark does last: write its markdown under bench/results and echo it; and the per-source
summary every accuracy table shares (the median of per-source medians, so no single table decides the headline)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


def publish(text: str, out: Path) -> int:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    print(text)
    return 0


@dataclass(frozen=True)
class SourceSummary:
    """Absolute % errors grouped by source: each source's median, their median, and the worst source.

    A row median over all rows lets the largest table (llm-foundry's 209 throughput rows) decide the headline;
    the median of per-source medians weighs every published source once."""

    medians: dict[str, float]

    @classmethod
    def of(cls, errors: Mapping[str, Sequence[float]]) -> SourceSummary:
        return cls({g: statistics.median(e) for g, e in sorted(errors.items()) if e})

    @property
    def median_of_medians(self) -> float:
        return statistics.median(self.medians.values()) if self.medians else float("nan")

    @property
    def worst(self) -> tuple[str, float]:
        if not self.medians:
            return "-", float("nan")
        group = max(self.medians, key=lambda g: self.medians[g])
        return group, self.medians[group]

    def line(self, target_median: float, target_worst: float) -> str:
        """One sentence: the headline numbers against the targets issue 24 sets, met or not."""
        group, worst = self.worst
        met = self.median_of_medians <= target_median and worst <= target_worst
        return (f"median of per-source medians {self.median_of_medians:.1f}% over {len(self.medians)} sources "
                f"(target <= {target_median:g}%); worst source {group} {worst:.1f}% (target <= {target_worst:g}%): "
                f"{'met' if met else 'NOT met'}")
