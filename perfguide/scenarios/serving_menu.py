"""Which weight formats a serving plan may price, and in what spirit: the checkpoint as given first.

The default serves the checkpoint in its own format (16-bit, or its own ``quantization_config``); a lossy
format is priced only when that does not fit, and only one the engine applies at load to a 16-bit
checkpoint. ``quantization='none'`` never quantizes; ``'auto'`` lets a lossy format compete on speed; a named
format is served if the checkpoint is in it or the engine converts to it at load. A format that needs a
pre-quantized checkpoint (AWQ, GPTQ, MXFP4, ...) comes only from the checkpoint itself or from the user's
``quantized_model``, so a printed command always loads weights that exist in that format.
"""

from __future__ import annotations

from typing import NamedTuple

from .._serving_data import serving_facts
from ..engines import ServerEngine
from ..errors import ConflictingConstraintsError, PerfGuideError
from ..hardware.types import GPU
from ..model.quantized import checkpoint_format
from ..model.types import ModelSpec
from .bnb_gate import quantization_runs
from .types import Request


class Menu(NamedTuple):
    served: str                 # the checkpoint's own format (its 16-bit dtype when unquantized)
    checkpoint: str | None      # the format stored in the checkpoint loaded (None: 16-bit)
    lossy: tuple[str, ...]      # formats applied at load, priced when the checkpoint as given does not fit (or competing: auto)
    compete: bool               # quantization='auto': lossy formats compete on speed even when the checkpoint fits
    named: bool                 # the format was named by the quantization constraint


def half(gpu: GPU) -> str:
    return "bf16" if gpu.supports_bf16 else "fp16"


def _refuse_where(engine: ServerEngine, fmt: str, gpu: GPU, what: str) -> ConflictingConstraintsError:
    row = engine.formats.get(fmt)
    needs = (f"it needs {'/'.join(v.upper() for v in row.vendors)}, compute capability >= {row.min_cc[0]}.{row.min_cc[1]} on NVIDIA, "
             f"per {engine.facts.formats_source}" if row else f"{engine.name} has no {fmt} kernels")
    runs = " or ".join(repr(f) for f in engine.quantizations() if engine.runs(f, gpu) and engine.formats[f].at_load)
    return ConflictingConstraintsError(f"{what} does not run on {gpu.name} ({gpu.vendor.upper()}) in {engine.name} {engine.version} "
                                       f"({needs}); use {runs + ' (quantized at load) or ' if runs else ''}another GPU")


def _quantized_model_format(request: Request) -> str:
    """The format of the user's pre-quantized checkpoint: from its config when it can be read, else named."""
    named = request.constraints.quantization
    path = request.constraints.quantized_model
    try:
        found = checkpoint_format(ModelSpec.from_any(path).config)
    except PerfGuideError:
        found = None
    if found is None and named in (None, "none", "auto"):
        raise ConflictingConstraintsError(f"quantized_model={path!r}: its config.json quantization_config cannot be read here; "
                                          "name its format too, e.g. quantization='awq', 'gptq', 'w4a16' or 'fp8'")
    fmt = found or str(named)
    if named not in (None, "none", "auto", fmt):
        raise ConflictingConstraintsError(f"quantized_model={path!r} stores {fmt} weights, not quantization={named!r}; "
                                          f"use quantization={fmt!r} or leave it unset")
    return fmt


def menu(request: Request, engine: ServerEngine) -> Menu:
    """The formats a plan prices on this engine and GPU, or one line saying why the request cannot be served."""
    gpu = request.hardware.smallest_gpu
    assert gpu is not None
    named = request.constraints.quantization
    checkpoint = _quantized_model_format(request) if request.constraints.quantized_model else checkpoint_format(request.model.config)
    served = checkpoint or half(gpu)
    source = f"quantized_model={request.constraints.quantized_model!r}" if request.constraints.quantized_model else request.model.name
    if checkpoint is not None and checkpoint not in engine.formats:
        raise ConflictingConstraintsError(f"{source} stores {checkpoint} weights, which {engine.name} {engine.version} does not serve; "
                                          f"use a checkpoint in one of {', '.join(f for f in engine.formats if serving_facts().formats[f].bits < 16)}")
    if not engine.runs(served, gpu):
        raise _refuse_where(engine, served, gpu, f"{source} ({served} weights)")
    lossy = () if checkpoint is not None else tuple(
        f for f, row in engine.formats.items()
        if row.at_load and serving_facts().formats[f].bits < 16 and engine.runs(f, gpu)
        and (f != "nf4" or quantization_runs("nf4", request.hardware)))
    if named in (None, "none", "auto"):
        return Menu(served, checkpoint, () if named == "none" else lossy, named == "auto", False)
    if named == served:
        return Menu(served, checkpoint, (), False, True)
    row = engine.formats.get(named)
    if checkpoint is None and row is not None and row.at_load:
        if not engine.runs(named, gpu):
            raise _refuse_where(engine, named, gpu, f"quantization={named!r}")
        return Menu(named, checkpoint, (), False, True)
    if checkpoint is not None:
        raise ConflictingConstraintsError(f"{source} already stores {checkpoint} weights; quantization={named!r} would need the "
                                          f"16-bit model: serve it as given (quantization=None) or pass the 16-bit repo")
    raise ConflictingConstraintsError(f"quantization={named!r} needs a pre-quantized {named} checkpoint of {request.model.name} "
                                      f"({engine.name} does not convert to it at load); pass quantized_model='org/repo' "
                                      "(a repo id or local path of that checkpoint)")


def checkpoint_only(engine: ServerEngine, gpu: GPU) -> list[str]:
    """4-bit formats that need a pre-quantized checkpoint and run here: what a no-fit plan suggests."""
    return [f for f, row in engine.formats.items() if not row.at_load and serving_facts().formats[f].bits <= 4 and engine.runs(f, gpu)]
