"""DeepSpeed ZeRO-1/2's ipg buffers by release: before 0.4.0 each held 4.5 x ``reduce_bucket_size`` fp16 elements.

deepspeed/runtime/zero/stage2.py v0.3.10 (tag 2021-01-08) ``backward()``: ``buf_0 = torch.empty(int(self.reduce_bucket_size
* 4.5), dtype=torch.half)``, a second one with overlap_comm; v0.4.0: ``torch.empty(int(self.reduce_bucket_size))``.
The epilogue's ``_release_ipg_buffers()`` drops them, so they meet the saved activations at the start of backward.
"""

from __future__ import annotations

import pytest
from helpers import load_bench

import perfguide.memory.analytic as analytic
from perfguide._data import load
from perfguide.memory.analytic import training_memory
from perfguide.model.types import ModelSpec
from perfguide.setup import Setup

BUCKET = 200_000_000   # the 2021 examples/seq2seq/ds_config.json reduce_bucket_size


def _zero2() -> Setup:
    # batch 8: the loss buffers stay under even the 0.4+ buffers, so both releases peak at the start of backward
    return Setup(micro_batch_size=8, seq_len=128, strategy="zero2", num_gpus=2, weights_dtype="fp32", autocast="fp16",
                 attn_implementation="eager")


@pytest.fixture
def bucket_2e8(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(load("calibration")["deepspeed_bucket_elements"], "value", BUCKET)


@pytest.mark.usefixtures("bucket_2e8")
def test_v0_3_ipg_buffers_hold_four_and_a_half_buckets(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = ModelSpec.from_any("google-t5/t5-large")
    monkeypatch.setattr(analytic, "installed_deepspeed", lambda: "0.4.0")
    new = training_memory(spec, _zero2())
    monkeypatch.setattr(analytic, "installed_deepspeed", lambda: "0.3.10")
    old = training_memory(spec, _zero2())
    assert new.notes[0] == old.notes[0] == "peak in checkpoint recompute"   # the start of backward
    assert new.other == 2 * BUCKET * 2                                   # two fp16 buffers (overlap_comm)
    assert old.other == 2 * int(4.5 * BUCKET) * 2
    assert old.peak_allocated - new.peak_allocated == 2 * int(3.5 * BUCKET) * 2
    assert old.weights == new.weights and old.activations == new.activations


def test_without_a_stated_release_the_buckets_stay_as_priced(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = ModelSpec.from_any("google-t5/t5-large")
    monkeypatch.setattr(analytic, "installed_deepspeed", lambda: None)
    base = training_memory(spec, _zero2())
    monkeypatch.setattr(analytic, "installed_deepspeed", lambda: "0.19.8")
    assert training_memory(spec, _zero2()).peak_allocated == base.peak_allocated
    ddp = _zero2().replace(strategy="ddp")                               # not DeepSpeed: no ipg buffers at all
    monkeypatch.setattr(analytic, "installed_deepspeed", lambda: "0.3.10")
    assert training_memory(spec, ddp).peak_allocated == training_memory(spec, ddp).peak_allocated


def test_the_bench_prices_a_row_with_its_release_and_bucket_then_restores_both() -> None:
    acc = load_bench("accuracy_runtime")
    row = {"parallelism": "DeepSpeed ZeRO-2 (no CPU offload)",
           "notes": "DeepSpeed 0.3.10 (inferred); ds_config reduce_bucket_size 2e8, overlap_comm"}
    before_fn, before = analytic.installed_deepspeed, load("calibration")["deepspeed_bucket_elements"]["value"]
    with acc.deepspeed_runtime(row):
        assert analytic.installed_deepspeed() == "0.3.10"
        assert load("calibration")["deepspeed_bucket_elements"]["value"] == BUCKET
    assert analytic.installed_deepspeed is before_fn
    assert load("calibration")["deepspeed_bucket_elements"]["value"] == before
    with acc.deepspeed_runtime({**row, "parallelism": "DDP (torch.distributed.launch, 2 processes)"}):
        assert analytic.installed_deepspeed is before_fn                 # a DDP row is priced as is
