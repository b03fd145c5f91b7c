"""Setup -> the shell command that starts the run.

One process: ``python train.py``. Several processes (or any ZeRO/FSDP plan): ``accelerate launch``,
because a plain ``python`` on a multi-GPU box makes the Trainer fall back to ``nn.DataParallel``.
Multi-node commands reference ``$MACHINE_RANK`` and ``$MAIN_PROCESS_IP``, which each node exports.
CPU runs pin ``OMP_NUM_THREADS`` per process: ranks sharing a socket otherwise oversubscribe cores.

``torchrun_command`` is the torchrun spelling of the same run. It suits Trainer scripts (the
TrainingArguments carry the FSDP/DeepSpeed settings); loops built on ``rec.accelerator()`` need nothing
else either, but scripts that rely on an accelerate YAML must use ``launch_command``.

Every file a command names is one ``rec.write_accelerate_config()`` writes: inline ZeRO commands name
``accelerate_deepspeed.json`` (what it writes by default, in the launch directory), and commands for a
``config_file`` name that YAML and the JSON beside it, by the same route the caller gave. A plan that splits
sequences under DeepSpeed has no inline form: accelerate's launcher refuses ``--use_parallelism_config`` beside
``--use_deepspeed`` (commands/launch.py ``_validate_launch_command``) and reads the parallelism block only from a
config file, so its command names ``accelerate.yaml``, the YAML ``write_accelerate_config()`` writes by default.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Any

from .accelerate import DEFAULT_CONFIG_FILE, accelerate_config, deepspeed_file_for

if TYPE_CHECKING:
    from ..recommendation import Recommendation

_TYPE_FLAGS = {"MULTI_GPU": "--multi_gpu", "FSDP": "--use_fsdp", "DEEPSPEED": "--use_deepspeed"}
_NODE_ARGS = ["--machine_rank", '"$MACHINE_RANK"', "--main_process_ip", '"$MAIN_PROCESS_IP"']


def needs_launcher(rec: Recommendation) -> bool:
    s = rec.setup
    if s.task == "infer":  # tensor parallel and one replica per GPU start one process per GPU; device_map is one
        return s.strategy == "tp" or (s.strategy == "single" and s.world_size > 1)
    return s.world_size > 1 or s.zero_stage is not None or s.is_fsdp


def _threads_env(rec: Recommendation) -> list[str]:
    s = rec.setup
    if s.device != "cpu":
        return []
    per_process = s.cpu_threads or max(1, rec.hardware.cpu.physical_cores // max(1, s.num_gpus))
    return [f"OMP_NUM_THREADS={per_process}"]


def _flag_value(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else shlex.quote(str(value))


def _inline_flags(rec: Recommendation) -> list[str]:
    """The YAML spelled as ``accelerate launch`` flags (the sub-dict keys are the flag names)."""
    cfg = accelerate_config(rec)
    flags = [_TYPE_FLAGS[cfg["distributed_type"]]] if cfg["distributed_type"] in _TYPE_FLAGS else []
    flags += ["--num_processes", str(cfg["num_processes"]), "--num_machines", str(cfg["num_machines"])]
    # no --cpu: accelerate refuses it beside --multi_gpu, and MULTI_CPU without mpirun starts one process; the
    # script's TrainingArguments(use_cpu=True) / Accelerator(cpu=True) keep the ranks on the CPU
    if "mixed_precision" in cfg:
        flags += ["--mixed_precision", cfg["mixed_precision"]]
    if "main_process_port" in cfg:
        flags += ["--main_process_port", str(cfg["main_process_port"])]
    if rec.setup.nodes > 1:
        flags.append("--same_network")
    if "parallelism_config" in cfg:   # FSDP2 only (HSDP): DeepSpeed's split is launched from the YAML (module docstring)
        flags.append("--use_parallelism_config")
    for section in ("fsdp_config", "deepspeed_config", "parallelism_config"):
        for key, value in cfg.get(section, {}).items():
            flags += [f"--{key}", _flag_value(value)]
    # the YAML's fp8_config keys lack the prefix the flags carry (accelerate adds ``fp8_`` when it reads the file);
    # without the backend the flags leave accelerate to pick one from what is installed, not the one priced. Only the
    # backend's flag takes lower case (ao / te / msamp, where the YAML names the enum AO); --fp8_format wants HYBRID
    for key, value in cfg.get("fp8_config", {}).items():
        text = _flag_value(value)
        flags += [f"--fp8_{key}", text.lower() if key == "backend" else text]
    return flags


def _config_file_flags(rec: Recommendation, config_file: str) -> list[str]:
    """``--config_file`` plus, for ZeRO plans, the JSON beside it by the same relative route: the YAML names it
    relative to its own directory, which is the launch directory only when launched from there."""
    flags = ["--config_file", shlex.quote(str(config_file))]
    if rec.setup.zero_stage is not None:
        flags += ["--deepspeed_config_file", shlex.quote(str(deepspeed_file_for(config_file)))]
    return flags


def launch_command(rec: Recommendation, script: str, *script_args: str, config_file: str | None = None) -> str:
    """``python script`` for one process, else ``accelerate launch`` with the YAML (or the same as flags)."""
    env = _threads_env(rec)
    tail = [shlex.quote(script), *map(shlex.quote, script_args)]
    if not needs_launcher(rec):
        return " ".join([*env, "python", *tail])
    if rec.setup.task == "infer":
        return _inference_command(rec, tail)
    if config_file is None and rec.setup.is_deepspeed and rec.setup.sequence_parallel > 1:
        config_file = DEFAULT_CONFIG_FILE
    how = _config_file_flags(rec, config_file) if config_file is not None else _inline_flags(rec)
    nodes = _NODE_ARGS if rec.setup.nodes > 1 else []
    return " ".join([*env, "accelerate", "launch", *how, *nodes, *tail])


def _inference_command(rec: Recommendation, tail: list[str]) -> str:
    """tp_plan="auto" needs one torchrun process per GPU; replicas split the prompts with accelerate
    (``accelerator.split_between_processes``), one process per GPU."""
    s = rec.setup
    if s.strategy == "tp":
        return _torchrun(rec, tail)
    return " ".join(["accelerate", "launch", "--multi_gpu", "--num_processes", str(s.world_size), *tail])


def torchrun_command(rec: Recommendation, script: str, *script_args: str) -> str:
    """The same run started by torchrun (Trainer scripts, or loops built on ``rec.accelerator()``)."""
    tail = [shlex.quote(script), *map(shlex.quote, script_args)]
    if not needs_launcher(rec):
        return " ".join([*_threads_env(rec), "python", *tail])
    return _torchrun(rec, tail)


def _torchrun(rec: Recommendation, tail: list[str]) -> str:
    s = rec.setup
    env = _threads_env(rec)
    parts = ["torchrun", "--nproc_per_node", str(s.num_gpus)]
    if s.nodes > 1:
        parts += ["--nnodes", str(s.nodes), "--node_rank", '"$MACHINE_RANK"', "--master_addr", '"$MAIN_PROCESS_IP"', "--master_port", "29500"]
    else:
        parts.append("--standalone")  # single node: torchrun picks a free rendezvous port
    return " ".join([*env, *parts, *tail])
