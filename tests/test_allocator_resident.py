"""The resident-bytes reading of the published allocator pairs (bench/allocator_resident.py, issue 24): each pair's
resident bytes against perfguide's ledger or a hand count from the model's parameter count, the refit against the
median of the pairs, and the one row the reading was tried on checked by hand."""

from __future__ import annotations

import csv
import statistics
from pathlib import Path
from types import ModuleType

import pytest
from helpers import load_bench

ROOT = Path(__file__).resolve().parents[1]
GiB = 2**30
LLAMA2_7B_PARAMS = 6_738_415_616   # meta-llama/Llama-2-7b-hf (its model card / config: 32 x 4096, 11008 MLP, 32000 vocab)
BERT_BASE_PARAMS = 109_482_240    # bert-base-uncased BertModel with pooler


@pytest.fixture(scope="module")
def mod() -> ModuleType:
    return load_bench("allocator_resident")


def _pairs() -> dict[str, dict[str, str]]:
    with (ROOT / "bench" / "data" / "allocator_pairs.csv").open(encoding="utf-8") as fh:
        return {r["pair_id"]: r for r in csv.DictReader(fh)}


def test_every_read_steady_pair_names_its_resident_bytes_and_their_derivation(mod: ModuleType) -> None:
    pairs = mod.steady_pairs()
    assert len(pairs) == 11
    assert all(float(p["resident"]) < float(p["allocated"]) and p["resident_source"] for p in pairs)


def test_llama_cookbook_and_bert_residents_by_hand() -> None:
    """C1-C3: the bf16 base sharded over 4 GPUs (3.369 GB) + adapters; P1: fp32 weights + two AdamW states, 12 B per
    parameter; P2/P3: the fp32 weights only (LoRA)."""
    pairs = _pairs()
    shard = LLAMA2_7B_PARAMS * 2 / 4 / 1e9
    assert shard == pytest.approx(3.369, abs=5e-4)
    for pid in ("C1", "C2", "C3"):
        assert float(pairs[pid]["resident"]) == pytest.approx(shard, abs=0.01)
    assert float(pairs["P1"]["resident"]) == pytest.approx(BERT_BASE_PARAMS * 12 / GiB, abs=1e-3)
    assert float(pairs["P2"]["resident"]) == pytest.approx(BERT_BASE_PARAMS * 4 / GiB, abs=1e-3)


def test_answerai_residents_are_perfguides_estimate_of_the_same_runs() -> None:
    """A1/A2 are rows 666/667: their resident column is what perfguide places on one GPU for those rows (weights +
    optimizer states), and at least the bf16 base's half (6.276 GiB)."""
    acc = load_bench("accuracy")
    with acc.CSV.open(encoding="utf-8") as fh:
        rows = {r["row_id"]: r for r in csv.DictReader(fh)}
    pairs = _pairs()
    for pid, rid in (("A1", "666"), ("A2", "667")):
        row = rows[rid]
        spec = acc._spec(row["model_hf_id"])
        setup = acc._train_setup(row, spec)
        spec = acc.trained_spec(row, spec)
        est = acc._verdict_estimate(row, spec, setup, acc._hardware(row["gpu_type"], setup.num_gpus))
        assert float(pairs[pid]["resident"]) == pytest.approx((est.weights + est.optimizer_states) / GiB, abs=1e-3)
        assert float(pairs[pid]["resident"]) > LLAMA2_7B_PARAMS * 2 / 2 / GiB


def test_refit_is_the_median_of_the_pairs_transient_ratios(mod: ModuleType) -> None:
    """C1 by hand: (32.67 - 3.375) / (25.86 - 3.375) = 1.303; the refit is the median of the 11 such ratios
    (1.198, the BERT-with-ESM-config full fine-tuning pair), held out without Answer.AI's two pairs 1.111."""
    pairs = _pairs()
    assert mod.transient_ratio(pairs["C1"]) == pytest.approx((32.67 - 3.375) / (25.86 - 3.375))
    assert round((32.67 - 3.375) / (25.86 - 3.375), 3) == 1.303
    ratios = [(float(p["reserved"]) - float(p["resident"])) / (float(p["allocated"]) - float(p["resident"]))
              for p in mod.steady_pairs()]
    assert mod.refit() == round(statistics.median(ratios), 3) == 1.198
    others = [r for r, p in zip(ratios, mod.steady_pairs()) if p["source_group"] != "answerai_fsdp_qlora"]
    assert mod.refit("answerai_fsdp_qlora") == round(statistics.median(others), 3) == 1.111
    # taking resident bytes out can only raise a ratio above 1
    assert all(r >= mod.whole_ratio(p) for r, p in zip(ratios, mod.steady_pairs()))


def test_row_685_line_by_hand(mod: ModuleType) -> None:
    """Row 685 (70B QLoRA, A100 80GB): the tried line is today's line less today's reserved (1.116 x allocated) plus
    resident + 1.198 x (allocated - resident); the resident share is the weights' and states' of the allocation."""
    acc = load_bench("accuracy")
    with acc.CSV.open(encoding="utf-8") as fh:
        row = next(r for r in csv.DictReader(fh) if r["row_id"] == "685")
    spec = acc._spec(row["model_hf_id"])
    setup = acc._train_setup(row, spec)
    spec = acc.trained_spec(row, spec)
    est = acc._verdict_estimate(row, spec, setup, acc._hardware(row["gpu_type"], 1))
    resident = est.weights + est.optimizer_states
    head_block = 2 * setup.seq_len * spec.logits_width   # the cached bf16 logits (bench/accuracy_reserved.py)
    tried = resident + 1.198 * (est.peak_allocated - resident) + head_block
    got = next(r for r in mod.line_rows(1.198, 1.079) if r["row"] == "685")
    assert got["split"] == pytest.approx(tried, rel=1e-6)
    assert got["share"] == pytest.approx(resident / est.peak_allocated)
