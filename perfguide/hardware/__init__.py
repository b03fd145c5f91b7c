"""Hardware: probe this machine, or name one to plan for."""

from .types import CPU, GPU, Hardware


def probe() -> Hardware:
    """Probe GPUs (NVML, never initialising CUDA), CPU and RAM. Never raises on driver trouble."""
    from .probe import probe as _probe

    return _probe()


__all__ = ["CPU", "GPU", "Hardware", "probe"]
