"""``perfguide env``: what a bug report needs, in the ``- key: value`` style of ``accelerate env``.

It reports what ``accelerate env`` and ``transformers env`` do (versions of the HF stack incl. huggingface_hub,
safetensors and numpy, where the ``accelerate`` launcher is, the accelerate default config) plus the probed
machine and the launcher/visibility variables. Library versions come from package metadata (no import, so a
broken install still reports); only torch is imported, to say which accelerator it was built for, and the
accelerate default config is read as YAML from where accelerate keeps it, without importing accelerate.
"""

from __future__ import annotations

import os
import platform
import shutil
import sys
from pathlib import Path

from .._packages import installed_release
from .._version import __version__
from ..hardware.types import Hardware
from .hardware import gpu_summary
from .units import fmt_bytes

LIBRARIES = ("torch", "transformers", "accelerate", "peft", "trl", "bitsandbytes", "deepspeed", "flash-attn",
             "liger-kernel", "huggingface_hub", "safetensors", "tokenizers", "datasets", "numpy", "nvidia-ml-py",
             "pydantic", "psutil", "rich", "matplotlib")
ENV_VARS = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "PYTORCH_CUDA_ALLOC_CONF", "WORLD_SIZE", "LOCAL_RANK",
            "HF_HOME", "HF_HUB_OFFLINE", "TOKENIZERS_PARALLELISM")
HEADER = "Copy-and-paste the text below in your GitHub issue."


def library_version(name: str) -> str:
    return installed_release(name) or "not installed"


def torch_accelerator() -> str:
    """Which backend torch was built with and whether it sees a device; 'not installed' without torch."""
    try:
        import torch
    except ImportError:
        return "not installed"
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else ("ROCm " + torch.version.hip if torch.version.hip else "CPU only")
    return f"{build}, device available: {torch.cuda.is_available()}"


def accelerate_default_config_path() -> Path:
    """Where ``accelerate config`` saves and ``accelerate launch`` reads its default (accelerate
    commands/config/config_args.py: ``$HF_HOME/accelerate/default_config.yaml``, HF_HOME defaulting to
    ``$XDG_CACHE_HOME/huggingface``, that to ``~/.cache``)."""
    cache = os.environ.get("XDG_CACHE_HOME", "~/.cache")
    home = os.environ.get("HF_HOME", os.path.join(cache, "huggingface"))
    return Path(os.path.expanduser(home)) / "accelerate" / "default_config.yaml"


def accelerate_default_config() -> str:
    """The default config as ``key=value, ...`` (what ``accelerate env`` prints), or why there is none."""
    path = accelerate_default_config_path()
    if not path.is_file():
        return f"not found ({path})"
    try:
        import yaml

        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        return f"unreadable ({path}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"
    if not isinstance(data, dict):
        return f"not a mapping ({path})"
    return f"{path}: " + ", ".join(f"{k}={v}" for k, v in data.items())


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
    beside_python = str(Path(sys.executable).parent)  # a venv used without activating it
    info["`accelerate` bash location"] = shutil.which("accelerate") or shutil.which("accelerate", path=beside_python) or "not found"
    info["Accelerate default config"] = accelerate_default_config()
    info |= {name: os.environ.get(name, "not set") for name in ENV_VARS}
    return info | hardware_summary(hw)


def render_env(info: dict[str, str]) -> str:
    from .safe import clean

    return "\n".join([HEADER, "", *(f"- {clean(k)}: {clean(v)}" for k, v in info.items())]) + "\n"
