"""The schema of techniques.json, beside it: every row a sourced number that a technique's cost hook reads by
name, plus the per-family fp16 facts. Validated once, at first read: a row without a number or a source fails
there, naming the file and the row; a row the code reads but the file lacks fails as one line too. The names
are written in the file and in the technique that reads them, nowhere else.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from .._data import DataModel, Fact, validated
from ..errors import DataFileError


class Fp16Families(DataModel):
    """Model types a bf16-trained checkpoint of which fine-tunes well in fp16 AMP, and those that overflow."""

    fine: dict[str, str]
    overflows: dict[str, str]
    source: str


class CompiledBlock(BaseModel):
    """One block code's bytes kept for backward per token, eager and under torch.compile (Inductor), as traced."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    eager_bytes_per_token: int
    compiled_bytes_per_token: int
    hidden_size: int
    intermediate_size: int


class CompiledBlocks(BaseModel):
    """scripts/trace_compiled_block.py's counts, keyed ``<code>:<model_type>`` (``transformers:llama``), PEFT LoRA on
    the frozen block ``<code>:<model_type>:lora:<targets>:<adapters' dtype>:<lora_dropout>``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: str = Field(min_length=10)
    blocks: dict[str, CompiledBlock]


class TechniquesFile(DataModel):
    """techniques.json: any number of ``{"value": number, "source": "..."}`` rows, and ``fp16_by_family``."""

    model_config = ConfigDict(frozen=True, extra="allow", populate_by_name=True)
    __pydantic_extra__: dict[str, Fact[float]]

    fp16_by_family: Fp16Families
    compiled_blocks: CompiledBlocks


def _file() -> TechniquesFile:
    return validated("techniques", TechniquesFile)


def constant(name: str) -> float:
    """The number of row ``name``."""
    rows = _file().model_extra or {}
    if name not in rows:
        raise DataFileError(f"perfguide/data/techniques.json has no row {name!r}; the bundled data is damaged, reinstall perfguide")
    return float(rows[name].value)


def compiled_blocks() -> CompiledBlocks:
    """The traced eager / compiled block bytes (techniques/torch_compile.py prices a compiled step from them)."""
    return _file().compiled_blocks


def fp16_verdict(model_type: str) -> tuple[str, str]:
    """('fine' | 'overflows' | 'unknown', source) for fine-tuning a bf16-trained ``model_type`` in fp16 AMP."""
    table = _file().fp16_by_family
    if model_type in table.fine:
        return "fine", table.fine[model_type]
    if model_type in table.overflows:
        return "overflows", table.overflows[model_type]
    return "unknown", table.source
