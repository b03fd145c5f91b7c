"""Memory cost model: analytic (fast, default) and traced (exact, on fake tensors)."""

from .types import MemoryEstimate


def estimate_memory(spec, setup, hardware=None):  # noqa: ANN001,ANN201 - re-exported below with types
    from .analytic import estimate_memory as _impl

    return _impl(spec, setup, hardware)


__all__ = ["MemoryEstimate", "estimate_memory"]
