"""Adapters to accelerate and DeepSpeed, checked with the libraries' own loaders and validators:
accelerate's config loader and launcher argument processing, FullyShardedDataParallelPlugin /
DeepSpeedPlugin, DeepSpeed's pydantic config classes, and TrainingArguments(deepspeed=dict)."""

from __future__ import annotations

import copy
import json
import warnings

import pytest

torch = pytest.importorskip("torch")
accelerate = pytest.importorskip("accelerate")

from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file  # noqa: E402
from accelerate.commands.launch import _validate_launch_command, launch_command_parser  # noqa: E402
from accelerate.utils import DistributedType  # noqa: E402

try:  # tests/ as a plain folder or as a package
    from helpers import hardware, make_rec, reset_accelerate_state, tiny_spec
except ImportError:  # pragma: no cover
    from tests.helpers import hardware, make_rec, reset_accelerate_state, tiny_spec

from perfguide.errors import InvalidSetupError, WrongMachineError  # noqa: E402
from perfguide.integrations.accelerate import CPU_FSDP_WARNING  # noqa: E402
from perfguide.integrations.deepspeed import resolved_deepspeed_config  # noqa: E402

GPU8 = {"micro_batch_size": 4, "gradient_accumulation_steps": 2, "autocast": "bf16", "num_gpus": 8}
CPU_DDP = {"device": "cpu", "num_gpus": 2, "strategy": "ddp", "micro_batch_size": 2}


def launcher_args(yaml_path, *extra):
    """What `accelerate launch --config_file <yaml> ...` makes of the file, without launching anything."""
    args = launch_command_parser().parse_args(["--config_file", str(yaml_path), *extra, "train.py"])
    args, defaults, mp_from_config = _validate_launch_command(args)
    return args, defaults, mp_from_config


# --- accelerate YAML ---------------------------------------------------------------------------------------

def test_single_process_cpu_yaml_loads(tmp_path):
    rec = make_rec({"device": "cpu", "autocast": "bf16"})
    path = rec.write_accelerate_config(tmp_path / "acc.yaml")
    cfg = load_config_from_file(str(path))
    assert isinstance(cfg, ClusterConfig)
    assert cfg.distributed_type == DistributedType.NO and cfg.num_processes == 1 and cfg.use_cpu
    assert cfg.mixed_precision == "bf16"


def test_cpu_ddp_yaml_starts_torchrun_with_cpu_ranks(tmp_path):
    path = make_rec(CPU_DDP).write_accelerate_config(tmp_path / "acc.yaml")
    cfg = ClusterConfig.from_yaml_file(str(path))
    # MULTI_CPU would start a single process without mpirun; MULTI_GPU's launcher is torchrun
    assert cfg.distributed_type == DistributedType.MULTI_GPU and cfg.use_cpu and cfg.num_processes == 2
    args, _, _ = launcher_args(path)
    assert args.multi_gpu and not args.cpu and args.num_processes == 2 and args.main_process_port == 0


@pytest.mark.parametrize("strategy, reshard", [("fsdp", True), ("fsdp_shard_grad_op", False)])
def test_fsdp_yaml_becomes_fsdp2_launch_env(strategy, reshard, tmp_path):
    from accelerate.utils.launch import prepare_multi_gpu_env

    rec = make_rec({**GPU8, "strategy": strategy, "gradient_checkpointing": True})
    path = rec.write_accelerate_config(tmp_path / "acc.yaml")
    cfg = load_config_from_file(str(path))
    assert cfg.distributed_type == DistributedType.FSDP and cfg.num_processes == 8 and cfg.mixed_precision == "bf16"
    args, _, _ = launcher_args(path)
    env = prepare_multi_gpu_env(args)
    assert env["ACCELERATE_USE_FSDP"] == "true" and env["FSDP_VERSION"] == "2"
    assert env["FSDP_RESHARD_AFTER_FORWARD"] == str(reshard).lower()
    assert env["FSDP_TRANSFORMER_CLS_TO_WRAP"] == "LlamaDecoderLayer"
    assert env["FSDP_ACTIVATION_CHECKPOINTING"] == "true" and env["FSDP_OFFLOAD_PARAMS"] == "false"
    assert env["ACCELERATE_MIXED_PRECISION"] == "bf16"


def test_multi_node_yaml_has_placeholders_and_world_size(tmp_path):
    rec = make_rec({**GPU8, "strategy": "ddp", "nodes": 2}, hw=hardware("a100", 8, nodes=2))
    cfg = load_config_from_file(str(rec.write_accelerate_config(tmp_path / "acc.yaml")))
    assert cfg.num_processes == 16 and cfg.num_machines == 2 and cfg.machine_rank == 0
    assert cfg.main_process_ip == "MAIN_PROCESS_IP" and cfg.main_process_port == 29500
    args, _, _ = launcher_args(tmp_path / "acc.yaml", "--machine_rank", "1", "--main_process_ip", "10.0.0.1")
    assert (args.machine_rank, args.main_process_ip, args.num_machines) == (1, "10.0.0.1", 2)  # the command line wins


