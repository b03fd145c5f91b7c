"""A launch command line: ``accelerate launch``, ``torchrun`` (``python -m torch.distributed.run``) or ``deepspeed``,
then the script and its TrainingArguments flags. The launcher gives the world size (accelerate's
``--num_processes`` counts every machine's processes; torchrun's ``--nproc_per_node`` and deepspeed's ``--num_gpus``
count one node's) and, for accelerate, the precision and the FSDP / DeepSpeed plugin; ``--config_file`` is read as
the accelerate YAML it names, under these flags (accelerate's own precedence: the command line wins).
"""

from __future__ import annotations

from typing import Any

from .accelerate import zero3_init
from .base import Collector, ConfigReadError, Reading, as_bool, as_int, choice, take_flags
from .deepspeed import deepspeed_overlap_default, merge_into

FORMAT = "launcher"
SYNTAX = "flags"
#: flags that take no value (accelerate launch / torchrun / deepspeed); every other ``--flag`` takes one
SWITCHES = frozenset({"multi_gpu", "use_deepspeed", "use_fsdp", "use_cpu", "cpu", "tpu", "use_megatron_lm", "debug", "quiet", "no_python",
                      "module", "m", "standalone", "run_path", "no_local_rank", "same_network", "q"})
PYTHONS = ("python", "python3")


def split(argv: list[str]) -> tuple[str, dict[str, Any], str, list[str]]:
    """(launcher, its flags, the script path, the script's own arguments after it)."""
    words = list(argv)
    if words and words[0].rsplit("/", 1)[-1] in PYTHONS and words[1:3] and words[1] == "-m":
        module = words[2]
        words = {"torch.distributed.run": ["torchrun"], "accelerate.commands.launch": ["accelerate", "launch"]}.get(module, ["python"]) + words[3:]
    if not words:
        raise ConfigReadError("empty command; expected `accelerate launch ...`, `torchrun ...`, `deepspeed ...` or `python train.py ...`")
    name = words[0].rsplit("/", 1)[-1]
    if name == "accelerate":
        if words[1:2] != ["launch"]:
            raise ConfigReadError(f"`accelerate {' '.join(words[1:2])}` is not a launch; expected `accelerate launch [flags] script.py ...`")
        name, words = "accelerate", words[2:]
    elif name in ("torchrun", "deepspeed", *PYTHONS):
        name, words = ("python" if name in PYTHONS else name), words[1:]
    else:
        raise ConfigReadError(f"cannot read a {name!r} command; accepted: accelerate launch, torchrun, deepspeed, "
                               "python script.py, trl sft / dpo, tune run, llamafactory-cli train, axolotl train")
    flags, i = take_flags(words, lambda w: w.lstrip("-").replace("-", "_"), SWITCHES)
    if i >= len(words):
        raise ConfigReadError(f"the {name} command names no script to run")
    return name, flags, words[i], words[i + 1:]


def read_launcher(name: str, flags: dict[str, Any], col: Collector, base_dir: str | None) -> list[Reading]:
    """The launcher's own settings; an accelerate ``--config_file`` comes back as a Reading of its own."""
    extra: list[Reading] = []
    if name == "accelerate":
        extra = _accelerate(flags, col, base_dir)
    elif name == "torchrun":
        if flags.get("nproc_per_node") not in (None, True):
            col.set("num_gpus", as_int(flags["nproc_per_node"], col.where("--nproc_per_node")), "--nproc_per_node")
        if flags.get("nnodes") not in (None, True):
            col.set("nodes", as_int(str(flags["nnodes"]).split(":")[-1], col.where("--nnodes")), "--nnodes")
    elif name == "deepspeed":
        if flags.get("num_gpus") not in (None, True):
            col.set("num_gpus", as_int(flags["num_gpus"], col.where("--num_gpus")), "--num_gpus")
        if flags.get("num_nodes") not in (None, True):
            col.set("nodes", as_int(flags["num_nodes"], col.where("--num_nodes")), "--num_nodes")
    known = {"accelerate": ("config_file", "num_processes", "num_machines", "mixed_precision", "use_deepspeed", "zero_stage",
                            "deepspeed_config_file", "offload_optimizer_device", "offload_param_device", "use_fsdp", "fsdp_version",
                            "fsdp_offload_params", "fsdp_reshard_after_forward", "multi_gpu", "use_cpu", "gradient_accumulation_steps",
                            "zero3_init_flag"),
             "torchrun": ("nproc_per_node", "nnodes"), "deepspeed": ("num_gpus", "num_nodes")}.get(name, ())
    col.ignore(*(f"--{k}" for k in flags if k not in known))
    return extra


