"""Text that came from outside (a config, NVML, /proc) made safe to show: no escapes, controls or bidi overrides.

Lives below every layer so the hardware probe can clean a device name as it reads it and the renderers can
clean whatever reaches a report; see perfguide.render.safe for why it matters.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

# ESC-introduced sequences (CSI ... final byte, OSC ... BEL/ST, and two-byte escapes), then any lone control char.
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]|\x9b[0-?]*[ -/]*[@-~]")
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")

def clean(text: str, keep_newlines: bool = False) -> str:
    """``text`` without escape sequences, control characters or bidi overrides (tabs become spaces)."""
    out = _CONTROLS.sub("", _ESCAPES.sub("", str(text)).replace("\t", " "))
    return out if keep_newlines else out.replace("\n", " ")


#: characters that make a name active markup in Markdown or HTML (links, images, tags, code spans, tables)
_MARKUP = re.compile(r"[<>\[\]`|{}*]|://")


def clean_data(value: Any, text: Callable[[str], str] | None = None) -> Any:
    """JSON-shaped data with every string (keys too) passed through ``text`` (default: ``clean``, newlines kept):
    what ``to_dict`` / ``to_json`` hand out, so a consumer that shows a field shows no escape or bidi override."""
    fix = text or (lambda s: clean(s, keep_newlines=True))
    if isinstance(value, str):
        return fix(value)
    if isinstance(value, dict):
        return {fix(k) if isinstance(k, str) else k: clean_data(v, fix) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean_data(v, fix) for v in value]
    return value


def plain_name(text: str) -> str:
    """A name from a config (``_name_or_path``) as inert text in every format: clean, and without the characters
    that turn Markdown or HTML into links, images, tags or code (hub ids and paths never need them)."""
    return _MARKUP.sub(lambda m: ":" if m.group() == "://" else "", clean(text)).strip()
