"""``python -m perfguide``: the same command as ``perfguide``.

Ctrl-C while the command's modules are still importing (torch takes seconds) exits 130 like Ctrl-C later on,
with one line instead of an import traceback.
"""

import sys

if __name__ == "__main__":
    try:
        from .cli import main

        code = main()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        code = 130
    raise SystemExit(code)