def test_deepspeed_yaml_and_trainer_config_pass_accelerates_checks(tmp_path, monkeypatch):
    from accelerate.utils import DeepSpeedPlugin
    from accelerate.utils.launch import prepare_deepspeed_cmd_env

    rec = make_rec({**GPU8, "strategy": "zero3", "offload_optimizer": True, "offload_params": True})
    path = rec.write_accelerate_config(tmp_path / "acc.yaml")
    cfg = load_config_from_file(str(path))
    assert cfg.distributed_type == DistributedType.DEEPSPEED and cfg.deepspeed_config["zero3_init_flag"] is True
    ds_file = path.parent / cfg.deepspeed_config["deepspeed_config_file"]  # named relative to the YAML's directory
    assert json.loads(ds_file.read_text()) == rec.deepspeed_config()
    args, defaults, mp_from_config = launcher_args(path)
    fields = list(defaults.deepspeed_config) + (["mixed_precision"] if mp_from_config else [])
    args.deepspeed_fields_from_accelerate_config = ",".join(fields)
    _, env = prepare_deepspeed_cmd_env(args)
    monkeypatch.setenv("ACCELERATE_CONFIG_DS_FIELDS", env["ACCELERATE_CONFIG_DS_FIELDS"])
    # what the Trainer does in each rank: its own DeepSpeed dict next to the launcher's env
    plugin = DeepSpeedPlugin(hf_ds_config=copy.deepcopy(rec.deepspeed_config()))
    assert plugin.zero_stage == 3 and plugin.offload_optimizer_device == "cpu" and plugin.offload_param_device == "cpu"
    # control: a YAML that also names mixed_precision is refused by that same check
    monkeypatch.setenv("ACCELERATE_CONFIG_DS_FIELDS", env["ACCELERATE_CONFIG_DS_FIELDS"] + ",mixed_precision")
    with pytest.raises(ValueError, match="will be ignored"):
        DeepSpeedPlugin(hf_ds_config=copy.deepcopy(rec.deepspeed_config()))


def test_cpu_fsdp_plan_warns_that_accelerate_ignores_it():
    with pytest.warns(UserWarning, match="ignores FSDP on CPU"):
        make_rec({**CPU_DDP, "strategy": "fsdp"}).accelerate_config()
    assert "DDP" in CPU_FSDP_WARNING


def test_inference_plan_has_no_accelerate_config():
    with pytest.raises(InvalidSetupError):
        make_rec({"task": "infer", "weights_dtype": "bf16"}).accelerate_config()


# --- Accelerator -------------------------------------------------------------------------------------------

def test_cpu_plan_builds_a_real_accelerator():
    rec = make_rec({"device": "cpu", "autocast": "bf16", "gradient_accumulation_steps": 4})
    kw = rec.accelerator_kwargs()
    assert kw == {"mixed_precision": "bf16", "gradient_accumulation_steps": 4, "cpu": True}
    reset_accelerate_state()
    acc = rec.accelerator()
    assert acc.device.type == "cpu" and acc.mixed_precision == "bf16" and acc.gradient_accumulation_steps == 4


def test_gpu_plan_accelerator_refuses_here():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(WrongMachineError, match="A100"):
        make_rec({"autocast": "bf16"}).accelerator()


def test_fsdp_plugin_is_fsdp2_explicitly():
    rec = make_rec({**GPU8, "strategy": "fsdp_shard_grad_op", "gradient_checkpointing": True, "offload_params": True})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plugin = rec.accelerator_kwargs()["fsdp_plugin"]
    assert plugin.fsdp_version == 2 and plugin.reshard_after_forward is False
    assert plugin.transformer_cls_names_to_wrap == ["LlamaDecoderLayer"]
    assert plugin.activation_checkpointing is True and type(plugin.cpu_offload).__name__ == "CPUOffloadPolicy"


