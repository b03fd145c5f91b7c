"""``perfguide env``: what a bug report needs, in the ``- key: value`` style of ``accelerate env``.

Library versions come from package metadata (no import, so a broken install still reports); only torch is
imported, to say which accelerator it was built for.
"""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata

from .._version import __version__
from ..hardware.types import Hardware
from .hardware import gpu_summary
from .units import fmt_bytes

LIBRARIES = ("torch", "transformers", "accelerate", "peft", "bitsandbytes", "deepspeed", "flash-attn", "trl",
             "nvidia-ml-py", "pydantic", "rich", "matplotlib")
ENV_VARS = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "PYTORCH_CUDA_ALLOC_CONF", "WORLD_SIZE", "LOCAL_RANK",
            "HF_HUB_OFFLINE", "TOKENIZERS_PARALLELISM")
HEADER = "Copy-and-paste the text below in your GitHub issue."


def library_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def torch_accelerator() -> str:
    """Which backend torch was built with and whether it sees a device; 'not installed' without torch."""
    try:
        import torch
    except ImportError:
        return "not installed"
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else ("ROCm " + torch.version.hip if torch.version.hip else "CPU only")
    return f"{build}, device available: {torch.cuda.is_available()}"


def hardware_summary(hw: Hardware) -> dict[str, str]:
    return {
        "GPUs": gpu_summary(hw),
        "CPU": f"{hw.cpu.model_name} ({hw.cpu.physical_cores} physical / {hw.cpu.logical_cores} logical cores)",
        "RAM": f"{fmt_bytes(hw.cpu.ram_total)} total, {fmt_bytes(hw.cpu.ram_available)} available",
        "probe warnings": "; ".join(hw.warnings) or "none",
    }


def env_report(hw: Hardware) -> dict[str, str]:
    """Versions, accelerator, launcher/visibility variables and the probed machine, as one flat dict."""
    info = {"perfguide": __version__, "Platform": platform.platform(), "Python": sys.version.split()[0]}
    info |= {name: library_version(name) for name in LIBRARIES}
    info["PyTorch accelerator"] = torch_accelerator()
    info |= {name: os.environ.get(name, "not set") for name in ENV_VARS}
    return info | hardware_summary(hw)


def render_env(info: dict[str, str]) -> str:
    from .safe import clean

    return "\n".join([HEADER, "", *(f"- {clean(k)}: {clean(v)}" for k, v in info.items())]) + "\n"
