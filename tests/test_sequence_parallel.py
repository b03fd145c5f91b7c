"""Sequence parallelism (Setup.sequence_parallel): each rank holds and computes one slice of every sequence.

Checked against hand-derived bytes and FLOPs and against published runs: Arctic Long Sequence Training's
Llama-3.1-8B recipe at 1.1M tokens on 8 H100 with Ulysses over 8 GPUs and Liger (ArcticTraining
projects/sequence-parallelism/run-sp8-llama-8b.yml: it ran), ms-swift's Qwen2.5-7B long-text example (its header:
43 GiB on each of 4 GPUs with --sequence_parallel_size 4), axolotl's ALST example (context_parallel_size 8).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import perfguide
from perfguide.api import estimate_speed
from perfguide.cli import main
from perfguide.setup import Setup
from perfguide.speed.sequence_split import all_to_all_bytes

GiB = 2**30
LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"   # 32 layers, hidden 4096, 32 query / 8 key-value heads of 128


def alst(sp: int, seq_len: int = 1_100_000, gpus: int = 8) -> dict[str, object]:
    """ALST's recipe as it ran: DeepSpeed ZeRO-3 with the optimizer on the CPU, bf16, checkpointing, FA2, Liger."""
    return dict(micro_batch_size=1, seq_len=seq_len, weights_dtype="bf16", autocast="bf16", gradient_checkpointing=True,
                attn_implementation="flash_attention_2", strategy="zero3", num_gpus=gpus, offload_optimizer=True,
                liger_kernel=True, sequence_parallel=sp)


def test_a_rank_holds_its_slice_and_alst_fits_where_it_ran() -> None:
    whole = perfguide.estimate(LLAMA_8B, alst(1), hardware="h100-80gb:8")
    split = perfguide.estimate(LLAMA_8B, alst(8), hardware="h100-80gb:8")
    # the checkpointed layer inputs alone, by hand: 32 layers x 1.1M tokens x 4096 x 2 B, of which a rank keeps 1/8
    kept_by_each = 32 * 1_100_000 * 4096 * 2
    assert whole.device_total - split.device_total >= kept_by_each * 7 / 8
    assert split.fits and not whole.fits   # ALST ran this recipe at 1.1M tokens on 80 GB cards
    assert split.device_total > kept_by_each / 8   # the slice's inputs are still there


def test_the_exchange_is_q_k_v_and_the_output_of_the_slice() -> None:
    from perfguide.model.types import ModelSpec

    spec = ModelSpec.from_any(LLAMA_8B)
    whole = Setup(**alst(8))
    local = whole.replace(seq_len=137_500, sequence_parallel=1)
    # forward, backward and the checkpointed recompute; q and the output 32 x 128 wide, k and v 8 x 128; 7/8 leaves the rank
    by_hand = 3 * 32 * 137_500 * (2 * 4096 + 2 * 1024) * 2 * 7 / 8
    assert all_to_all_bytes(spec, whole, local) == pytest.approx(by_hand)
    # 16 ranks and 8 key-value heads: Ulysses repeats them to one per rank before splitting
    wide = Setup(**alst(16, gpus=16))
    assert all_to_all_bytes(spec, wide, wide.replace(seq_len=68_750, sequence_parallel=1)) == \
        pytest.approx(3 * 32 * 68_750 * (2 * 4096 + 2 * 16 * 128) * 2 * 15 / 16)


