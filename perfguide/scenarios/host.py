"""Host-side knobs: dataloader workers, pinned memory, CPU threads (the transformers guides perf_train_gpu_one
"Data preloading", perf_train_cpu and perf_train_cpu_many).

Workers only have to keep the accelerator fed; every worker is a process holding a copy of the dataset
handle, so more is not faster once the GPU is busy. On CPU training the cores are the compute, so workers
are few and threads equal the physical cores.
"""

from __future__ import annotations

from .. import sources, techniques
from .._base import GiB, MiB
from ..decisions import Alternative, Decision
from ..hardware.hosts import HostGuess
from ..hardware.named import assumed_host
from ..hardware.types import CPU, Hardware
from ..setup import Setup

GPU_WORKERS_CAP = 4      # the transformers docs' starting value (perf_train_gpu_one, "Data preloading")
CPU_WORKERS_CAP = 2      # 0-2 workers when the cores do the training: every worker takes a core from the matmuls
_SOURCE = f"{sources.TRAIN_GPU_ONE}#data-preloading"
#: torch.utils.data.DataLoader: ``prefetch_factor`` batches per worker, 2 by default when num_workers > 0 (the Trainer's
#: dataloader_prefetch_factor defaults to None, which leaves torch's default)
PREFETCH_FACTOR = 2
#: what TRL's collators hand the model each micro-step, int64: SFT input_ids, attention_mask (padding-free: position_ids),
#: labels; DPO input_ids, attention_mask, completion_mask over the chosen and rejected rows
BATCH_TENSORS, INDEX_BYTES = 3, 8
DATALOADER_SOURCE = ("https://docs.pytorch.org/docs/stable/data.html#torch.utils.data.DataLoader (prefetch_factor); "
                     "https://docs.pytorch.org/tutorials/intermediate/pinmem_nonblock.html (pinned memory: asynchronous copies)")


def gpu_dataloader(cpu: CPU, gpus_per_node: int) -> tuple[int, bool, tuple[Decision, ...]]:
    """(workers, pin_memory, decisions) for GPU training: leave one core per rank for the training loop. Pinning is
    decided with the chosen micro-batch (``pin_memory_decision``)."""
    per_rank_cores = cpu.physical_cores // max(1, gpus_per_node)
    workers = max(0, min(GPU_WORKERS_CAP, per_rank_cores - 1))
    reason = (f"{cpu.physical_cores} physical cores / {gpus_per_node} GPU process(es) = {per_rank_cores} per rank, "
              f"one kept for the training loop, capped at {GPU_WORKERS_CAP} (tokenized text needs little preprocessing)")
    workers_dec = Decision(setting="dataloader_num_workers", value=workers, reason=reason, number=per_rank_cores, unit="cores/rank",
                           source=_SOURCE, alternatives=(Alternative(value=0, why_not="the GPU would wait while the main process collates batches"),)
                           if workers else ())
    return workers, True, (workers_dec,)


