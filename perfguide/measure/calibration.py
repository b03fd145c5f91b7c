"""The calibration store: measured/predicted ratios of verified runs, per machine and model family / size band.

A JSON file (``$PERFGUIDE_CACHE_DIR`` or ``~/.cache/perfguide``/calibration.json) that planning reads and
training runs append to, so it is treated as state that must never break planning or lose history:

* read: validated by a pydantic schema; a file that is not valid JSON, or valid JSON of another shape, is set
  aside (renamed next to itself, with a warning naming the new name) and planning goes on uncalibrated;
* write: read-modify-write under a file lock, to a temporary file then ``os.replace``, so concurrent writers
  lose nothing and a reader never sees half a file; an unwritable store is a warning, never an exception
  (the measurement it came from is still returned to the caller);
* scope: a run only calibrates later plans on the same machine for the same model family and size band
  (half a decade of parameters), so a tiny model's fixed overheads never rescale an 8B model;
* robustness: a ratio outside ``SANE_RATIO`` (the band the model's own error spans) or more than 3 median
  absolute deviations (log space) from the others is an outlier: once sane runs of the scope exist it is left
  out of the factor, but the first measurement of a scope is kept and used (capped by ``factors.clamp``) rather
  than discarded, and the caller says it is an outlier; each run stores the spread of its step times, so a
  noisy first measurement reads as one. The CUDA context is stored only when the device had no other process
  on it during the run.
"""

from __future__ import annotations

import logging
import math
import os
import statistics
import time
import warnings
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import Field, ValidationError

from .._base import GiB, Model
from .._cache import cache_root
from .._files import write_atomic
from ..errors import PerfGuideError
from ..hardware.types import Hardware
from ..memory.factors import SANE_RATIO, Factors
from ..model.types import ModelSpec
from .types import Verification

if TYPE_CHECKING:
    from ..recommendation import Recommendation

logger = logging.getLogger("perfguide.calibration")

STORE_VERSION: Literal[2] = 2
#: A measured CUDA context above this is another tenant's memory, not a context (real ones are 0.3-1.5 GiB).
MAX_CUDA_CONTEXT = 4 * GiB
#: Only the most recent runs of a scope count (and are kept): a driver or library upgrade changes the machine.
KEEP_RUNS = 50
LOCK_TIMEOUT_S = 30.0
MEMORY_QUANTITIES = ("peak_allocated", "rss_growth")


#: what make_run stores: a finite positive measured/predicted ratio (the reader holds a file to the same bounds)
Ratio = Annotated[float, Field(gt=0, allow_inf_nan=False)]
Spread = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class Run(Model):
    """One verified run: which machine and model it was, and what it measured relative to the prediction."""

    machine: str = Field(min_length=1, max_length=500)
    family: str = Field(min_length=1, max_length=100)
    band: str = Field(min_length=1, max_length=40)
    model: str = Field(max_length=1000)
    setup: str = Field(max_length=1000)
    time: float = Field(ge=0, allow_inf_nan=False)
    ratios: dict[str, Ratio] = Field(default_factory=dict)
    #: relative spread of a quantity over the run's steady steps: (max - min) / (2 * mean); step time only
    spread: dict[str, Spread] = Field(default_factory=dict)
    cuda_context_bytes: int | None = Field(default=None, gt=0, le=MAX_CUDA_CONTEXT)  # the bounds _cuda_context stores

    def scope(self) -> tuple[str, str, str]:
        return self.machine, self.family, self.band


class Store(Model):
    version: Literal[2] = STORE_VERSION
    runs: tuple[Run, ...] = ()


def cache_path() -> Path:
    return cache_root() / "calibration.json"


def store_file(path: Path | None) -> Path:
    """The file the store really is: a ``calibration.json`` symlinked to a shared store is read, locked and
    written at its target (written through), never replaced by a private file."""
    return Path(os.path.realpath(path or cache_path()))


def machine_key(hw: Hardware) -> str:
    """Same GPU model and memory (or same CPU and core count) = same machine for calibration."""
    gpu = hw.smallest_gpu
    if gpu is not None:
        return f"gpu:{gpu.name}:{gpu.memory_total}"
    return f"cpu:{hw.cpu.model_name}:{hw.cpu.physical_cores}"


