"""data/optimizers.json as typed rows: every fact about an optimizer, written once.

One row per TrainingArguments ``optim`` name: how its states are stored (family, state tensors, bits), what
its step allocates and streams, whether it is paged, offloadable to DeepSpeed's CPU AdamW, usable on FSDP2
shards, and which package the target needs. The memory model, the speed model, the search, the adapters and
``Setup`` validation all read these rows; none keeps a list of optimizer names of its own.
"""

from __future__ import annotations

from functools import cache
from typing import Literal

from pydantic import Field

from ._data import DataModel, validated

Family = Literal["torch", "adafactor", "bnb", "torchao", "lomo", "adalomo", "galore", "apollo"]


class OptimizerRow(DataModel):
    family: Family
    states: int = Field(ge=0, le=3, description="state tensors per trainable element")
    bits: Literal[4, 8, 32]
    foreach_temp: bool = Field(description="the default foreach step allocates a parameter-sized temporary")
    streamed_state_bytes: float = Field(ge=0, description="state bytes per trainable fp32 parameter the step streams")
    passes: float = Field(gt=0, description="times the step streams its tensors")
    paged: bool
    offloadable: bool = Field(description="DeepSpeed's CPU AdamW can run it when the optimizer state is offloaded")
    fsdp2: bool = Field(description="runs on FSDP2's DTensor shards")
    package: Literal["bitsandbytes", "torchao", "lomo-optim", "galore-torch", "apollo-torch", "schedulefree"] | None
    in_backward: bool = Field(default=False, description="the Trainer fuses the update into backward (LOMO, *_layerwise)")
    rank: int | None = Field(default=None, ge=1, description="projection rank of GaLore/APOLLO target matrices")
    source: str = Field(min_length=10)

    @property
    def bnb_8bit(self) -> bool:
        """bitsandbytes 8-bit states: the Trainer gives embeddings 32-bit state for these (transformers#14819)."""
        return self.family == "bnb" and self.bits == 8

    @property
    def low_bit(self) -> bool:
        return self.bits < 32


class OptimizersData(DataModel):
    optimizers: dict[str, OptimizerRow]


@cache
def rows() -> dict[str, OptimizerRow]:
    return dict(validated("optimizers", OptimizersData).optimizers)


def names() -> tuple[str, ...]:
    """Every optimizer name perfguide can price, in the data file's order."""
    return tuple(rows())


def steps_in_backward(name: str | None) -> bool:
    """Whether ``name`` is one of transformers' optimizers that step inside backward themselves (LOMO, *_layerwise)."""
    return name is not None and name in rows() and rows()[name].in_backward


def row(name: str) -> OptimizerRow:
    """The row of ``name``; an unknown name is one line listing the accepted ones."""
    table = rows()
    if name not in table:
        from .errors import InvalidSetupError, unknown_value

        raise unknown_value("optimizer", name, tuple(table), InvalidSetupError)
    return table[name]
