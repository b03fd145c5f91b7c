"""Setup -> accelerate objects: ``Accelerator(**kwargs)`` and the YAML ``accelerate launch --config_file`` reads.

Verified against accelerate 1.15 (launch.py, state.py, config_args.py):

* CPU plans with several processes use ``distributed_type: MULTI_GPU`` plus ``use_cpu: true``. The
  MULTI_CPU type starts several processes only through ``mpirun`` (``mpirun_config``); without it
  ``accelerate launch`` starts ONE process. The MULTI_GPU launcher is torchrun, and inside each rank
  ``use_cpu`` / ``cpu=True`` make accelerate pick MULTI_CPU with gloo.
* FSDP is only honoured on GPU-like devices: ``AcceleratorState`` promotes to ``DistributedType.FSDP``
  from MULTI_GPU/NPU/XPU/..., never from MULTI_CPU, so a CPU "FSDP" run silently trains as DDP with full
  replicas (torch's own ``fully_shard`` does work on CPU/gloo). We warn instead of emitting it quietly.
* DeepSpeed YAMLs point at the DeepSpeed JSON and carry no ``mixed_precision``/ZeRO fields: the Trainer
  passes its own DeepSpeed config, and accelerate then raises if the YAML also set those fields.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..techniques.precision import accelerate_mixed_precision
from .adapter_facts import (
    check_cuda_machine,
    emitted,
    fsdp_settings,
    hsdp_sizes,
    require_training,
)
from .deepspeed import deepspeed_config, resolved_deepspeed_config

if TYPE_CHECKING:
    import accelerate

    from ..recommendation import Recommendation
    from ..setup import Setup

#: Placeholder written where only the user knows the value (multi-node runs).
MAIN_PROCESS_IP = "MAIN_PROCESS_IP"
MULTI_NODE_PORT = 29500
CPU_FSDP_WARNING = (
    "accelerate 1.15 ignores FSDP on CPU (AcceleratorState only enables FSDP from GPU-like distributed types, "
    "not MULTI_CPU): this CPU plan will train as plain DDP with a full model replica per process"
)


def _warn_cpu_fsdp(rec: Recommendation) -> None:
    if rec.setup.is_fsdp and rec.setup.device == "cpu":
        warnings.warn(CPU_FSDP_WARNING, stacklevel=3)


def fsdp_plugin(rec: Recommendation) -> Any:
    """FullyShardedDataParallelPlugin for FSDP2; ``fsdp_version=2`` explicitly, the plugin default is 1."""
    from accelerate.utils import FullyShardedDataParallelPlugin

    f = fsdp_settings(rec)
    layer = f.get("transformer_layer_cls_to_wrap")
    return FullyShardedDataParallelPlugin(
        fsdp_version=f["version"],
        reshard_after_forward=f["reshard_after_forward"],
        auto_wrap_policy=f["auto_wrap_policy"].lower(),
        transformer_cls_names_to_wrap=[layer] if layer else None,
        cpu_offload=f["cpu_offload"],
        state_dict_type=f["state_dict_type"],
        activation_checkpointing=f["activation_checkpointing"],
    )


def accelerator_kwargs(rec: Recommendation) -> dict[str, Any]:
    """kwargs for ``accelerate.Accelerator``: precision, accumulation, device, sharding plugin."""
    s = rec.setup
    kw: dict[str, Any] = {"mixed_precision": accelerate_mixed_precision(s), **_accumulation(s)}
    if s.device == "cpu":
        kw["cpu"] = True
    stage = s.zero_stage
    if s.is_fsdp:
        _warn_cpu_fsdp(rec)
        kw["fsdp_plugin"] = fsdp_plugin(rec)
        if (sizes := hsdp_sizes(s)) is not None:
            from accelerate import ParallelismConfig

            kw["parallelism_config"] = ParallelismConfig(**sizes)
    elif stage is not None:
        from accelerate.utils import DeepSpeedPlugin

        kw["deepspeed_plugin"] = DeepSpeedPlugin(hf_ds_config=resolved_deepspeed_config(rec), zero3_init_flag=stage == 3 and s.zero3_init)
        if s.sequence_parallel > 1:
            kw["parallelism_config"] = sequence_parallel_config(rec)
    elif s.world_size > 1 and rec.model.separate_expert_modules:
        from accelerate.utils import DistributedDataParallelKwargs

        # experts that are modules of their own get no gradient when no token reaches them; DDP must look for them
        # (transformers 5's fused experts always get one: accelerate's default find_unused_parameters=False holds)
        kw["kwargs_handlers"] = [DistributedDataParallelKwargs(find_unused_parameters=True)]
    return kw


def sequence_parallel_config(rec: Recommendation) -> Any:
    """accelerate's ParallelismConfig for a plan that splits sequences: the same sizes the YAML carries (the
    sequence-parallel technique's accelerate_config keys, without their ``parallelism_config_`` prefix)."""
    from accelerate import ParallelismConfig
    from accelerate.utils import DeepSpeedSequenceParallelConfig

    keys = {k.removeprefix("parallelism_config_"): v for k, v in emitted(rec, "accelerate_config")["parallelism_config"].items()}
    handler = DeepSpeedSequenceParallelConfig(sp_seq_length_is_variable=keys.pop("sp_seq_length_is_variable"),
                                              sp_attn_implementation=keys.pop("sp_attn_implementation"))
    return ParallelismConfig(**keys, sp_handler=handler)


