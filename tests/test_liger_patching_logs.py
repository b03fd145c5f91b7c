"""Liger-Kernel's patching-method logs (rows 2031-2054, source liger_kernel_patching_logs): HF Trainer + FSDP FULL_SHARD
on 4 GPUs, each model with and without Liger, logged by examples/huggingface/callback.py (rank 0's
torch.cuda.max_memory_allocated per step).

The Liger runs of Llama-3-8B, Mistral-7B and Gemma-7B peak at one value whatever the step's length (the log's step
peaks are flat): the optimizer step. It is counted here by hand: accelerate 0.34 upcasts the bf16-loaded FlatParameters
to fp32, so each rank holds a quarter of the fp32 parameters, their fp32 gradients, AdamW's two fp32 moments and the
foreach step's one parameter-sized temporary (torch.optim.AdamW foreach: ``_foreach_sqrt(exp_avg_sqs)``): 5 x 4 B x P / 4.
No gathered unit is alive there: FULL_SHARD FSDP reshards every unit after its backward once gradients sync
(torch distributed/fsdp/_runtime_utils.py ``_should_free_in_backward``), so the estimate must not carry FSDP's gather
window into the optimizer step. Each row also reads back as the setup its log ran."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from helpers import load_bench

from perfguide.hardware.types import Hardware
from perfguide.memory import estimate_memory
from perfguide.model.types import ModelSpec
from perfguide.setup import Setup

ROOT = Path(__file__).resolve().parents[1]
CSV = ROOT / "bench" / "data" / "published_measurements.csv"
MiB = 2**20

#: config.json shapes counted by hand: embedding + untied head + 32 blocks (q, k, v, o, gate, up, down; two norms) + norm
LLAMA3_8B = 2 * 128256 * 4096 + 32 * (4096 * 4096 * 2 + 4096 * 1024 * 2 + 3 * 4096 * 14336 + 2 * 4096) + 4096
MISTRAL_7B = 2 * 32000 * 4096 + 32 * (4096 * 4096 * 2 + 4096 * 1024 * 2 + 3 * 4096 * 14336 + 2 * 4096) + 4096
#: Gemma-7B: tied embedding (256000 x 3072), 28 blocks of 16 heads x 256 (q, k, v 3072 -> 4096, o back), GeGLU FFN 24576
GEMMA_7B = 256000 * 3072 + 28 * (3072 * 4096 * 3 + 4096 * 3072 + 3 * 3072 * 24576 + 2 * 3072) + 3072


def _rows() -> dict[str, dict[str, str]]:
    with CSV.open(encoding="utf-8") as fh:
        return {r["row_id"]: r for r in csv.DictReader(fh) if r["source_group"] == "liger_kernel_patching_logs"}


ROWS = _rows()


def _step_peak(params: int) -> float:
    """MiB one of 4 ranks holds through the AdamW foreach step: fp32 shard, gradient, two moments, one temporary."""
    return 5 * 4 * params / 4 / MiB


@pytest.mark.parametrize(("rows", "params"), [(("2033", "2034"), MISTRAL_7B), (("2037", "2038"), LLAMA3_8B),
                                              (("2041", "2042"), GEMMA_7B)])
def test_liger_runs_peak_at_the_hand_counted_optimizer_step(rows, params):
    for rid in rows:
        published = float(ROWS[rid]["peak_mem_value"])
        assert ROWS[rid]["peak_mem_unit"] == "MiB"
        assert published == pytest.approx(_step_peak(params), rel=0.001)   # what the log shows is that step


def test_fsdp_full_shard_optimizer_step_holds_no_gathered_unit():
    """Llama-3-8B, FULL_SHARD on 4 GPUs, fp32 masters under bf16 autocast, Liger's fused head at 16 tokens: the peak is
    the optimizer step and it is the hand count, without the gathered root unit (embedding and head: 3.9 GiB)."""
    spec = ModelSpec.from_any("meta-llama/Meta-Llama-3-8B")
    assert spec.total_params == LLAMA3_8B
    setup = Setup(micro_batch_size=1, seq_len=16, autocast="bf16", optimizer="adamw_torch", gradient_checkpointing=True,
                  strategy="fsdp", num_gpus=4, fsdp_version=1, liger_kernel=True)
    est = estimate_memory(spec, setup, Hardware.from_name("a100-80gb:4"))
    assert "peak in optimizer step" in est.notes
    assert est.peak_allocated / MiB == pytest.approx(_step_peak(LLAMA3_8B), rel=1e-4)


def test_rows_read_back_as_the_runs():
    setup_mod = load_bench("accuracy_setup")
    spec_mod = load_bench("accuracy_spec")
    loss = load_bench("accuracy_loss")
    assert len(ROWS) == 24
    for row in ROWS.values():
        spec = spec_mod._spec(row["model_hf_id"])
        if "Liger partially applied" in row["method"] or "without fused linear" in row["method"]:
            with pytest.raises(setup_mod.Skip):
                setup_mod._train_setup(row, spec)
            continue
        s = setup_mod._train_setup(row, spec)
        assert (s.strategy, s.num_gpus, s.fsdp_version, s.weights_dtype, s.autocast) == ("fsdp", 4, 1, "fp32", "bf16")
        assert s.gradient_checkpointing and s.optimizer == "adamw_torch"
        assert s.liger_kernel == ("Liger kernels on" in row["method"])
        assert s.attn_implementation == ("eager" if spec.model_type == "phi3" else "sdpa")   # 4.43.3 Phi3: no SDPA
        assert loss._transformers_version(row) == "4.43.3"


def test_fsdp_wrapper_checkpointing_is_priced_non_reentrant():
    """accelerate's FSDP activation checkpointing wraps each block in checkpoint_wrapper(NO_REENTRANT), so these rows'
    block backward is the non-reentrant one although transformers 4.43 (reentrant by default) trained them."""
    runtime = load_bench("accuracy_runtime")
    import perfguide.memory.analytic as analytic
    from perfguide.memory.block_backward import checkpoint_mode

    seen: list[str | None] = []

    def record(spec: object, setup: object, release: str | None = None, *rest: object) -> int:
        seen.append(release)
        return 0

    saved = analytic.block_backward_bytes
    analytic.block_backward_bytes = record   # type: ignore[assignment]
    try:
        with runtime.checkpoint_release(ROWS["2037"]):
            analytic.block_backward_bytes(None, None, "5.24.0")
    finally:
        analytic.block_backward_bytes = saved
    assert checkpoint_mode(seen[0]) == "non_reentrant" and checkpoint_mode("4.43.3") == "reentrant"
