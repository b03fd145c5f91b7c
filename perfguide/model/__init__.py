"""Model shapes and exact parameter counts: ``ModelSpec.from_any`` and the offline architecture catalog."""

from .catalog import catalog_names
from .resolve import spec_from_any

__all__ = ["catalog_names", "spec_from_any"]
