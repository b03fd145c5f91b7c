"""Speed cost model: FLOPs, achievable TFLOP/s, communication and offload time."""

from .types import Throughput


def estimate_speed(spec, setup, hardware):  # noqa: ANN001,ANN201
    from .model import estimate_speed as _impl

    return _impl(spec, setup, hardware)


__all__ = ["Throughput", "estimate_speed"]
