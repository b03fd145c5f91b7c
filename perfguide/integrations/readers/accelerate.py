"""An ``accelerate launch`` config YAML (accelerate 1.15's ``ClusterConfig``) <-> Setup fields.

``num_processes`` is the total over all machines (accelerate's ``--num_processes``), so GPUs per node are
``num_processes / num_machines``. A DeepSpeed block either names a JSON (``deepspeed_config_file``, read by
perfguide.integrations.readers.deepspeed) or carries accelerate's own short keys (``zero_stage``,
``offload_optimizer_device``, ...); its "auto" precision comes from ``mixed_precision``, as accelerate fills it.
"""

from __future__ import annotations

from typing import Any

from ..._packages import installed_release
from ...memory.loss_path import version_tuple
from .base import Collector, ConfigReadError, as_bool, as_int, choice, mapping, switched_on
from .deepspeed import _OFFLOAD, deepspeed_overlap_default, merge_into
from .deepspeed import load as load_deepspeed
from .deepspeed import read as read_deepspeed

FORMAT = "accelerate"
SYNTAX = "yaml"
#: accelerate 1.15 ClusterConfig fields (commands/config/config_args.py); tests check them against the dataclass
KEYS = (
    "command_file", "commands", "compute_environment", "debug", "deepspeed_config", "distributed_type", "downcast_bf16",
    "dynamo_config", "enable_cpu_affinity", "fp8_config", "fsdp_config", "gpu_ids", "machine_rank", "main_process_ip",
    "main_process_port", "main_training_function", "megatron_lm_config", "mixed_precision", "mpirun_config", "num_machines",
    "num_processes", "parallelism_config", "rdzv_backend", "same_network", "tpu_env", "tpu_name", "tpu_use_cluster",
    "tpu_use_sudo", "tpu_vm", "tpu_zone", "use_cpu",
)
PRICED = ("distributed_type", "num_processes", "num_machines", "mixed_precision", "use_cpu", "fsdp_config", "deepspeed_config",
          "dynamo_config", "fp8_config")
#: distributed_type -> (device, strategy); accelerate's other backends (XLA, Megatron-LM, XPU, ...) are not priced
DISTRIBUTED = {"no": ("cuda", None), "multi_gpu": ("cuda", "ddp"), "fsdp": ("cuda", "fsdp"), "deepspeed": ("cuda", "deepspeed"),
               "multi_cpu": ("cpu", "ddp")}
PRECISION = {"no": None, "fp16": "fp16", "bf16": "bf16", "fp8": "fp8"}
DS_KEYS = ("deepspeed_config_file", "zero_stage", "offload_optimizer_device", "offload_param_device", "gradient_accumulation_steps",
           "gradient_clipping", "zero3_init_flag", "zero3_save_16bit_model", "deepspeed_multinode_launcher", "deepspeed_hostfile",
           "deepspeed_exclusion_filter", "deepspeed_inclusion_filter", "offload_optimizer_nvme_path", "offload_param_nvme_path",
           "deepspeed_moe_layer_cls_names")
FSDP_KEYS = ("fsdp_version", "fsdp_reshard_after_forward", "fsdp_sharding_strategy", "fsdp_offload_params", "fsdp_activation_checkpointing",
             "fsdp_auto_wrap_policy", "fsdp_transformer_layer_cls_to_wrap", "fsdp_min_num_params", "fsdp_backward_prefetch",
             "fsdp_forward_prefetch", "fsdp_state_dict_type", "fsdp_use_orig_params", "fsdp_cpu_ram_efficient_loading",
             "fsdp_sync_module_states")