def size_band(params: int) -> str:
    """Half a decade of parameters (1e9 .. 3.2e9 is one band): fixed overheads and kernel efficiency change
    with model size, so a ratio carries over only between models of similar size."""
    low = math.floor(2 * math.log10(max(params, 1))) / 2
    return f"1e{low:g}-1e{low + 0.5:g}"


def scope_of(hw: Hardware, spec: ModelSpec) -> tuple[str, str, str]:
    return machine_key(hw), spec.family or spec.model_type, size_band(spec.total_params)


# --- reading --------------------------------------------------------------------------------------
class CorruptStore(Exception):
    """The file exists but is not a calibration store this version understands."""


def _parse(text: str) -> Store:
    try:
        return Store.model_validate_json(text)
    except ValidationError as exc:
        raise CorruptStore(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from exc


def _load(path: Path) -> Store:
    """The store at ``path`` (empty when there is none); raises CorruptStore or OSError."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return Store()
    except UnicodeDecodeError as exc:
        raise CorruptStore("not UTF-8 text") from exc
    return _parse(text)


def _aside_name(path: Path) -> Path:
    """A name next to ``path`` that nothing has: two stores set aside in the same second both survive."""
    stem = f"{path.name}.unreadable-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    n = 0
    while os.path.lexists(path.with_name(stem if n == 0 else f"{stem}-{n}")):
        n += 1
    return path.with_name(stem if n == 0 else f"{stem}-{n}")


def _set_aside(path: Path, why: str) -> Path | None:
    """Rename a store this version cannot read next to itself (under the store's lock, so the name chosen is
    still free), so nothing in it is lost; warn with its new name."""
    aside = _aside_name(path)
    try:
        os.replace(path, aside)
    except OSError as exc:
        warnings.warn(f"perfguide: calibration store {path} is unreadable ({why}) and could not be set aside ({exc}); "
                      "planning goes on uncalibrated", stacklevel=3)
        return None
    warnings.warn(f"perfguide: calibration store {path} was unreadable ({why}); kept it as {aside} and started a new one",
                  stacklevel=3)
    return aside


def _lock(path: Path):  # noqa: ANN202 - filelock's lock type is an implementation detail
    from filelock import FileLock

    return FileLock(str(path) + ".lock", timeout=LOCK_TIMEOUT_S)


def _load_or_set_aside(path: Path) -> Store:
    """Under the lock: the store, or (after setting an unreadable one aside) an empty one."""
    try:
        return _load(path)
    except CorruptStore as exc:
        _set_aside(path, str(exc))
        return Store()


# --- writing --------------------------------------------------------------------------------------
def write_store(path: Path, store: Store) -> None:
    """Replace the store whole (a temporary file in its folder, then ``os.replace``; its mode kept), or raise
    PerfGuideError leaving the old one as it was."""
    write_atomic(path, store.model_dump_json(indent=1), "calibration store")


def _cuda_context(verification: Verification) -> int | None:
    """NVML's used memory minus the allocator's reserved peak, only when nothing else was on the device."""
    m = verification.measured
    if m is None or not m.device_total or not m.peak_reserved or m.device_processes != 1:
        return None
    context = m.device_total - m.peak_reserved
    return context if 0 < context <= MAX_CUDA_CONTEXT else None


def step_spread(times: tuple[float, ...]) -> float | None:
    """Half the range of the steady step times over their mean: how far one step strays from the mean."""
    if len(times) < 2 or sum(times) <= 0:
        return None
    return (max(times) - min(times)) / (2 * (sum(times) / len(times)))


def make_run(rec: Recommendation, verification: Verification) -> Run:
    machine, family, band = scope_of(rec.hardware, rec.model)
    ratios = {c.quantity: c.ratio for c in verification.comparisons if math.isfinite(c.ratio) and c.ratio > 0}
    spread = step_spread(verification.measured.step_times_s) if verification.measured else None
    return Run(machine=machine, family=family, band=band, model=rec.model.name[:1000], setup=rec.setup.label[:1000],
               time=time.time(), ratios=ratios, spread={"step_time_s": spread} if spread is not None else {},
               cuda_context_bytes=_cuda_context(verification))


def _trim(runs: tuple[Run, ...]) -> tuple[Run, ...]:
    """Keep the newest KEEP_RUNS of each scope."""
    seen: dict[tuple[str, str, str], int] = {}
    kept: list[Run] = []
    for r in reversed(runs):
        n = seen.get(r.scope(), 0)
        if n < KEEP_RUNS:
            kept.append(r)
        seen[r.scope()] = n + 1
    return tuple(reversed(kept))


def record(rec: Recommendation, verification: Verification, path: Path | None = None) -> Path | None:
    """Append this verified run to the store; the path written, or None (with a warning) when it could not be.

    This is the one entry point for recording (``perfguide calibrate`` and ``PerfGuideCallback(record=True)``
    use it). Out-of-memory runs measured nothing and are not recorded.
    """
    if verification.oom or verification.measured is None:
        return None
    path = store_file(path)
    run = make_run(rec, verification)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with _lock(path):
            store = _load_or_set_aside(path)
            write_store(path, Store(runs=_trim((*store.runs, run))))
    except (OSError, TimeoutError, PerfGuideError) as exc:  # filelock.Timeout is a TimeoutError
        warnings.warn(f"perfguide: could not record the calibration run in {path} ({exc}); the measurement is still returned",
                      stacklevel=2)
        return None
    _factors_cached.cache_clear()
    return path


# --- turning runs into factors -----------------------------------------------------------------------
def sane(ratio: float) -> bool:
    return SANE_RATIO[0] <= ratio <= SANE_RATIO[1]


def robust_median(values: list[float]) -> float | None:
    """Median of the sane ratios after dropping outliers (> 3 MADs from the median in log space); with no sane
    ratio at all (a scope's first measurements), the median of what was measured: kept, not discarded."""
    finite = [v for v in values if v > 0 and math.isfinite(v)]
    logs = [math.log(v) for v in finite if sane(v)] or [math.log(v) for v in finite]
    if not logs:
        return None
    if len(logs) >= 3:
        mid = statistics.median(logs)
        mad = max(statistics.median(abs(x - mid) for x in logs), 0.02)
        logs = [x for x in logs if abs(x - mid) <= 3 * mad]
    return math.exp(statistics.median(logs))


def factors_from_runs(runs: list[Run], scope: str = "") -> Factors | None:
    if not runs:
        return None
    mem = robust_median([r.ratios[k] for r in runs for k in MEMORY_QUANTITIES if k in r.ratios])
    step = robust_median([r.ratios["step_time_s"] for r in runs if "step_time_s" in r.ratios])
    contexts = [r.cuda_context_bytes for r in runs if r.cuda_context_bytes]
    return Factors(memory=mem or 1.0, step_time=step or 1.0, samples=len(runs), scope=scope,
                   cuda_context_bytes=int(statistics.median(contexts)) if contexts else None)


def factors_for(hw: Hardware | None, spec: ModelSpec, path: Path | None = None) -> Factors | None:
    """This machine's calibration for models like ``spec``; None for a named target (somebody else's machine),
    when nothing similar was recorded, or when the store cannot be read (then with a warning)."""
    if hw is None or hw.source != "probe":
        return None
    path = store_file(path)
    try:
        st = path.stat()
    except OSError:
        return None
    return _factors_cached(str(path), st.st_mtime_ns, st.st_size, scope_of(hw, spec))


@lru_cache(maxsize=16)
def _factors_cached(path: str, mtime_ns: int, size: int, scope: tuple[str, str, str]) -> Factors | None:
    p = Path(path)
    try:
        store = _load(p)
    except CorruptStore as exc:
        try:
            with _lock(p):  # another process may have replaced it meanwhile: check again before renaming
                _load_or_set_aside(p)
        except (OSError, TimeoutError) as lock_exc:
            warnings.warn(f"perfguide: calibration store {p} is unreadable ({exc}; {lock_exc}); planning goes on uncalibrated",
                          stacklevel=4)
        return None
    except OSError as exc:
        warnings.warn(f"perfguide: calibration store {p} cannot be read ({exc}); planning goes on uncalibrated", stacklevel=4)
        return None
    runs = [r for r in store.runs if r.scope() == scope][-KEEP_RUNS:]
    return factors_from_runs(runs, scope=f"{scope[1]}, {scope[2]} parameters")
