"""Hardware: probe this machine, or name one to plan for.

``probe`` is imported eagerly: a lazy wrapper would be shadowed by the ``probe`` submodule once imported.
The probe module itself is light (pynvml and psutil are loaded inside its functions).
"""

from .probe import probe
from .types import CPU, GPU, Hardware

__all__ = ["CPU", "GPU", "Hardware", "probe"]
