"""recommend() splits each sequence over several GPUs (Ulysses through accelerate's sp_size) where no unsplit layout
fits, and writes what runs it: checked with accelerate's own config loader, launcher and ParallelismConfig, the
Trainer's batch formula, DeepSpeed's config parser and TRL's SFTConfig; asked-for sizes that cannot run are refused."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

import perfguide
from perfguide.errors import ConflictingConstraintsError
from perfguide.integrations.readers.verdict import Check

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"   # 32 query / 8 key-value heads
LONG = {"scenario": "train_gpu_many", "hardware": "rtx4090:8", "seq_len": 131072}


@pytest.fixture(scope="module")
def split_rec() -> perfguide.Recommendation:
    return perfguide.recommend(LLAMA_8B, **LONG)


def test_a_sequence_that_fits_no_unsplit_layout_is_split_and_the_global_batch_is_kept(split_rec) -> None:
    s = split_rec.setup
    assert split_rec.fits and s.sequence_parallel in (2, 4, 8) and s.strategy == "zero3"
    # transformers Trainer.get_total_train_batch_size: micro x accumulation x world / sp (the default global batch, 32)
    assert s.micro_batch_size * s.gradient_accumulation_steps * s.world_size // s.sequence_parallel == 32
    # the unsplit plan at the same length does not fit (it is why the split was taken): asked with sequence_parallel=1
    unsplit = perfguide.recommend(LLAMA_8B, **LONG, sequence_parallel=1)
    assert not unsplit.fits
    decision = next(d for d in split_rec.decisions if d.setting == "sequence_parallel")
    assert decision.value == s.sequence_parallel and "no unsplit layout fits" in decision.reason
    assert f"{131072 // s.sequence_parallel:,} of every sequence" in decision.reason


def test_a_sequence_that_fits_unsplit_is_not_split() -> None:
    rec = perfguide.recommend(LLAMA_8B, scenario="train_gpu_many", hardware="h100-80gb:8", seq_len=8192)
    assert rec.fits and rec.setup.sequence_parallel == 1
    assert all(d.setting != "sequence_parallel" for d in rec.decisions)


def test_the_yaml_reaches_accelerates_parallelism_config_through_its_launcher(split_rec, tmp_path, monkeypatch) -> None:
    from accelerate import ParallelismConfig
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_extend_env_parallelism_config

    sp, world = split_rec.setup.sequence_parallel, split_rec.setup.world_size
    path = split_rec.write_accelerate_config(tmp_path / "accelerate.yaml")
    cfg = load_config_from_file(str(path))
    assert cfg.parallelism_config["parallelism_config_sp_size"] == sp
    args, _, _ = _validate_launch_command(launch_command_parser().parse_args(["--config_file", str(path), "train.py"]))
    assert args.use_deepspeed and args.use_parallelism_config
    env = prepare_extend_env_parallelism_config(args, {})   # what prepare_deepspeed_cmd_env exports for this flag
    assert env["PARALLELISM_CONFIG_SP_SIZE"] == str(sp) and env["PARALLELISM_CONFIG_SP_BACKEND"] == "deepspeed"
    for key, value in env.items():
        if key.startswith("PARALLELISM_CONFIG_"):
            monkeypatch.setenv(key, value)
    pc = ParallelismConfig()   # what the Trainer's Accelerator builds in each rank from that environment
    assert pc.sp_enabled and pc.sp_size == sp and pc.data_parallel_size == world // sp
    # accelerate's last-moment DeepSpeed batch (Accelerator._prepare_deepspeed): micro x accumulation x dp size
    s = split_rec.setup
    assert s.micro_batch_size * s.gradient_accumulation_steps * pc.data_parallel_size == s.global_batch_size


def test_the_command_names_the_yaml_because_the_launcher_refuses_the_inline_form(split_rec) -> None:
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    cmd = split_rec.launch_command("train.py")
    assert cmd == "accelerate launch --config_file accelerate.yaml --deepspeed_config_file accelerate_deepspeed.json train.py"
    inline = ["--use_deepspeed", "--use_parallelism_config", "--parallelism_config_sp_size", "4", "train.py"]
    with pytest.raises(ValueError, match="use_parallelism_config"):
        _validate_launch_command(launch_command_parser().parse_args(inline))


def test_the_python_objects_carry_the_same_split(split_rec) -> None:
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.config import DeepSpeedConfig
    from trl import SFTConfig

    sp = split_rec.setup.sequence_parallel
    pc = split_rec.accelerator_kwargs()["parallelism_config"]
    assert pc.sp_size == sp and pc.sp_backend == "deepspeed" and pc.sp_handler.sp_seq_length_is_variable
    assert pc.sp_handler.sp_attn_implementation == split_rec.setup.attn_implementation
    kw = split_rec.sft_config_dict()   # the object itself is built on the CUDA target (bf16, tf32, DeepSpeed)
    assert kw["pad_to_multiple_of"] == sp and set(kw) <= set(SFTConfig.__dataclass_fields__)
    assert SFTConfig(output_dir="out", pad_to_multiple_of=kw["pad_to_multiple_of"], report_to="none", use_cpu=True, bf16=False).pad_to_multiple_of == sp
    ds = copy.deepcopy(split_rec.deepspeed_config())
    ds.update(train_micro_batch_size_per_gpu=1, gradient_accumulation_steps=1, train_batch_size=1)
    import torch

    # without the key DeepSpeed reduces a split plan's gradients in fp32 (runtime/constants.py)
    assert DeepSpeedConfig(ds).seq_parallel_communication_data_type == torch.bfloat16


def test_an_asked_size_is_kept_even_where_no_split_is_needed() -> None:
    rec = perfguide.recommend(LLAMA_8B, scenario="train_gpu_many", hardware="h100-80gb:8", seq_len=8192, sequence_parallel=2)
    assert rec.setup.sequence_parallel == 2 and rec.setup.strategy == "zero3"
    assert "sequence_parallel=2 was asked" in next(d.reason for d in rec.decisions if d.setting == "sequence_parallel")


@pytest.mark.parametrize("kwargs, words", [
    ({"sequence_parallel": 3}, "must divide the world size (8 GPU(s))"),
    ({"sequence_parallel": 2, "num_gpus": 1}, "must divide the world size (1 GPU(s))"),   # asked, never dropped on one GPU
    ({"sequence_parallel": 2, "strategy": "fsdp"}, "splits sequences only under DeepSpeed"),
    ({"sequence_parallel": 2, "attn_implementation": "eager"}, "Ulysses needs a fused kernel"),
    ({"sequence_parallel": 2, "objective": "dpo"}, "decoder's next-token loss"),
])
def test_an_asked_size_that_cannot_run_is_refused_in_one_line(kwargs, words) -> None:
    with pytest.raises(ConflictingConstraintsError, match=words.replace("(", r"\(").replace(")", r"\)")) as err:
        perfguide.recommend(LLAMA_8B, scenario="train_gpu_many", hardware="h100-80gb:8", seq_len=8192, **kwargs)
    assert "\n" not in str(err.value)


def test_heads_that_do_not_split_are_refused_and_not_offered() -> None:
    # gpt2: 12 heads (and 12 key/value heads): 8 does not divide them, as DeepSpeed's UlyssesSPAttentionHF checks
    with pytest.raises(ConflictingConstraintsError, match="12 attention heads, not divisible by 8"):
        perfguide.recommend("gpt2", scenario="train_gpu_many", hardware="h100-80gb:8", seq_len=1024, sequence_parallel=8)
    from perfguide.scenarios.sequence_split import head_problem

    rec = perfguide.recommend(LLAMA_8B, scenario="train_gpu_many", hardware="h100-80gb:8", seq_len=8192)
    assert head_problem(rec.request, 16) is None            # 32 heads, 8 key/value heads replicated twice
    assert "key/value heads" in head_problem(rec.request.model_copy(update={"model": rec.request.model.model_copy(
        update={"num_attention_heads": 24, "num_key_value_heads": 6})}), 4)   # 6 kv heads: 4 neither divides nor is a multiple


def test_one_device_scenarios_refuse_a_split() -> None:
    with pytest.raises(ConflictingConstraintsError, match="use scenario='train_gpu_many'"):
        perfguide.recommend(LLAMA_8B, scenario="train_gpu_one", hardware="h100-80gb", seq_len=8192, sequence_parallel=2)


def test_hsdp_inline_command_carries_its_parallelism_config() -> None:
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_extend_env_parallelism_config

    rec = perfguide.recommend("llama-3-8b", scenario="train_gpu_many", hardware="a100-80gb:8x4", strategy="fsdp")
    assert rec.setup.hybrid_shard
    words = rec.launch_command("train.py").replace('"$MACHINE_RANK"', "0").replace('"$MAIN_PROCESS_IP"', "10.0.0.1").split()
    args, _, _ = _validate_launch_command(launch_command_parser().parse_args(words[2:]))
    env = prepare_extend_env_parallelism_config(args, {})
    assert env["PARALLELISM_CONFIG_DP_REPLICATE_SIZE"] == "4" and env["PARALLELISM_CONFIG_DP_SHARD_SIZE"] == "8"


# --- check: the split's own settings in a user's configs ------------------------------------------------------

DATA = Path(__file__).with_name("data") / "check"


def test_trls_alst_yaml_reads_the_models_kernel_and_says_the_reduce_dtype_key_is_inert() -> None:
    # TRL examples/accelerate_configs/alst_ulysses_4gpu.yaml: sp 2 x dp_shard 2, ZeRO-3, FA2, and a
    # deepspeed_config.seq_parallel_communication_data_type that accelerate's launcher never exports (only the keys it
    # names become ACCELERATE_* variables: accelerate utils/launch.py prepare_deepspeed_cmd_env)
    c = perfguide.check("Qwen/Qwen2-0.5B", DATA / "trl_alst_ulysses_4gpu.yaml", hardware="h100-80gb:4", seq_len=4096)
    assert (c.setup.sequence_parallel, c.setup.strategy, c.setup.attn_implementation) == (2, "zero3", "flash_attention_2")
    key = "deepspeed_config.seq_parallel_communication_data_type"
    assert any(key in u for u in c.unknown) and not any(key in i for i in c.ignored)   # unknown to accelerate, not "no effect"
    assert any("accelerate passes no such setting to DeepSpeed" in n for n in c.notes)
    assert any("reduces the split plan's gradients in fp32" in n for n in c.notes)


def _deepspeed_run(tmp_path: Path, ds: dict, sp: int) -> Check:
    (tmp_path / "ds.json").write_text(json.dumps(ds), encoding="utf-8")
    acc = {"distributed_type": "DEEPSPEED", "num_processes": 8, "mixed_precision": "bf16",
           "deepspeed_config": {"deepspeed_config_file": "ds.json"},
           "parallelism_config": {"parallelism_config_sp_size": sp, "parallelism_config_sp_backend": "deepspeed"}}
    (tmp_path / "acc.yaml").write_text(yaml.safe_dump(acc), encoding="utf-8")
    return perfguide.check(LLAMA_8B, tmp_path / "acc.yaml", hardware="h100-80gb:8", seq_len=32768, micro_batch_size=1,
                           gradient_accumulation_steps=2)


def test_a_deepspeed_json_reduce_dtype_is_judged_against_the_split(tmp_path) -> None:
    zero3 = {"zero_optimization": {"stage": 3}, "bf16": {"enabled": True}}
    split = _deepspeed_run(tmp_path, {**zero3, "seq_parallel_communication_data_type": "bf16"}, 4)
    assert any("in 16 bits, as priced" in n for n in split.notes)
    unsplit = _deepspeed_run(tmp_path, {**zero3, "seq_parallel_communication_data_type": "bf16"}, 1)
    assert any("has no effect: DeepSpeed splits no sequence here" in n for n in unsplit.notes)
    default = _deepspeed_run(tmp_path, zero3, 4)
    assert any("unset (DeepSpeed's default fp32)" in n for n in default.notes)


def test_deepspeeds_batch_rule_counts_the_world_over_the_split(tmp_path) -> None:
    # DeepSpeed's config: world_size = ranks / sequence_parallel_size (runtime/config.py), and it asserts
    # train_batch_size == micro x accumulation x that world: 1 x 2 x 8 / 4 = 4
    zero3 = {"zero_optimization": {"stage": 3}, "bf16": {"enabled": True}, "train_micro_batch_size_per_gpu": 1,
             "gradient_accumulation_steps": 2}
    assert _deepspeed_run(tmp_path, {**zero3, "train_batch_size": 4}, 4).setup.global_batch_size == 4
    with pytest.raises(perfguide.PerfGuideError, match=r"x 8 process\(es\) / 4 \(each sequence split over 4\) = 4"):
        _deepspeed_run(tmp_path, {**zero3, "train_batch_size": 16}, 4)


def _llama_8b_long() -> object:
    """Llama-3.1-8B's shape with the context limit raised, as ALST's recipes run it."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                       num_key_value_heads=8, max_position_embeddings=4_000_000, rope_theta=500000.0, tie_word_embeddings=False)


