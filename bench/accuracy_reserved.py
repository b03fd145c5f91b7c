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

How far perfguide is from such a row is also said in memory (``boundary_note``): a small card's length is the
card minus a fixed ~9 GiB, divided by the bytes per token, so a few percent of memory error is several times that
in tokens; ``context_notes`` writes the memory gaps and the evidence on what is left into bench/results/accuracy.md.
"""

from __future__ import annotations

import re
import statistics
from typing import Any

from perfguide.hardware.types import Hardware
from perfguide.memory.loss_path import head_bytes
from perfguide.memory.overhead import reserved_from_allocated
from perfguide.memory.types import MemoryEstimate
from perfguide.model.types import ModelSpec
from perfguide.setup import Setup

#: the row's mem_metric text that marks a boundary extrapolated from reserved bytes (bench/data rows 679-685)
RESERVED_LINE = "extrapolated from torch.cuda.max_memory_reserved()"
FP32 = 4
GiB = 2**30
#: bytes in a decimal GB over bytes in a GiB: how much smaller an "N GB" card is when N counts 10^9 bytes
DECIMAL_GB = 1e9 / GiB


def cached_head_block(spec: ModelSpec, setup: Setup) -> int:
    """Bytes of the 16-bit head logits block that stays cached through the loss backward (0 for an fp32 head)."""
    head = head_bytes(setup)
    if head >= FP32:
        return 0
    return head * setup.micro_batch_size * setup.seq_len * spec.logits_width


def line_bytes(est: MemoryEstimate, spec: ModelSpec, setup: Setup) -> int:
    """What perfguide puts on the publisher's line: steady-state reserved plus the cached head block (no CUDA
    context). The line is extrapolated, not run, so its reserved is not held at the card as a real run's is."""
    return max(est.peak_reserved, reserved_from_allocated(est.peak_allocated, setup.task)) + cached_head_block(spec, setup)


def reserved_line_fits(est: MemoryEstimate, spec: ModelSpec, setup: Setup, hw: Hardware) -> bool:
    """Fits on the publisher's line: peak reserved plus the cached head block within the card's stated GiB."""
    card = min(g.memory_total for g in hw.gpus)
    return line_bytes(est, spec, setup) <= card


def boundary_note(est: MemoryEstimate, spec: ModelSpec, setup: Setup, hw: Hardware) -> str:
    """At the published length: perfguide's bytes on the publisher's line against the card (the error the context
    error multiplies)."""
    card = min(g.memory_total for g in hw.gpus)
    line = line_bytes(est, spec, setup)
    text = (f"{line / GiB:.2f} GiB on the publisher's line at the published length, the card {card / GiB:.2f} GiB "
            f"({(line / card - 1) * 100:+.1f}%)")
    if line <= card or not est.peak_allocated:
        return text
    # over the card: the reserved/allocated ratio at which the line would meet it (allocated and the cached block as priced)
    return f"{text}; on the card at a reserved/allocated ratio up to {line_ratio_to_card(est, spec, setup, card):.3f}"


def line_ratio_to_card(est: MemoryEstimate, spec: ModelSpec, setup: Setup, card: int) -> float:
    """The steady-state reserved/allocated ratio at which perfguide's line meets ``card``: (card - cached head block) /
    peak allocated. A row decided by this ratio alone is a miss of the allocator constant, not of a priced term."""
    return (card - cached_head_block(spec, setup)) / est.peak_allocated


def decimal_gb_lengths(points: list[tuple[float, float]]) -> list[float]:
    """perfguide's lengths if each "N GB" card held N x 10^9 bytes instead of N GiB: its lengths are a straight line
    in the card's GiB (one fixed part, one per-token cost), so each moves along that line by N x (1 - 10^9 / 2^30)
    GiB. ``points``: (N, perfguide's length at N GiB), two or more card sizes."""
    caps, lengths = [c for c, _ in points], [n for _, n in points]
    tokens_per_gib = statistics.linear_regression(caps, lengths).slope
    return [n - c * (1 - DECIMAL_GB) * tokens_per_gib for c, n in points]


