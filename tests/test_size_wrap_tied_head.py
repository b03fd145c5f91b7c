"""FSDP1's size-based auto-wrap and a tied LM head: two units, two copies of the one weight (torch 1.12
``_recursive_wrap`` + FlattenParamsWrapper, which dedups shared parameters only inside its own module)."""

from __future__ import annotations

import csv
from pathlib import Path

from helpers import load_bench

from perfguide.memory.analytic import training_memory
from perfguide.memory.sharding import size_wrap_splits_tied_head, size_wrapped_spec
from perfguide.model.types import ModelSpec
from perfguide.setup import Setup

# GPT-2 large (config.json: vocab 50257, n_embd 1280, n_layer 36): wte = 50257 x 1280 = 64,328,960 parameters
WTE = 50257 * 1280


def _large() -> ModelSpec:
    return ModelSpec.from_any("openai-community/gpt2-large")


def test_the_blog_thresholds_split_the_tie() -> None:
    spec = _large()
    assert spec.tie_word_embeddings and spec.lm_head_params == 0
    # 2K and 1M: wte (64.3M) is a leaf over the threshold, a unit of its own; 1e8 (accelerate 0.7's default): no
    # leaf or block reaches it, but GPT2Model's leftover (all 774M) does, so the base model is a unit and the head,
    # the root's other child, is flattened again by the root
    for threshold in (2_000, 1_000_000, 100_000_000):
        assert size_wrap_splits_tied_head(spec, threshold)
    untied = size_wrapped_spec(spec, 2_000)
    assert untied.lm_head_params == WTE and untied.total_params == spec.total_params + WTE
    assert not untied.tie_word_embeddings


def test_no_policy_or_a_threshold_over_the_model_keeps_one_unit() -> None:
    spec = _large()
    assert not size_wrap_splits_tied_head(spec, 0)                       # accelerate: no auto_wrap_policy at 0
    assert not size_wrap_splits_tied_head(spec, spec.total_params + 1)  # the root is never recursed into
    assert size_wrapped_spec(spec, 0) is spec
    assert not size_wrap_splits_tied_head(ModelSpec.from_any("meta-llama/Llama-2-7b-hf"), 2_000)  # untied already


def test_blocks_wrapped_but_embedding_and_leftover_under_the_threshold_keep_the_tie() -> None:
    # GPT-2 large with an 8,000-token vocabulary: wte 10,240,000 < 15M <= one block (708,390,400 / 36 = 19,677,511):
    # every block is a unit; the leftover (wte + wpe 1,310,720 + ln_f 2,560 = 11,553,280) stays under 15M, so
    # GPT2Model is not wrapped and wte and the head both sit in the root's FlatParameter
    big = _large()
    emb = 8000 * 1280 + 1024 * 1280
    spec = big.model_copy(update={"vocab_size": 8000, "embedding_params": emb,
                                  "total_params": big.outside_embeddings + emb})
    assert not size_wrap_splits_tied_head(spec, 15_000_000)
    assert size_wrap_splits_tied_head(spec, 10_000_000)   # now wte itself is over the threshold


def test_the_second_copy_is_sharded_like_the_rest() -> None:
    spec = _large()
    setup = Setup(task="train", micro_batch_size=4, seq_len=128, weights_dtype="fp32", optimizer="adamw_torch_fused",
                  strategy="fsdp", num_gpus=2, fsdp_version=1)
    tied, split = training_memory(spec, setup), training_memory(size_wrapped_spec(spec, 2_000), setup)
    share = WTE * 4 // 2   # fp32, one half per rank
    assert split.weights - tied.weights == share
    assert split.gradients - tied.gradients == share
    assert split.optimizer_states - tied.optimizer_states == 2 * share   # AdamW: exp_avg and exp_avg_sq


def test_blog_rows_read_their_thresholds() -> None:
    acc = load_bench("accuracy_spec")
    with open(Path(acc.__file__).parent / "data" / "published_measurements.csv", newline="") as f:
        rows = {r["row_id"]: r for r in csv.DictReader(f)}
    assert acc.size_wrap_threshold(rows["640"]) is None               # DDP
    assert acc.size_wrap_threshold(rows["643"]) == 1_000_000           # "min_num_params=1M"
    assert acc.size_wrap_threshold(rows["651"]) == 2_000               # "FSDP 2K + CPU offload"
    assert acc.size_wrap_threshold(rows["642"]) == 2_000               # SHARD_GRAD_OP: the blog's sample config
    assert acc.trained_spec(rows["640"], _large()).lm_head_params == 0
