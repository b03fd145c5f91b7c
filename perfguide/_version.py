"""The one place the version lives (pyproject reads it from here)."""

__version__ = "0.1.0"
