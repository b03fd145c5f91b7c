"""`perfguide check -- accelerate launch ... train.py ...` on the commands PEFT's DeepSpeed and FSDP guides run
(PEFT examples/sft, copied with their accelerate configs into tests/data/check/peft_sft), against the memory those
guides publish for them (bench/data/published_measurements.csv rows 757, 968, 969, 3210).

The script parses SFTConfig beside its own ModelArguments (``use_peft_lora``, ``use_4bit_quantization``, ...): those
flags were listed as unknown and the run priced as a full fine-tune (586 GiB for the 70B QLoRA ZeRO-3 command).
The script itself is not copied here: a stand-in declares the fields the reader recognises it by."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from helpers import with_keys

import perfguide

DATA = Path(__file__).parent / "data" / "check" / "peft_sft"
GB = 1e9
STAND_IN = '''from dataclasses import dataclass, field
from transformers import HfArgumentParser
from trl import SFTConfig

@dataclass
class ModelArguments:
    model_name_or_path: str = field()
    use_peft_lora: bool = field(default=False)
    use_4bit_quantization: bool = field(default=False)
    bnb_4bit_quant_storage_dtype: str = field(default="uint8")

parser = HfArgumentParser((ModelArguments, SFTConfig))
'''


@pytest.fixture
def example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "train.py").write_text(STAND_IN, encoding="utf-8")
    (tmp_path / "configs").mkdir()
    for f in (DATA / "configs").iterdir():
        (tmp_path / "configs" / f.name).write_text(f.read_text(encoding="utf-8"), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def command(name: str) -> str:
    text = (DATA / name).read_text(encoding="utf-8")
    return " ".join(line.rstrip().rstrip("\\") for line in text.splitlines() if not line.startswith("#"))


def check(name: str, hardware: str) -> perfguide.Check:
    return perfguide.check(None, shlex.split(command(name)), hardware=hardware)


def test_the_qlora_zero3_command_is_priced_as_qlora(example: Path) -> None:
    """run_peft_qlora_deepspeed_stage3.sh: Llama-2-70B QLoRA (nf4, nested, bf16 storage and load), ZeRO-3 on 2 GPUs;
    PEFT's guide: 36.6 GB per GPU (row 969)."""
    c = check("run_peft_qlora_deepspeed_stage3.sh", "a100-80gb:2")
    s = c.setup
    assert (s.weights_dtype, s.nf4_double_quant, s.strategy, s.num_gpus) == ("nf4", True, "zero3", 2)
    assert s.lora is not None and (s.lora.r, s.lora.alpha, s.lora.target_modules) == (8, 16, "all-linear")
    assert s.attn_implementation == "flash_attention_2" and s.kbit_upcast is False   # loaded in bf16, the storage dtype
    assert c.memory.device_total / GB == pytest.approx(36.6, rel=0.10)
    assert not any("use_peft_lora" in u for u in c.unknown)


def test_the_lora_zero3_command_loads_fp32(example: Path) -> None:
    """run_peft_deepspeed.sh: no 4-bit, so the script loads float32 (its own rule); 8 x H100, 64 GB (row 968)."""
    c = check("run_peft_deepspeed.sh", "h100-80gb:8")
    assert (c.setup.weights_dtype, c.setup.strategy, c.setup.num_gpus) == ("fp32", "zero3", 8)
    assert c.memory.device_total / GB == pytest.approx(64, rel=0.10)


def test_the_qlora_fsdp_offload_command(example: Path) -> None:
    """run_peft_qlora_fsdp.sh with fsdp_config_qlora.yaml (CPU offload), 2 GPUs: 19.6 GB per GPU (row 757)."""
    c = check("run_peft_qlora_fsdp.sh", "a100-80gb:2")
    assert (c.setup.strategy, c.setup.offload_params, c.setup.weights_dtype) == ("fsdp", True, "nf4")
    assert c.memory.device_total / GB == pytest.approx(19.6, rel=0.10)


