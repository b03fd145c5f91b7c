"""The part of accuracy.md that says why three loss-dominated verdict rows stay misses (issue 24): what the code of the
stack each row ran holds at its length, term by term (hand counts in tests/test_vocab32k_rows.py), and what is left.

Row 771 (LLaMA-Factory issue #4642: Qwen2-7B-Instruct LoRA at cutoff 32,768 under DeepSpeed ZeRO-3 with offload,
published OOM) and rows 685 / 1008 (Unsloth's "Hugging Face + FA2" longest context for a 70B QLoRA on an A100 80GB).
Nothing here changes a price or a row's reading; the section reports the evidence the misses were checked against.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

OPEN_ROWS = ("771", "685", "1008")

#: row 771: each term the stack's code holds at the loss peak, and each other phase ruled out, with where it was read
ROW_771 = (
    "loss path: transformers 4.41.2's Qwen2ForCausalLM returns `logits.float()` and shifts by a slice that is a no-op "
    "copy on one row; Trainer.compute_loss returns only the loss, so the output is freed before backward: 8 B per "
    "logit in forward, 12 B at the cross-entropy's backward (log-softmax output, its gradient, the input gradient), "
    "12 x 32,768 x 152,064 = 59.8 GB. Traced once on 4.41.2's own Qwen2ForCausalLM (tiny config, CPU, perfguide's "
    "live-bytes tracker): 8.35 / 12.31 B per logit, the rest the labels and the small model; priced as 12",
    "checkpointing: LLaMA-Factory 0.8.3 enables reentrant checkpointing (model/model_utils/checkpointing.py: "
    "use_reentrant True), so the 28 blocks keep their bf16 inputs: 28 x 32,768 x 3,584 x 2 B = 6.6 GB",
    "ZeRO-3 with offload_param: DeepSpeed 0.14.4's coordinator prefetches ahead until its own count meets "
    "stage3_max_live_parameters (1e9), a count that starts each forward one embedding (152,064 x 3,584) below the "
    "true one (step() releases the embedding its backward gathered, after reset_step zeroed the count), and the head's "
    "prefetch overshoots it: 2.08e9 bf16 elements at the peak with the persistent norms and adapters (whole on the GPU, "
    "and uncounted as the embedding is), plus the ipg bucket of reduce_bucket_size = 3,584^2 (4.20 GB), as "
    "memory/zero3_window.py walks it (checked on 0.14.4 itself: scripts/trace_zero3_window.py). The former "
    "price, two heads and an fp32 head gradient (4.36 GB), counted a gradient the frozen head never gets",
    "not the evaluation: the sft workflow sets no compute_metrics unless predict_with_generate or compute_accuracy "
    "(llamafactory 0.8.3 train/sft/workflow.py) and Trainer.evaluate then passes prediction_loss_only=True "
    "(transformers 4.41.2 trainer.py), so val_size 100 keeps no logits on the GPU",
    "not the head's dtype: LLaMA-Factory leaves torch_dtype unset under ZeRO-3 (model/patcher.py) and zero.Init "
    "partitions in the config's bf16; an fp32 head would peak at the same 12 B per logit",
)
ROW_771_LEFT = (
    "left: perfguide's needs hold every term above and stay the margin "
    "above under the card at 32,768 tokens; the issue states no sample length "
    "(medical_summary_32k is the user's own data set, padded per batch to its longest sample), no GPU count, and "
    "neither the phase nor the message of the OOM. The row stays a miss, read as published",
)

#: rows 685 / 1008: the allocated bytes term by term, and what decides the verdict
ROWS_70B = (
    "allocated at the published length, each term from the 70B's shapes: the 80 blocks' nf4 Linears with double "
    "quant, the fp32 embedding, head and norms (peft prepare_model_for_kbit_training) and the fp32 adapters (42.26 GiB), "
    "adamw_8bit's state (0.77), the head's bf16 cast that autocast makes and the head's matmul saves (1.96), and per "
    "token the fp32 residual stream the checkpointed blocks keep (4 B x 8,192 x 80 = 2.5 MiB), the final norm's fp32 "
    "input and the loss backward's 12 B x 128,256 (1.47 MiB)",
    "the line adds the cached bf16 head block (2 B per logit) and the training reserved/allocated ratio 1.116; each "
    "row meets the card at the ratio its note gives (Max context above), inside the spread of the published "
    "single-GPU pairs (1.030-1.191, bench/data/allocator_pairs.csv P1-P6): the verdicts turn on the allocator "
    "constant, not on a priced term",
    "the same table's Llama-3.1-8B rows fit the 1.116 line within 3%; at the published length the 70B's allocation is "
    "59% weights loaded once, the 8B's at 80 GB 12%, so a ratio that applies to the transient bytes only would "
    "separate them. That recalibration (the ratio over the pairs' non-resident bytes: 1.198, held out 1.111) was tried "
    "and not adopted: row 685 turns right but the 8B rows 682-684 turn wrong (verdicts 116 -> 114, median of "
    "per-source medians 5.4 -> 6.4%); the FSDP pairs' ratios (1.30-2.63) and the single-GPU pairs' (1.03-1.20) do not "
    "share one value (docs/validation.md 7b, bench/results/allocator_resident.md)",
    "the reading: TRL's peft_module_casting_to_bf16 (SFTTrainer given a peft_config, bf16=True: bf16 embedding, head "
    "and, in TRL 0.7.5-0.8.6, adapters; the fp32 norms keep the residual stream fp32) would put the 70B line's longest "
    "context at 8,079 tokens: row 1008 would fit (77.3 GiB on the line at 7,500, 7.7% long) but row 685 would be 16.8% "
    "long and the same post's 8B rows far off (932 -> 2,383 tokens at 12 GB). With TRL 0.9.2-0.21's cast (fp32 "
    "adapters) the line's longest context is 7,887 tokens: row 1008 would fit (78.1 GiB at 7,500, 5.2% long), row 685 "
    "would be 14.0% long, the 8B rows 932 -> 2,303 tokens. Neither post states the HF baseline's trainer or "
    "casts, and the December table the 8B rows share with row 685 reads as the upcast; row 1008's April 2024 baseline "
    "code is not public, so its reading stays",
)


class _Result(Protocol):
    row: dict[str, str]
    verdict_ok: bool | None
    margin: str
    note: str


def open_verdicts(results: Sequence[_Result]) -> list[str]:
    """The section: each open row's verdict and margin (or note), then the evidence per row."""
    rows = {r.row["row_id"]: r for r in results if r.row["row_id"] in OPEN_ROWS and r.verdict_ok is not None}
    if not rows or all(r.verdict_ok for r in rows.values()):
        return []
    lines = ["## Open verdicts: the loss at long sequence with a large vocabulary", ""]
    if (r := rows.get("771")) is not None:
        lines += [f"Row 771 ({r.row['model_hf_id']}, {r.row['gpu_type']}, published OOM): needs / card "
                  f"{r.margin or '-'} GiB, {'right' if r.verdict_ok else 'a miss'}.", "",
                  *(f"- {t}" for t in (*ROW_771, *ROW_771_LEFT)), ""]
    big = [rows[i] for i in ("685", "1008") if i in rows]
    if big:
        lines += ["Rows " + " / ".join(r.row["row_id"] for r in big) + " (70B QLoRA, HF + FA2, A100 80GB): "
                  + "; ".join(f"row {r.row['row_id']}: {r.note or '-'}" for r in big) + ".", "",
                  *(f"- {t}" for t in ROWS_70B), ""]
    return lines
