"""Max-context rows that a publisher extrapolated from its own ``torch.cuda.max_memory_reserved()`` readings.

Unsloth's long-context tables (docs.unsloth.ai/basics/unsloth-benchmarks, blog llama3-3) are linear in the card
size to the token: Llama-3.1-8B "Hugging Face + FA2" gains 1,619 tokens per 4 GB (932 at 12 GB, 2,551 at 16,
5,789 at 24, 12,264 at 40, 15,502 at 48, 28,454 at 80: steps of 1,619 / 3,238 / 6,475 / 3,238 / 12,952), so the
lengths are the publisher's straight line of peak memory against context, solved for each card size, not one OOM
search per card. Unsloth's notebooks read peak memory as ``torch.cuda.max_memory_reserved() / 1024 / 1024 / 1024``
and print it as "GB" (their "Show final memory and time stats" cell): the line is the caching allocator's
reserved bytes in GiB, with no CUDA context, measured below capacity (no allocation ever failed and made the
allocator release its cache).

Below capacity the allocator keeps what the loss path freed. HF's cross-entropy upcasts the head's 16-bit logits
(2 B per logit) to an fp32 copy; when the forward returns, the 16-bit block is freed and stays cached, and every
later loss-path request (the fp32 log-softmax gradient and input gradient, 4 B per logit) is larger than it, so
it cannot be reused and ``max_memory_reserved`` carries it through the backward of the loss. A real OOM would
first release it (the allocator frees its cache and retries cudaMalloc), so plans do not price it: only these
extrapolated rows do.
"""

from __future__ import annotations

from perfguide.hardware.types import Hardware
from perfguide.memory.loss_path import head_bytes
from perfguide.memory.types import MemoryEstimate
from perfguide.model.types import ModelSpec
from perfguide.setup import Setup

#: the row's mem_metric text that marks a boundary extrapolated from reserved bytes (bench/data rows 679-685)
RESERVED_LINE = "extrapolated from torch.cuda.max_memory_reserved()"
FP32 = 4


def cached_head_block(spec: ModelSpec, setup: Setup) -> int:
    """Bytes of the 16-bit head logits block that stays cached through the loss backward (0 for an fp32 head)."""
    head = head_bytes(setup)
    if head >= FP32:
        return 0
    return head * setup.micro_batch_size * setup.seq_len * spec.logits_width


def reserved_line_fits(est: MemoryEstimate, spec: ModelSpec, setup: Setup, hw: Hardware) -> bool:
    """Fits on the publisher's line: peak reserved plus the cached head block within the card's stated GiB."""
    card = min(g.memory_total for g in hw.gpus)
    return est.peak_reserved + cached_head_block(spec, setup) <= card
