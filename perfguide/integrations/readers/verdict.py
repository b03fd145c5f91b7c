"""What ``perfguide.check`` returns: the verdict on a user's own config, and the changes, in the user's own keys."""

from __future__ import annotations

import json
from typing import Any, Literal

from ..._base import GiB, Model
from ...memory.types import MemoryEstimate
from ...setup import Setup
from ...speed.types import Throughput
from .base import Setting, nest


class Edit(Model):
    """Keys to change in one of the user's configs (dotted names for nested keys), in that config's syntax."""

    format: str
    source: str
    syntax: Literal["kwargs", "yaml", "json", "flags", "setup"]
    keys: dict[str, Any]

    def text(self) -> str:
        if self.syntax == "yaml":
            import yaml

            return str(yaml.safe_dump(nest(self.keys), sort_keys=False)).strip()
        if self.syntax == "json":
            return json.dumps(nest(self.keys))
        if self.syntax == "flags":
            import shlex  # pasted into a shell: a JSON object or a spaced value stays one word

            return " ".join(f"{k}" if v is True else f"{k} {shlex.quote(str(v))}" for k, v in self.keys.items())
        return ", ".join(f"{k}={v!r}" for k, v in nest(self.keys).items())


class Change(Model):
    """A change to the read Setup, priced: ``fit`` is the smallest one that makes it fit, ``recommended`` the move to
    the plan ``perfguide recommend`` picks for the same model, hardware, sequence length and global batch."""

    kind: Literal["fit", "recommended"]
    setup: dict[str, Any]
    edits: tuple[Edit, ...]
    fits: bool
    peak_gib: float
    tokens_per_s: float | None = None
    speedup: float | None = None
    reason: str = ""


class Check(Model):
    """The verdict on a config as written: does it fit, how fast, what was read, what was not, what to change."""

    model: str
    hardware: str
    setup: Setup
    fits: bool
    memory: MemoryEstimate
    throughput: Throughput | None = None
    read: tuple[Setting, ...]
    ignored: tuple[str, ...] = ()
    unknown: tuple[str, ...] = ()
    changes: tuple[Change, ...] = ()
    notes: tuple[str, ...] = ()

    def change(self, kind: str) -> Change | None:
        return next((c for c in self.changes if c.kind == kind), None)

    def report(self) -> str:
        return render(self)


def _edits(change: Change) -> list[str]:
    out = []
    for edit in change.edits:
        text = edit.text()
        label = f"{edit.source} ({edit.format})" if edit.syntax != "setup" else "perfguide Setup (no key in your configs)"
        if "\n" in text:
            out += [f"    {label}:", *(f"      {line}" for line in text.splitlines())]
        else:
            out.append(f"    {label}: {text}")
    return out


def _by_source(entries: tuple[str, ...]) -> list[str]:
    """``("a.json: x", "a.json: y")`` -> ``["  a.json: x, y"]``: one line per file, keys in the order read."""
    groups: dict[str, list[str]] = {}
    for entry in entries:
        source, _, key = entry.partition(": ")
        groups.setdefault(source, []).append(key)
    return [f"  {source}: {', '.join(keys)}" for source, keys in groups.items()]


def _speed(t: Throughput | None, m: MemoryEstimate) -> str:
    kv = "" if m.kv_cache_tokens is None else \
        f"KV cache: {m.kv_cache_tokens:,} tokens, max concurrency {m.max_concurrency or 0:.2f} requests of max_model_len\n"  # engine log
    if kv and t is None:
        return kv + "speed: not priced (the engine does not start)"
    if t is None:
        return "speed: not priced (no device)"
    return kv + f"speed: {t.tokens_per_s:,.0f} tokens/s, step {t.step_time_s:.3g} s" + (f", MFU {t.mfu:.0%}" if t.mfu else "")


#: how the check says the sequence length is its own guess (no config, and no library default, gave one)
GUESSED_LENGTH = "no sequence length in the configs"


def _assumed_length(c: Check) -> str:
    """The verdict holds at a length nothing gave (a config without a cap, a tool with no default): say so on the
    verdict's own line. A library's default cap (TRL's max_length 1,024) is the run's cap, listed with the rest."""
    length = next((s.value for s in c.read if s.field == "seq_len" and s.assumed and s.source.startswith(GUESSED_LENGTH)), None)
    return "" if length is None else f", at an assumed {length:,} tokens per sample (none read; pass --seq-len)"


def render(c: Check) -> str:
    m = c.memory
    room = f" of {m.capacity / GiB:.1f} GiB usable" if m.capacity else ""
    verdict = ("fits" if c.fits else "does NOT run (the attention kernel's 32-bit index; notes)" if m.kernel_limit
               else "does NOT start (notes)" if m.start_limit else "does NOT fit")
    lines = [f"perfguide check: {c.model} on {c.hardware}: {c.setup.label}",
             f"verdict: {verdict}: {m.device_total / GiB:.1f} GiB per device{room}"
             + (f", {m.cpu_ram / GiB:.1f} GiB host RAM" if m.cpu_ram else "") + _assumed_length(c),
             _speed(c.throughput, m), "", "read:"]
    width = max((len(f"{s.field} = {s.value!r}") for s in c.read), default=0)
    for s in c.read:
        shown = f"{s.field} = {s.value!r}"
        lines.append(f"  {shown:<{width}}  {'assumed: ' if s.assumed else ''}{s.source}")
    if c.ignored:
        lines += ["", "read, not priced (no effect on memory or speed here):", *_by_source(c.ignored)]
    if c.unknown:
        lines += ["", "unknown keys (not read):", *_by_source(c.unknown)]
    for change in c.changes:
        title = "to fit (smallest change)" if change.kind == "fit" else "toward the recommended plan"
        gain = f", x{change.speedup:.2f} tokens/s" if change.speedup else ""
        speed = f", {change.tokens_per_s:,.0f} tokens/s" if change.tokens_per_s else ""
        lines += ["", f"{title}: {change.peak_gib:.1f} GiB per device{speed}{gain}"]
        lines += _edits(change) if change.edits else [f"    {change.reason}"]
    if c.notes:
        lines += ["", "notes:", *(f"  - {n}" for n in c.notes)]
    return "\n".join(lines) + "\n"
