"""The part of accuracy.md that says what is known about the TRL v1.15.0 long-context rows (1180-1185): perfguide fits
them 16-40% longer than published, and the room it leaves at the published length, per row x s^2 and per row-token,
is what any missing term has to fill. Nothing here changes a price; the section lists what was checked.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol

SOURCE = "trl_v1_15_fused_head"
GiB = 2**30
TRAINER = re.compile(r"TRL (\w+Trainer) \(trl==([\d.]+)(?:, (loss_type='\w+'|default loss_type))?")

CHECKED = (
    "the setup as it ran (the release's details, quoted by a summary of the notes: bench/data row notes): one B300 with "
    "the caching allocator capped at 79 GiB, gemma-3-1b-pt from its config with random bf16 weights; priced so "
    "(reserved within the cap, the CUDA context outside it), which moved the lengths 0.5-0.8% longer",
    "the s x s tensors of a real TRL step (trl 1.16 SFTTrainer and DPOTrainer on a tiny Gemma 3, CPU, bf16, SDPA, the "
    "trainers' checkpointing; scripts/trace_trl_gemma.py, tests/test_trl_gemma_trace.py): at every block's recompute "
    "only the kept bool sliding mask (1 B per row x s^2) and the recomputed block's bf16 bias (2 B), as memory/masks.py "
    "prices; the measured s^2 coefficient of each recompute phase is 3.000 (SFT and DPO alike, per row). The most s x s "
    "bytes alive at any moment of any phase is what is priced too: 3 B per row in the forward (mask building, or the "
    "mask and one bias), 4 in DPO's reference forward (the policy's kept mask, the reference's own, one bias)",
    "SDPA's bool-to-bias conversion: at::where(mask, 0, -inf), no logical_not transient (torch 2.13, dispatch trace)",
    "a full-attention mask in the release's own code (TRL 1.15.0's collators and transformers 5.19.0, the release "
    "current on TRL 1.15.0's date; scripts/trace_trl_release_masks.py, real CPU tensors): an unpadded batch hands the "
    "full-attention layers no mask (SDPA's is_causal), a padded one a bool rows x 1 x s x s mask the checkpointed "
    "blocks keep; the collators pad to the batch's longest sequence (pad_to_multiple_of None by default), so SFT at "
    "batch 1 is never padded. Replayed with that mask kept anyway (scripts/trace_trl_gemma_replay.py --full-mask), "
    "rows 1183-1185 would fit 114,688 (6.7% long) and 1182 21,504 (unchanged); row 1181 padded fits 66,560 (below)",
    "the caching allocator, capped at 79 GiB, replayed over the SFT step's own allocations and frees at the real "
    "shape and length (scripts/trace_trl_gemma_replay.py: fake tensors, 2 steps; its allocated peak is perfguide's "
    "within 0.4% at 107,520 tokens and 1.1% at 20,480): the SFT rows' lengths (1182-1185, the 'priced' column) are the "
    "longest multiple of 1,024 that survives it (bench/data/allocator_max_context.csv); row 1182 (full logits) "
    "23,759 -> 21,504 against 20,480: at 22,528 a 22 GiB fp32 logits-sized request fails with 18.8 GiB cached in "
    "split segments no OOM can release; replayed with 1.15.0's own fused head (its CUDA branch: the boolean gather of "
    "the scored positions, the Triton tiles; scripts/trace_trl_dpo_replay.py's stand-in) in place of the installed "
    "1.16's CPU branch, rows 1183-1185 keep 128,000",
    "the DPO rows through the same replay with the release's own DPOTrainer.compute_loss (scripts/"
    "trace_trl_dpo_replay.py: trl 1.14.2's and 1.15.0's wheels, the policy and a frozen bf16 reference prepared as "
    "accelerate's bf16 AMP, one unpadded pair; allocated peak within 1.1% (10,240) and 0.3% (59,392) of perfguide's "
    "plan): row 1180 (full logits) 13,855 -> 10,240, the published length, padded or not; its room at the published "
    "length (the table) is the allocator's: at 11,264 the second step's 22 GiB fp32 reference logits fail with 19.5 "
    "GiB cached in split segments (the AdamW states took the first step's cached bf16 logits segment, so the bf16 head "
    "output split a cached fp32 one), 42.3 GiB live. The logits-sized tensors are the plan's: 10 B per logit in the forward (the policy's "
    "fp32 copy, the reference's bf16 output and fp32 copy), 8 in backward (the kernel's saved logits and grad_logits)",
    "the replayed DPO step against the same release's 8,192-token peaks (rows 1186, 1187, nothing fitted): allocated "
    "48.79 GiB (1.14.2; published 48.97) and 11.86 (1.15.0; published 12.00). A reference at create_model_from_path's "
    "float32 default (TRL 1.14.2 / 1.15.0 given a model object and no ref_model; 1.16 takes the policy's dtype) would "
    "read 50.63 and 15.08 GiB: the release's reference was bf16, as priced",
    "the kernel: on sm90 / sm100 / sm103 with cuDNN > 9.15 torch puts cuDNN attention first (sdp_utils.cpp "
    "check_prefer_cudnn_attention), for head_dim 256 only with cuDNN > 9.22; cuDNN and the memory-efficient kernel both "
    "take the bias broadcast over the heads (an expand, attention.cu) and save it for backward: the same 2 B per row x s^2",
    "the 8,192-token peaks (rows 1186-1189) do not test the recompute's terms: the optimizer step, the end of backward "
    "or the full-logits loss holds the peak there",
    "the recomputed block's gradients in flight (memory/block_backward.py, data post_mlp_norm): Gemma's fp32 norm after "
    "the MLP makes a bf16 full fine-tune's block backward peak at max(12 h, 4 i - 12 h) + 4 h per token (non-reentrant), "
    "18,432 B at gemma-3-1b's block, where Llama's coefficients priced 27,648 (traced on that block's shape, "
    "scripts/trace_gemma_block_backward.py --real): rows 1183-1185 about 1,200 tokens longer, away from the published",
)
OPEN = (
    "a DPO pair padded to its longer completion carries zeros in its 2-D mask, so the full-attention layers get a bool "
    "mask too (traced: +1 B per row x s^2 at the recompute while a full layer is still ahead in backward, +2 in the "
    "reference forward, which builds both masks again); the release does not say whether its pairs were padded. "
    "Replayed both ways (scripts/trace_trl_dpo_replay.py): row 1181 fits 77,824 tokens unpadded (the reading of a "
    "max-length benchmark, both rows at max_length: the 'priced' column), 66,560 padded (12.1% long); row 1180 "
    "10,240 either way",
    "CUDA-only buffers no CPU trace shows: cuDNN's SDPA backward workspace on Blackwell",
    "the fused-head rows beyond the caching allocator: with the release's 79 GiB cap the replays keep 128,000 tokens "
    "for SFT (1183-1185; perfguide's plan 131,004; the published 107,520) and 77,824 for DPO (1181; the plan 82,941; "
    "the published 59,392), so what holds them 19% and 31% short is not the allocator's cache as replayed",
)


class _Context(Protocol):
    row: dict[str, str]
    kind: str
    predicted: float | None
    err_pct: float | None
    margin: str


def trl_long_context(results: Sequence[_Context]) -> list[str]:
    """The section: each row's lengths, the room left at the published length, then what was checked and what is open."""
    rows = [r for r in results if r.kind == "context" and r.row["source_group"] == SOURCE and r.margin]
    if not rows:
        return []
    lines = ["## Open gap: TRL v1.15.0's long-context rows (gemma-3-1b)", "",
             "| row | trainer | published | priced | err % | room at the published length | per row x s^2 | per row-token |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        s, pairs = int(r.row["seq_len"]), "DPOTrainer" in r.row["method"]
        rows_per_step = 2 if pairs else 1
        needed, capacity = (float(x) for x in r.margin.split(" / "))
        room = (capacity - needed) * GiB
        m = TRAINER.search(r.row["method"])
        trainer = " ".join(x for x in m.groups() if x) if m else r.row["method"][:30]
        lines.append(f"| {r.row['row_id']} | {trainer} | {s:,} | {int(r.predicted or 0):,} | {r.err_pct:.1f} | "
                     f"{room / GiB:.1f} GiB | {room / (rows_per_step * s * s):.2f} B | "
                     f"{room / (rows_per_step * s) / 2**20:.3f} MiB |")
    lines += ["", "Checked:", *(f"- {t}" for t in CHECKED), "", "Open:", *(f"- {t}" for t in OPEN), ""]
    return lines
