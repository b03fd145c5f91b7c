"""A published-measurements row's GPU read as a perfguide Hardware: the named card, or a same-generation spec with
the memory the row states (an unstated model, a card gpus.json lacks, an allocator capped below the card).
"""

from __future__ import annotations

import re

from perfguide.hardware.types import Hardware
from perfguide.memory.overhead import cuda_context_bytes

GPUS = [("a100-sxm4-80gb", "a100-80gb"), ("a100-80gb", "a100-80gb"), ("a100 80gb", "a100-80gb"), ("a100", "a100-40gb"),
        ("v100-sxm2-16gb", "v100-16gb"), ("rtx 3090", "rtx3090"), ("rtx 4090", "rtx4090"), ("a10g", "a10g"),
        ("h100", "h100-80gb"), ("h200", "h200"), ("l40s", "l40s"), ("titan rtx", "t4"), ("rtx3080ti", "rtx3090"),
        ("rtx 2060", "t4"), ("v100 32gb", "v100-32gb"), ("a800", "a100-80gb"),
        ("nvidia l4", "l4"), ("v100s", "v100-pcie-32gb"), ("rtx a6000", "a6000"), ("v100 16gb", "v100-16gb"), ("a10 ", "a10"),
        ("b300", "b300"), ("tesla t4", "t4"), ("h20 ", "h100-80gb")]
# H20 (Hopper GH100, cc 9.0, 96 GB HBM3) has no gpus.json row: the H100's spec with the H20's memory (GPU_MEMORY);
# its key "h20 " ends in a space so that no H200 row matches it
# A800 is the A100 with NVLink capped at 400 GB/s (export variant): same GA100 die, same 80 GB HBM2e
# TITAN RTX is Turing (TU102, compute capability 7.5) like the T4: same CUDA context class (calibration by_cc_major)
# TITAN RTX: the card's total as the hf_blog_pytorch_fsdp source's own OOM message prints it ("GPU 0; 23.65 GiB total
# capacity"), the cudaMemGetInfo total that nvidia-smi also shows (24220 MiB), not the nominal 24 GiB
# RTX 3080 Ti Laptop GPU: nvidia-smi shows 16384 MiB; no torch print found, so CUDA's total by gpus.json's rule (2):
# less the most a published cc-8.6 card holds back (A10: 23028 MiB vs 21.99 GiB, 510 MiB) -> 15.50 GiB
GPU_MEMORY = {"rtx3080ti": int(15.50 * 2**30), "rtx 2060": 8 * 2**30, "titan rtx": int(23.65 * 2**30), "h100 96gb": 96 * 2**30,
              "h20 ": 96 * 2**30}


#: a row that states only the card's memory ("24 GB GPU (model not stated)"), or whose length the publisher solved at a
#: named card's nominal size ("24 GB GPU (RTX 4090 named; read at its nominal size)"): an Ampere datacenter spec with
#: that memory (read as GiB, as boards are sized), so the CUDA context is cc-8's
UNSTATED_GPU = re.compile(r"(\d+) GB GPU \((?:model not stated|[^)]*read at its nominal size)\)")
#: a run whose caching allocator was capped (torch.cuda.set_per_process_memory_fraction) OOMs when the allocator's
#: reserved bytes would pass the cap; the CUDA context lies outside it. The estimate charges the context on top of the
#: step, so the card's allocatable is the cap plus that context (trl_v1_15_fused_head: one B300 capped at 79 GiB)
ALLOCATOR_CAP = re.compile(r"allocator capped at (\d+(?:\.\d+)?) GiB")


def _hardware(gpu_type: str, num_gpus: int) -> Hardware | None:
    low = gpu_type.lower()
    unstated = UNSTATED_GPU.search(gpu_type)
    name = "a100-80gb" if unstated else next((n for key, n in GPUS if key in low), None)
    if name is None:
        return None
    # a row over 16 GPUs ran on 8-GPU nodes (ALST's recipes: "H100 80GB nodes w/ 8 GPUs per node"); Hardware names
    # such a cluster GPUS_PER_NODExNODES
    count = f"8x{num_gpus // 8}" if num_gpus > 16 and num_gpus % 8 == 0 else str(num_gpus)
    hw = Hardware.from_name(f"{name}:{count}")
    mem = int(unstated.group(1)) * 2**30 if unstated else next((v for k, v in GPU_MEMORY.items() if k in low), None)
    cap = ALLOCATOR_CAP.search(gpu_type)
    if cap:
        mem = int(float(cap.group(1)) * 2**30) + cuda_context_bytes(hw)
    if mem is not None:  # GPUs without an entry in gpus.json: borrow a same-generation spec, fix the memory
        reserve = {} if unstated else {"memory_reserved": 0}  # GPU_MEMORY figures are CUDA's totals already
        gpus = tuple(g.model_copy(update={"memory_total": mem, "memory_free": mem, **reserve}) for g in hw.gpus)
        hw = hw.model_copy(update={"gpus": gpus})
    return hw