def context_notes(rows: list[Any]) -> list[str]:
    """Lines under the max-context table for the rows on a publisher's reserved line (``Result`` objects of
    bench/accuracy_report.py): each row's memory gap at the published length, and what the gap can and cannot be."""
    on_line = [r for r in rows if RESERVED_LINE in r.row["mem_metric"] and r.predicted]
    if not on_line:
        return []
    out = ["Memory at the published length (perfguide's reserved bytes on the publisher's line; a length error is "
           "this error times card / (card - fixed bytes)), and the longest context a plan of perfguide's allows on "
           "that card (its own verdict: reserved + CUDA context within the card, without the cached head block, "
           "which the allocator releases before it reports an OOM):", ""]
    out += [f"- row {r.row['row_id']} ({r.row['gpu_type'][:24]}): {r.note}" for r in on_line]
    models = dict.fromkeys(r.row["model_hf_id"] for r in on_line)   # one line per model: lengths move along its own line
    for model in models:
        sized = [(r, float(m.group(1))) for r in on_line
                 if r.row["model_hf_id"] == model and (m := re.search(r"(\d+) GB GPU", r.row["gpu_type"]))]
        if len({n for _, n in sized}) < 2:
            continue
        moved = decimal_gb_lengths([(n, float(r.predicted)) for r, n in sized])
        worst = max(abs(m / float(r.published) - 1) * 100 for (r, _), m in zip(sized, moved))
        as_gib = max(abs(float(r.predicted) / float(r.published) - 1) * 100 for r, _ in sized)
        out += ["", f"- if the \"N GB\" cards are N x 10^9 bytes (the sources do not say), perfguide's lengths for "
                    f"these {len(sized)} {model} rows would be {', '.join(f'{m:,.0f}' for m in moved)}: within {worst:.0f}% of "
                    f"every published length; read as GiB, as the rows do, within {as_gib:.0f}%"]
    return [*out, *DISAGREEMENT, ""]


#: What the evidence says about the rest of the gap (issue 24, long context); each claim's source is named.
DISAGREEMENT = [
    "- the loss path is not the gap: at batch 1 every release the row could have run (transformers 4.43-4.47, "
    "2024-07..12) holds 12 B per logit at the cross-entropy backward under HF Trainer / TRL SFTTrainer (log-softmax "
    "output + its gradient + the input gradient, 4 B each; the shift copy is a no-op on one row; compute_loss "
    "returns only the loss, so the model output is freed before backward) and 2 B more stay cached (the freed "
    "16-bit head block); accelerate's fp32 copy of a 16-bit output (convert_outputs_to_fp32, 4.46+) lands in the "
    "freed upcast block. One more 16-bit logits copy (0.245 MiB per token, the per-token gap) would need a loop "
    "that holds the output through backward, which neither trainer does",
    "- the line is the allocator's steady state, so it is priced with the training reserved/allocated ratio "
    "(calibration.json reserved_over_allocated_training 1.116, the median of 11 published training pairs in "
    "bench/data/allocator_pairs.csv, among them Answer.AI's fsdp_qlora runs that report both peaks of one run: rows "
    "664/666: 10.24 / 8.28 GiB = 1.24 at 512 tokens, 665/667: 10.22 / 9.16 GiB = 1.12 at 2048), not the inference "
    "1.04: every length is then within 8%. The ratio varies by run (1.03-1.35 over the pairs; single-GPU pairs "
    "1.03-1.19, FSDP ones 1.12-1.35): Qwen's single-GPU LoRA profiling rows of 7B and 14B (702-713, nvidia-smi, "
    "steady state, priced with the bf16 adapters of the peft 0.6 they ran) fit within 6% at 1.116",
    "- the row's setup reading stands: a fixed part above 9 GiB is the kbit-upcast QLoRA's (peft "
    "prepare_model_for_kbit_training: fp32 embeddings and head, 4.2 GB, plus the head's bf16 cast under autocast, "
    "1.05 GB). TRL's SFTTrainer given a peft_config and bf16 casts head and embeddings back to bf16 "
    "(trl.trainer.utils.peft_module_casting_to_bf16), which prices at about 6.5 GiB fixed and 2.2 MiB per token, "
    "further from the published line, not closer",
]
