"""Strings from configs and hub metadata are data, not terminal commands.

A config's ``_name_or_path`` (or any string a model brings) can carry ANSI/OSC escape sequences that clear the
screen, set the window title or repaint a verdict, and bidi overrides that reorder what is shown. Every report
(text, rich, markdown) and every CLI message passes through ``clean`` before it is written.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from .._text import clean

T = TypeVar("T")


def _clean_any(value: Any) -> Any:
    if isinstance(value, str):
        return clean(value)
    if isinstance(value, tuple):
        return tuple(_clean_any(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(value, **{f.name: _clean_any(getattr(value, f.name)) for f in dataclasses.fields(value)})
    return value


def clean_document(doc: T) -> T:
    """Every string inside a (frozen dataclass) report document, cleaned."""
    return _clean_any(doc)
