"""HSDP (FSDP2 hybrid sharding) for multi-node plans (issue 11 item 10): memory divided over a node's GPUs only,
inter-node traffic one all-reduce of the gradient shard, chosen where predicted faster than FULL_SHARD across
nodes, emitted as accelerate's ParallelismConfig and checked by accelerate's launcher and a real 2 x 2 gloo mesh."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import perfguide as pg
from perfguide import Setup

try:
    from helpers import make_rec
except ImportError:  # pragma: no cover
    from tests.helpers import make_rec

MODEL = "meta-llama/Llama-3.1-8B"
SCRIPT = Path(__file__).with_name("launch_fsdp2_script.py")


@pytest.fixture(scope="module")
def eight_b():
    return pg.recommend(MODEL, scenario="train_gpu_many", hardware="h100-80gb:8x4")


def test_hsdp_chosen_for_8b_on_four_nodes(eight_b):
    s = eight_b.setup
    assert s.strategy == "fsdp" and s.hybrid_shard and s.nodes == 4 and s.num_gpus == 8
    d = next(d for d in eight_b.decisions if d.setting == "hybrid_shard")
    assert d.value is True and "faster than FULL_SHARD" in d.reason and "dp_replicate_size=4" in d.reason
    full = d.alternatives[0]
    assert full.value is False and full.number < eight_b.memory.device_total   # full sharding holds less per GPU


def test_hsdp_states_divided_over_the_node_only(eight_b):
    """fp32 AMP: 4 B weights + 4 B grads + 8 B AdamW per parameter, over the 8 GPUs of a node (not all 32)."""
    p = eight_b.model.total_params
    m = eight_b.memory
    assert m.weights == pytest.approx(4 * p / 8, rel=1e-6)
    assert m.gradients == pytest.approx(4 * p / 8, rel=1e-6)
    from perfguide.memory import estimate_memory

    full = estimate_memory(eight_b.model, eight_b.setup.replace(hybrid_shard=False), eight_b.hardware)
    assert full.weights == pytest.approx(4 * p / 32, rel=1e-6)


def test_internode_bytes_hand_formula(eight_b):
    from perfguide.scenarios.hybrid import internode_bytes

    s = eight_b.setup.replace(gradient_accumulation_steps=1)
    g16 = 2 * eight_b.model.total_params    # bf16 gradients under autocast
    assert internode_bytes(eight_b.model, s) == pytest.approx(2 * 3 / 4 * g16 / 8)
    full = s.replace(hybrid_shard=False)
    assert internode_bytes(eight_b.model, full) == pytest.approx(3 / 4 * (2 * g16 + g16))


def test_hsdp_not_chosen_when_a_node_cannot_hold_the_states():
    rec = pg.recommend("meta-llama/Llama-3.1-70B", scenario="train_gpu_many", hardware="h100-80gb:8x4")
    assert not rec.setup.hybrid_shard
    d = next(d for d in rec.decisions if d.setting == "hybrid_shard")
    assert d.value is False and "one copy of the states per node" in d.reason


def test_hybrid_shard_needs_fsdp2_and_several_nodes():
    with pytest.raises(ValueError, match="hybrid_shard"):
        Setup(strategy="fsdp", num_gpus=8, nodes=1, hybrid_shard=True)
    with pytest.raises(ValueError, match="hybrid_shard"):
        Setup(strategy="zero3", num_gpus=8, nodes=2, hybrid_shard=True)


def test_yaml_carries_parallelism_config_through_accelerates_launcher(eight_b, tmp_path):
    from accelerate import ParallelismConfig
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_extend_env_parallelism_config

    path = eight_b.write_accelerate_config(tmp_path / "acc.yaml")
    cfg = load_config_from_file(str(path))
    assert cfg.parallelism_config == {"parallelism_config_dp_replicate_size": 4, "parallelism_config_dp_shard_size": 8}
    args, _, _ = _validate_launch_command(launch_command_parser().parse_args(["--config_file", str(path), "train.py"]))
    assert args.use_parallelism_config and args.use_fsdp and args.fsdp_version == 2
    env = prepare_extend_env_parallelism_config(args, {})
    pc = ParallelismConfig(dp_replicate_size=int(env["PARALLELISM_CONFIG_DP_REPLICATE_SIZE"]),
                           dp_shard_size=int(env["PARALLELISM_CONFIG_DP_SHARD_SIZE"]))
    assert pc.total_size == eight_b.setup.world_size and pc.dp_replicate_enabled
    from perfguide.integrations.accelerate import accelerator_kwargs

    kw = accelerator_kwargs(eight_b)
    assert kw["parallelism_config"].dp_replicate_size == 4 and kw["parallelism_config"].dp_shard_size == 8


@pytest.mark.slow
def test_hsdp_mesh_shards_within_a_node_for_real(tmp_path):
    """2 'nodes' x 2 ranks on gloo: the environment accelerate's launcher makes of the YAML, accelerate's own 2-D mesh
    and fsdp2_prepare_model; each rank then holds 1/2 of every parameter (the node's share), not 1/4."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    rec = make_rec({"device": "cpu", "strategy": "fsdp", "num_gpus": 2, "nodes": 2, "hybrid_shard": True, "micro_batch_size": 1})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # accelerate ignores FSDP on CPU: the script shards with fsdp2_prepare_model itself
        path = rec.write_accelerate_config(tmp_path / "acc.yaml")
    args, _, _ = _validate_launch_command(launch_command_parser().parse_args(["--config_file", str(path), str(SCRIPT)]))
    launcher_env = prepare_multi_gpu_env(args)
    keep = {k: v for k, v in launcher_env.items() if k.startswith(("FSDP_", "PARALLELISM_CONFIG", "ACCELERATE_"))}
    rec_json, out = tmp_path / "rec.json", tmp_path / "out"
    rec_json.write_text(rec.to_json())
    out.mkdir()
    env = {**os.environ, **keep, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    env["ACCELERATE_USE_CPU"] = "true"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "4", str(SCRIPT), str(rec_json), str(out)]
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((out / f"rank{i}.json").read_text()) for i in range(4)]
    for r in ranks:
        assert r["mesh"] == {"dp_replicate": 2, "dp_shard": 2} and r["all_dtensor"]
        assert r["local_numel"] * 2 == r["full_numel"]
        assert all(math.isfinite(x) for x in r["losses"])