def test_alsts_longest_single_node_recipe_with_checkpoint_offload_is_planned_split_8_ways() -> None:
    # ArcticTraining projects/sequence-parallelism/run-h100-sp8-llama-8b-yes-act-offload.yml ran Llama-3.1-8B at 2,400,000
    # tokens on 8 H100 (Ulysses 8, ZeRO-3, checkpoints offloaded to the CPU): the plan must fit it, split 8 ways (a rank's
    # checkpointed inputs alone, 32 x 2.4M / 8 x 4096 x 2 B, are 18.75 GiB; unsplit, 150 GiB)
    rec = perfguide.recommend(_llama_8b_long(), scenario="train_gpu_many", hardware="h100-80gb:8", seq_len=2_400_000, global_batch_size=8)
    s = rec.setup
    assert rec.fits and s.sequence_parallel == 8 and s.strategy == "zero3" and s.activation_offloading
    assert "no unsplit layout fits" in next(d.reason for d in rec.decisions if d.setting == "sequence_parallel")


def test_a_split_that_fits_no_gpu_alone_keeps_its_states_in_host_ram() -> None:
    # past what any on-GPU split holds, the tier after CPU offload: split with ZeRO-3's optimizer in host RAM, as ALST runs
    rec = perfguide.recommend(_llama_8b_long(), scenario="train_gpu_many", hardware="h100-80gb:8", seq_len=2_800_000, global_batch_size=8)
    s = rec.setup
    assert rec.fits and s.sequence_parallel == 8 and s.offload_optimizer and rec.memory.cpu_ram > 0


