"""Named targets: plan for a machine you do not have, e.g. ``"a100-80gb:8"`` or ``"h100:8x4"``.

Grammar: ``NAME``, ``NAME:COUNT`` (GPUs per node) or ``NAME:COUNTxNODES``, and the way accelerate's docs and
the clouds' consoles write a node, ``COUNTxNAME`` (``8xa100-80gb``, ``8x A100 80GB``); case, spaces,
underscores and a vendor word (``NVIDIA A100``) do not matter, and ``80g`` means ``80gb``. ``"cpu"`` is a
GPU-less host.

Ambiguous short names resolve to the variant that cannot out-promise the real card, because
the plan's job is to not run out of memory: ``a100`` -> ``a100-40gb``, ``v100`` -> ``v100-16gb``.
``h100`` -> ``h100-80gb`` (SXM): both H100 boards hold 80 GB, SXM is the common training part.
The chosen key is kept in ``Hardware.name``, and ``name_decision`` makes it a Decision naming the other
variants, so a reader who meant the 80 GB card sees it on the plan, not after an OOM.

Node types (``dgx-h100``, ``p5.48xlarge``, ``nd96isr-h100-v5``...) are GPUs on the host those machines ship
with (cores, RAM, network); a bare GPU name gets the host its cards typically ship in (``hosts.typical_host``:
a consumer desktop for two RTX 4090s, the cloud instance carrying that many A100s), or the generic server where no
sourced row covers it. ``host_ram`` replaces the RAM of any target; ``assumed_host`` says which figure is a guess.
"""

from __future__ import annotations

import math
import re

from ..decisions import Alternative, Decision
from ..errors import UnknownHardwareError, did_you_mean
from . import specs
from .hosts import HostGuess, typical_host
from .types import CPU, Hardware

MAX_GPUS_PER_NODE = 16  # DGX-2 / HGX-2 boards; larger counts are several nodes
MAX_NODES = 100_000      # Setup.nodes' own bound
_COUNT = re.compile(r"^\s*(?P<count>[+-]?\d+)\s*(?:[x*]\s*(?P<nodes>[+-]?\d+)\s*)?$", re.IGNORECASE)
_EXAMPLE = "e.g. 'a100-80gb', 'h100:8', '8xh100' or 'h100:8x4' (8 GPUs per node, 4 nodes)"
#: "8xa100-80gb", "8 x A100", "8*h100": a GPU count written before the name
_LEADING_COUNT = re.compile(r"^\s*(?P<count>\d+)\s*[x*\u00d7]\s*(?P<name>\S.*)$", re.IGNORECASE)


_BYTES = re.compile(r"^\s*(?P<n>\d+(?:\.\d+)?)\s*(?P<unit>[kmgtp]i?b?|b)?\s*$", re.IGNORECASE)
_UNITS = {"": 2**30, "b": 1, **{f"{p}{i}b": (1024 if i else 1000) ** (k + 1) for k, p in enumerate("kmgtp") for i in ("", "i")},
          **{f"{p}i": 1024 ** (k + 1) for k, p in enumerate("kmgtp")}, **{p: 1024 ** (k + 1) for k, p in enumerate("kmgtp")}}


def known_names() -> list[str]:
    """Every canonical target name Hardware.from_name accepts (aliases aside)."""
    return [*specs.canonical_names(), *specs.node_names(), "cpu"]


#: one exbibyte: more than any machine has, and still exact as an int of bytes
MAX_HOST_RAM = 2**60


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
    if not math.isfinite(number) or number <= 0:
        raise UnknownHardwareError(f"host_ram must be a finite size more than zero, got {value!r}; use e.g. '2TB' or 512 (GiB).")
    ram = number * _UNITS[unit]
    if ram > MAX_HOST_RAM:
        raise UnknownHardwareError(f"host_ram={value!r} is more RAM than any machine has; use at most 1 EiB, e.g. '2TB' or 512 (GiB).")
    return int(ram)


