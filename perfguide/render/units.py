"""Numbers as people read them: bytes in GiB, times in ms/s/min, counts in M/B.

Every renderer (report, hardware, CLI) formats through these so one quantity never reads two ways.
"""

from __future__ import annotations

from typing import Any

from .._base import GiB, MiB

KiB = 1024
_COUNT_STEPS = ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K"))
_BY_UNIT_WORD = frozenset({"bytes", "byte", "s", "sec", "seconds", "x"})


def fmt_bytes(n: float | None) -> str:
    """Binary units (GiB) because torch.cuda and nvidia-smi both count in powers of two."""
    if n is None:
        return "unknown"
    size = abs(n)
    sign = "-" if n < 0 else ""
    if size >= GiB:
        return f"{sign}{size / GiB:.1f} GiB"
    if size >= MiB:
        return f"{sign}{size / MiB:.0f} MiB"
    if size >= KiB:
        return f"{sign}{size / KiB:.0f} KiB"
    return f"{sign}{size:.0f} B"


def fmt_decimal_gb(n: float | None) -> str:
    """Decimal GB, the unit of spec sheets ("80 GB A100"), shown beside GiB where users compare with them."""
    return "unknown" if n is None else f"{n / 1e9:.1f} GB"


def fmt_seconds(s: float | None) -> str:
    """Pick the unit that keeps 2-3 significant digits: step times span microseconds to hours."""
    if s is None:
        return "unknown"
    if s < 1e-3:
        return f"{s * 1e6:.0f} us"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    if s < 120:
        return f"{s:.2f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def fmt_count(n: float | None, suffix: str = "") -> str:
    """Parameter and token counts the way model cards write them (7.2B, 124M)."""
    if n is None:
        return "unknown"
    for step, letter in _COUNT_STEPS:
        if abs(n) >= step:
            return f"{n / step:.3g}{letter}{suffix}"
    return f"{n:.3g}{suffix}"


def fmt_percent(fraction: float | None) -> str:
    return "unknown" if fraction is None else f"{fraction * 100:.1f}%"


def fmt_number(value: float | None, unit: str | None) -> str:
    """The number that decided a decision, in its own unit ("bytes", "s", "x", "fraction", "tokens/s"...).

    A unit with words after a known one ("bytes KV cache per sequence") formats the number by the first word
    and keeps the rest as its description.
    """
    if value is None:
        return ""
    head, _, tail = (unit or "").strip().partition(" ")
    if tail and head.lower() in _BY_UNIT_WORD:
        return f"{fmt_number(value, head)} {tail}"
    unit_key = (unit or "").strip().lower()
    if unit_key in ("bytes", "byte", "b"):
        return fmt_bytes(value)
    if unit_key in ("s", "sec", "seconds"):
        return fmt_seconds(value)
    if unit_key in ("x", "ratio"):
        return f"{value:.3g}x"  # compact: "16x", "1.33x", not "16.00x"
    if unit_key == "compute capability":
        return f"{value:.1f} {unit}"  # a version: 8.0 must not read as "8"
    if unit_key in ("fraction", "%", "percent"):
        return fmt_percent(value if unit_key == "fraction" else value / 100)
    if unit_key in ("tokens/s", "tok/s"):
        return f"{fmt_count(value)} tokens/s"
    if unit_key in ("params", "parameters"):
        return fmt_count(value, " params")
    text = f"{value:,.0f}" if float(value).is_integer() else f"{value:.3g}"
    return f"{text} {unit}" if unit else text


def fmt_value(value: Any) -> str:
    """A decision's chosen value: booleans read as on/off, None as 'none', containers compactly."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if hasattr(value, "model_dump"):
        return fmt_value(value.model_dump(mode="json"))
    if isinstance(value, dict):
        return ", ".join(f"{k}={fmt_value(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(fmt_value(v) for v in value) + "]"
    return str(value)
