"""`perfguide check` on ArcticTraining recipes (integrations/readers/arctic_training.py), read as ArcticTraining's
TrainerConfig builds the run: the ALST recipes copied in tests/data/check (SOURCES.md names the commit), and small
recipes written here for its defaults. Each expected value is the one ArcticTraining's own code sets (config/
trainer.py build_deepspeed_config and set_max_length, model.py, data.py, utils.py parse_human_val)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

import perfguide
from perfguide.integrations.readers import detect
from perfguide.integrations.readers.arctic_training import human_int, write
from perfguide.integrations.readers.base import ConfigReadError

DATA = Path(__file__).parent / "data" / "check"


def _recipe(tmp_path: Path, **keys: Any) -> Path:
    body = {"model": {"name_or_path": "meta-llama/Llama-3.1-8B-Instruct"}, "data": {"max_length": "64k"}, **keys}
    path = tmp_path / "run.yml"
    path.write_text(yaml.safe_dump(body), encoding="utf-8")
    return path


def test_alsts_one_node_recipe_reads_as_arctic_training_runs_it() -> None:
    """run-h100-sp8-llama-8b.yml: Ulysses over 8 H100 at 3.8M tokens with TiledMLP, checkpoint offload, Liger, ZeRO-3
    with the optimizer on the CPU; ALST's paper trains it (3.7M on one node), so it must fit."""
    c = perfguide.check(None, DATA / "arctic_training_run-h100-sp8-llama-8b.yml", hardware="h100-80gb:8")
    s = c.setup
    assert (s.sequence_parallel, s.seq_len, s.micro_batch_size, s.num_gpus) == (8, 3_800_000, 1, 8)
    assert (s.strategy, s.offload_optimizer, s.offload_params) == ("zero3", True, False)
    assert (s.weights_dtype, s.autocast, s.attn_implementation) == ("fp32", "bf16", "flash_attention_2")
    assert s.liger_kernel and s.activation_offloading and s.gradient_checkpointing
    assert s.tiled_mlp_shard_tokens == 4096   # ceil(s / hidden) shards of Llama-3.1-8B's 4,096 hidden units
    assert c.fits
    assert any("reduces the split plan's gradients in 16 bits" in n for n in c.notes)


def test_flash_attention_3_recipe_is_read_as_flash_attention_3(tmp_path: Path) -> None:
    """The 1x H200 recipe runs 1.2M tokens through FlashAttention-3: q holds 1 x 1,200,000 x 4096 = 4.9e9 elements,
    past flash-attn 2's 32-bit reach, which FA3 does not share: priced, not refused."""
    c = perfguide.check(None, DATA / "arctic_training_run-h200-sp1-llama-8b-liger-offload-tiled-mlp.yml", hardware="h200")
    assert (c.setup.attn_implementation, c.setup.seq_len, c.setup.sequence_parallel) == ("flash_attention_3", 1_200_000, 1)
    assert (c.setup.strategy, c.setup.offload_params, c.setup.offload_optimizer) == ("zero3", True, True)
    assert not any("32-bit offsets" in n for n in c.notes)


def test_flash_attention_2_past_its_32_bit_reach_is_a_crash_not_a_fit(tmp_path: Path) -> None:
    """ALST's 1x H100 Llama-3.1-8B recipe under flash_attention_2: 'max_length: 500000 # ok', '555000 # Triton Error
    [CUDA]: an illegal memory access' (run-h100-sp1-llama-8b.yml). q's elements by hand: 500,000 x 32 heads x 128 =
    2,048,000,000 < 2^31 = 2,147,483,648 <= 555,000 x 4096 = 2,273,280,000."""
    recipe = yaml.safe_load((DATA / "arctic_training_run-h200-sp1-llama-8b-liger-offload-tiled-mlp.yml").read_text(encoding="utf-8"))
    recipe["model"]["attn_implementation"] = "flash_attention_2"
    for length, crashes in ((500_000, False), (555_000, True)):
        recipe["data"]["max_length"] = length
        path = tmp_path / f"run-{length}.yml"
        path.write_text(yaml.safe_dump(recipe), encoding="utf-8")
        c = perfguide.check(None, path, hardware="h100-80gb")
        said = [n for n in c.notes if "32-bit offsets" in n]
        assert bool(said) is crashes, (length, c.notes)
        if crashes:
            assert "2,273,280,000 elements >= 2^31" in said[0] and "longest here 524,287 tokens" in said[0]
            assert not c.fits
            fix = c.changes[0]   # what the crash's reporters were told to use, on a Hopper card
            assert fix.fits and fix.setup == {"attn_implementation": "flash_attention_3"}


