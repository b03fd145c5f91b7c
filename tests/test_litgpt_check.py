"""`perfguide check -- litgpt finetune_lora CHECKPOINT --config lora.yaml`: LitGPT's own fine-tuning, priced as its own
GPT (Setup.model_code='litgpt').

Expected values come from LitGPT's source at 26857050 (litgpt/finetune/lora.py and full.py: the setup() defaults and
the strategy each device count gets) and from its config hub's published table (config_hub/finetune/README.md: which
configs ran on one or four A10G cards and which ran out of memory). The configs below carry the keys of the hub's YAML
files that decide memory (precision, quantize, LoRA switches, batch sizes, length). Before this reader a LitGPT YAML
was read as TrainingArguments and `litgpt ...` commands were refused.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import perfguide
from perfguide.errors import PerfGuideError


def _yaml(tmp_path: Path, **keys: object) -> Path:
    path = tmp_path / "config.yaml"
    base = {"out_dir": "out", "devices": 1, "num_nodes": 1, "data": {"class_path": "litgpt.data.Alpaca2k"}, "logger_name": "csv",
            "seed": 1337, "optimizer": {"class_path": "torch.optim.AdamW", "init_args": {"lr": 0.0002}}}
    path.write_text(yaml.safe_dump({**base, **keys}), encoding="utf-8")
    return path


def test_a_bare_command_takes_litgpts_defaults() -> None:
    """lora.py setup(): lora_r 8, alpha 16, dropout 0.05 on query and value; global batch 16, micro 1; precision None is
    bf16-mixed on a bf16 GPU (utils.get_default_supported_precision); one device: no FSDP, no checkpointing."""
    check = perfguide.check(None, ["litgpt", "finetune_lora", "checkpoints/meta-llama/Llama-2-7b-hf", "--train.max_seq_length", "512"],
                            hardware="a100-80gb")
    s = check.setup
    assert s.model_code == "litgpt" and check.model == "meta-llama/Llama-2-7b-hf"
    assert s.lora is not None and (s.lora.r, s.lora.alpha, s.lora.dropout) == (8, 16, 0.05)
    assert s.lora.target_modules == ("self_attn.q_proj", "self_attn.v_proj")
    assert (s.micro_batch_size, s.gradient_accumulation_steps, s.seq_len) == (1, 16, 512)
    assert (s.weights_dtype, s.autocast, s.gradient_checkpointing, s.num_gpus) == ("fp32", "bf16", False, 1)


def test_several_devices_shard_and_checkpoint() -> None:
    """lora.py: devices * num_nodes > 1 is ModelParallelStrategy with parallelize_fn (fully_shard, every Block
    checkpointed); full.py: FSDPStrategy with activation_checkpointing_policy={Block}. Accumulation is
    global / processes / micro (TrainArgs.gradient_accumulation_iters)."""
    lora = perfguide.check(None, ["litgpt", "finetune_lora", "meta-llama/Llama-2-7b-hf", "--devices", "4", "--train.global_batch_size",
                                  "64", "--train.micro_batch_size", "2", "--train.max_seq_length", "512"], hardware="a100-80gb:4").setup
    full = perfguide.check(None, ["litgpt", "finetune_full", "meta-llama/Llama-2-7b-hf", "--devices", "4", "--train.max_seq_length", "512"],
                           hardware="a100-80gb:4").setup
    assert (lora.strategy, lora.fsdp_version, lora.gradient_checkpointing, lora.gradient_accumulation_steps) == ("fsdp", 2, True, 8)
    assert (full.strategy, full.fsdp_version, full.gradient_checkpointing, full.lora) == ("fsdp", 1, True, None)


@pytest.mark.parametrize(("model", "keys", "cards", "fits"), [
    ("google/gemma-7b", {"lora_r": 8, "lora_alpha": 16, "lora_query": True, "lora_key": True, "lora_value": True,
                         "lora_projection": True, "lora_mlp": True, "lora_head": True, "micro": 1, "global": 6}, "a10g", False),
    ("google/gemma-7b", {"quantize": "bnb.nf4", "lora_r": 8, "lora_alpha": 16, "lora_query": True, "lora_key": True,
                         "lora_value": True, "lora_projection": True, "lora_mlp": True, "lora_head": True, "micro": 1, "global": 6},
     "a10g", True),
    ("google/gemma-2-9b", {"lora_r": 8, "lora_alpha": 16, "lora_query": True, "lora_key": True, "lora_value": True,
                           "lora_projection": True, "lora_mlp": True, "lora_head": True, "micro": 1, "global": 6}, "a10g", False),
    ("meta-llama/Llama-2-7b-hf", {"lora_r": 32, "lora_alpha": 16, "micro": 2, "global": 8}, "a10g", True),
    ("meta-llama/Llama-2-7b-hf", {"devices": 4, "micro": 4, "global": 64, "full": True}, "a10g:4", False),
    ("tiiuae/falcon-7b", {"lora_r": 32, "lora_alpha": 16, "micro": 1, "global": 8}, "a10g", True),
])
def test_the_config_hubs_published_verdicts(tmp_path: Path, model: str, keys: dict, cards: str, fits: bool) -> None:
    """config_hub/finetune/README.md: gemma-7b/lora.yaml and gemma2-9b/lora.yaml ran out of memory on an A10G,
    gemma-7b/qlora.yaml ran (17.18 GB), llama-2-7b/lora.yaml ran (19.77 GB), llama-2-7b/full.yaml ran out of memory on
    4 x A10G, falcon-7b/lora.yaml ran (16.69 GB); all at 512 tokens in bf16-true."""
    keys = dict(keys)
    micro, total, full = keys.pop("micro"), keys.pop("global"), keys.pop("full", False)
    path = _yaml(tmp_path, checkpoint_dir=f"checkpoints/{model}", precision="bf16-true",
                 train={"global_batch_size": total, "micro_batch_size": micro, "max_seq_length": 512, "epochs": 1}, **keys)
    check = perfguide.check(None, ["litgpt", "finetune_full" if full else "finetune_lora", "--config", str(path)], hardware=cards)
    assert check.fits is fits


def test_a_fused_qkv_family_maps_the_switches_onto_its_linears(tmp_path: Path) -> None:
    """Falcon's attention is one query_key_value Linear (transformers' names, as the spec counts them)."""
    s = perfguide.check(None, _yaml(tmp_path, checkpoint_dir="checkpoints/tiiuae/falcon-7b", precision="bf16-true", lora_r=8,
                                    train={"micro_batch_size": 1, "max_seq_length": 512}), hardware="a100-80gb").setup
    assert s.lora is not None and s.lora.target_modules == ("self_attention.query_key_value",)


@pytest.mark.parametrize(("words", "said"), [
    (["--quantize", "bnb.nf4", "--precision", "bf16-mixed"], "Quantization and mixed precision is not supported"),
    (["--quantize", "bnb.nf4", "--devices", "2", "--precision", "bf16-true"], "not supported for multi-GPU training"),
    (["--precision", "transformer-engine"], "bf16-true"),
    (["--optimizer", "Lion"], "adamw"),
])
def test_what_litgpt_itself_refuses_is_one_line(words: list[str], said: str) -> None:
    with pytest.raises(PerfGuideError, match=said) as err:
        perfguide.check(None, ["litgpt", "finetune_lora", "meta-llama/Llama-2-7b-hf", *words], hardware="a100-80gb:2")
    assert "\n" not in str(err.value)
    with pytest.raises(PerfGuideError, match="finetune_adapter"):
        perfguide.check(None, ["litgpt", "finetune_adapter", "meta-llama/Llama-2-7b-hf"], hardware="a100-80gb")


def test_a_change_is_written_as_litgpt_keys(tmp_path: Path) -> None:
    """A config that does not fit is told the smallest change that does, in LitGPT's own keys, and never a switch LitGPT
    has no key for (checkpointing on one device, Liger's patches of transformers' classes)."""
    path = _yaml(tmp_path, checkpoint_dir="checkpoints/meta-llama/Llama-2-7b-hf", precision="bf16-true", lora_r=8,
                 train={"global_batch_size": 16, "micro_batch_size": 16, "max_seq_length": 512})
    check = perfguide.check(None, path, hardware="a10g")
    fit = check.change("fit")
    assert not check.fits and fit is not None and fit.fits
    litgpt_keys = next(e.keys for e in fit.edits if e.format == "litgpt")
    assert set(litgpt_keys) <= {"train.micro_batch_size", "train.global_batch_size", "train.max_seq_length", "precision", "devices",
                                "lora_r", "lora_alpha"}
    assert all(e.format == "litgpt" for e in fit.edits)
    assert any("no recommended plan to compare with" in n for n in check.notes)