def test_a_plan_that_fits_nowhere_shows_the_closest_unsplit_layout() -> None:
    # Llama-2-70B full fine-tune on 2 RTX 4090: bound by host RAM (16 B per offloaded parameter, 1.1 TB), which no split
    # changes; the closest plan shown is unsplit (a split layout would only trim activations)
    rec = perfguide.recommend("meta-llama/Llama-2-70b-hf", scenario="train_gpu_many", hardware="rtx4090:2")
    assert not rec.fits and rec.setup.sequence_parallel == 1


def test_a_check_that_needs_a_split_writes_the_whole_block_accelerate_needs(monkeypatch) -> None:
    # TRL's fsdp2.yaml with Llama-3.1-8B at 128K on 8 RTX 4090 fits nowhere unsplit; the change toward the recommended
    # plan must carry dp_shard_size too: accelerate sizes DeepSpeed's batch as micro x accumulation x data_parallel_size
    # (Accelerator._prepare_deepspeed), which without it is one group where DeepSpeed counts world / sp
    from accelerate import ParallelismConfig

    c = perfguide.check(LLAMA_8B, DATA / "trl_fsdp2.yaml", hardware="rtx4090:8", seq_len=131072, micro_batch_size=1)
    edit = next(e for ch in c.changes for e in ch.edits if "parallelism_config.parallelism_config_sp_size" in e.keys)
    block = {k.removeprefix("parallelism_config."): v for k, v in edit.keys.items() if k.startswith("parallelism_config.")}
    for key, value in block.items():   # as accelerate's launcher exports them (utils/launch.py)
        monkeypatch.setenv(key.upper(), str(value))
    pc = ParallelismConfig()
    sp = block["parallelism_config_sp_size"]
    assert pc.sp_size == sp and pc.data_parallel_size * sp == 8