def test_a_recipe_without_deepspeed_takes_arctic_trainings_defaults(tmp_path: Path) -> None:
    """No zero_optimization: build_deepspeed_config writes stage 2; a bf16 model gets DeepSpeed's bf16; every run
    checkpoints; attention defaults to sdpa; ``64k`` is 64,000 tokens."""
    path = _recipe(tmp_path)
    assert detect(yaml.safe_load(path.read_text(encoding="utf-8"))) == "arctic_training"
    c = perfguide.check(None, path, hardware="h100-80gb")
    s = c.setup
    assert (s.strategy, s.overlap_comm, s.seq_len, s.attn_implementation) == ("zero2", False, 64_000, "sdpa")
    assert (s.weights_dtype, s.autocast, s.gradient_checkpointing, s.liger_kernel) == ("fp32", "bf16", True, False)
    assert any("enables DeepSpeed's bf16" in n for n in c.notes)


def test_an_unset_length_is_the_models_context(tmp_path: Path) -> None:
    path = tmp_path / "run.yml"
    path.write_text(yaml.safe_dump({"model": {"name_or_path": "meta-llama/Llama-3.1-8B-Instruct"}, "data": {"sources": []}}),
                    encoding="utf-8")
    c = perfguide.check(None, path, hardware="h100-80gb")
    assert c.setup.seq_len == 131_072   # Llama-3.1-8B-Instruct config.json max_position_embeddings


def test_a_lora_recipe_and_fp32_without_mixed_precision(tmp_path: Path) -> None:
    path = _recipe(tmp_path, model={"name_or_path": "meta-llama/Llama-3.1-8B-Instruct", "dtype": "float32",
                                    "peft_config": {"peft_type": "LORA", "r": 16, "lora_alpha": 32, "target_modules": ["q_proj", "v_proj"]}},
                   deepspeed={"zero_optimization": {"stage": 3}})
    s = perfguide.check(None, path, hardware="h100-80gb").setup
    assert s.lora is not None and (s.lora.r, s.lora.alpha, tuple(s.lora.target_modules)) == (16, 32, ("q_proj", "v_proj"))
    assert (s.weights_dtype, s.autocast, s.strategy) == ("fp32", None, "zero3")


def test_human_ints_are_parse_human_vals() -> None:
    assert [human_int(v, "x") for v in ("1.2M", "500k", "64ki", "2^20", "1_000", "1e6", 4096)] == [
        1_200_000, 500_000, 65_536, 1_048_576, 1_000, 1_000_000, 4096]
    with pytest.raises(ConfigReadError, match="x"):
        human_int("lots", "x")


@pytest.mark.parametrize(("keys", "needle"), [
    ({"type": "dpo"}, "dpo trainer is not priced; accepted: sft, causal"),
    ({"expert_parallel_size": 8}, "expert parallelism is not priced"),
    ({"model": {"name_or_path": "meta-llama/Llama-3.1-8B-Instruct", "peft_config": {"peft_type": "IA3"}}}, "only LORA is priced"),
    ({"model": {"name_or_path": "meta-llama/Llama-3.1-8B-Instruct", "type": "vllm"}}, "model.type"),
])
def test_what_it_cannot_price_is_refused_in_one_line(tmp_path: Path, keys: dict[str, Any], needle: str) -> None:
    with pytest.raises(perfguide.PerfGuideError) as info:
        perfguide.check(None, _recipe(tmp_path, **keys), hardware="h100-80gb")
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_an_unknown_key_is_listed_with_the_closest_real_one(tmp_path: Path) -> None:
    c = perfguide.check(None, _recipe(tmp_path, micro_batch=4), hardware="h100-80gb")
    assert any("micro_batch" in u and "micro_batch_size" in u for u in c.unknown)


def test_changes_are_written_in_arctic_trainings_keys() -> None:
    keys, rest = write({"micro_batch_size": 2, "gradient_checkpointing": False, "seq_len": 1000, "offload_params": True,
                        "sequence_parallel": 4, "tiled_mlp_shard_tokens": 4096, "num_gpus": 4}, None)
    assert keys == {"micro_batch_size": 2, "model.disable_activation_checkpoint": True, "data.max_length": 1000,
                    "sequence_parallel_size": 4, "tiled_mlp_compute": True, "deepspeed.zero_optimization.offload_param.device": "cpu"}
    assert rest == {"num_gpus": 4}