def cpu_dataloader(cpu: CPU) -> tuple[int, bool, tuple[Decision, ...]]:
    """(workers, pin_memory, decisions) for CPU training: workers steal cores from the matmuls."""
    workers = 0 if cpu.physical_cores <= 4 else min(CPU_WORKERS_CAP, cpu.physical_cores // 8)
    reason = (f"{cpu.physical_cores} physical cores do the training; "
              + ("no worker processes to compete with them" if workers == 0 else f"{workers} worker(s) prefetch without starving the matmuls"))
    workers_dec = Decision(setting="dataloader_num_workers", value=workers, reason=reason, number=cpu.physical_cores, unit="cores",
                           source=f"{sources.TRAIN_CPU}; {sources.TRAINING_ARGUMENTS}.dataloader_num_workers")
    return workers, False, (workers_dec,)


def _batch(setup: Setup) -> tuple[int, int, int]:
    """(batches in flight, rows, tokens per row) of one rank's DataLoader: ``prefetch_factor`` batches per worker (torch's
    default 2), or the one batch the main process loads without workers; each micro-batch as the collator builds it,
    which is the shape the memory model counts (``techniques.shaped``: a DPO pair is two rows, padding-free one row of
    real tokens)."""
    shaped = techniques.shaped(setup)
    in_flight = setup.dataloader_num_workers * PREFETCH_FACTOR if setup.dataloader_num_workers else 1
    return in_flight, shaped.micro_batch_size, shaped.seq_len


def pinned_bytes(setup: Setup) -> int:
    """Page-locked host bytes one rank's DataLoader holds at most when it pins: the batches in flight x one micro-batch
    of ``BATCH_TENSORS`` int64 tensors."""
    in_flight, rows, tokens = _batch(setup)
    return in_flight * rows * tokens * BATCH_TENSORS * INDEX_BYTES


def pin_memory_decision(setup: Setup, cpu: CPU) -> Decision:
    """Pinning, with the bytes it locks: on a GPU a few prefetched micro-batches of token ids, a negligible share of
    host RAM, buy asynchronous host-to-device copies; on the CPU there is no device copy, so nothing is locked."""
    pinned, ranks = pinned_bytes(setup), setup.num_gpus if setup.device == "cuda" else 1
    in_flight, rows, tokens = _batch(setup)
    batches = f"{in_flight} batch(es) in flight x {rows} x {tokens} tokens x {BATCH_TENSORS} int64 tensors"
    if not setup.dataloader_pin_memory:
        return Decision(setting="dataloader_pin_memory", value=False, number=0, unit="bytes page-locked",
                        reason=f"there is no device copy to speed up on CPU (use_cpu=True turns it off anyway); pinning would lock "
                               f"{batches} = {pinned / MiB:.1f} MiB for nothing", source=f"{sources.TRAINING_ARGUMENTS}.dataloader_pin_memory")
    share = pinned * ranks / cpu.ram_total if cpu.ram_total else 0.0
    return Decision(setting="dataloader_pin_memory", value=True, number=pinned, unit="bytes page-locked per rank",
                    reason=(f"page-locked host buffers let host-to-GPU copies run asynchronously; they lock {batches} = "
                            f"{pinned / MiB:.1f} MiB per rank, {share * 100:.2g}% of the host's {cpu.ram_total / GiB:.0f} GiB RAM for {ranks} rank(s)"),
                    source=f"{_SOURCE}; {DATALOADER_SOURCE}",
                    alternatives=(Alternative(value=False, why_not="pageable batches are copied through a staging buffer, synchronously"),))


def cpu_threads(cpu: CPU, source: str = sources.TRAIN_CPU, processes: int = 1) -> tuple[int, Decision]:
    """Threads = physical cores (split between processes): hyper-threads share the FMA units, so they add
    contention, not FLOPs.

    The same rule for training and serving on CPU; only the source differs (perf_infer_cpu for inference).
    """
    threads = max(1, cpu.physical_cores // max(1, processes))
    per = f" / {processes} processes" if processes > 1 else ""
    dec = Decision(
        setting="cpu_threads", value=threads,
        reason=f"one intra-op thread per physical core ({cpu.physical_cores} physical{per}, {cpu.logical_cores} logical); "
               "set OMP_NUM_THREADS or torch.set_num_threads",
        number=threads, unit="threads", source=source,
        alternatives=(
            Alternative(value=cpu.logical_cores // max(1, processes), why_not="hyper-threads share the vector units and slow GEMMs down")
            if cpu.logical_cores > cpu.physical_cores else Alternative(value=max(1, threads - 1), why_not="the docs' minus-one-for-the-OS only matters on a busy shared machine"),
        ),
    )
    return threads, dec


def cpu_processes(cpu: CPU, requested: int | None, global_batch: int) -> tuple[int, Decision]:
    """One training process per socket: each keeps its threads and memory on its own NUMA node, and DDP over
    gloo averages the gradients (transformers perf_train_cpu_many)."""
    processes = requested or cpu.sockets
    if global_batch % processes:
        from ..errors import ConflictingConstraintsError

        raise ConflictingConstraintsError(f"global batch {global_batch} does not split over {processes} CPU processes; "
                                          f"use a multiple of {processes}")
    if processes == 1:
        reason = "one socket: a single process uses every core without crossing a NUMA boundary"
    else:
        reason = (f"{processes} processes ({cpu.sockets} socket(s)): DDP over gloo, each process with its own threads "
                  "and memory; launch with accelerate or torchrun, never several thread pools in one process")
    return processes, Decision(setting="cpu_processes", value=processes, reason=reason, number=cpu.sockets, unit="sockets",
                               source=sources.TRAIN_CPU_MANY)


def host_guess(hardware: Hardware) -> HostGuess | None:
    """The typical host a bare GPU name is planned with, while its RAM is still the guess (``host_ram=`` not given)."""
    guess = assumed_host(hardware)
    return guess if guess is not None and hardware.cpu.ram_total == guess.cpu.ram_total else None


def host_decision(hardware: Hardware) -> list[Decision]:
    """Name the assumed host on every plan for a bare GPU name: its cores and RAM, where they come from, and the flag
    that replaces them (the offload and dataloader rules read both)."""
    guess = assumed_host(hardware)
    if guess is None:
        return []
    cpu = hardware.cpu
    known = cpu.ram_total != guess.cpu.ram_total
    reason = (f"{hardware.name} names GPUs, not their host: " +
              (f"cores from the assumed host ({guess.describe()}); its RAM replaced by host_ram=: {cpu.ram_total / GiB:.0f} GiB" if known else
               f"planned with {guess.describe()}; pass host_ram= (CLI --host-ram) with the real RAM, or run "
               "on the machine itself (probe) for its cores too"))
    return [Decision(setting="host", value=f"{cpu.physical_cores} cores, {cpu.ram_total / GiB:.0f} GiB RAM", reason=reason,
                     number=cpu.ram_total, unit="bytes", source=guess.source if guess.sourced else "data/gpus.json 'cpu' (perfguide assumption)")]


def host_assumption_warnings(hardware: Hardware, cpu_ram_needed: int, headroom: float, fits: bool,
                             ram_blocked: tuple[str, int] | None = None) -> list[str]:
    """Say it when a decision rests on the assumed host RAM: the chosen plan offloads into it, a refusal came from it,
    or a setup that fits the GPUs was passed over because it does not fit it (``ram_blocked``: its label and need)."""
    guess = host_guess(hardware)
    if guess is None:
        return []
    ram = hardware.cpu.ram_total / GiB
    where = f"{guess.label} ({ram:.0f} GiB, {'data/hosts.json' if guess.sourced else 'data/gpus.json cpu'})"
    out = []
    if cpu_ram_needed > 0:
        need = cpu_ram_needed / (1 - headroom) / GiB
        out.append(f"host RAM is assumed, not known: {hardware.name} is planned on a typical {where}, and this plan's offloaded "
                   f"states need {cpu_ram_needed / GiB:.1f} GiB of it ({need:.1f} GiB with the headroom): with "
                   f"{'less' if fits else 'more'} RAM the verdict changes; pass host_ram= (CLI --host-ram) with the target's real RAM")
    if ram_blocked is not None and (fits or cpu_ram_needed == 0):   # a refusal from host RAM is said above already
        label, need_bytes = ram_blocked
        out.append(f"host RAM is assumed, not known: {label} fits the GPUs but its offloaded states need "
                   f"{need_bytes / (1 - headroom) / GiB:.0f} GiB with the headroom, more than the assumed {where}; with that much "
                   "RAM the choice may change: pass host_ram= (CLI --host-ram) with the target's real RAM")
    return out
