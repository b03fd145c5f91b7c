"""Arctic Long Sequence Training's recipes, read on the gauge their authors used: the device's NVML used memory.

The recipes (snowflakedb/ArcticTraining projects/sequence-parallelism, 9d33fd2 and 5885b9f; rows 2200-2228) write
beside each length what the device showed, never an OOM search: ``max_length: 32_000 # w/ param offload: NV 71.91
GB`` (commented out) above ``max_length: 36_000 # w/ param offload close to oom``; ``max_length: 65_000 # ok 137.36
GB`` and ``300_000 # ok 134.96 GB`` on the H200, whose CUDA can allocate 139.86 GiB. "NV" is NVML's used memory /
2**30 (``arctic_training/debug.py`` ``get_mem_metrics``, printed after the step), and "close to oom" is said of a
length that ran. So a recipe's length is where that reading meets the card, and the row is judged there.

What NVML shows under the recipes' ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` (README, "1 GPU"): the
pages the caching allocator has mapped, plus the CUDA context. An expandable segment maps pages as requests need
them and unmaps free ones only on ``empty_cache()`` or when a mapping fails (``release_cached_blocks`` ->
``unmap_block``), which a run below the card never triggers; there is no per-segment rounding to leave idle, so
mapped = the fit footprint (allocated plus the small free pieces) plus the free blocks the step's order leaves
mapped. At these lengths one such block dwarfs the rest: HF's loss (transformers 4.51.3, ``ForCausalLMLoss``)
upcasts the head's 16-bit logits (2 B per logit) to fp32 (4) and takes the fp32 log-softmax (4); when the model
returns, the 16-bit logits and the upcast are freed side by side (6 B); the backward's nll gradient (4) takes the
front of that hole, the log-softmax gradient (4) finds no free block of its size and maps new pages, so 2 B per
logit stay mapped and free beside the 12 allocated (tests/test_alst_gauge.py replays that order through
scripts/caching_allocator.py). Liger's fused linear cross-entropy makes no logits: nothing stays.

The gauge is a reading, not a plan verdict: a mapping that fails unmaps the free block and retries, so the plan's
own verdict (``MemoryEstimate.fits``) leaves the block out, and each row's note gives the plan's own longest length.
"""

from __future__ import annotations

from typing import Any

from accuracy_reserved import cached_head_block

from perfguide.memory.types import MemoryEstimate
from perfguide.model.types import ModelSpec
from perfguide.setup import Setup
from perfguide.techniques import per_rank

#: the source whose rows are read on the NVML gauge, and the allocator setting the reading rests on (row notes)
GAUGED_SOURCE = "arctictraining_alst_recipes"
EXPANDABLE = "expandable_segments:True"
GiB = 2**30
#: the H100 recipes' machines, as the README's 'Environment used to create these examples' states them ("H100 80GB
#: nodes w/ 8 GPUs per node", "1.9TB CPU memory"; the row notes quote it): each node's host RAM holds its 8 ranks'
#: offloaded optimizer states and checkpointed layer inputs, so a length is judged on it too. 1.9 TB read as 1.9e12
#: bytes (the README does not say TB or TiB; 1.9 TiB would allow 9.95% more)
H100_NODES = "H100 80GB nodes, 8 GPUs per node"
NODE_GPUS, NODE_RAM = 8, int(1.9e12)


def on_recipe_nodes(row: dict[str, str]) -> bool:
    """An H100 recipe row: it ran on the README's 8-GPU nodes with their stated host RAM."""
    return gauged(row) and row["gpu_type"].startswith("H100") and H100_NODES in row["notes"]


def recipe_nodes(row: dict[str, str], num_gpus: int) -> dict[str, int]:
    """Setup fields for a recipe run over several nodes: 8 processes per node (empty for one node)."""
    if not on_recipe_nodes(row) or num_gpus <= NODE_GPUS or num_gpus % NODE_GPUS:
        return {}
    return {"num_gpus": NODE_GPUS, "nodes": num_gpus // NODE_GPUS}


def host_ram_fits(row: dict[str, str], est: MemoryEstimate) -> bool:
    """The node's host RAM holds what its ranks offload (``cpu_ram`` is summed over a node's ranks); rows on machines
    of unstated RAM are judged on the GPU only."""
    return not on_recipe_nodes(row) or est.cpu_ram <= NODE_RAM


def gauged(row: dict[str, str]) -> bool:
    """A row of the recipes that ran with expandable segments (its notes say so)."""
    return row["source_group"] == GAUGED_SOURCE and EXPANDABLE in row["notes"]


def mapped_free_block(spec: ModelSpec, setup: Setup) -> int:
    """The free block HF's loss leaves mapped through its backward: the 16-bit head logits (0 under Liger's fused
    linear cross-entropy, which makes no logits)."""
    if setup.task != "train" or setup.liger_kernel:
        return 0
    return cached_head_block(spec, setup)


def gauge_bytes(est: MemoryEstimate, spec: ModelSpec, setup: Setup) -> int:
    """What the device's NVML reading shows for the step: the fit footprint with the CUDA context (and NCCL's
    buffers), plus the free block left mapped."""
    return (est.fit_total or 0) + mapped_free_block(spec, per_rank(setup))   # None only without hardware; a rank's slice


def gauge_fits(est: MemoryEstimate, spec: ModelSpec, setup: Setup) -> bool:
    """The NVML reading within what CUDA can allocate on the card."""
    return est.capacity is None or gauge_bytes(est, spec, setup) <= est.capacity


def gauge_note(est: MemoryEstimate, spec: ModelSpec, setup: Setup, plan_longest: int) -> str:
    """At the published length: the reading perfguide gives, the card, and the plan's own longest length."""
    block = mapped_free_block(spec, setup)
    card = est.capacity or 0
    return (f"{gauge_bytes(est, spec, setup) / GiB:.2f} GiB on the NVML gauge at the published length (the 16-bit "
            f"head block {block / GiB:.2f} of it), the card {card / GiB:.2f} GiB; a plan on this card fits "
            f"{plan_longest:,} tokens")


def gauge_notes(rows: list[Any]) -> list[str]:
    """Lines under the max-context table for the rows read on the NVML gauge (``Result`` objects)."""
    on_gauge = [r for r in rows if gauged(r.row) and r.note]
    if not on_gauge:
        return []
    return ["ArcticTraining's ALST recipes are read on their authors' gauge, NVML used memory under expandable segments "
            "(bench/accuracy_gauge.py: the fit footprint, the context and the free 16-bit head block HF's loss leaves "
            "mapped through its backward); the plan's own verdict releases that block before an OOM:", "",
            *(f"- row {r.row['row_id']} ({r.row['gpu_type'][:24]}): {r.note}" for r in on_gauge), ""]
