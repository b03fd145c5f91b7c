"""The schema of techniques.json, beside it: every row a sourced number that a technique's cost hook reads by
name, plus the per-family fp16 facts. Validated once, at first read: a row without a number or a source fails
there, naming the file and the row; a row the code reads but the file lacks fails as one line too. The names
are written in the file and in the technique that reads them, nowhere else.
"""

from __future__ import annotations

from pydantic import ConfigDict

from .._data import DataModel, Fact, validated
from ..errors import DataFileError


class Fp16Families(DataModel):
    """Model types a bf16-trained checkpoint of which fine-tunes well in fp16 AMP, and those that overflow."""

    fine: dict[str, str]
    overflows: dict[str, str]
    source: str


class TechniquesFile(DataModel):
    """techniques.json: any number of ``{"value": number, "source": "..."}`` rows, and ``fp16_by_family``."""

    model_config = ConfigDict(frozen=True, extra="allow", populate_by_name=True)
    __pydantic_extra__: dict[str, Fact[float]]

    fp16_by_family: Fp16Families


def _file() -> TechniquesFile:
    return validated("techniques", TechniquesFile)


def constant(name: str) -> float:
    """The number of row ``name``."""
    rows = _file().model_extra or {}
    if name not in rows:
        raise DataFileError(f"perfguide/data/techniques.json has no row {name!r}; the bundled data is damaged, reinstall perfguide")
    return float(rows[name].value)


def fp16_verdict(model_type: str) -> tuple[str, str]:
    """('fine' | 'overflows' | 'unknown', source) for fine-tuning a bf16-trained ``model_type`` in fp16 AMP."""
    table = _file().fp16_by_family
    if model_type in table.fine:
        return "fine", table.fine[model_type]
    if model_type in table.overflows:
        return "overflows", table.overflows[model_type]
    return "unknown", table.source
