"""The FSDP + QLoRA rows (PEFT docs, philschmid.de, Answer.AI's fsdp_qlora) read as the LoraConfig their scripts
build, and the bytes that reading adds, derived by hand from Llama-2-70B's config."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from perfguide.memory.analytic import training_memory

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("row_id,dropout", [("757", 0.1), ("758", 0.1), ("714", 0.05), ("676", 0.1), ("662", 0.1)])
def test_rows_carry_their_lora_dropout(acc: ModuleType, rows: dict[str, dict[str, str]], row_id: str, dropout: float) -> None:
    """run_peft_qlora_fsdp.sh --lora_dropout 0.1; philschmid's LoraConfig lora_dropout=0.05; fsdp_qlora train.py's
    default lora_dropout 0.1 (its benchmark commands leave it)."""
    row = rows[row_id]
    setup = acc._train_setup(row, acc._spec(row["model_hf_id"]))
    assert setup.lora is not None and setup.lora.dropout == dropout


def test_dropout_masks_of_the_recomputed_llama2_70b_block(acc: ModuleType, rows: dict[str, dict[str, str]]) -> None:
    """PEFT runs ``lora_A(dropout(x))`` per adapted Linear; CUDA dropout keeps a 1-byte mask per element for backward.
    With checkpointing only the recomputed block holds them: 2 x 2048 tokens x (6 x 8192 inputs of q, k, v, o, gate,
    up + 28672 of down) x 1 B = 318,767,104 B on row 757, whose peak is that recompute."""
    row = rows["757"]
    spec = acc._spec(row["model_hf_id"])
    setup = acc._train_setup(row, spec)
    assert setup.lora is not None
    dry = setup.replace(lora=setup.lora.model_copy(update={"dropout": 0.0}))
    with_masks, without = training_memory(spec, setup), training_memory(spec, dry)
    assert with_masks.notes[0] == without.notes[0] == "peak in checkpoint recompute"
    assert with_masks.peak_allocated - without.peak_allocated == 2 * 2048 * (6 * 8192 + 28672) == 318_767_104


def test_accelerate_accumulation_holds_the_unsharded_lora_gradients(acc: ModuleType, rows: dict[str, dict[str, str]]) -> None:
    """HF Trainer accumulates inside accelerate's ``accumulate``, which skips the gradient sync (FSDP1 ``no_sync``,
    FSDP2 ``set_requires_gradient_sync(False)``) on the first of the 2 micro-steps: every rank holds the whole LoRA
    gradient, 16-bit under the Trainer's bf16 FSDP mixed precision, on the GPU even with CPU offload. Llama-2-70B
    all-linear r=8: 80 x 8 x (2 x (8192 + 8192) + 2 x (8192 + 1024) + 3 x (8192 + 28672)) = 103,546,880 parameters
    x 2 B = 207,093,760 B; philschmid's r=16 on Llama-3-70B (same Linears) twice that."""
    for row_id, held in (("757", 207_093_760), ("714", 414_187_520)):
        row = rows[row_id]
        spec = acc._spec(row["model_hf_id"])
        setup = acc._train_setup(row, spec)
        assert setup.gradient_accumulation_steps == 2 and setup.offload_params
        assert training_memory(spec, setup).gradients == held
        assert training_memory(spec, setup.replace(gradient_accumulation_steps=1)).gradients == 0   # offloaded shards


def test_reduce_scatter_pool_stays_reserved_through_the_next_forward(acc: ModuleType, rows: dict[str, dict[str, str]]) -> None:
    """FSDP allocates the sharded gradients on its reduce-scatter stream; after zero_grad frees them that stream's
    pool keeps the blocks, so row 758's peak (the first recompute, gradients of the last step freed) sees them as
    reserved: the r=8 LoRA's 103,546,880 fp32 gradients over 2 ranks = 207,093,760 B. Under CPU offload (row 757)
    the gradients live on the CPU and the pool holds nothing extra; a loop that keeps its gradients allocated
    (zero_grad(set_to_none=False)) has them in the allocated peak instead."""
    from perfguide.memory.overhead import reserved_from_allocated

    row = rows["758"]
    spec = acc._spec(row["model_hf_id"])
    setup = acc._train_setup(row, spec)
    est = training_memory(spec, setup)
    assert est.notes[0] == "peak in checkpoint recompute"
    assert est.peak_reserved - reserved_from_allocated(est.peak_allocated, "train") == 103_546_880 * 4 // 2 == 207_093_760
    kept = training_memory(spec, setup, grads_persist=True)
    assert kept.peak_reserved == reserved_from_allocated(kept.peak_allocated, "train")