def read(data: dict[str, Any], col: Collector, base_dir: str | None = None) -> None:
    col.reject(sorted(k for k in data if k not in KEYS), KEYS)
    col.ignore(*sorted(k for k in data if k in KEYS and k not in PRICED and not (k == "parallelism_config" and _split(data, col))))
    if "distributed_type" not in data:
        raise ConfigReadError(f"{col.source} has no distributed_type; accelerate requires it (NO, MULTI_GPU, FSDP, DEEPSPEED, MULTI_CPU)")
    device, strategy = choice(data["distributed_type"], col.where("distributed_type"), DISTRIBUTED)
    if switched_on(data, "use_cpu", col):
        device = "cpu"
    col.set("device", device, "use_cpu" if data.get("use_cpu") else "distributed_type")
    machines = as_int(data.get("num_machines", 1), col.where("num_machines"))
    total = as_int(data.get("num_processes", 1), col.where("num_processes"))
    if total % machines:
        raise ConfigReadError(f"{col.where('num_processes')}={total} is not a multiple of num_machines={machines}: "
                              "accelerate's num_processes counts every process on every machine")
    col.set("num_gpus", total // machines, "num_processes")
    if machines > 1:
        col.set("nodes", machines, "num_machines")
    if strategy == "ddp" and total > 1:
        col.set("strategy", "ddp", "distributed_type")
    if data.get("mixed_precision") is not None:
        col.set("autocast", choice(data["mixed_precision"], col.where("mixed_precision"), PRECISION), "mixed_precision")
    dynamo = data.get("dynamo_config") or {}
    if isinstance(dynamo, dict) and str(dynamo.get("dynamo_backend", "NO")).upper() != "NO":
        col.set("torch_compile", True, "dynamo_config.dynamo_backend")
    if strategy == "fsdp":
        _fsdp(mapping(data.get("fsdp_config"), col.where("fsdp_config")), col)
    elif strategy == "deepspeed":
        _deepspeed(mapping(data.get("deepspeed_config"), col.where("deepspeed_config")), col, base_dir)


def _split(data: dict[str, Any], col: Collector) -> bool:
    """accelerate's ParallelismConfig (``parallelism_config_<dim>_size``): tensor parallelism splits the weights, which
    the check cannot price, so it is refused; context parallelism (``cp``: torch's ring attention under FSDP2) and
    sequence parallelism (``sp``: DeepSpeed's Ulysses, ALST) split each sequence over the ranks: priced per rank
    (Setup.sequence_parallel). True when a split is set (the key then has an effect)."""
    cfg = mapping(data.get("parallelism_config") or {}, col.where("parallelism_config"))
    sizes = {dim: as_int(cfg.get(f"parallelism_config_{dim}_size", 1), col.where(f"parallelism_config.parallelism_config_{dim}_size"))
             for dim in ("tp", "cp", "sp")}
    if sizes["tp"] > 1:
        raise ConfigReadError(f"{col.where('parallelism_config.parallelism_config_tp_size')}={sizes['tp']}: tensor-parallel "
                              "training is not priced (the check prices data-parallel, FSDP and ZeRO layouts); drop it to check "
                              "the layout without TP")
    split = {dim: n for dim, n in sizes.items() if dim != "tp" and n > 1}
    if len(split) > 1:
        raise ConfigReadError(f"{col.where('parallelism_config')}: cp_size={sizes['cp']} and sp_size={sizes['sp']} together are "
                              "not priced; perfguide prices one sequence split (context or sequence parallelism)")
    for dim, n in split.items():
        col.set("sequence_parallel", n, f"parallelism_config.parallelism_config_{dim}_size")
    if split.get("sp"):   # DeepSpeed runs this split itself (its Ulysses process groups); torch runs cp
        col.set("_deepspeed_split", True, "parallelism_config.parallelism_config_sp_size")
    kernel = cfg.get("parallelism_config_sp_attn_implementation")
    if split.get("sp") and kernel is not None:
        # DeepSpeed's UlyssesSPAttentionHF wraps this kernel and raises unless the loaded model runs the same one
        # (runtime/sequence_parallel/ulysses_sp.py register_with_transformers), so it names the model's attention
        key = "parallelism_config.parallelism_config_sp_attn_implementation"
        col.set("attn_implementation", choice(str(kernel).split(":")[0], col.where(key), SP_KERNELS), key)
    return bool(split)


#: the kernels Ulysses accepts (accelerate's --parallelism_config_sp_attn_implementation help), as perfguide prices them:
#: the Hub's flash-attn kernels are builds of flash-attn 2 or 3 (FlashAttention-3 for the vllm one)
SP_KERNELS = {"flash_attention_2": "flash_attention_2", "flash_attention_3": "flash_attention_3", "sdpa": "sdpa",
              "kernels-community/flash-attn2": "flash_attention_2", "kernels-community/flash-attn3": "flash_attention_3",
              "kernels-community/vllm-flash-attn3": "flash_attention_3"}


def _fsdp(cfg: dict[str, Any], col: Collector) -> None:
    where = "fsdp_config."
    col.reject([where + k for k in cfg if k not in FSDP_KEYS], FSDP_KEYS)
    version = as_int(cfg.get("fsdp_version", 1), col.where(where + "fsdp_version"))
    col.set("fsdp_version", version, where + "fsdp_version" if "fsdp_version" in cfg else where + "fsdp_version (accelerate default 1)")
    if "fsdp_reshard_after_forward" in cfg:
        raw, key = cfg["fsdp_reshard_after_forward"], "fsdp_reshard_after_forward"
    else:
        raw, key = cfg.get("fsdp_sharding_strategy", "FULL_SHARD"), "fsdp_sharding_strategy"
    if isinstance(raw, str) and raw.upper() in ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2", "NO_SHARD"):
        reshard = raw.upper() in ("FULL_SHARD", "HYBRID_SHARD")
    else:
        reshard = as_bool(raw, col.where(where + key))
    col.set("strategy", "fsdp" if reshard else "fsdp_shard_grad_op", where + key)
    if cfg.get("fsdp_offload_params") is not None and as_bool(cfg["fsdp_offload_params"], col.where(where + "fsdp_offload_params")):
        col.set("offload_params", True, where + "fsdp_offload_params")
        col.set("offload_optimizer", True, where + "fsdp_offload_params")
    if cfg.get("fsdp_activation_checkpointing") is not None:
        col.set("gradient_checkpointing", as_bool(cfg["fsdp_activation_checkpointing"], col.where(where + "fsdp_activation_checkpointing")),
                where + "fsdp_activation_checkpointing")
    col.ignore(*(where + k for k in cfg if k in FSDP_KEYS and k not in ("fsdp_version", "fsdp_reshard_after_forward", "fsdp_sharding_strategy",
                                                                         "fsdp_offload_params", "fsdp_activation_checkpointing")))


#: what a false zero3_init_flag means for the model's load, by the accelerate release that reads it
ZERO3_INIT_OFF = ("{key} is false: priced as a model loaded whole and moved onto every GPU before ZeRO-3 partitions it "
                  "(accelerate {release} builds no HfDeepSpeedConfig for a false flag, so from_pretrained runs without "
                  "zero.Init)")
ZERO3_INIT_IGNORED = ("{key} is false, but accelerate {release} builds the HfDeepSpeedConfig whatever the flag "
                      "(DeepSpeedPlugin.set_deepspeed_weakref since 1.0), so a model loaded after Accelerator() or "
                      "TrainingArguments is still built under zero.Init: priced so; a script that loads the model before "
                      "either is not (Setup.zero3_init=False)")
#: the first accelerate release whose plugin builds the HfDeepSpeedConfig whatever zero3_init_flag says
FLAG_IGNORED_SINCE = (1, 0)


def zero3_init(value: Any, col: Collector, key: str, stage: str | None = None, release: str | None = None) -> None:
    """accelerate's ``zero3_init_flag`` (config key or ``--zero3_init_flag``; accelerate's default: true under ZeRO-3).
    Read where the plugin it sits in is ZeRO-3 (``stage``: the strategy read elsewhere, else ``col``'s): accelerate
    sets it False for any other stage (DeepSpeedPlugin.__post_init__). ``release``: the accelerate that runs the
    script (default: the installed one); only before 1.0 does a false flag keep from_pretrained off zero.Init."""
    stage = next((s.value for s in reversed(col.settings) if s.field == "strategy"), stage)
    if as_bool(value, col.where(key)) or stage != "zero3":
        return
    release = release or installed_release("accelerate") or "0"
    if version_tuple(release)[:2] >= FLAG_IGNORED_SINCE:
        col.note(ZERO3_INIT_IGNORED.format(key=col.where(key), release=release))
        return
    col.set("zero3_init", False, key)
    col.note(ZERO3_INIT_OFF.format(key=col.where(key), release=release))


def _deepspeed(cfg: dict[str, Any], col: Collector, base_dir: str | None) -> None:
    where = "deepspeed_config."
    col.reject([where + k for k in cfg if k not in DS_KEYS], DS_KEYS)
    if cfg.get("deepspeed_config_file"):
        data, name = load_deepspeed(str(cfg["deepspeed_config_file"]), base_dir)
        inner = Collector("deepspeed", name)
        read_deepspeed(data, inner)
        merge_into(col, inner)
        if cfg.get("zero3_init_flag") is not None:   # a plugin field, with or without a config file
            zero3_init(cfg["zero3_init_flag"], col, where + "zero3_init_flag")
        col.ignore(*(where + k for k in cfg if k not in ("deepspeed_config_file", "zero3_init_flag")))
        return
    stage = as_int(cfg.get("zero_stage", 2), col.where(where + "zero_stage"), 0)
    if stage:
        col.set("strategy", f"zero{stage}", where + "zero_stage")
        deepspeed_overlap_default(stage, col, where + "zero_stage")   # DeepSpeedPlugin's own config has no overlap_comm
    else:
        col.set("_zero0", True, where + "zero_stage")
    for key, field in (("offload_optimizer_device", "offload_optimizer"), ("offload_param_device", "offload_params")):
        if cfg.get(key) is not None:
            col.set(field, choice(cfg[key], col.where(where + key), _OFFLOAD), where + key)
    if cfg.get("gradient_accumulation_steps") is not None:
        col.set("gradient_accumulation_steps", as_int(cfg["gradient_accumulation_steps"], col.where(where + "gradient_accumulation_steps")),
                where + "gradient_accumulation_steps")
    if cfg.get("zero3_init_flag") is not None:
        zero3_init(cfg["zero3_init_flag"], col, where + "zero3_init_flag")
    col.ignore(*(where + k for k in cfg if k in DS_KEYS and k not in ("zero_stage", "offload_optimizer_device", "offload_param_device",
                                                                       "gradient_accumulation_steps", "zero3_init_flag")))
    if "seq_parallel_communication_data_type" in cfg:   # TRL's ALST example sets it here
        col.note(f"{col.where(where + 'seq_parallel_communication_data_type')}: accelerate passes no such setting to DeepSpeed (no "
                 "DeepSpeedPlugin field or launcher flag carries it, accelerate commands/launch.py); it takes effect from a "
                 "DeepSpeed JSON (deepspeed_config_file)")


def _split_block(setup: Any) -> dict[str, Any]:
    """The parallelism_config a DeepSpeed split writes (the sequence-parallel technique's accelerate keys)."""
    from ... import techniques
    from ...techniques.base import EmitContext

    return dict(techniques.get("sequence_parallel").accelerate_config(EmitContext(setup=setup))["parallelism_config"])


def write(changes: dict[str, Any], setup: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Setup changes as accelerate config keys; micro-batch and the like stay with the script's TrainingArguments."""
    keys: dict[str, Any] = {}
    rest: dict[str, Any] = {}
    for field, value in changes.items():
        if field == "strategy" and setup.is_deepspeed:
            keys.update({"distributed_type": "DEEPSPEED", "deepspeed_config.zero_stage": setup.zero_stage})
        elif field == "strategy" and setup.is_fsdp:
            keys.update({"distributed_type": "FSDP", "fsdp_config.fsdp_version": setup.fsdp_version,
                         "fsdp_config.fsdp_reshard_after_forward": setup.gathers_params})
        elif field == "strategy":
            keys["distributed_type"] = "MULTI_GPU" if value == "ddp" else "NO"
        elif field == "fsdp_version" and setup.is_fsdp:
            keys.update({"fsdp_config.fsdp_version": value, "fsdp_config.fsdp_reshard_after_forward": setup.gathers_params})
        elif field == "num_gpus":
            keys["num_processes"] = value * setup.nodes
        elif field == "autocast":
            keys["mixed_precision"] = value or "no"
        elif field in ("offload_optimizer", "offload_params") and setup.is_fsdp:
            keys["fsdp_config.fsdp_offload_params"] = value
        elif field in ("offload_optimizer", "offload_params") and setup.is_deepspeed:
            keys[f"deepspeed_config.{field.replace('params', 'param')}_device"] = "cpu" if value else "none"
        elif field == "gradient_checkpointing" and setup.is_fsdp:
            keys["fsdp_config.fsdp_activation_checkpointing"] = value
        elif field == "sequence_parallel" and setup.is_deepspeed and value > 1:
            # Ulysses needs the whole block: without dp_shard_size accelerate sizes DeepSpeed's batch for one data-parallel
            # group (Accelerator._prepare_deepspeed), and the kernel must be the model's (the plan's own YAML keys)
            keys.update({f"parallelism_config.{k}": v for k, v in _split_block(setup).items()})
        elif field == "sequence_parallel":   # FSDP2 runs torch's context parallelism (cp)
            keys[f"parallelism_config.parallelism_config_{'sp' if setup.is_deepspeed else 'cp'}_size"] = value
        elif field == "zero3_init":   # only a ZeRO-3 plugin reads it; another strategy needs no key
            keys.update({"deepspeed_config.zero3_init_flag": value} if setup.strategy == "zero3" else {})
        else:
            rest[field] = value
    return keys, rest
