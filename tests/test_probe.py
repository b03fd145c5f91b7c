"""probe(): the real machine (no GPU, no NVML library here), and faults injected at the NVML boundary.

The fake below stands in for the ``pynvml`` module only (the one allowed mock): it answers the
NVML calls the probe makes from a list of fake boards and raises where a test says so.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import warnings
from dataclasses import dataclass, field
from types import SimpleNamespace

import psutil
import pynvml
import pytest

import perfguide
from perfguide.hardware.probe import ProbeWarning
from perfguide.hardware.visible import parse_visible_devices
from perfguide.memory.overhead import capacity_bytes
from perfguide.setup import Setup

MIB = 2**20
# by module path: the package attribute 'perfguide.hardware.probe' is also the name of a function
probe_module = importlib.import_module("perfguide.hardware.probe")


class NVMLError(Exception):
    pass


class NVMLError_LibraryNotFound(NVMLError):  # noqa: N801 - pynvml's spelling
    def __str__(self) -> str:
        return "NVML Shared Library Not Found"


class NVMLError_NotSupported(NVMLError):  # noqa: N801
    pass


class NVMLError_NotFound(NVMLError):  # noqa: N801
    pass


class NVMLError_InvalidArgument(NVMLError):  # noqa: N801
    pass


@dataclass
class Board:
    name: str
    uuid: str
    total_mib: int
    cc: tuple[int, int] = (8, 0)
    sms: int | None = None  # None: nvmlDeviceGetAttributes not supported
    free_mib: int | None = None
    nvlinks: int | None = None  # active links; None: NVLink not supported
    migs: list[Board] | None = None  # MIG mode on with these instances
    processes: list[tuple[int, int]] = field(default_factory=list)  # (pid, MiB) of other processes on the board
    reserved_mib: int | None = 0  # NVML v2 'reserved' (the driver's share); None: the driver answers v1 only
    fail: set[str] = field(default_factory=set)  # NVML calls that raise for this board


class FakeNVML:
    """Duck-types the subset of pynvml the probe uses."""

    NVML_NVLINK_MAX_LINKS = 18
    NVML_DEVICE_MIG_ENABLE = 1

    def __init__(self, boards: list[Board], init_error: Exception | None = None, count_error: bool = False) -> None:
        self.boards, self.init_error, self.count_error = boards, init_error, count_error
        self.initialised = self.shut_down = False

    def _check(self, board: Board, call: str) -> Board:
        if call in board.fail:
            raise NVMLError(f"Unknown Error in {call}")
        return board

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.shut_down = True

    def nvmlDeviceGetCount(self) -> int:
        if self.count_error:
            raise NVMLError("GPU is lost")
        return len(self.boards)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Board:
        return self._check(self.boards[index], "handle")

    def nvmlDeviceGetName(self, h: Board) -> str:
        return self._check(h, "name").name

    def nvmlDeviceGetUUID(self, h: Board) -> str:
        return self._check(h, "uuid").uuid

    nvmlMemory_v2 = pynvml.nvmlMemory_v2  # noqa: N815 - pynvml's spelling

    def nvmlDeviceGetMemoryInfo(self, h: Board, version: int | None = None) -> object:
        """pynvml's own structs: v1 (total, free, used) or, asked with nvmlMemory_v2, v2 with the driver's reserve."""
        self._check(h, "memory")
        free = (h.total_mib - (h.reserved_mib or 0) if h.free_mib is None else h.free_mib) * MIB
        if not version:
            return pynvml.c_nvmlMemory_t(total=h.total_mib * MIB, free=free, used=h.total_mib * MIB - free)
        if h.reserved_mib is None:
            raise NVMLError_NotSupported("Function Not Found")  # a driver before the v2 call
        return pynvml.c_nvmlMemory_v2_t(version=version, total=h.total_mib * MIB, reserved=h.reserved_mib * MIB,
                                        free=free, used=h.total_mib * MIB - free)

    def nvmlDeviceGetCudaComputeCapability(self, h: Board) -> tuple[int, int]:
        return self._check(h, "cc").cc

    def nvmlDeviceGetComputeRunningProcesses(self, h: Board) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=pid, usedGpuMemory=mib * MIB) for pid, mib in h.processes]

    def nvmlDeviceGetAttributes(self, h: Board) -> SimpleNamespace:
        if h.sms is None:
            raise NVMLError_NotSupported("Not Supported")
        return SimpleNamespace(multiprocessorCount=h.sms)

    def nvmlDeviceGetMigMode(self, h: Board) -> list[int]:
        if h.migs is None:
            raise NVMLError_NotSupported("Not Supported")
        return [1, 1]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: Board) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: Board, index: int) -> Board:
        if h.migs is None or index >= len(h.migs):
            raise NVMLError_NotFound("Not Found")
        return h.migs[index]

    def nvmlDeviceGetNvLinkState(self, h: Board, link: int) -> int:
        if h.nvlinks is None:
            raise NVMLError_NotSupported("Not Supported")
        if link >= 12:  # an A100 has 12 links; beyond them NVML says Invalid Argument
            raise NVMLError_InvalidArgument("Invalid Argument")
        return int(link < h.nvlinks)


def a100(i: int, **kw: object) -> Board:
    return Board("NVIDIA A100-SXM4-80GB", f"GPU-a100000{i}-1111-2222-3333-444444444444", 81920, (8, 0), 108, **kw)  # type: ignore[arg-type]


def t4(i: int, **kw: object) -> Board:
    return Board("Tesla T4", f"GPU-7400000{i}-aaaa-bbbb-cccc-dddddddddddd", 15360, (7, 5), None, **kw)  # type: ignore[arg-type]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch):
    """Install a FakeNVML built from boards; clears the CUDA env vars the probe reads."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)

    def install(boards: list[Board], **kw: object) -> FakeNVML:
        nvml = FakeNVML(boards, **kw)  # type: ignore[arg-type]
        monkeypatch.setattr(probe_module, "_nvml", lambda: nvml)
        return nvml

    return install


