"""Named targets: plan for a machine you do not have, e.g. ``"a100-80gb:8"`` or ``"h100:8x4"``.

Grammar: ``NAME``, ``NAME:COUNT`` (GPUs per node) or ``NAME:COUNTxNODES``; case, spaces and
underscores do not matter, and ``80g`` means ``80gb``. ``"cpu"`` is a GPU-less host.

Ambiguous short names resolve to the variant that cannot out-promise the real card, because
the plan's job is to not run out of memory: ``a100`` -> ``a100-40gb``, ``v100`` -> ``v100-16gb``.
``h100`` -> ``h100-80gb`` (SXM): both H100 boards hold 80 GB, SXM is the common training part.
The chosen key is kept in ``Hardware.name`` so reports show what was assumed.
"""

from __future__ import annotations

import re

from ..errors import UnknownHardwareError, unknown_value
from . import specs
from .types import Hardware

MAX_GPUS_PER_NODE = 16  # DGX-2 / HGX-2 boards; larger counts are several nodes
MAX_NODES = 100_000      # Setup.nodes' own bound
_COUNT = re.compile(r"^\s*(?P<count>[+-]?\d+)\s*(?:[x*]\s*(?P<nodes>[+-]?\d+)\s*)?$", re.IGNORECASE)
_EXAMPLE = "e.g. 'a100-80gb', 'h100:8' or 'h100:8x4' (8 GPUs per node, 4 nodes)"


def known_names() -> list[str]:
    """Every canonical target name Hardware.from_name accepts (aliases aside)."""
    return [*specs.canonical_names(), "cpu"]


def hardware_from_name(name: str) -> Hardware:
    """Build the Hardware a named target stands for: idle, spec-sheet GPUs on a default host."""
    if not isinstance(name, str) or not name.strip():
        raise UnknownHardwareError(f"empty hardware name {name!r}; expected NAME or NAME:COUNT, {_EXAMPLE}.")
    base, sep, count_text = name.strip().partition(":")
    base = base.strip()
    if not base:
        raise UnknownHardwareError(f"hardware {name!r} has no GPU name before ':'; {_EXAMPLE}.")
    gpus_per_node, nodes = _parse_count(name, count_text) if sep else (1, 1)
    if specs.normalize(base) == "cpu":
        if sep:
            raise UnknownHardwareError(f"hardware {name!r}: 'cpu' takes no count; use 'cpu' for a GPU-less host.")
        return Hardware(cpu=specs.default_cpu(), source="named", name="cpu")
    key = specs.resolve(base)
    if key is None:
        raise unknown_value("hardware", base, known_names(), UnknownHardwareError)
    return _build(key, gpus_per_node, nodes)


def _parse_count(name: str, text: str) -> tuple[int, int]:
    """'8' -> (8, 1), '8x4' -> (8, 4); anything else is one clear error naming the accepted form."""
    match = _COUNT.match(text)
    if match is None:
        raise UnknownHardwareError(f"hardware {name!r}: GPU count {text!r} is not a whole number; {_EXAMPLE}.")
    digits = max(len(match["count"]), len(match["nodes"] or ""))
    if digits > 9:  # int() of a 4,300+ digit string raises; nothing that long is a machine
        raise UnknownHardwareError(f"hardware {name[:40]!r}...: a count of {digits} digits is not a machine; GPUs per node are "
                                   f"1..{MAX_GPUS_PER_NODE} and nodes 1..{MAX_NODES:,}; {_EXAMPLE}.")
    count, nodes = int(match["count"]), int(match["nodes"] or 1)
    if count < 1:
        raise UnknownHardwareError(f"hardware {name!r}: GPU count must be >= 1, got {count}; {_EXAMPLE}.")
    if nodes < 1:
        raise UnknownHardwareError(f"hardware {name!r}: node count must be >= 1, got {nodes}; {_EXAMPLE}.")
    if nodes > MAX_NODES:
        raise UnknownHardwareError(f"hardware {name!r}: {nodes:,} nodes is more than the {MAX_NODES:,} a plan can describe; "
                                   f"use 1..{MAX_NODES:,} nodes; {_EXAMPLE}.")
    if count > MAX_GPUS_PER_NODE:
        raise UnknownHardwareError(
            f"hardware {name!r}: {count} GPUs in one node is more than {MAX_GPUS_PER_NODE}; "
            f"write GPUS_PER_NODExNODES, e.g. ':8x{-(-count // 8)}'."
        )
    return count, nodes


def _build(key: str, count: int, nodes: int) -> Hardware:
    link = specs.default_link(key) if count > 1 else "none"
    return Hardware(
        gpus=tuple(specs.gpu_from_spec(key, index=i) for i in range(count)),
        cpu=specs.default_cpu(),
        interconnect=link,
        intra_node_bandwidth_gbps=specs.link_bandwidth_gbps(key, link),
        inter_node_bandwidth_gbps=specs.inter_node_bandwidth_gbps() if nodes > 1 else None,
        nodes=nodes,
        source="named",
        name=key if (count, nodes) == (1, 1) else f"{key}:{count}" + (f"x{nodes}" if nodes > 1 else ""),
    )
