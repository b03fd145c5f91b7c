"""Launch commands: their shape for each kind of plan, and real 2-process CPU runs started from the generated
accelerate YAML and command, unchanged, training a tiny Llama with the Trainer (gloo)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

try:  # tests/ as a plain folder or as a package
    from helpers import hardware, make_rec
except ImportError:  # pragma: no cover
    from tests.helpers import hardware, make_rec

from perfguide.integrations.launch import torchrun_command

SCRIPT = Path(__file__).with_name("launch_train_script.py")
FSDP2_SCRIPT = Path(__file__).with_name("launch_fsdp2_script.py")
CPU_DDP = {"device": "cpu", "num_gpus": 2, "strategy": "ddp", "micro_batch_size": 2, "optimizer": "adamw_torch"}
GPU8 = {"autocast": "bf16", "num_gpus": 8, "strategy": "ddp"}


def test_single_process_is_plain_python():
    assert make_rec({"autocast": "bf16"}).launch_command("train.py", "--lr", "1e-4") == "python train.py --lr 1e-4"
    assert make_rec({"device": "cpu", "cpu_threads": 7}).launch_command("t.py") == "OMP_NUM_THREADS=7 python t.py"


def test_multi_gpu_uses_accelerate_launch():
    rec = make_rec(GPU8)
    assert rec.launch_command("train.py", config_file="acc.yaml") == "accelerate launch --config_file acc.yaml train.py"
    inline = rec.launch_command("train.py")
    assert inline.startswith("accelerate launch --multi_gpu --num_processes 8 --num_machines 1 --mixed_precision bf16")
    assert inline.endswith(" train.py")


def test_single_gpu_zero_offload_still_needs_the_launcher():
    rec = make_rec({"autocast": "bf16", "strategy": "zero3", "offload_optimizer": True, "offload_params": True})
    cmd = rec.launch_command("train.py")
    assert cmd.startswith("accelerate launch --use_deepspeed --num_processes 1") and "--deepspeed_config_file" in cmd


def test_multi_node_passes_rank_and_ip_from_the_environment():
    rec = make_rec({**GPU8, "nodes": 2}, hw=hardware("a100", 8, nodes=2))
    cmd = rec.launch_command("train.py", config_file="acc.yaml")
    assert cmd == 'accelerate launch --config_file acc.yaml --machine_rank "$MACHINE_RANK" --main_process_ip "$MAIN_PROCESS_IP" train.py'
    tr = torchrun_command(rec, "train.py")
    assert "--nnodes 2" in tr and "--nproc_per_node 8" in tr and '--node_rank "$MACHINE_RANK"' in tr


def test_cpu_processes_split_the_cores():
    rec = make_rec(CPU_DDP)  # helpers' CPU has 2 physical cores
    assert rec.launch_command("t.py", config_file="a.yaml").startswith("OMP_NUM_THREADS=1 accelerate launch")
    assert torchrun_command(rec, "t.py") == "OMP_NUM_THREADS=1 torchrun --nproc_per_node 2 --standalone t.py"


def test_script_arguments_are_shell_quoted():
    assert make_rec({}).launch_command("my train.py", "a b") == "python 'my train.py' 'a b'"


# --- real runs ---------------------------------------------------------------------------------------------

def _run(rec, tmp_path: Path, config_file: str | None, script: Path | None = None) -> list[dict]:
    """Run the plan's own command in a shell, exactly as generated; return each rank's report."""
    rec_json = tmp_path / "rec.json"
    rec_json.write_text(rec.to_json())
    out = tmp_path / "out"
    out.mkdir()
    cmd = rec.launch_command(str(script or SCRIPT), str(rec_json), str(out), config_file=config_file)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(cmd, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, f"{cmd}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return [json.loads((out / f"rank{i}.json").read_text()) for i in range(rec.setup.world_size)]


@pytest.mark.slow
def test_ddp_cpu_plan_runs_two_gloo_ranks(tmp_path):
    rec = make_rec(CPU_DDP)
    yaml_path = rec.write_accelerate_config(tmp_path / "accelerate.yaml")
    ranks = _run(rec, tmp_path, str(yaml_path))
    assert [r["rank"] for r in ranks] == [0, 1]
    for r in ranks:
        assert r["world_size"] == 2 and r["steps"] == 2 and r["wrapper"] == "DistributedDataParallel"
        assert r["distributed_type"] == "DistributedType.MULTI_CPU" and r["torch_threads"] == 1


@pytest.mark.slow
def test_fsdp_cpu_plan_runs_but_accelerate_trains_it_as_ddp(tmp_path):
    """accelerate 1.15 never promotes MULTI_CPU to FSDP (state.py); torch's fully_shard itself works on gloo.

    If this starts failing because the wrapper became FSDP, accelerate gained CPU FSDP: drop the warning.
    """
    rec = make_rec({**CPU_DDP, "strategy": "fsdp"})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yaml_path = rec.write_accelerate_config(tmp_path / "accelerate.yaml")
    assert any("ignores FSDP on CPU" in str(w.message) for w in caught)
    ranks = _run(rec, tmp_path, str(yaml_path))
    for r in ranks:
        assert r["world_size"] == 2 and r["steps"] == 2
        assert r["wrapper"] == "DistributedDataParallel" and r["distributed_type"] == "DistributedType.MULTI_CPU"


@pytest.mark.slow
def test_fsdp_cpu_plan_shards_for_real_with_accelerates_fsdp2_code(tmp_path):
    """The generated FSDP YAML, launched unchanged, shards the model over 2 gloo ranks with FSDP2.

    The launched script builds accelerate's FSDP plugin from the environment the YAML produced and applies
    accelerate's own fsdp2_prepare_model (what Accelerator.prepare does on GPUs; on CPU accelerate skips it).
    """
    rec = make_rec({**CPU_DDP, "strategy": "fsdp"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yaml_path = rec.write_accelerate_config(tmp_path / "accelerate.yaml")
    ranks = _run(rec, tmp_path, str(yaml_path), script=FSDP2_SCRIPT)
    for r in ranks:
        assert r["world_size"] == 2 and r["steps"] == 2 and r["fsdp_version"] == 2
        assert r["reshard_after_forward"] is True and r["wrap"] == ["LlamaDecoderLayer"]
        assert r["all_dtensor"] and r["wrapper"].startswith("FSDP")
        assert r["local_numel"] * 2 == r["full_numel"]  # each rank holds exactly half of every parameter
        assert all(math.isfinite(x) for x in r["losses"])


def test_inference_launchers_match_the_strategy():
    tp = make_rec({"task": "infer", "weights_dtype": "bf16", "strategy": "tp", "num_gpus": 4})
    assert tp.launch_command("generate.py") == "torchrun --nproc_per_node 4 --standalone generate.py"
    replicas = make_rec({"task": "infer", "weights_dtype": "bf16", "strategy": "single", "num_gpus": 4})
    assert replicas.launch_command("generate.py") == "accelerate launch --multi_gpu --num_processes 4 generate.py"
    split = make_rec({"task": "infer", "weights_dtype": "bf16", "strategy": "device_map", "num_gpus": 4})
    assert split.launch_command("generate.py") == "python generate.py"  # device_map="auto" is one process


@pytest.mark.slow
def test_ddp_cpu_plan_runs_from_the_inline_command(tmp_path):
    """The command printed in the report (accelerate flags, no YAML) starts the same 2-rank gloo run."""
    ranks = _run(make_rec(CPU_DDP), tmp_path, None)
    assert [r["world_size"] for r in ranks] == [2, 2] and all(r["steps"] == 2 for r in ranks)
    assert all(r["distributed_type"] == "DistributedType.MULTI_CPU" for r in ranks)


def test_fp8_plans_name_their_backend_in_the_inline_command_as_in_the_yaml(tmp_path):
    """The YAML's ``fp8_config: {backend: AO}`` is what perfguide priced (torchao Float8Linear); the flags must carry
    it too, or accelerate picks a backend from what happens to be installed. Both read by accelerate's own parser."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    rec = make_rec({"autocast": "fp8", "num_gpus": 8, "strategy": "ddp"}, hw=hardware("h100", 8))
    assert rec.setup.autocast == "fp8"
    inline = rec.launch_command("train.py").split()
    assert inline[inline.index("--fp8_backend") + 1] == "ao"
    from_flags, _, _ = _validate_launch_command(launch_command_parser().parse_args(inline[2:]))
    path = tmp_path / "acc.yaml"
    rec.write_accelerate_config(path)
    from_yaml, _, _ = _validate_launch_command(launch_command_parser().parse_args(["--config_file", str(path), "train.py"]))
    assert from_flags.mixed_precision == from_yaml.mixed_precision == "fp8"
    assert from_flags.fp8_backend.lower() == from_yaml.fp8_backend.lower() == "ao"