def test_the_lora_fsdp1_command_gives_frozen_weights_no_gradient(example: Path) -> None:
    """run_peft_fsdp.sh: FSDP1 with use_orig_params false; the HF Trainer wraps each LoRA leaf apart (peft's
    fsdp_auto_wrap_policy, transformers' update_fsdp_plugin_peft), so the blocks' frozen fp32 weights get no gradient.
    PEFT's guide ran it on 8 x H100 at "72-80 GB (90-98%)" per GPU (row 3210); priced with frozen gradients it read
    251 GiB, "does not fit"."""
    c = check("run_peft_fsdp.sh", "h100-80gb:8")
    s = c.setup
    assert (s.strategy, s.fsdp_version, s.weights_dtype, s.micro_batch_size, s.gradient_accumulation_steps) == ("fsdp", 1, "fp32", 8, 4)
    assert c.fits and c.memory.gradients < 2**30
    assert 72 * 0.9 <= c.memory.device_total / GB <= 80 * 1.1
    plain_wrap = perfguide.estimate("meta-llama/Llama-2-70b-hf", s.replace(fsdp_adapter_units=False), hardware="h100-80gb:8")
    assert plain_wrap.gradients > 30 * 2**30   # accelerate's transformer wrap alone: the frozen weights' gradients


def test_unsloth_is_refused(example: Path) -> None:
    cmd = [*shlex.split(command("run_peft_qlora_fsdp.sh")), "--use_unsloth", "True"]
    with pytest.raises(perfguide.PerfGuideError, match="use_unsloth: Unsloth's model and kernels are not priced"):
        perfguide.check(None, cmd, hardware="a100-80gb:2")


def test_changes_come_back_in_flags_the_script_takes(example: Path) -> None:
    """The script parses its ModelArguments and SFTConfig: every flag a change writes is a field of one of them (the
    adapter as --use_peft_lora, a 4-bit base as --use_4bit_quantization), and the load dtype, which the script has no
    flag for, comes back as a perfguide.Setup change."""
    import dataclasses

    import trl

    from perfguide.integrations.readers import peft_example

    accepted = {f.name for f in dataclasses.fields(trl.SFTConfig)} | peft_example.MODEL_FIELDS | peft_example.DATA_FIELDS
    keys, rest = peft_example.write({"lora": {"r": 16, "alpha": 32}, "weights_dtype": "nf4", "attn_implementation": "sdpa",
                                     "micro_batch_size": 4}, perfguide.Setup(weights_dtype="nf4", lora={"r": 16, "alpha": 32}))
    assert keys == {"--use_peft_lora": True, "--lora_r": 16, "--lora_alpha": 32, "--use_4bit_quantization": True,
                    "--use_flash_attn": False, "--per_device_train_batch_size": 4} and not rest
    for name in ("run_peft_fsdp.sh", "run_peft_qlora_deepspeed_stage3.sh"):
        c = check(name, "h100-80gb:8" if name == "run_peft_fsdp.sh" else "a100-40gb:2")
        edits = [e for ch in c.changes for e in ch.edits if e.format == "peft_example"]
        assert edits and all(k.removeprefix("--") in accepted for e in edits for k in e.keys), [e.keys for e in edits]
        assert not any(e.format == "training_args" for ch in c.changes for e in ch.edits)


def test_the_fsdp_version_change_lands_in_the_launchers_config(example: Path) -> None:
    """A field no config sets (the FSDP version, accelerate's default 1) goes to the config that has a key for it, the
    accelerate YAML, rather than to a perfguide.Setup note; the YAML with it applied loads in accelerate's own parser
    and reads back as the plan's FSDP2."""
    import yaml
    from accelerate.commands.config.config_args import load_config_from_file

    c = check("run_peft_fsdp.sh", "h100-80gb:8")
    edit = next(e for ch in c.changes if ch.kind == "recommended" for e in ch.edits if e.format == "accelerate")
    assert edit.keys["fsdp_config.fsdp_version"] == 2
    path = example / "configs" / "fsdp_config.yaml"
    cfg = with_keys(yaml.safe_load(path.read_text(encoding="utf-8")), edit.keys)
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    assert load_config_from_file(str(path)).fsdp_config["fsdp_version"] == 2
    again = check("run_peft_fsdp.sh", "h100-80gb:8")
    assert again.setup.fsdp_version == 2