def test_a_model_with_recurrent_layers_is_never_split() -> None:
    # Qwen3-Next's linear-attention layers carry a state along the sequence: accelerate refuses Ulysses on any config whose
    # layer_types name "linear_attention" (big_modeling._refuse_recurrent_layers_under_sequence_parallelism), restated here
    from transformers import Qwen3NextConfig

    cfg = Qwen3NextConfig(num_hidden_layers=8)
    assert any("linear_attention" in t for t in cfg.layer_types)
    with pytest.raises(ConflictingConstraintsError, match="linear_attention layers carry a recurrent state"):
        perfguide.recommend(cfg, scenario="train_gpu_many", hardware="h100-80gb:8", seq_len=4096, sequence_parallel=2)
    from perfguide.model.types import ModelSpec

    assert ModelSpec.from_any(cfg).recurrent_layer_types == ("linear_attention",)
    assert ModelSpec.from_any(LLAMA_8B).recurrent_layer_types == ()
    # a user's split config on it does not start: refused in one line, not priced
    with pytest.raises(perfguide.PerfGuideError, match="linear_attention layers carry a recurrent state"):
        perfguide.check(cfg, DATA / "trl_alst_ulysses_4gpu.yaml", hardware="h100-80gb:4", seq_len=4096)


def test_a_split_another_library_runs_gets_no_deepspeed_reduce_note(tmp_path) -> None:
    # axolotl's context_parallel_size runs ring-flash-attn in its own process groups and hands DeepSpeed no sequence-
    # parallel groups (no mpu), so DeepSpeed's seq_parallel_communication_data_type never applies there
    (tmp_path / "ds.json").write_text(json.dumps({"zero_optimization": {"stage": 3}, "bf16": {"enabled": "auto"}}), encoding="utf-8")
    cfg = {"base_model": LLAMA_8B, "sequence_len": 65536, "context_parallel_size": 4, "micro_batch_size": 1, "bf16": True,
           "gradient_checkpointing": True, "attn_implementation": "flash_attention_2", "deepspeed": str(tmp_path / "ds.json")}
    (tmp_path / "ax.yaml").write_text(yaml.safe_dump(cfg), encoding="utf-8")
    c = perfguide.check(None, tmp_path / "ax.yaml", hardware="h100-80gb:8", num_gpus=8)
    assert c.setup.sequence_parallel == 4 and c.setup.strategy == "zero3"
    assert not any("seq_parallel_communication_data_type" in n for n in c.notes)