def quiet_probe() -> perfguide.Hardware:
    """probe() with no ProbeWarning allowed (turns one into an error)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", ProbeWarning)
        return perfguide.probe()


# --- the real machine -------------------------------------------------------------------------

def test_real_probe_is_cpu_only_with_a_warning_and_real_cpu_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hw = perfguide.probe()
    assert hw.source == "probe" and hw.nodes == 1
    cpu = hw.cpu
    assert 1 <= cpu.physical_cores <= cpu.logical_cores <= (psutil.cpu_count() or 1)
    assert cpu.logical_cores <= len(os.sched_getaffinity(0))
    assert 0 < cpu.ram_available <= cpu.ram_total <= psutil.virtual_memory().total
    assert cpu.fp32_gflops is not None and cpu.fp32_gflops > 0
    with open("/proc/cpuinfo") as f:
        assert ("avx2" in f.read().split()) == ("avx2" in cpu.flags)
    if hw.has_gpu:  # the same test run on a GPU machine: whatever NVML says must be self-consistent
        assert all(0 < g.memory_free <= g.memory_total for g in hw.gpus)
        return
    assert hw.gpus == () and hw.interconnect == "none"
    probe_warnings = [w for w in caught if issubclass(w.category, ProbeWarning)]
    assert probe_warnings and hw.warnings
    assert str(probe_warnings[0].message) in hw.warnings
    assert "CPU-only" in hw.warnings[0]


def test_probe_does_not_import_torch() -> None:
    code = "import sys, warnings, perfguide; warnings.simplefilter('ignore'); perfguide.probe(); print(sorted(m for m in ('torch', 'transformers', 'accelerate') if m in sys.modules))"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True, timeout=120)
    assert out.stdout.strip() == "[]"


def test_pynvml_not_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes 'import pynvml' raise ImportError
    with pytest.warns(ProbeWarning, match="nvidia-ml-py"):
        hw = perfguide.probe()
    assert not hw.has_gpu and hw.cpu.physical_cores >= 1


# --- NVML faults ------------------------------------------------------------------------------

def test_library_missing(fake) -> None:
    nvml = fake([a100(0)], init_error=NVMLError_LibraryNotFound())
    with pytest.warns(ProbeWarning, match="no NVIDIA driver"):
        hw = perfguide.probe()
    assert hw.gpus == () and "libnvidia-ml" in hw.warnings[0] and not nvml.shut_down


def test_init_failure(fake) -> None:
    fake([a100(0)], init_error=NVMLError("Insufficient Permissions"))
    with pytest.warns(ProbeWarning, match="failed to initialise .*Insufficient Permissions"):
        hw = perfguide.probe()
    assert not hw.has_gpu


def test_count_failure_still_shuts_nvml_down(fake) -> None:
    nvml = fake([a100(0)], count_error=True)
    with pytest.warns(ProbeWarning, match="could not count"):
        hw = perfguide.probe()
    assert not hw.has_gpu and nvml.shut_down


def test_unexpected_binding_behaviour_never_raises(fake, monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = fake([a100(0)])
    monkeypatch.setattr(nvml, "nvmlDeviceGetMemoryInfo", lambda h: object(), raising=False)  # no .total
    with pytest.warns(ProbeWarning, match="failed unexpectedly"):
        hw = perfguide.probe()
    assert not hw.has_gpu and nvml.shut_down


def test_one_gpu_failing_is_left_out_and_others_kept(fake) -> None:
    nvml = fake([a100(0), a100(1, fail={"handle"}), a100(2)])
    with pytest.warns(ProbeWarning, match="GPU 1: NVML could not open it"):
        hw = perfguide.probe()
    assert [g.uuid for g in hw.gpus] == [nvml.boards[0].uuid, nvml.boards[2].uuid]
    assert [g.index for g in hw.gpus] == [0, 1]
    assert any("could not be read" in w for w in hw.warnings)


def test_failed_fields_fall_back_to_the_spec_sheet(fake) -> None:
    fake([a100(0, fail={"memory", "cc", "uuid"})])
    with pytest.warns(ProbeWarning, match="memory .*compute capability|compute capability"):
        hw = perfguide.probe()
    (gpu,) = hw.gpus
    # A100-SXM4-80GB: nvidia-smi total 81920 MiB, cc 8.0 (used because NVML did not answer); assumed idle, so free is
    # what CUDA can allocate there: torch's published "total capacity of 79.14 GiB"
    assert gpu.memory_total == 81920 * MIB
    assert gpu.memory_free == gpu.allocatable == round(79.14 * 2**30)
    assert gpu.compute_capability == (8, 0) and gpu.uuid is None and gpu.bf16_tflops == 312


def test_unknown_model_keeps_nvml_facts_without_speeds(fake) -> None:
    fake([Board("NVIDIA Imaginary X1", "GPU-x1", 32768, (10, 0), 200)])
    with pytest.warns(ProbeWarning, match="no spec-sheet entry"):
        hw = perfguide.probe()
    (gpu,) = hw.gpus
    assert gpu.name == "NVIDIA Imaginary X1" and gpu.memory_total == 32768 * MIB and gpu.multiprocessors == 200
    assert gpu.bf16_tflops is None and gpu.supports_bf16


def test_healthy_gpu_reads_nvml_values(fake) -> None:
    nvml = fake([t4(0, free_mib=15000)])
    hw = quiet_probe()
    (gpu,) = hw.gpus
    assert (gpu.name, gpu.uuid, gpu.index) == ("Tesla T4", nvml.boards[0].uuid, 0)
    assert gpu.memory_total == 15360 * MIB and gpu.memory_free == 15000 * MIB
    # T4 datasheet: cc 7.5, 40 SMs (from the table: nvmlDeviceGetAttributes is unsupported before Ampere), 65 FP16 TFLOP/s
    assert gpu.compute_capability == (7, 5) and gpu.multiprocessors == 40 and gpu.fp16_tflops == 65
    assert not gpu.supports_bf16 and hw.interconnect == "none" and hw.warnings == ()
    assert nvml.shut_down


# --- MIG and mixed boxes ----------------------------------------------------------------------

def mig_a100() -> Board:
    slices = [
        Board("NVIDIA A100-SXM4-40GB MIG 3g.20gb", "MIG-aaaa1111-0000-0000-0000-000000000000", 19968, sms=42),
        Board("NVIDIA A100-SXM4-40GB MIG 1g.5gb", "MIG-bbbb2222-0000-0000-0000-000000000000", 4864, sms=14),
    ]
    return Board("NVIDIA A100-SXM4-40GB", "GPU-mig00000-1111-2222-3333-444444444444", 40960, (8, 0), 108, migs=slices)


def test_mig_instances_reported_with_their_own_memory(fake) -> None:
    fake([mig_a100()])
    hw = quiet_probe()
    assert [g.mig for g in hw.gpus] == [True, True]
    assert [g.memory_total for g in hw.gpus] == [19968 * MIB, 4864 * MIB]
    assert [g.multiprocessors for g in hw.gpus] == [42, 14]
    assert all(g.compute_capability == (8, 0) for g in hw.gpus)
    # the 3g slice has 42 of 108 SMs: 312 * 42 / 108 bf16 TFLOP/s
    assert hw.gpus[0].bf16_tflops == pytest.approx(312 * 42 / 108, abs=0.01)
    assert hw.smallest_gpu is hw.gpus[1] and hw.interconnect == "pcie"


def test_mig_uuid_in_cuda_visible_devices(fake, monkeypatch: pytest.MonkeyPatch) -> None:
    fake([mig_a100()])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-bbbb")
    (gpu,) = quiet_probe().gpus
    assert gpu.uuid == "MIG-bbbb2222-0000-0000-0000-000000000000" and gpu.memory_total == 4864 * MIB and gpu.index == 0


def test_mig_mode_without_instances_is_unusable(fake) -> None:
    board = mig_a100()
    board.migs = []
    fake([board, a100(1)])
    with pytest.warns(ProbeWarning, match="MIG mode but has no MIG instances"):
        hw = perfguide.probe()
    assert [g.name for g in hw.gpus] == ["NVIDIA A100-SXM4-80GB"]


def test_mixed_models_keep_all_and_smallest_gpu_is_the_t4(fake) -> None:
    fake([a100(0), t4(1)])
    hw = quiet_probe()
    assert sorted(g.name for g in hw.gpus) == ["NVIDIA A100-SXM4-80GB", "Tesla T4"]
    assert hw.smallest_gpu is not None and hw.smallest_gpu.name == "Tesla T4"
    assert hw.interconnect == "pcie"
    assert hw.intra_node_bandwidth_gbps == 16  # T4: PCIe Gen3 x16, 32 GB/s both ways; the slowest link decides


def test_mixed_indices_guess_fastest_first_and_say_so(fake, monkeypatch: pytest.MonkeyPatch) -> None:
    fake([t4(0), a100(1)])  # PCI order: T4 first
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with pytest.warns(ProbeWarning, match="CUDA_DEVICE_ORDER=PCI_BUS_ID"):
        hw = perfguide.probe()
    assert [g.name for g in hw.gpus] == ["NVIDIA A100-SXM4-80GB"]  # CUDA's fastest-first ordinal 0
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    assert [g.name for g in quiet_probe().gpus] == ["Tesla T4"]


# --- CUDA_VISIBLE_DEVICES ---------------------------------------------------------------------

def test_visible_indices_select_and_reorder(fake, monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = fake([a100(i) for i in range(4)])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    hw = quiet_probe()
    assert [g.uuid for g in hw.gpus] == [nvml.boards[2].uuid, nvml.boards[0].uuid]
    assert [g.index for g in hw.gpus] == [0, 1]


def test_visible_index_out_of_range_stops_the_list(fake, monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = fake([a100(i) for i in range(2)])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,7,0")
    hw = quiet_probe()
    assert [g.uuid for g in hw.gpus] == [nvml.boards[1].uuid]
    assert any("GPU 7" in w for w in hw.warnings)


def test_visible_uuid_prefixes(fake, monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = fake([a100(0), t4(1)])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-74,GPU-a100000")
    hw = quiet_probe()
    assert [g.uuid for g in hw.gpus] == [nvml.boards[1].uuid, nvml.boards[0].uuid]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-")  # ambiguous prefix: CUDA stops there
    hw = quiet_probe()
    assert hw.gpus == () and any("more than one" in w for w in hw.warnings)


@pytest.mark.parametrize("value", ["", "-1", "0,0"])
def test_visible_hides_everything(fake, monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    nvml = fake([a100(0), a100(1)])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
    hw = quiet_probe()  # a deliberate choice, not a degraded probe: no ProbeWarning
    assert hw.gpus == () and "hides every GPU" in hw.warnings[0] and not nvml.initialised


@pytest.mark.parametrize(("value", "parsed"), [
    (None, None), ("", []), ("-1", []), ("0,1", [0, 1]), (" 3 , 1 ", [3, 1]), ("1gpu,2", [1, 2]),
    ("0,-1,2", [0]), ("0,x,2", [0]), ("1,1", []), ("GPU-ab,GPU-cd", ["GPU-ab", "GPU-cd"]), ("GPU-ab,0", ["GPU-ab"]),
    ("MIG-ab", ["MIG-ab"]), ("GPU-ab,GPU-ab", []),
])
def test_parse_visible_devices_like_cuda(value: str | None, parsed: list | None) -> None:
    assert parse_visible_devices(value) == parsed


# --- NVLink -----------------------------------------------------------------------------------

def test_nvlink_detected(fake) -> None:
    fake([a100(i, nvlinks=12) for i in range(8)])
    hw = quiet_probe()
    assert hw.gpu_count == 8 and hw.interconnect == "nvlink"
    assert hw.intra_node_bandwidth_gbps == 300  # A100 SXM: 600 GB/s NVLink both ways


def test_links_present_but_down_is_pcie(fake) -> None:
    fake([a100(i, nvlinks=0) for i in range(2)])
    hw = quiet_probe()
    assert hw.interconnect == "pcie" and hw.intra_node_bandwidth_gbps == 32  # A100: PCIe Gen4 64 GB/s both ways


def test_nvlink_errors_mean_pcie_and_one_gpu_means_none(fake, monkeypatch: pytest.MonkeyPatch) -> None:
    fake([t4(0), t4(1)])
    assert quiet_probe().interconnect == "pcie"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    hw = quiet_probe()
    assert hw.interconnect == "none" and hw.intra_node_bandwidth_gbps is None and hw.gpu_count == 1


# --- GPUs other processes already use ----------------------------------------------------------

@pytest.mark.parametrize("free_mib", [0, 1024])
def test_a_busy_gpu_is_planned_on_what_is_free_and_says_who_holds_the_rest(fake, free_mib: int) -> None:
    used = 81920 - free_mib
    fake([a100(0, free_mib=free_mib, processes=[(4242, used - 512), (777, 512)])])
    hw = quiet_probe()
    (note,) = [w for w in hw.warnings if "in use" in w]
    assert "pid 4242" in note and "pid 777" in note and f"{used / 1024:.1f} GiB of 80.0 GiB" in note
    assert ("nothing fits" in note) == (free_mib == 0)
    from perfguide.memory.overhead import capacity_bytes
    from perfguide.setup import Setup

    # free memory reading 0 is a full GPU, not an empty one
    assert capacity_bytes(hw, Setup()) == free_mib * MIB
    rec = perfguide.recommend("gpt2", "train_gpu_one", hardware=hw)
    assert rec.memory.capacity == free_mib * MIB
    if free_mib == 0:
        assert not rec.fits


def test_nvml_v2_reserve_is_taken_off_what_plans_fit_in(fake) -> None:
    """NVML v2 (pynvml's c_nvmlMemory_v2_t) says what the driver holds back; an idle A100 with 881 MiB reserved
    offers 81,039 MiB, is not reported busy, and the report names the figure."""
    fake([a100(0, reserved_mib=881)])
    hw = quiet_probe()
    (gpu,) = hw.gpus
    assert gpu.memory_total == 81920 * MIB and gpu.allocatable == gpu.memory_free == (81920 - 881) * MIB
    assert capacity_bytes(hw, Setup(num_gpus=1)) == (81920 - 881) * MIB
    assert gpu.memory_usable_source is not None and "881 MiB reserved by the driver" in gpu.memory_usable_source


def test_v1_only_driver_takes_the_cards_published_reserve(fake) -> None:
    """No v2 call (older driver): the gpus.json row's reserve comes off (A100 80GB: 81,920 MiB board, torch prints
    79.14 GiB); an unknown card keeps NVML's total (reserve unknown, 0)."""
    fake([a100(0, reserved_mib=None), Board("NVIDIA Imaginary X1", "GPU-x1", 32768, (10, 0), 200, reserved_mib=None)])
    with pytest.warns(ProbeWarning, match="no spec-sheet entry"):
        hw = perfguide.probe()
    known, unknown = hw.gpus
    assert known.allocatable == round(79.14 * 2**30) and known.memory_reserved == 81920 * MIB - round(79.14 * 2**30)
    assert unknown.memory_reserved == 0 and unknown.allocatable == 32768 * MIB
