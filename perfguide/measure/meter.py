"""Peak memory and step time of the running process, on CUDA or CPU.

CPU has no allocator statistics, so a background thread samples RSS; CUDA uses the caching allocator's own
peak counters plus NVML for what nvidia-smi would show.
"""

from __future__ import annotations

import threading
import time

import psutil


class RssSampler:
    """Samples this process's RSS every ``interval`` seconds and keeps the maximum."""

    def __init__(self, interval: float = 0.002) -> None:
        self.interval = interval
        self._proc = psutil.Process()
        self.baseline = self._proc.memory_info().rss
        self.peak = self.baseline
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._proc.memory_info().rss)
            self._stop.wait(self.interval)

    def start(self) -> RssSampler:
        self._thread.start()
        return self

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(timeout=1)
        self.peak = max(self.peak, self._proc.memory_info().rss)
        return self.peak


def cuda_device_used(index: int = 0) -> int | None:
    """Device memory in use as nvidia-smi reports it; None when NVML is unavailable."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index)).used)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - a missing driver must not break a measurement
        return None


def cuda_device_processes(index: int = 0) -> int | None:
    """Processes (compute and graphics) holding memory on the device; None when NVML cannot say.

    A CUDA context is only measurable as "used minus reserved" when this process is alone on the device;
    with another tenant the difference is that tenant's memory."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            procs = [*pynvml.nvmlDeviceGetComputeRunningProcesses(handle), *pynvml.nvmlDeviceGetGraphicsRunningProcesses(handle)]
            return len({p.pid for p in procs})
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - a missing driver must not break a measurement
        return None


class StepTimer:
    """Times steps; the first ``warmup`` steps (allocations, compilation) are not averaged."""

    def __init__(self, warmup: int = 1) -> None:
        self.warmup = warmup
        self.durations: list[float] = []
        self._t0: float | None = None

    def begin(self) -> None:
        self._t0 = time.perf_counter()

    def end(self) -> None:
        if self._t0 is not None:
            self.durations.append(time.perf_counter() - self._t0)
            self._t0 = None

    @property
    def steady(self) -> list[float]:
        """The steps after warm-up (all of them when there were no more)."""
        return self.durations[self.warmup:] or self.durations

    @property
    def mean(self) -> float | None:
        steady = self.steady
        return sum(steady) / len(steady) if steady else None
