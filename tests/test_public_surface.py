"""What the docs tell users to use is importable from ``perfguide`` itself, and the docs' examples never reach
into internal modules (which may move between releases)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import perfguide

ROOT = Path(__file__).resolve().parents[1]
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


@pytest.mark.parametrize("name", perfguide.__all__)
def test_every_public_name_resolves(name: str) -> None:
    assert getattr(perfguide, name) is not None


def test_error_classes_are_public_and_share_the_base() -> None:
    from perfguide import errors

    classes = [v for v in vars(errors).values() if isinstance(v, type) and issubclass(v, errors.PerfGuideError)]
    assert len(classes) >= 8
    for cls in classes:
        assert getattr(perfguide, cls.__name__) is cls


def test_documented_helpers_are_top_level() -> None:
    from perfguide.measure.batch_finder import find_micro_batch
    from perfguide.measure.calibration import record

    assert perfguide.find_micro_batch is find_micro_batch and perfguide.record is record
    assert "lora" in perfguide.techniques.names()


def test_lazy_exports_keep_import_light() -> None:
    code = "import sys, perfguide; perfguide.record; print(any(m in sys.modules for m in ('torch', 'transformers')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_doc_examples_import_only_from_the_top_level() -> None:
    internal = re.compile(r"^\s*(?:>>>\s*)?(?:from\s+perfguide\.\w|import\s+perfguide\.\w)", re.M)
    offenders = {str(p.relative_to(ROOT)): internal.findall(p.read_text(encoding="utf-8")) for p in DOC_FILES}
    assert {k: v for k, v in offenders.items() if v} == {}