def _accumulation(s: Setup) -> dict[str, Any]:
    """accelerate takes the count bare or inside a GradientAccumulationPlugin, not both; the plugin carries
    sync_each_batch, which accumulate() honours (Setup.sync_grads_each_micro_step)."""
    if not s.sync_grads_each_micro_step:
        return {"gradient_accumulation_steps": s.gradient_accumulation_steps}
    from accelerate.utils import GradientAccumulationPlugin

    return {"gradient_accumulation_plugin": GradientAccumulationPlugin(num_steps=s.gradient_accumulation_steps, sync_each_batch=True)}


def accelerator(rec: Recommendation, **overrides: Any) -> accelerate.Accelerator:
    """A real Accelerator for this plan; WrongMachineError when this machine lacks the plan's GPU."""
    kw = {**accelerator_kwargs(rec), **overrides}
    if not kw.get("cpu"):
        check_cuda_machine(rec, needs_ampere=kw.get("mixed_precision") == "bf16")
    from accelerate import Accelerator

    return Accelerator(**kw)


def _distributed_type(rec: Recommendation) -> str:
    s = rec.setup
    if s.zero_stage is not None:
        return "DEEPSPEED"
    if s.is_fsdp:
        return "FSDP"
    return "MULTI_GPU" if s.world_size > 1 else "NO"


#: The YAML ``write_accelerate_config()`` writes without a path, and the name inline launch commands assume.
DEFAULT_CONFIG_FILE = "accelerate.yaml"


def deepspeed_file_for(config_file: str | Path) -> Path:
    """The DeepSpeed JSON that belongs to an accelerate YAML: ``<stem>_deepspeed.json`` in the same directory."""
    config_file = Path(config_file)
    return config_file.with_name(f"{config_file.stem}_deepspeed.json")


def accelerate_config(rec: Recommendation, deepspeed_config_file: str | None = None) -> dict[str, Any]:
    """The dict ``accelerate launch --config_file`` reads (``ClusterConfig`` fields only)."""
    s = require_training(rec, "accelerate_config")
    dist_type = _distributed_type(rec)
    cfg: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "debug": False,
        "distributed_type": dist_type,
        "num_processes": s.world_size,  # accelerate counts all processes of all machines
        "num_machines": s.nodes,
        "machine_rank": 0,
        "mixed_precision": accelerate_mixed_precision(s),
        "use_cpu": s.device == "cpu",
        "rdzv_backend": "static",
        "same_network": True,
        "main_training_function": "main",
        "enable_cpu_affinity": False,
        "downcast_bf16": False,
    }
    cfg.update(emitted(rec, "accelerate_config"))   # what the plan's techniques add (fp8: its backend)
    if s.nodes > 1:
        # every node runs the same file; launch_command passes the real rank/ip per node
        cfg.update(main_process_ip=MAIN_PROCESS_IP, main_process_port=MULTI_NODE_PORT)
    elif s.world_size > 1:
        cfg["main_process_port"] = 0  # 0: accelerate picks a free port on this machine
    if dist_type == "FSDP":
        _warn_cpu_fsdp(rec)
        cfg["fsdp_config"] = _fsdp_yaml(rec)
        if (sizes := hsdp_sizes(s)) is not None:
            # the launcher copies these keys to its --parallelism_config_* arguments and exports PARALLELISM_CONFIG_*,
            # which the Trainer's Accelerator reads (accelerate commands/launch.py, utils/launch.py)
            cfg["parallelism_config"] = {f"parallelism_config_{k}": v for k, v in sizes.items()}
    elif dist_type == "DEEPSPEED":
        del cfg["mixed_precision"]  # the DeepSpeed JSON owns precision ("auto" from TrainingArguments)
        ds_file = deepspeed_config_file or deepspeed_file_for(DEFAULT_CONFIG_FILE).name
        ds: dict[str, Any] = {"deepspeed_config_file": ds_file, "zero3_init_flag": s.zero_stage == 3 and s.zero3_init}
        if s.nodes > 1:
            ds["deepspeed_multinode_launcher"] = "standard"
        cfg["deepspeed_config"] = ds
    return cfg


def _fsdp_yaml(rec: Recommendation) -> dict[str, Any]:
    """The shared FSDP settings in accelerate's spelling, plus the launcher's own sync_module_states."""
    cfg = {"fsdp_offload_params" if key == "cpu_offload" else f"fsdp_{key}": value for key, value in fsdp_settings(rec).items()}
    cfg["fsdp_sync_module_states"] = True  # required by the launcher with cpu_ram_efficient_loading
    return cfg


def accelerate_files(rec: Recommendation, path: str | Path = DEFAULT_CONFIG_FILE) -> dict[Path, str]:
    """``{path: text}`` of the YAML and, for ZeRO plans, ``<stem>_deepspeed.json`` beside it (nothing written).

    The YAML names the JSON by its bare file name, relative to the directory both are written to, so the pair
    carries from the machine that planned to the one that runs (accelerate resolves it against the launch
    directory; ``rec.launch_command(config_file=...)`` also passes the JSON's path explicitly).
    """
    import yaml

    path = Path(path)
    ds = deepspeed_config(rec)
    ds_path = deepspeed_file_for(path)
    files = {path: yaml.safe_dump(accelerate_config(rec, deepspeed_config_file=ds_path.name), sort_keys=False)}
    if ds is not None:
        files[ds_path] = json.dumps(ds, indent=2) + "\n"
    return files


def write_accelerate_config(rec: Recommendation, path: str | Path = DEFAULT_CONFIG_FILE, *, overwrite: bool = False) -> Path:
    """Write ``accelerate_files``; returns the YAML path. Existing files are kept (OutputExistsError) unless
    ``overwrite=True``; symlinks are replaced, never written through; the set is written all or nothing."""
    from .files import write_files

    return write_files(accelerate_files(rec, path), overwrite)[0]
