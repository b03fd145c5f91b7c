"""`perfguide check -- tune run ... / llamafactory-cli train ... / axolotl train ...`: the tools' own commands.

Each reads the config file the command names, with the command line's overrides applied as the tool applies them
(OmegaConf dot-lists for torchtune and LLaMA-Factory: `key=value`, dotted for nested keys, values parsed as YAML
scalars; `--key value` flags for axolotl), and the process count its launcher uses. The expected values are read
from the example files and the command words here, not from perfguide.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import perfguide
from perfguide.errors import PerfGuideError

DATA = Path(__file__).parent / "data" / "check"
TUNE = DATA / "torchtune_llama3_2_1B_lora_single_device.yaml"
LMF = DATA / "llamafactory_qwen3_lora_sft_ds3.yaml"
AXO = DATA / "axolotl_lora-1b.yml"


def test_tune_run_applies_dotted_overrides_and_torchruns_process_count() -> None:
    y = yaml.safe_load(TUNE.read_text())
    assert y["batch_size"] == 4 and y["tokenizer"]["max_seq_len"] is None   # the premise: the overrides change both
    cmd = ["tune", "run", "--nproc_per_node", "2", "lora_finetune_distributed", "--config", str(TUNE), "batch_size=8",
           "tokenizer.max_seq_len=4096"]
    s = perfguide.check(None, cmd, hardware="a100-80gb:2").setup
    assert (s.micro_batch_size, s.seq_len, s.num_gpus) == (8, 4096, 2)
    assert s.strategy == "fsdp"   # torchtune's distributed recipes shard with FSDP2
    plain = perfguide.check(None, ["tune", "run", "lora_finetune_single_device", "--config", str(TUNE)], hardware="a100-80gb",
                            seq_len=2048).setup
    assert (plain.micro_batch_size, plain.num_gpus) == (y["batch_size"], 1)


def test_llamafactory_cli_train_overrides_and_spans_the_visible_gpus() -> None:
    y = yaml.safe_load(LMF.read_text())
    assert y["per_device_train_batch_size"] == 1
    s = perfguide.check("Qwen/Qwen3-4B", ["llamafactory-cli", "train", str(LMF), "per_device_train_batch_size=2"],
                        hardware="a100-80gb:4").setup
    assert (s.micro_batch_size, s.seq_len, s.num_gpus) == (2, y["cutoff_len"], 4)
    check = perfguide.check("Qwen/Qwen3-4B", ["llamafactory-cli", "train", str(LMF)], hardware="a100-80gb:4", num_gpus=2)
    assert check.setup.num_gpus == 2   # a count given to check wins over the launcher's default


def test_axolotl_train_flag_overrides() -> None:
    y = yaml.safe_load(AXO.read_text())
    assert y["micro_batch_size"] == 2
    s = perfguide.check("meta-llama/Llama-3.2-1B", ["axolotl", "train", str(AXO), "--micro-batch-size", "4"], hardware="a100-80gb").setup
    assert (s.micro_batch_size, s.gradient_accumulation_steps, s.seq_len) == (4, y["gradient_accumulation_steps"], y["sequence_len"])


@pytest.mark.parametrize(("cmd", "message"), [
    (["tune", "run", "lora_finetune_single_device", "--config", "llama3_2/1B_lora_single_device"], "tune cp llama3_2/1B_lora_single_device"),
    (["tune", "ls"], "accepted: `tune run ...`"),
    (["llamafactory-cli", "export", "x.yaml"], "accepted: `llamafactory-cli train ...`"),
    (["llamafactory-cli", "train", str(LMF), "--per_device_train_batch_size", "2"], "accepted overrides: key=value"),
    (["axolotl", "train"], "names no config file"),
])
def test_what_cannot_be_read_is_one_line(cmd: list[str], message: str) -> None:
    with pytest.raises(PerfGuideError, match=message.replace("(", r"\(").replace("`", "`").replace(".", r"\.")):
        perfguide.check("meta-llama/Llama-3.2-1B", cmd, hardware="a100-80gb")


@pytest.mark.parametrize(("env", "processes", "nodes"), [(["CUDA_VISIBLE_DEVICES=0"], 1, 1), (["CUDA_VISIBLE_DEVICES=0,1,2,3"], 4, 1),
                                                          (["FORCE_TORCHRUN=1", "NNODES=2", "NPROC_PER_NODE=8"], 8, 2)])
def test_llamafactory_cli_takes_its_process_count_from_the_environment(env: list[str], processes: int, nodes: int) -> None:
    """LLaMA-Factory's launcher (src/llamafactory/launcher.py at ff6d4d12) starts torchrun with NPROC_PER_NODE processes,
    else one per visible device, on NNODES nodes: its examples README runs `CUDA_VISIBLE_DEVICES=0 llamafactory-cli train
    ...` and `FORCE_TORCHRUN=1 NNODES=2 ... llamafactory-cli train ...`. The words were refused as a command before."""
    check = perfguide.check("Qwen/Qwen3-4B", [*env, "llamafactory-cli", "train", str(LMF)], hardware="a100-80gb:8x2")
    assert (check.setup.num_gpus, check.setup.nodes) == (processes, nodes)
    unread = [w.split("=")[0] for w in env if w.split("=")[0] not in ("CUDA_VISIBLE_DEVICES", "NPROC_PER_NODE", "NNODES")]
    assert any(f"environment {', '.join(unread)} before the command: not read" in n for n in check.notes) is bool(unread)


@pytest.mark.parametrize(("launch", "processes"), [(["accelerate", "launch", "--num_processes", "2", "-m"], 2),
                                                   (["torchrun", "--nproc_per_node", "4", "-m"], 4), (["python", "-m"], 1)])
def test_axolotl_launched_as_a_module_reads_its_yaml(launch: list[str], processes: int) -> None:
    """axolotl's docs launch `accelerate launch -m axolotl.cli.train config.yml`, `torchrun ... -m axolotl.cli.train` and
    `python -m axolotl.cli.train examples/mistral/qlora.yml` (docs/multi-node.qmd, examples READMEs): the YAML is
    axolotl's, overrides as `axolotl train` takes them, and the launcher's process count. The config was taken for the
    script and the check failed with 'no model'."""
    y = yaml.safe_load(AXO.read_text())
    s = perfguide.check(None, [*launch, "axolotl.cli.train", str(AXO), "--micro_batch_size", "3"], hardware="a100-80gb:8").setup
    assert (s.micro_batch_size, s.num_gpus) == (3, processes) and s.seq_len == y["sequence_len"]


def test_llamafactorys_entry_script_under_accelerate_reads_its_yaml(tmp_path: Path) -> None:
    """LLaMA-Factory's README and its Ascend examples launch ``accelerate launch --config_file fsdp2.yaml src/train.py
    examples/x.yaml``: src/train.py calls run_exp, whose parser loads the YAML given first (hparams/parser.py
    read_args). That command read "no model"; the YAML is read as LLaMA-Factory's and the process count and FSDP from
    the accelerate config."""
    y = yaml.safe_load(LMF.read_text())
    acc = yaml.safe_load((DATA / "trl_fsdp2.yaml").read_text())
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("from llamafactory.train.tuner import run_exp\nrun_exp()\n", encoding="utf-8")
    lf = tmp_path / "sft.yaml"
    lf.write_text(yaml.safe_dump({k: v for k, v in y.items() if k != "deepspeed"}), encoding="utf-8")
    cmd = ["accelerate", "launch", "--config_file", str(DATA / "trl_fsdp2.yaml"), str(tmp_path / "src" / "train.py"), str(lf),
           "per_device_train_batch_size=2"]
    c = perfguide.check(None, cmd, hardware="h100-80gb:8")
    assert c.model == y["model_name_or_path"] and c.setup.micro_batch_size == 2
    assert (c.setup.strategy, c.setup.num_gpus) == ("fsdp", acc["num_processes"])
    assert c.setup.seq_len == y["cutoff_len"]
