"""Liger-Kernel's published kernel memory rows priced with perfguide's own loss-path and activation components.

Liger-Kernel benchmarks each kernel against a reference (``huggingface``) and records the peak of
``torch.cuda.max_memory_allocated()`` around the op (benchmark/scripts/utils.py ``_test_memory``: ten calls, each
after ``reset_peak_memory_stats``, the median kept). Every row is priced as two parts:

* the bytes the benchmark script itself holds, counted by hand from the script that produced the row (SCRIPTS):
  its inputs, the modules it builds, the ``.grad`` an earlier call left (the scripts never zero gradients, so
  from the second call on the previous gradient is alive and the new one is accumulated into it in place), and
  torch's cuBLAS workspaces (CUBLAS_WORKSPACE);
* the op's own bytes from perfguide's component for it: HF's loss path (memory/loss_path.py
  ``loss_path_units``), Liger's fused linear cross-entropy (techniques/liger_kernel.py ``loss_bytes``), the gated
  MLP's saved tensors (data/activations.json, the llama family's per-token ``i`` coefficient) and what Liger's
  GEGLU keeps less (data/techniques.json ``liger_saved_less_half_per_ffn_unit``).

Priced: the memory rows of cross_entropy, fused_linear_cross_entropy and geglu's forward mode. Not priced, with
why in the report: geglu's full and backward modes (the peak is the isolated MLP's backward in flight, which
perfguide prices per block, not per op) and the kernels perfguide has no per-op term for (rms_norm, swiglu,
rope, layer_norm: their HF-vs-Liger difference enters as saved-for-backward bytes inside a block). Speed rows are
kernel times, not training steps, and are stored (taken whole) but not priced.

Run: .venv/bin/python bench/kernels.py
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))
sys.path.insert(0, str(ROOT))

from _report import publish
from kernels_rows import CSV, BenchRow, load

from perfguide import ModelSpec, Setup
from perfguide.data.techniques import constant
from perfguide.memory.activations import family_coefficients, regime
from perfguide.memory.activations_data import activations_data
from perfguide.memory.loss_path import loss_path_units
from perfguide.techniques import liger_kernel

OUT = ROOT / "results" / "kernels.md"
MiB = 2**20
#: torch's cuBLAS workspace per handle and stream before Hopper: the default CUBLAS_WORKSPACE_CONFIG ":4096:2:16:8",
#: 2 x 4096 KiB + 8 x 16 KiB (pytorch aten/src/ATen/cuda/CublasHandlePool.cpp getChosenWorkspaceSize), taken from the
#: caching allocator and kept for the process. Two live in every GEMM row: the main thread's (forward) and the
#: autograd engine's device thread's (backward); each script runs its speed benchmarks, backward included, first.
CUBLAS_WORKSPACE = 4096 * 1024 * 2 + 16 * 1024 * 8
SCRIPTS = {
    "cross_entropy": "benchmark/scripts/benchmark_cross_entropy.py @ b5672a15 (the commit that wrote these rows)",
    "fused_linear_cross_entropy": "benchmark/scripts/benchmark_fused_linear_cross_entropy.py @ 90fb5e4a",
    "geglu": "benchmark/scripts/benchmark_geglu.py @ b5672a15",
}
DTYPE_BYTES = {"torch.bfloat16": 2, "torch.float16": 2, "torch.float32": 4}
#: _test_memory's calls per row: gradients accumulate over them (no zero_grad), as over accumulation micro-steps
CALLS = 10
#: Llama 3 8B's head is FLCE's benchmark shape (H 4096, V 128256); ``loss_bytes`` reads its two dimensions
FLCE_SPEC = "meta-llama/Llama-3.1-8B"


@dataclass(frozen=True)
class Priced:
    row: BenchRow
    script: int        # bytes the benchmark script holds (hand count, module docstring)
    op: int            # bytes perfguide's component gives the op
    component: str     # which perfguide function priced the op

    @property
    def estimate_mib(self) -> float:
        return (self.script + self.op) / MiB

    @property
    def error_pct(self) -> float:
        return 100 * (self.estimate_mib - self.row.y_value_50) / self.row.y_value_50


def _traced_release() -> str:
    """The transformers release perfguide's loss eras were traced on; from 4.49 on the loss shifts the labels, not
    the logits, so no shift copy: a bare cross-entropy on [BT, V] copies nothing either."""
    return activations_data().loss_paths.traced_release


def cross_entropy(row: BenchRow) -> Priced:
    """``CrossEntropyLoss()(x, y)`` / ``LigerCrossEntropyLoss()(x, y)`` then ``backward()`` on an fp32 [B*T, V] leaf.

    Script: ``x`` (held through backward: the loss path's held output, loop_keeps_outputs), int64 targets, and
    ``x.grad`` from the previous call (fp32, [BT, V]). The reference is torch's loss on fp32 logits, which is HF's
    own path once the logits are fp32 (no upcast): ``loss_path_units`` with fp32 weights. Liger's kernel writes the
    gradient into ``x`` in place and returns it as the gradient (ops/cross_entropy.py), so it adds only its fp32
    per-token loss, the term ``liger_kernel.loss_bytes`` counts for it; perfguide's Liger runs the fused linear
    loss, not this one, so no other component applies."""
    bt, v = row.config["B"] * row.config["T"], row.x_value
    setup = Setup(weights_dtype="fp32", micro_batch_size=row.config["B"], seq_len=row.config["T"])
    targets = bt * 8
    if row.kernel_provider == "huggingface":
        op = loss_path_units(setup, _traced_release(), loop_keeps_outputs=True) * bt * v
        return Priced(row, targets + bt * v * 4, op, "loss_path_units(fp32, keeps x)")
    return Priced(row, targets + bt * v * 4, bt * 4, "in-place gradient + fp32 per-token loss")


def fused_linear_cross_entropy(row: BenchRow) -> Priced:
    """``Linear(H, V, bias=False)`` + ``CrossEntropyLoss`` vs ``LigerFusedLinearCrossEntropyLoss`` on [BT, H].

    Script: BOTH modules are built on the GPU for every row (two [V, H] head weights), the input [BT, H] and its
    ``.grad`` from the previous call, the int64 targets, the used head's weight ``.grad`` from the previous call,
    and two cuBLAS workspaces. The reference runs torch's cross-entropy on the 16-bit logits themselves (no fp32
    upcast, unlike HF's ForCausalLMLoss): ``loss_path_units`` with ``ce_bytes`` = the logits' dtype, and the loop
    does not hold the logits (the module returns the loss). Liger: ``liger_kernel.loss_bytes`` (the [chunk, V]
    tiles, the [BT, H] input gradient, the fp32 loss) plus ``accumulating_head_grad_bytes``: the [V, H] weight
    gradient it allocates in forward beside the previous call's ``.grad`` (the ten calls accumulate, never
    zeroed: a Setup with gradient_accumulation_steps=10)."""
    cfg = row.config
    h, v, bt, dt = cfg["H"], cfg["V"], row.x_value, DTYPE_BYTES[cfg["dtype"]]
    spec = ModelSpec.from_any(FLCE_SPEC)
    if (spec.hidden_size, spec.vocab_size) != (h, v):
        raise ValueError(f"{row.label}: H {h} / V {v} is not {FLCE_SPEC}'s head ({spec.hidden_size} / {spec.vocab_size})")
    setup = Setup(weights_dtype="bf16" if dt == 2 else "fp32", micro_batch_size=1, seq_len=bt,
                  gradient_accumulation_steps=CALLS)
    script = 2 * v * h * dt + 2 * bt * h * dt + bt * 8 + v * h * dt + 2 * CUBLAS_WORKSPACE
    if row.kernel_provider == "huggingface":
        op = loss_path_units(setup, _traced_release(), loop_keeps_outputs=False, ce_bytes=dt) * bt * v
        return Priced(row, script, op, f"loss_path_units(ce_bytes={dt})")
    op = liger_kernel.loss_bytes(spec, setup) + liger_kernel.accumulating_head_grad_bytes(spec, setup, dt)
    return Priced(row, script, op, "loss_bytes + accumulating_head_grad_bytes")


def geglu(row: BenchRow) -> Priced:
    """Forward only: ``LlamaMLP`` (``down(act(gate(x)) * up(x))``) vs ``LigerGEGLUMLP`` in 16 bits on [B, T, H].

    Script: the three [I, H] weights (built in fp32, converted), ``x``, the returned output [BT, H], two cuBLAS
    workspaces. The op: the MLP's saved tensors, the llama family's per-token ``i`` coefficient of the row's
    regime (gate, act(gate), up and the product, 2 B each in 16 bits); Liger keeps act(gate) less
    (``liger_saved_less_*`` by regime: its GELU-mul recomputes it in backward)."""
    cfg = row.config
    bt, h, i, dt = cfg["bsz"] * row.x_value, cfg["hidden_size"], cfg["intermediate_size"], DTYPE_BYTES[cfg["dtype"]]
    setup = Setup(weights_dtype="bf16" if dt == 2 else "fp32", micro_batch_size=cfg["bsz"], seq_len=row.x_value)
    kind = regime(setup)
    per_i = family_coefficients("llama")[kind].per_token["i"]
    if row.kernel_provider == "liger":
        per_i -= constant(liger_kernel.SAVED_LESS["half" if kind == "half" else "fp32"])
    script = 3 * i * h * dt + 2 * bt * h * dt + 2 * CUBLAS_WORKSPACE
    return Priced(row, script, int(per_i * bt * i), f"llama {kind} per-token i ({per_i:g} B)")


PRICERS: dict[str, Callable[[BenchRow], Priced]] = {
    "cross_entropy": cross_entropy, "fused_linear_cross_entropy": fused_linear_cross_entropy, "geglu": geglu,
}


def not_priced(row: BenchRow) -> str | None:
    """Why a stored memory row is not priced; None when it is."""
    if row.metric_name != "memory":
        return "speed row (kernel time, not a training step)"
    if row.kernel_name == "geglu" and row.kernel_operation_mode != "forward":
        return ("the isolated MLP's backward in flight (gradients of act, gate, up and the weights) sets this peak; "
                "perfguide prices the backward in flight per block (memory/block_backward.py), not per op")
    return None


def price_all(rows: list[BenchRow]) -> tuple[list[Priced], list[tuple[BenchRow, str]]]:
    priced, skipped = [], []
    for row in rows:
        why = not_priced(row)
        if why:
            skipped.append((row, why))
        else:
            priced.append(PRICERS[row.kernel_name](row))
    return priced, skipped


def tile_bytes(row: BenchRow) -> int:
    """One [chunk, V] 16-bit logits tile of Liger's fused linear cross-entropy at the row's shape."""
    spec = ModelSpec.from_any(FLCE_SPEC)
    return liger_kernel.chunk_rows(spec, row.x_value) * row.config["V"] * DTYPE_BYTES[row.config["dtype"]]


def _group_lines(priced: list[Priced]) -> list[str]:
    lines = ["| kernel | provider | mode | rows | median abs error | worst row (error) |", "|---|---|---|---:|---:|---|"]
    groups: dict[tuple[str, str, str], list[Priced]] = {}
    for p in priced:
        groups.setdefault((p.row.kernel_name, p.row.kernel_provider, p.row.kernel_operation_mode), []).append(p)
    for (kernel, provider, mode), ps in groups.items():
        worst = max(ps, key=lambda p: abs(p.error_pct))
        med = statistics.median(abs(p.error_pct) for p in ps)
        lines.append(f"| {kernel} | {provider} | {mode} | {len(ps)} | {med:.2f}% | "
                     f"{worst.row.x_name}={worst.row.x_value} ({worst.error_pct:+.2f}%) |")
    return lines


def _row_lines(priced: list[Priced]) -> list[str]:
    lines = ["| row | liger | GPU | published MiB | script MiB | op MiB (component) | estimate MiB | error |",
             "|---|---|---|---:|---:|---|---:|---:|"]
    for p in priced:
        r = p.row
        lines.append(f"| {r.label} | {r.liger_version} | {r.gpu_name} | {r.y_value_50:.3f} | {p.script / MiB:.3f} | "
                     f"{p.op / MiB:.3f} ({p.component}) | {p.estimate_mib:.3f} | {p.error_pct:+.2f}% |")
    return lines


def _flce_notes(priced: list[Priced]) -> list[str]:
    liger = [p for p in priced if p.row.kernel_name == "fused_linear_cross_entropy" and p.row.kernel_provider == "liger"]
    hf = [p for p in priced if p.row.kernel_name == "fused_linear_cross_entropy" and p.row.kernel_provider == "huggingface"]
    gaps = ", ".join(f"{(p.row.y_value_50 * MiB - p.script - p.op) / tile_bytes(p.row):.3f}" for p in liger)
    lines = [
        "## Who is right where perfguide and the rows differ", "",
        f"**Liger fused linear cross-entropy (liger {liger[0].row.liger_version if liger else '-'}).** The published "
        f"peaks sit above perfguide's `loss_bytes` by exactly two [chunk, V] 16-bit logits tiles at every BT "
        f"(published minus estimate, in tiles: {gaps}). perfguide counts two tiles, what the current release "
        "holds: at a chunk's first GEMM the previous chunk's logits (their gradient, written in place and aliased "
        "as `grad_logits_chunk` since v0.5.3) and the new chunk's logits. The release that measured these rows "
        "kept two more there: v0.4.2's loop (ops/fused_linear_cross_entropy.py at tag v0.4.2) upcasts each "
        "chunk (`logits_chunk.float()`, one fp32 tile = two 16-bit tiles, beside the 16-bit logits it came from) "
        "while the previous chunk's scaled copy (`grad_logits_chunk = logits_chunk * alpha`) is still bound: "
        "16-bit logits + fp32 copy + previous gradient copy = 4 tiles. PR #406 (90fb5e4a, the commit that "
        "wrote these rows) removed the upcast but left the version string at 0.4.2, and its rows moved by 1 KiB "
        "(4245.546875 -> 4245.5478515625 MiB at BT 4096), so they measured a loop that still upcast (an "
        "installed 0.4.2 release, not the PR's source, by this count); v0.5.3 (42ff02ac) dropped the `* alpha` "
        "copy. perfguide is right for the releases it plans for (liger-kernel 0.5.3 on); the rows are right "
        "for v0.4.2. No perfguide change: pricing a 2024 release's extra tiles would take a Liger release era "
        "perfguide does not read.", "",
        "**Liger's head-gradient buffer.** Without the [V, H] buffer Liger allocates in forward "
        "(`torch.zeros_like(weight)`) beside the previous call's `.grad`, every Liger row would sit 1002 MiB "
        "lower (-24% at BT 4096): the script's ten calls accumulate, as accumulation micro-steps do. perfguide "
        "prices it (`accumulating_head_grad_bytes`) for a trained head under gradient accumulation on one GPU or "
        "DDP; before this bench it counted only the head gradient a first micro-step makes.", "",
        "**The fused_linear_cross_entropy reference is not HF's loss.** The benchmark's `huggingface` provider "
        "is `torch.nn.Linear` + `torch.nn.CrossEntropyLoss` on the 16-bit logits, so log-softmax, its gradient "
        "and the logits' gradient are 16-bit: 6 B per logit at the peak, which `loss_path_units(..., "
        "ce_bytes=2)` prices to the byte. HF's `ForCausalLMLoss` (transformers >= 4.46) upcasts the logits to "
        "fp32 first; perfguide's default (`ce_bytes` None) prices that path, 12 B per logit at the same point"
        + (f" ({(12 - 6) * hf[-1].row.x_value * hf[-1].row.config['V'] / 2**30:.1f} GiB more at BT "
           f"{hf[-1].row.x_value})" if hf else "") + ". Both are right for what they run: a Liger user "
        "comparing against this reference sees a smaller saving than an HF Trainer run gets.", "",
        "**cross_entropy.** The reference is fp32 logits, where HF's path and torch's coincide (no upcast): "
        "`loss_path_units` with the benchmark holding its input through backward is 16 B per logit, plus the "
        "previous call's `.grad` (4 B) = 20 B, to 0.001 MiB. Liger's kernel writes the gradient over its input, so "
        "the row is the input, the targets and the fp32 loss; the small residue (about 0.14 MiB) is Liger's "
        "bookkeeping tensors.", "",
    ]
    return lines


def report(priced: list[Priced], skipped: list[tuple[BenchRow, str]]) -> str:
    rows = priced[0].row if priced else None
    skipped_memory = [(r, why) for r, why in skipped if r.metric_name == "memory"]
    lines = [
        "# Liger-Kernel kernel memory benchmarks vs perfguide's components", "",
        f"Generated by `bench/kernels.py` from `{CSV.relative_to(ROOT.parent)}`: every row of the priced kernels "
        f"(cross_entropy, fused_linear_cross_entropy, geglu) in {rows.source_repo if rows else ''} "
        f"`{rows.source_path if rows else ''}` @ {rows.commit[:12] if rows else ''}, {len(priced) + len(skipped)} rows "
        f"({len(priced)} memory rows priced, {len(skipped_memory)} memory rows not priced, "
        f"{len(skipped) - len(skipped_memory)} speed rows stored, not priced).", "",
        "Published: `torch.cuda.max_memory_allocated() / 2**20` around the op (MiB; benchmark/scripts/utils.py "
        "`_test_memory`, median of ten calls). Estimate = the bytes the benchmark script holds (hand-counted "
        "from the script that wrote the rows: " + "; ".join(f"{k}: {v}" for k, v in SCRIPTS.items()) + ") + the "
        "op's bytes from perfguide's own component. Two cuBLAS workspaces of "
        f"{CUBLAS_WORKSPACE / MiB:.3f} MiB each sit in every GEMM row (A100: torch's default "
        "CUBLAS_WORKSPACE_CONFIG, one for the forward thread, one for autograd's device thread). Nothing is "
        "fitted to these rows.", "",
        "## Per kernel and provider", "", *_group_lines(priced), "",
        *_flce_notes(priced),
        "**geglu, forward mode.** The published forward peaks are the MLP's four saved 16-bit [BT, I] tensors "
        "(llama `half` per-token `i` = 8 B: gate, act(gate), up, the product) for HF and three for Liger "
        "(`liger_saved_less_half_per_ffn_unit` = 2 B: act(gate) is recomputed in backward), to the byte: the "
        "published HF-minus-Liger difference is 2.000 B per token per FFN unit at every T.", "",
        "## Not priced", "",
        "- geglu full and backward modes (16 rows): " + (not_priced(next(r for r, _ in skipped_memory)) or "") + ".",
        "- rms_norm, swiglu, rope, layer_norm (not stored): perfguide has no per-op price for them. Its Liger "
        "terms are what a block keeps less for backward (`norm_savings`, `liger_saved_less_*`; RoPE none), "
        "folded into the per-block activation model; an isolated op's fwd+bwd peak is set by that op's own "
        "backward temporaries (HF's RMSNorm: about 40 B per element at H 1024 in the published file, Liger's about 18), "
        "which inside a block sit below the block's peak. swiglu's rows are all full mode (the backward peak), "
        "so they carry no forward-only reading as geglu's do.",
        "- Speed rows: kernel times, not training steps (bench/throughput.py prices steps).", "",
        "## Every priced row", "", *_row_lines(priced), "",
    ]
    return "\n".join(lines)


def main() -> int:
    priced, skipped = price_all(load())
    return publish(report(priced, skipped), OUT)


if __name__ == "__main__":
    raise SystemExit(main())
