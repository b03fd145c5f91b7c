"""``python -m perfguide``: the same command as ``perfguide``."""

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