def _accelerate(flags: dict[str, Any], col: Collector, base_dir: str | None) -> list[Reading]:
    extra: list[Reading] = []
    if flags.get("config_file") not in (None, True):
        from . import read_file

        extra.append(read_file(str(flags["config_file"]), "accelerate"))
    machines = as_int(flags.get("num_machines", 1), col.where("--num_machines"))
    if flags.get("num_processes") not in (None, True):
        total = as_int(flags["num_processes"], col.where("--num_processes"))
        col.set("num_gpus", max(1, total // machines), "--num_processes")
    if machines > 1:
        col.set("nodes", machines, "--num_machines")
    if flags.get("mixed_precision") not in (None, True):
        col.set("autocast", choice(flags["mixed_precision"], col.where("--mixed_precision"), {"no": None, "bf16": "bf16", "fp16": "fp16", "fp8": "fp8"}),
                "--mixed_precision")
    if flags.get("use_cpu"):
        col.set("device", "cpu", "--use_cpu")
    if flags.get("use_deepspeed"):
        if flags.get("deepspeed_config_file") not in (None, True):
            from .deepspeed import load, read

            data, name = load(str(flags["deepspeed_config_file"]), base_dir)
            inner = Collector("deepspeed", name)
            read(data, inner)
            merge_into(col, inner)
            stage = next((x.value for x in inner.settings if x.field == "strategy"), "ddp")
            col.set("strategy", stage, "--use_deepspeed")   # the command line's plugin, over a config file's distributed_type
        elif flags.get("zero_stage") not in (None, True):
            stage = as_int(flags["zero_stage"], col.where("--zero_stage"), 0)
            col.set("strategy", f"zero{stage}" if stage else "ddp", "--zero_stage")
            deepspeed_overlap_default(stage, col, "--zero_stage")   # the plugin's own config has no overlap_comm
        for key, field in (("offload_optimizer_device", "offload_optimizer"), ("offload_param_device", "offload_params")):
            if flags.get(key) not in (None, True):
                col.set(field, choice(flags[key], col.where(f"--{key}"), {"cpu": True, "nvme": True, "none": False}), f"--{key}")
    if flags.get("zero3_init_flag") not in (None, True):   # a value ("true" | "false"), over the config file's
        from_file = next((x.value for r in extra for x in r.settings if x.field == "strategy"), None)
        zero3_init(flags["zero3_init_flag"], col, "--zero3_init_flag", from_file)
    if flags.get("use_fsdp"):
        reshard = flags.get("fsdp_reshard_after_forward", True)
        col.set("strategy", "fsdp" if as_bool(reshard, col.where("--fsdp_reshard_after_forward")) else "fsdp_shard_grad_op", "--use_fsdp")
        col.set("fsdp_version", as_int(flags.get("fsdp_version", 1), col.where("--fsdp_version")), "--fsdp_version")
        if flags.get("fsdp_offload_params") not in (None, True) and as_bool(flags["fsdp_offload_params"], col.where("--fsdp_offload_params")):
            col.set("offload_params", True, "--fsdp_offload_params")
            col.set("offload_optimizer", True, "--fsdp_offload_params")
    return extra


def write(changes: dict[str, Any], setup: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Setup changes as ``accelerate launch`` flags (the launcher flags perfguide's own launch commands use)."""
    keys: dict[str, Any] = {}
    rest: dict[str, Any] = {}
    for field, value in changes.items():
        if field == "num_gpus":
            keys["--num_processes"] = value * setup.nodes
        elif field == "autocast":
            keys["--mixed_precision"] = value or "no"
        elif field == "strategy" and setup.is_deepspeed:
            keys.update({"--use_deepspeed": True, "--zero_stage": setup.zero_stage})
        elif field == "strategy" and setup.is_fsdp:
            keys.update({"--use_fsdp": True, "--fsdp_version": setup.fsdp_version, "--fsdp_reshard_after_forward": setup.gathers_params})
        elif field == "zero3_init":   # only a ZeRO-3 plugin reads it; another strategy needs no flag
            keys.update({"--zero3_init_flag": str(value).lower()} if setup.strategy == "zero3" else {})
        else:
            rest[field] = value
    return keys, rest