def test_a_rank_executes_its_share_of_the_whole_attention() -> None:
    s, sp = 131_072, 8
    split = estimate_speed(LLAMA_8B, alst(sp, s), hardware="h100-80gb:8")
    slice_alone = estimate_speed(LLAMA_8B, alst(1, s // sp), hardware="h100-80gb:8")
    # QK^T and AV forward: 4 x layers x 4096 x s x s per sequence; a rank runs 1/sp of the whole sequence's, its slice
    # alone (s/sp)^2; forward + backward (2x) + the recompute: 4 forwards' worth
    fwd = 4 * 32 * 4096
    assert split.flops_per_step - slice_alone.flops_per_step == pytest.approx(4 * fwd * (s * s / sp - (s / sp) ** 2), rel=1e-9)
    # one sequence per group of 8 ranks: a step trains s tokens
    assert split.tokens_per_s * split.step_time_s == pytest.approx(s)
    assert split.step_time_s > slice_alone.step_time_s


@pytest.mark.parametrize(("change", "said"), [
    ({"num_gpus": 6}, "must divide the world size"),
    ({"attn_implementation": "eager"}, "not eager attention"),
    ({"device": "cpu", "strategy": "ddp", "offload_optimizer": False, "liger_kernel": False}, "needs a cuda device"),
])
def test_what_cannot_run_is_one_line(change: dict[str, object], said: str) -> None:
    with pytest.raises(ValueError, match=said) as exc:
        Setup(**{**alst(8), **change})
    assert "sequence_parallel=1" in str(exc.value)


def test_ms_swifts_long_text_example_is_priced_per_rank(capsys: pytest.CaptureFixture[str]) -> None:
    # ms-swift examples/train/long_text/sequence_parallel.sh at ms-swift 3.x ("# 4 * 43GiB"): Qwen2.5-7B, full, ZeRO-3,
    # --max_length 16384, packing, --sequence_parallel_size 4 on 4 GPUs (bench row 2242)
    words = ["NPROC_PER_NODE=4", "swift", "sft", "--model", "Qwen/Qwen2.5-7B", "--train_type", "full", "--torch_dtype",
             "bfloat16", "--deepspeed", "zero3", "--max_length", "16384", "--packing", "true", "--attn_impl", "flash_attn",
             "--sequence_parallel_size", "4", "--per_device_train_batch_size", "1"]
    c = perfguide.check(None, words, hardware="a100-80gb:4")
    assert (c.setup.sequence_parallel, c.setup.world_size, c.setup.seq_len) == (4, 4, 16384)
    assert abs(c.memory.device_total / GiB - 43) / 43 < 0.15
    assert main(["check", "--hardware", "a100-80gb:4", "--", *words]) == 0
    assert " sp4" in capsys.readouterr().out


def test_axolotls_alst_example_fits_where_it_is_published(tmp_path: Path) -> None:
    # axolotl examples/alst/llama3-8b-fsdp2-alst.yaml (the keys that price it): 500K tokens, context_parallel_size 8
    path = tmp_path / "alst.yaml"
    path.write_text(yaml.safe_dump({
        "base_model": "meta-llama/Llama-3.1-8B", "sequence_len": 500_000, "sample_packing": True, "tiled_mlp": True,
        "context_parallel_size": 8, "plugins": ["axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin"],
        "micro_batch_size": 1, "gradient_accumulation_steps": 1, "optimizer": "adamw_torch_8bit", "bf16": True,
        "gradient_checkpointing": True, "activation_offloading": "legacy", "attn_implementation": "flash_attention_2",
        "fsdp_version": 2, "fsdp_config": {"offload_params": False, "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                                           "transformer_layer_cls_to_wrap": "LlamaDecoderLayer", "reshard_after_forward": True}}),
        encoding="utf-8")
    c = perfguide.check(None, path, hardware="h100-80gb:8", num_gpus=8)
    assert (c.setup.sequence_parallel, c.setup.seq_len) == (8, 500_000) and c.fits
    # axolotl's tiled MLP: 32,768-token shards of each rank's 62,500 tokens (monkeypatch/tiled_mlp/patch.py)
    assert c.setup.tiled_mlp_shard_tokens == 32_768
    assert any("tiled MLP" in n and "32,768-token shard of 62,500" in n for n in c.memory.notes)
    path.write_text(path.read_text(encoding="utf-8") + "tiled_mlp_num_shards: 4\n", encoding="utf-8")
    assert perfguide.check(None, path, hardware="h100-80gb:8", num_gpus=8).setup.tiled_mlp_shard_tokens == 15_625


def test_a_change_of_the_split_is_written_in_the_configs_own_key() -> None:
    from perfguide.integrations.readers import axolotl, swift

    setup = Setup(**alst(8))
    assert swift.write({"sequence_parallel": 4}, setup)[0] == {"--sequence_parallel_size": 4}
    assert axolotl.write({"sequence_parallel": 4}, setup)[0] == {"context_parallel_size": 4}


def test_ulysses_repeats_kv_heads_when_the_split_is_wider_than_them() -> None:
    """DeepSpeed's UlyssesSPAttentionHF: kv_replication_factor = sp // kv_heads where sp > kv_heads, each rank then one
    K/V head over the whole sequence. Llama-3.1-70B (64 query heads, 8 K/V heads, head_dim 128), one rank's slice of
    s tokens, by hand: the kernel saves k and v at sp x 128 per slice token instead of 8 x 128, 2 B each."""
    from perfguide.memory.block_backward import flash_backward_bytes, kv_replication, replicated_kv_bytes
    from perfguide.model.types import ModelSpec

    spec = ModelSpec.from_any("meta-llama/Llama-3.1-70B-Instruct")
    s = 125_000
    local = Setup(seq_len=s, attn_implementation="flash_attention_2", weights_dtype="bf16", gradient_checkpointing=True)
    assert [kv_replication(spec, n) for n in (1, 8, 16, 32, 64)] == [1, 1, 2, 4, 8]
    assert replicated_kv_bytes(spec, local, 8) == 0
    assert replicated_kv_bytes(spec, local, 32) == s * 2 * 2 * (32 - 8) * 128   # k and v, 24 more heads' worth
    s_r = -(-s // 128) * 128
    dq_accum = 4 * s_r * 64 * (128 + 1)
    # 32 ranks: 2 query heads meet 1 K/V head (expanded to 2, query-wide); dk / dv at 32 heads' worth per slice token
    assert flash_backward_bytes(spec, local, 32) == 2 * s * (2 * 64 * 128 + 2 * 32 * 128) + dq_accum + 2 * 2 * s * 64 * 128
    # 64 ranks: 1 query head, 1 K/V head: nothing to expand; dk / dv at 64 heads' worth
    assert flash_backward_bytes(spec, local, 64) == 2 * s * (2 * 64 * 128 + 2 * 64 * 128) + dq_accum
    assert flash_backward_bytes(spec, local, 8) == flash_backward_bytes(spec, local)   # heads divide: as unsplit
