"""What every benchmark does last: write its markdown under bench/results and echo it."""

from __future__ import annotations

from pathlib import Path


def publish(text: str, out: Path) -> int:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    print(text)
    return 0
