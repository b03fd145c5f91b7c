"""Long-context rows 2200-2244 (issue 24): Arctic Long Sequence Training's recipes (snowflakedb/ArcticTraining
projects/sequence-parallelism, 9d33fd2 2025-06-03 and 5885b9f 2025-07-18) and ms-swift's examples/train/long_text
headers (April-May 2025).

Each row reads back as the recipe or script states it: Ulysses sequence parallelism per rank, ALST's tiled MLP as
shards of at most hidden_size tokens, its own checkpoint offload as activation offloading.
The loss path is counted by hand: at sequence_parallel_size 1 ArcticTraining takes ``model(**batch).loss``, and
transformers 4.51's LlamaForCausalLM returns 16-bit logits that its loss upcasts to fp32; the output is dropped
before backward, whose cross-entropy holds the fp32 log-softmax output, its gradient and the input gradient (12 B
per logit). perfguide's errors on these rows are reported by bench/accuracy.py, not tested here."""

from __future__ import annotations

from types import ModuleType

V = 128256   # Llama-3.1-8B-Instruct config.json vocab_size
ALST = [str(i) for i in range(2200, 2229)]
SWIFT = [str(i) for i in range(2240, 2245)]


def test_rows_name_their_sources_and_commits(rows: dict[str, dict[str, str]]) -> None:
    for i in ALST:
        assert rows[i]["source_group"] == "arctictraining_alst_recipes"
        assert "ArcticTraining/blob/" in rows[i]["source"] and rows[i]["commit_or_date"][:7] in ("9d33fd2", "5885b9f")
    for i in SWIFT:
        assert rows[i]["source_group"] == "swift_long_text_examples" and "ms-swift/blob/" in rows[i]["source"]


def test_one_gpu_baseline_reads_as_the_recipe(acc: ModuleType, rows: dict[str, dict[str, str]]) -> None:
    """run-sp1-llama-8b-baseline.yml: ZeRO-3 with offload_param and offload_optimizer on one H100, FA2, batch 1,
    checkpointing (ArcticTraining's default), no Liger; 32,000 tokens measured, 36,000 the recipe's length."""
    row = rows["2200"]
    spec = acc._spec(row["model_hf_id"])
    s = acc._train_setup(row, spec)
    assert (s.strategy, s.offload_params, s.offload_optimizer, s.num_gpus) == ("zero3", True, True, 1)
    assert (s.micro_batch_size, s.seq_len, s.attn_implementation) == (1, 32000, "flash_attention_2")
    assert s.gradient_checkpointing and not s.liger_kernel and s.autocast == "bf16"
    assert acc._loss_bytes(row, spec, s) == 12 * 32000 * V
    assert acc._train_setup(rows["2201"], spec).seq_len == 36000
    assert acc.evaluate(row, []).kind == "value" and acc.evaluate(rows["2201"], []).kind == "context"


def test_eight_gpu_baselines_ran_data_parallel(acc: ModuleType, rows: dict[str, dict[str, str]]) -> None:
    """The 'no-ulysses' recipes set sequence_parallel_size 1 until e622b40 (2025-09-19) changed it without changing
    the length: ZeRO-3 data parallel over 8 GPUs with only the optimizer offloaded; the second adds Liger, whose
    fused linear cross-entropy replaces HF's loss path (no loss bytes from the bench)."""
    spec = acc._spec(rows["2204"]["model_hf_id"])
    base, liger = acc._train_setup(rows["2204"], spec), acc._train_setup(rows["2205"], spec)
    for s in (base, liger):
        assert (s.strategy, s.offload_optimizer, s.offload_params, s.num_gpus) == ("zero3", True, False, 8)
    assert not base.liger_kernel and liger.liger_kernel
    assert (base.seq_len, liger.seq_len) == (32000, 160000)
    assert acc._loss_bytes(rows["2205"], spec, liger) is None


def test_sequence_parallel_tiled_and_offloaded_rows_read_as_their_recipes(acc: ModuleType, rows: dict[str, dict[str, str]]) -> None:
    """Ulysses rows are priced per rank (Setup.sequence_parallel); ALST's TiledMLP reads as shards of at most
    hidden_size tokens (ArcticTraining model/tiled_compute.py: ceil(s / hidden) shards) and its checkpoint CPU
    offload as activation offloading of the checkpointed layer inputs."""
    spec = acc._spec(rows["2209"]["model_hf_id"])
    assert acc.evaluate(rows["2206"], []).kind == "context"
    assert acc.evaluate(rows["2242"], []).kind == "value"
    tiled, offload, both = (acc._train_setup(rows[i], spec) for i in ("2207", "2208", "2209"))
    assert (tiled.tiled_mlp_shard_tokens, tiled.activation_offloading) == (spec.hidden_size, False)
    assert (offload.tiled_mlp_shard_tokens, offload.activation_offloading) == (0, True)
    assert (both.tiled_mlp_shard_tokens, both.activation_offloading) == (4096, True)
    assert {acc.evaluate(rows[i], []).kind for i in ("2207", "2208", "2209", "2227")} == {"context"}
    # the same recipe with Ulysses over its 8 GPUs planted: each rank holds an eighth of the sequence, so the longest
    # length that fits grows several-fold (the model states stay as they were)
    plain = acc.evaluate(rows["2204"], [])
    planted = acc.evaluate(dict(rows["2204"], parallelism=rows["2204"]["parallelism"] + " with Ulysses sequence parallel 8"), [])
    assert (plain.kind, planted.kind) == ("context", "context")
    assert planted.predicted > 4 * plain.predicted


def test_swift_long_text_headers_are_one_script(acc: ModuleType, rows: dict[str, dict[str, str]]) -> None:
    """zero3.sh (2025-04-11, '4 * 56GB') was renamed liger_kernel.sh (2025-05-08, '4 * 42GB') with the same
    arguments: both rows read as one setup, full fine-tuning of Qwen2.5-7B under ZeRO-3 on 4 GPUs, Liger, packs of
    16,384 tokens, batch 1."""
    spec = acc._spec(rows["2240"]["model_hf_id"])
    a, b = acc._train_setup(rows["2240"], spec), acc._train_setup(rows["2241"], spec)
    assert a == b
    assert (a.strategy, a.num_gpus, a.seq_len, a.micro_batch_size, a.liger_kernel) == ("zero3", 4, 16384, 1, True)
    assert not a.offload_optimizer and a.gradient_checkpointing and a.lora is None
    assert (rows["2240"]["peak_mem_value"], rows["2241"]["peak_mem_value"]) == ("56", "42")
