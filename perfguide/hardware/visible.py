"""Which physical GPUs a CUDA process would see, decided without initialising CUDA.

NVML numbers GPUs in PCI bus order and ignores ``CUDA_VISIBLE_DEVICES``; CUDA numbers them
fastest-first unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, then keeps only (and reorders to) the
devices the variable names. So the probe maps CUDA ordinals to NVML devices itself:

* unset: every GPU (MIG-enabled GPUs contribute their MIG instances);
* integers: ordinals into CUDA's order. With ``PCI_BUS_ID`` that is NVML's order exactly;
  otherwise perfguide reproduces FASTEST_FIRST by ranking on the spec-sheet FP32 peak
  (CUDA cores x clock, what the heuristic ranks on), ties kept in PCI order. Identical GPUs
  rank identically, so only mixed boxes depend on the guess, and the probe says so;
* ``GPU-<uuid>`` / ``MIG-<uuid>``: prefixes of the UUIDs NVML reports, as CUDA accepts;
* ``""`` or ``"-1"``: nothing.

Parsing follows CUDA (and torch's NVML-based device count): the list stops at the first entry
that is invalid, negative or unmatched, and a repeated entry hides every device.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

Visible = list[int] | list[str] | None


@dataclass(frozen=True)
class Candidate:
    """One device CUDA could enumerate: a whole GPU (``mig_of`` None) or a MIG slice of NVML GPU ``mig_of``."""

    nvml_index: int
    uuid: str | None
    rank_key: float  # larger is faster; only used for FASTEST_FIRST
    mig_of: int | None = None
    ref: int = 0  # the caller's own handle for this device (position in its list)


def parse_visible_devices(value: str | None) -> Visible:
    """``CUDA_VISIBLE_DEVICES`` -> None (unset), ordinals, or UUID prefixes; [] hides everything."""
    if value is None:
        return None
    value = value.strip()
    for prefix in ("GPU-", "MIG-"):
        if value.startswith(prefix):
            return _prefixed(value, prefix)
    ordinals: list[int] = []
    for item in value.split(","):
        number = _leading_int(item.strip())
        if number is None or number < 0:
            break
        if number in ordinals:
            return []
        ordinals.append(number)
    return ordinals


def _prefixed(value: str, prefix: str) -> list[str]:
    found: list[str] = []
    for item in (part.strip() for part in value.split(",")):
        if item in found:
            return []
        if not item.startswith(prefix):
            break
        found.append(item)
    return found


def _leading_int(text: str) -> int | None:
    """strtoul-like: '1gpu' -> 1, '-1' -> -1, 'x' -> None (CUDA accepts the digits it can read)."""
    sign, digits = (text[0], text[1:]) if text[:1] in ("+", "-") else ("", text)
    end = len(digits) - len(digits.lstrip("0123456789"))
    return int(sign + digits[:end]) if end else None


def cuda_order(gpus: Sequence[Candidate], pci_bus_order: bool) -> list[Candidate]:
    """Whole GPUs in the order CUDA numbers them (see the module docstring)."""
    return list(gpus) if pci_bus_order else sorted(gpus, key=lambda g: -g.rank_key)


def select(
    gpus: Sequence[Candidate], migs: Sequence[Candidate], visible: Visible, pci_bus_order: bool
) -> tuple[list[Candidate], list[str]]:
    """The devices a CUDA process would see, in its ordinal order, plus notes on what was dropped.

    ``gpus`` are whole GPUs in NVML (PCI) order; ``migs`` are MIG slices of MIG-enabled ones.
    A MIG-enabled GPU is replaced by its slices, since CUDA cannot use it whole.
    """
    by_parent: dict[int, list[Candidate]] = {}
    for mig in migs:
        by_parent.setdefault(mig.mig_of, []).append(mig)  # type: ignore[arg-type]

    def expand(gpu: Candidate) -> list[Candidate]:
        return by_parent.get(gpu.nvml_index, [gpu])

    if visible is None:
        return [dev for gpu in cuda_order(gpus, pci_bus_order) for dev in expand(gpu)], []
    if not visible:
        return [], ["CUDA_VISIBLE_DEVICES hides every GPU"]
    if isinstance(visible[0], int):
        order = cuda_order(gpus, pci_bus_order)
        chosen: list[Candidate] = []
        for ordinal in visible:
            if ordinal >= len(order):
                return chosen, [f"CUDA_VISIBLE_DEVICES names GPU {ordinal} but only {len(order)} exist; ignoring it and later entries"]
            chosen.extend(expand(order[ordinal]))
        return chosen, []
    pool = list(migs) if str(visible[0]).startswith("MIG-") else list(gpus)
    return _by_uuid(pool, [str(v) for v in visible], expand)


def _by_uuid(
    pool: list[Candidate], prefixes: list[str], expand: Callable[[Candidate], list[Candidate]]
) -> tuple[list[Candidate], list[str]]:
    chosen: list[Candidate] = []
    for prefix in prefixes:
        matches = [dev for dev in pool if dev.uuid and dev.uuid.startswith(prefix)]
        if len(matches) != 1:
            why = "matches no" if not matches else "matches more than one"
            return chosen, [f"CUDA_VISIBLE_DEVICES entry {prefix!r} {why} GPU UUID; ignoring it and later entries"]
        if matches[0] in chosen:
            return [], ["CUDA_VISIBLE_DEVICES names the same GPU twice, which hides every GPU"]
        chosen.extend(expand(matches[0]) if matches[0].mig_of is None else [matches[0]])
    return chosen, []
