"""The PEFT README's ZeRO-3 + CPU offload rows (1155 mt0-xxl, 1158 bloomz-7b1) on one A100 with DeepSpeed 0.8.0's
gather (perfguide/memory/zero3_window.py ``offload_copy_shards``, ``zero3_copy_bytes``; docs/validation.md 63).

By hand from DeepSpeed 0.8.0's runtime/zero/partition_parameters.py: on one GPU the offloaded partition of a parameter
is the whole parameter, and ``all_gather_coalesced`` copies it to the GPU (``param.ds_tensor.to(device)``) beside the
buffer it gathers into. The largest gather is the vocabulary-sized head (mt0-xxl's untied ``lm_head``, bloomz's tied
embedding), gathered at the end of forward beside the window; the copy adds vocab x hidden fp32 elements there. The
walk's peak without copies is one step later: the head's own fetch then prefetches while the coordinator's count is
under stage3_max_live_parameters, for mt0-xxl one more Linear (the last decoder block's ``wo``, d_ff x d_model, the
backward's first use after the head), for bloomz none (the count is already at 1e9). So the copies add (vocab - d_ff)
x d_model elements for mt0-xxl and vocab x hidden for bloomz-7b1, and the loss path (logits, loss) never runs inside
a gather."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from helpers import load_bench

from perfguide.memory.ledger import ledger
from perfguide.memory.zero3_window import DEEPSPEED_DEFAULT_KNOBS, zero3_copy_bytes

CSV = Path(__file__).resolve().parents[1] / "bench" / "data" / "published_measurements.csv"
HEADS = {"1155": 250_112 * 4_096, "1158": 250_880 * 4_096}   # vocab x d_model of mt0-xxl and bloomz-7b1 (config.json)
AFTER_HEAD = {"1155": 10_240 * 4_096, "1158": 0}              # what the head's fetch prefetches next (mt0-xxl's wo)


def _row(row_id: str) -> dict[str, str]:
    with CSV.open(newline="") as f:
        return next(r for r in csv.DictReader(f) if r["row_id"] == row_id)


@pytest.mark.parametrize("row_id", sorted(HEADS))
def test_the_copy_is_the_whole_head_in_fp32_before_0_9(row_id: str) -> None:
    row = _row(row_id)
    spec = load_bench("accuracy_spec")._spec(row["model_hf_id"])
    setup = load_bench("accuracy_setup")._train_setup(row, spec)
    assert setup.strategy == "zero3" and setup.offload_params and setup.num_gpus == 1 and setup.weights_dtype == "fp32"
    assert spec.vocab_size * spec.hidden_size == HEADS[row_id]
    trainable = ledger(spec, setup).trainable
    copy = {release: zero3_copy_bytes(spec, setup, trainable, DEEPSPEED_DEFAULT_KNOBS, checkpointed=False, release=release,
                                      params_offloaded=True)
            for release in ("0.8.0", "0.9.0")}
    assert copy == {"0.8.0": 4 * (HEADS[row_id] - AFTER_HEAD[row_id]), "0.9.0": 0}


@pytest.mark.parametrize("row_id", sorted(HEADS))
def test_the_rows_run_0_8_and_the_copy_is_not_stacked_on_the_loss_path(row_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    row = _row(row_id)
    assert "DeepSpeed 0.8.0 (inferred" in row["notes"] and "reduce_bucket_size 5e8" in row["notes"]
    accuracy = load_bench("accuracy")
    import perfguide.memory.zero3_window as window

    (with_copy,) = accuracy.evaluate_all([row], [])
    monkeypatch.setattr(window, "offload_copy_shards", lambda setup, release, params_offloaded: 0)
    (without,) = accuracy.evaluate_all([row], [])
    spec = load_bench("accuracy_spec")._spec(row["model_hf_id"])
    setup = load_bench("accuracy_setup")._train_setup(row, spec)
    logits = accuracy.estimate_memory(spec, setup, None, loss_bytes=accuracy._loss_bytes(row, spec, setup)).logits
    # the forward peak holds the larger of the head's copy and the loss path, not both (1e9-byte GB, the row's unit)
    assert with_copy.predicted is not None and without.predicted is not None
    assert round((with_copy.predicted - without.predicted) * 1e9) == max(4 * (HEADS[row_id] - AFTER_HEAD[row_id]) - logits, 0)