def with_host_ram(hardware: Hardware, value: int | float | str) -> Hardware:
    """The same machine with ``host_ram`` of RAM (all of it available): a named target's host is a guess."""
    ram = parse_host_ram(value)
    cpu = hardware.cpu.model_copy(update={"ram_total": ram, "ram_available": ram})
    return hardware.model_copy(update={"cpu": cpu})


def hardware_from_name(name: str, host_ram: int | float | str | None = None) -> Hardware:
    """Build the Hardware a named target stands for: idle, spec-sheet GPUs on the node's host (or a generic one)."""
    hardware = _from_name(name)
    return hardware if host_ram is None else with_host_ram(hardware, host_ram)


def _split(name: str) -> tuple[str, str, str]:
    """(base name, ':' or '', count text): ``COUNTxNAME`` is the same as ``NAME:COUNT``, given once."""
    leading = _LEADING_COUNT.match(name)
    if leading is None:
        base, sep, count_text = name.strip().partition(":")
        return base.strip(), sep, count_text
    if ":" in leading["name"]:
        raise UnknownHardwareError(f"hardware {name!r} gives the GPU count twice; use one count: "
                                   f"'{leading['count']}x{leading['name'].partition(':')[0].strip()}' or "
                                   f"'{leading['name'].partition(':')[0].strip()}:{leading['count']}'.")
    base = leading["name"].strip()
    if specs.resolve_node(base) is not None:
        raise UnknownHardwareError(f"hardware {name!r}: a count before a node type is ambiguous (GPUs or nodes?); use "
                                   f"'{base}:GPUSxNODES', e.g. '{base}:{specs.node(specs.resolve_node(base) or base).gpus}x{leading['count']}' "
                                   f"for {leading['count']} nodes.")
    return base, ":", leading["count"]


def name_decision(name: str) -> Decision | None:
    """For a family name several rows share (``a100``: 40 and 80 GB), the row it is read as and the others,
    each with its memory; None when the name means one card."""
    if not isinstance(name, str) or not name.strip():
        return None
    try:
        base = _split(name)[0]
    except UnknownHardwareError:
        return None
    key, others = specs.resolve(base), specs.variants(base)
    if key is None or not others:
        return None
    gib = specs.memory_bytes(key) / 2**30
    return Decision(
        setting="hardware", value=key, number=specs.memory_bytes(key), unit="bytes",
        reason=(f"{base!r} names {len(others) + 1} cards; it is read as {key} ({gib:.0f} GiB), the variant that cannot "
                f"out-promise the card you have; name the card to plan for another ({', '.join(others)})"),
        source=specs.entry(key).source,
        alternatives=tuple(Alternative(value=other, why_not=f"not what {base!r} is read as: pass hardware={other!r} to plan for it",
                                       number=specs.memory_bytes(other), unit="bytes") for other in others),
    )


def _from_name(name: str) -> Hardware:
    if not isinstance(name, str) or not name.strip():
        raise UnknownHardwareError(f"empty hardware name {name!r}; expected NAME or NAME:COUNT, {_EXAMPLE}.")
    base, sep, count_text = _split(name)
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
    return _build(key, gpus_per_node, nodes, cpu=typical_host(key, gpus_per_node).cpu)


def assumed_host(hardware: Hardware) -> HostGuess | None:
    """The typical host a bare GPU name was planned with (None: probed, a node type, or 'cpu'). Its RAM is still an
    assumption unless ``host_ram=`` replaced it (``HostGuess.cpu.ram_total`` then differs from the hardware's)."""
    if hardware.source != "named" or not hardware.gpus or not hardware.name:
        return None
    try:
        base, sep, count_text = _split(hardware.name)
    except UnknownHardwareError:
        return None
    key = specs.resolve(base)
    if key is None or specs.resolve_node(base) is not None:
        return None
    return typical_host(key, _parse_count(hardware.name, count_text)[0] if sep else 1)


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