@pytest.mark.parametrize("update", [
    {"strategy": "fsdp", "gradient_checkpointing": False, "offload_params": True},
    {"strategy": "fsdp_shard_grad_op", "gradient_checkpointing": True, "offload_params": False},
])
def test_trainer_yaml_and_plugin_describe_the_same_fsdp_run(update, tmp_path):
    """Three adapters, one FSDP plan: what the launcher, the Accelerator plugin and the Trainer make of them agrees."""
    import transformers
    from accelerate.utils.launch import prepare_multi_gpu_env

    rec = make_rec({**GPU8, **update})
    env = prepare_multi_gpu_env(launcher_args(rec.write_accelerate_config(tmp_path / "acc.yaml"))[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plugin = rec.accelerator_kwargs()["fsdp_plugin"]
    d = rec.training_args_dict()
    cpu_safe = {k: v for k, v in d.items() if k not in ("bf16", "tf32", "ddp_backend")}
    trainer = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, **cpu_safe).fsdp_plugin_args
    reshard, ckpt, offload = update["strategy"] == "fsdp", update["gradient_checkpointing"], update["offload_params"]
    assert env["FSDP_RESHARD_AFTER_FORWARD"] == str(reshard).lower()
    assert plugin.reshard_after_forward is reshard and trainer["reshard_after_forward"] is reshard
    assert env["FSDP_ACTIVATION_CHECKPOINTING"] == str(ckpt).lower()
    assert plugin.activation_checkpointing is ckpt and trainer.get("activation_checkpointing", False) is ckpt
    assert env["FSDP_OFFLOAD_PARAMS"] == str(offload).lower()
    assert (type(plugin.cpu_offload).__name__ == "CPUOffloadPolicy") is offload
    assert d["fsdp_config"]["cpu_offload"] is offload
    assert env["FSDP_TRANSFORMER_CLS_TO_WRAP"] == trainer["transformer_cls_names_to_wrap"] == "LlamaDecoderLayer"
    assert plugin.transformer_cls_names_to_wrap == ["LlamaDecoderLayer"]


def test_deepspeed_plugin_and_moe_ddp_kwargs():
    kw = make_rec({**GPU8, "strategy": "zero2", "offload_optimizer": True}).accelerator_kwargs()
    plugin = kw["deepspeed_plugin"]
    assert plugin.zero_stage == 2 and plugin.offload_optimizer_device == "cpu" and plugin.zero3_init_flag is False
    assert plugin.deepspeed_config["train_batch_size"] == 4 * 2 * 8
    separate = tiny_spec(num_experts=8, num_experts_per_tok=2, separate_expert_modules=True)
    moe = make_rec({**GPU8, "strategy": "ddp"}, spec=separate).accelerator_kwargs()
    assert moe["kwargs_handlers"][0].find_unused_parameters is True
    fused = make_rec({**GPU8, "strategy": "ddp"}, spec=tiny_spec(num_experts=8, num_experts_per_tok=2)).accelerator_kwargs()
    assert "kwargs_handlers" not in fused  # accelerate's own default, find_unused_parameters=False


# --- DeepSpeed config --------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "strategy, offload_opt, offload_par",
    [("zero1", False, False), ("zero2", False, False), ("zero2", True, False), ("zero3", False, False), ("zero3", True, True)],
)
def test_deepspeed_config_is_valid_for_deepspeed(strategy, offload_opt, offload_par):
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    # one GPU (ZeRO with offload on a single card): DeepSpeedConfig checks the batch against this process's world
    rec = make_rec({**GPU8, "num_gpus": 1, "strategy": strategy, "offload_optimizer": offload_opt, "offload_params": offload_par})
    cfg = rec.deepspeed_config()
    stage = int(strategy[-1])
    zero = DeepSpeedZeroConfig(**cfg["zero_optimization"])  # extra="forbid": catches misspelt keys
    assert zero.stage == stage
    assert (zero.offload_optimizer is not None) == offload_opt and (zero.offload_param is not None) == offload_par
    assert all(cfg[k] == "auto" for k in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size", "gradient_clipping"))
    resolved = DeepSpeedConfig(resolved_deepspeed_config(rec))
    assert resolved.zero_optimization_stage == stage and resolved.train_batch_size == 4 * 2
    assert resolved.gradient_accumulation_steps == 2 and resolved.bfloat16_config.enabled


def test_trainer_fills_the_auto_values(tmp_path):
    pytest.importorskip("deepspeed")
    import transformers

    rec = make_rec({**GPU8, "strategy": "zero3", "offload_optimizer": True})
    kw = {k: v for k, v in rec.training_args_dict().items() if k not in ("bf16", "ddp_backend")}
    args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, **kw)
    filled = args.hf_deepspeed_config.config
    assert filled["train_micro_batch_size_per_gpu"] == 4 and filled["gradient_accumulation_steps"] == 2
    assert filled["gradient_clipping"] == args.max_grad_norm and filled["optimizer"]["params"]["lr"] == args.learning_rate
    assert rec.deepspeed_config()["train_micro_batch_size_per_gpu"] == "auto"  # our dict was not filled in place


def test_deepspeed_config_none_and_bad_offload():
    assert make_rec({**GPU8, "strategy": "ddp"}).deepspeed_config() is None
    with pytest.raises(InvalidSetupError, match="offload_params needs strategy 'zero3'"):
        make_rec({**GPU8, "strategy": "zero2", "offload_params": True}).deepspeed_config()
    # DeepSpeed documents optimizer offload for stages 1, 2 and 3 (runtime/zero/offload_config.py)
    zo = make_rec({**GPU8, "strategy": "zero1", "offload_optimizer": True}).deepspeed_config()["zero_optimization"]
    assert zo["stage"] == 1 and zo["offload_optimizer"]["device"] == "cpu"
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    assert DeepSpeedZeroConfig(**zo).offload_optimizer is not None
