"""Horizontal bars from block characters, so memory reads at a glance in any terminal or log."""

from __future__ import annotations

from dataclasses import dataclass

FULL = "█"
EMPTY = "░"
OVER = "▶"
_EIGHTHS = " ▏▎▍▌▋▊▉"  # index k = k/8 of a cell
DEFAULT_WIDTH = 24


@dataclass(frozen=True)
class BarRow:
    """One bar: a label, its bytes, and the scale (the device's usable memory) it is drawn against."""

    label: str
    value: float
    scale: float
    text: str  # the value as printed beside the bar ("13.4 GiB")

    @property
    def fraction(self) -> float:
        return self.value / self.scale if self.scale > 0 else 0.0

    @property
    def over(self) -> bool:
        return self.value > self.scale > 0


def text_bar(fraction: float, width: int = DEFAULT_WIDTH) -> str:
    """Eighth-cell resolution so small components (a few % of an 80 GiB card) still show up.

    A fraction above 1 fills the bar and ends it with an arrow: the value does not fit the scale.
    """
    if fraction > 1:
        return FULL * (width - 1) + OVER
    cells = max(0.0, fraction) * width
    full = int(cells)
    part = round((cells - full) * 8)
    if part == 8:
        full, part = full + 1, 0
    partial = _EIGHTHS[part] if part and full < width else ""
    return FULL * full + partial + EMPTY * (width - full - len(partial))


def text_bar_lines(rows: list[BarRow], width: int = DEFAULT_WIDTH) -> list[str]:
    """Aligned ``label  bar  value`` lines; labels padded to the longest one."""
    pad = max((len(r.label) for r in rows), default=0)
    return [f"{r.label.ljust(pad)}  {text_bar(r.fraction, width)} {r.text}" for r in rows]
