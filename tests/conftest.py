"""Session-wide isolation: perfguide's on-disk cache (trace results, calibration) lives in a temp dir, so a
developer's own `perfguide calibrate` runs can never change what the tests see. Also the accuracy bench and its
published rows, which several test files read."""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from helpers import load_bench, reset_accelerate_state

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True, scope="session")
def _isolated_perfguide_cache(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("PERFGUIDE_CACHE_DIR", str(tmp_path_factory.mktemp("perfguide-cache")))
    yield
    mp.undo()


@pytest.fixture(scope="module")
def acc() -> ModuleType:
    """bench/accuracy.py, imported as the bench runs it."""
    return load_bench("accuracy")


@pytest.fixture(scope="module")
def rows() -> dict[str, dict[str, str]]:
    """bench/data/published_measurements.csv by row_id (a test module may define its own ``rows``)."""
    with (ROOT / "bench" / "data" / "published_measurements.csv").open(encoding="utf-8") as fh:
        return {r["row_id"]: r for r in csv.DictReader(fh)}


@pytest.fixture
def gloo_group(tmp_path: Path) -> Iterator[None]:
    """A one-rank gloo process group (CPU) with a fresh accelerate state, for FSDP/DDP wraps in this process."""
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    from accelerate import PartialState

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    reset_accelerate_state()
    PartialState(cpu=True)  # accelerate's logging (its upcast warning) needs a state
    try:
        yield
    finally:
        reset_accelerate_state()
        dist.destroy_process_group()
