"""Named targets: plan for a machine you do not have, e.g. ``"a100-80gb:8"`` or ``"h100:8x4"``.

Grammar: ``NAME``, ``NAME:COUNT`` (GPUs per node) or ``NAME:COUNTxNODES``; case, spaces and
underscores do not matter, and ``80g`` means ``80gb``. ``"cpu"`` is a GPU-less host.

Ambiguous short names resolve to the variant that cannot out-promise the real card, because
the plan's job is to not run out of memory: ``a100`` -> ``a100-40gb``, ``v100`` -> ``v100-16gb``.
``h100`` -> ``h100-80gb`` (SXM): both H100 boards hold 80 GB, SXM is the common training part.
The chosen key is kept in ``Hardware.name`` so reports show what was assumed.

Node types (``dgx-h100``, ``p5.48xlarge``, ``nd96isr-h100-v5``...) are GPUs on the host those machines ship
with (cores, RAM, network); a bare GPU name gets a generic host. ``host_ram`` replaces the RAM of any target.
"""

from __future__ import annotations

import re

from ..errors import UnknownHardwareError, did_you_mean
from . import specs
from .types import CPU, Hardware

MAX_GPUS_PER_NODE = 16  # DGX-2 / HGX-2 boards; larger counts are several nodes
MAX_NODES = 100_000      # Setup.nodes' own bound
_COUNT = re.compile(r"^\s*(?P<count>[+-]?\d+)\s*(?:[x*]\s*(?P<nodes>[+-]?\d+)\s*)?$", re.IGNORECASE)
_EXAMPLE = "e.g. 'a100-80gb', 'h100:8' or 'h100:8x4' (8 GPUs per node, 4 nodes)"


_BYTES = re.compile(r"^\s*(?P<n>\d+(?:\.\d+)?)\s*(?P<unit>[kmgtp]i?b?|b)?\s*$", re.IGNORECASE)
_UNITS = {"": 2**30, "b": 1, **{f"{p}{i}b": (1024 if i else 1000) ** (k + 1) for k, p in enumerate("kmgtp") for i in ("", "i")},
          **{f"{p}i": 1024 ** (k + 1) for k, p in enumerate("kmgtp")}, **{p: 1024 ** (k + 1) for k, p in enumerate("kmgtp")}}


def known_names() -> list[str]:
    """Every canonical target name Hardware.from_name accepts (aliases aside)."""
    return [*specs.canonical_names(), *specs.node_names(), "cpu"]


def parse_host_ram(value: int | float | str) -> int:
    """``host_ram=`` in bytes: a number of GiB (``512``) or a size with its unit (``"1.5TB"``, ``"768GiB"``)."""
    if isinstance(value, bool):
        raise UnknownHardwareError(f"host_ram={value!r} is not a size; use e.g. host_ram='1TB' or host_ram=512 (GiB).")
    if isinstance(value, (int, float)):
        number, unit = float(value), ""
    else:
        match = _BYTES.match(str(value))
        if match is None:
            raise UnknownHardwareError(f"host_ram={value!r} is not a size; use e.g. '2TB', '768GiB' or 512 (GiB).")
        number, unit = float(match["n"]), (match["unit"] or "").lower()
    if number <= 0:
        raise UnknownHardwareError(f"host_ram must be more than zero, got {value!r}; use e.g. '2TB' or 512 (GiB).")
    return int(number * _UNITS[unit])


def with_host_ram(hardware: Hardware, value: int | float | str) -> Hardware:
    """The same machine with ``host_ram`` of RAM (all of it available): a named target's host is a guess."""
    ram = parse_host_ram(value)
    cpu = hardware.cpu.model_copy(update={"ram_total": ram, "ram_available": ram})
    return hardware.model_copy(update={"cpu": cpu})


def hardware_from_name(name: str, host_ram: int | float | str | None = None) -> Hardware:
    """Build the Hardware a named target stands for: idle, spec-sheet GPUs on the node's host (or a generic one)."""
    hardware = _from_name(name)
    return hardware if host_ram is None else with_host_ram(hardware, host_ram)


def _from_name(name: str) -> Hardware:
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
    node_key = specs.resolve_node(base)
    if node_key is not None:
        return _build_node(name, node_key, gpus_per_node if sep else None, nodes)
    key = specs.resolve(base)
    if key is None:
        raise UnknownHardwareError(  # every name, grouped: the list outgrew unknown_value's 30
            f"unknown hardware {base!r}.{did_you_mean(base, known_names())} Accepted: GPUs {', '.join(specs.canonical_names())}; "
            f"node types {', '.join(specs.node_names())}; or 'cpu'. {_EXAMPLE[0].upper() + _EXAMPLE[1:]}.")
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


def _build_node(name: str, key: str, count: int | None, nodes: int) -> Hardware:
    """A node type: its GPUs (all of them unless a count asks for fewer) on its own host and network."""
    row = specs.node(key)
    count = row.gpus if count is None else count
    if count > row.gpus:
        raise UnknownHardwareError(f"hardware {name!r}: a {key} node has {row.gpus} GPUs, not {count}; "
                                   f"use '{key}', '{key}:{row.gpus}x2' for two nodes, or a GPU name such as '{row.gpu}:{count}'.")
    label = key if (count, nodes) == (row.gpus, 1) else f"{key}:{count}" + (f"x{nodes}" if nodes > 1 else "")
    return _build(row.gpu, count, nodes, cpu=specs.cpu_from_row(row.cpu), network=row.inter_node_bandwidth_gbps, label=label)


def _build(key: str, count: int, nodes: int, *, cpu: CPU | None = None, network: float | None = None,
           label: str | None = None) -> Hardware:
    link = specs.default_link(key) if count > 1 else "none"
    return Hardware(
        gpus=tuple(specs.gpu_from_spec(key, index=i) for i in range(count)),
        cpu=cpu or specs.default_cpu(),
        interconnect=link,
        intra_node_bandwidth_gbps=specs.link_bandwidth_gbps(key, link),
        inter_node_bandwidth_gbps=(network or specs.inter_node_bandwidth_gbps()) if nodes > 1 else None,
        nodes=nodes,
        source="named",
        name=label or (key if (count, nodes) == (1, 1) else f"{key}:{count}" + (f"x{nodes}" if nodes > 1 else "")),
    )