def test_a_split_plans_collator_pads_to_the_split_and_gives_position_ids(split_rec) -> None:
    # DeepSpeed's UlyssesSPDataLoaderAdapter raises without position_ids and on a length the ranks do not divide
    # (runtime/sequence_parallel/ulysses_sp.py); the plain Trainer's default collator gives neither
    import torch

    from perfguide.integrations.collate import SplitBatches

    sp = split_rec.setup.sequence_parallel
    collator = split_rec.data_collator()
    assert isinstance(collator, SplitBatches) and collator.multiple == sp
    feats = [{"input_ids": [5, 6, 7, 8, 9], "labels": [5, 6, 7, 8, 9], "attention_mask": [1] * 5}] * 2
    batch = collator(feats)
    length = -(-5 // sp) * sp   # 5 tokens padded up to the next multiple of the split
    assert batch["input_ids"].shape == (2, length) and batch["position_ids"].shape == (2, length)
    assert torch.equal(batch["position_ids"][0], torch.arange(length))
    assert batch["labels"][0, 5:].eq(-100).all() and batch["attention_mask"][0, 5:].eq(0).all()
    # a packed (padding-free) row keeps its per-sample positions and gets its padding as one more short segment
    from transformers import DataCollatorWithFlattening

    packed = SplitBatches(DataCollatorWithFlattening(return_flash_attn_kwargs=False), 4)
    out = packed([{"input_ids": [1, 2, 3]}, {"input_ids": [4, 5, 6, 7]}])
    assert out["input_ids"].shape == (1, 8)
    assert out["position_ids"][0].tolist() == [0, 1, 2, 0, 1, 2, 3, 0]
    assert out["labels"][0, -1] == -100


def _adapter_rank(rank: int, port: int, collators: dict, out: object) -> None:
    """One of two CPU ranks: each collator behind a DataLoader, wrapped in DeepSpeed's own Ulysses adapter."""
    import os

    import deepspeed
    import torch
    import torch.distributed as dist
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPDataLoaderAdapter

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2")
    deepspeed.init_distributed(dist_backend="gloo")   # the adapter talks through deepspeed.comm
    feats = [{"input_ids": [3 + i for i in range(5)], "labels": [3 + i for i in range(5)], "attention_mask": [1] * 5}] * 2
    try:
        for name, collator in collators.items():
            loader = torch.utils.data.DataLoader(feats, batch_size=1, collate_fn=collator)
            adapter = UlyssesSPDataLoaderAdapter(loader, sp_rank=rank, sp_group=dist.group.WORLD, sp_world_size=2,
                                                 device=torch.device("cpu"))
            try:
                batch = next(iter(adapter))
                out[(name, rank)] = (tuple(batch["input_ids"].shape), batch["position_ids"][0].tolist())  # type: ignore[index]
            except ValueError as exc:
                out[(name, rank)] = str(exc)  # type: ignore[index]
    finally:
        dist.destroy_process_group()


def test_deepspeeds_own_ulysses_adapter_takes_the_plans_batches_and_refuses_the_default_ones() -> None:
    # two CPU ranks (gloo) running DeepSpeed's UlyssesSPDataLoaderAdapter, as accelerate wraps the Trainer's dataloader
    pytest.importorskip("deepspeed")
    import socket

    import torch.multiprocessing as mp
    from transformers import default_data_collator

    from perfguide.integrations.collate import SplitBatches

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = mp.Manager().dict()
    mp.spawn(_adapter_rank, args=(port, {"split": SplitBatches(default_data_collator, 2), "plain": default_data_collator}, out),
             nprocs=2, join=True)
    # 5 tokens padded to 6, split 3 + 3 with the global positions kept
    assert out[("split", 0)] == ((1, 3), [0, 1, 2]) and out[("split", 1)] == ((1, 3), [3, 4, 5])
    assert all("requires `position_ids`" in str(out[("plain", r)]) for r in (0, 1))


def test_a_split_another_library_runs_on_recurrent_layers_is_priced_not_refused() -> None:
    # ms-swift runs its own Ulysses on Qwen3.5's linear-attention layers (examples/train/sequence_parallel/
    # sequence_parallel_qwen3_5.sh, "8 * 80GiB"); only accelerate's DeepSpeed split refuses them
    from transformers import Qwen3NextConfig

    cfg = Qwen3NextConfig(num_hidden_layers=8)
    words = ["NPROC_PER_NODE=8", "swift", "sft", "--model", "local-qwen3-next", "--tuner_type", "lora", "--torch_dtype", "bfloat16",
             "--lora_dropout", "0", "--max_length", "8192", "--attn_impl", "flash_attn", "--sequence_parallel_size", "4",
             "--padding_free", "true"]
    c = perfguide.check(cfg, words, hardware="h100-80gb:8")
    assert c.setup.sequence_parallel == 4
