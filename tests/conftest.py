"""Session-wide isolation: perfguide's on-disk cache (trace results, calibration) lives in a temp dir, so a
developer's own `perfguide calibrate` runs can never change what the tests see."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="session")
def _isolated_perfguide_cache(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("PERFGUIDE_CACHE_DIR", str(tmp_path_factory.mktemp("perfguide-cache")))
    yield
    mp.undo()
