"""ms-swift's ``swift sft`` / ``swift pt`` command line <-> Setup fields, as ms-swift 4.x (commit 3602360a5) parses it.

Its arguments extend transformers' Seq2SeqTrainingArguments (read by perfguide.integrations.readers.training_args) with
defaults of its own, each read in swift/arguments and swift/trainers/arguments.py:

- ``--tuner_type`` (3.x: ``--train_type``) ``lora`` by default; LoRA rank 8, alpha 32, dropout 0.05 on ``all-linear``,
  adapters left to PEFT (fp32) unless ``--lora_dtype``;
- ``--torch_dtype`` None loads the checkpoint's own dtype, and ``_init_mixed_precision`` turns on ``bf16`` for a
  bfloat16 model, ``fp16`` for a float16 or float32 one (unless the flags say);
- ``gradient_checkpointing`` True, ``per_device_train_batch_size`` 1, and ``gradient_accumulation_steps`` None made
  ``ceil(16 / batch / world size)``;
- ``--max_length`` None truncates at the model's own length, each batch padded to its longest sample: the step's length
  is the data's;
- ``--quant_method bnb --quant_bits 4`` is bitsandbytes nf4 with double quantization on by default; ms-swift runs no
  peft k-bit preparation, so the embedding, head and norms stay in the load dtype;
- ``--deepspeed NAME`` one of its presets (swift/config/NAME.json) or a JSON file; ``--fsdp fsdp2`` its FSDP2 preset
  (full shard, activation checkpointing in fsdp_config, which switches ``gradient_checkpointing`` off) or a JSON of
  ``fsdp`` / ``fsdp_config``.

The process count comes from the environment words before ``swift``: ``NPROC_PER_NODE`` (torchrun per node) and
``NNODES``; several ``CUDA_VISIBLE_DEVICES`` without ``NPROC_PER_NODE`` is one process splitting the model over them
(``device_map``), which is not priced.
"""

from __future__ import annotations

import math
from typing import Any

from .base import Collector, ConfigReadError, Reading, as_bool, as_float, as_int, choice, mapping, refuse_unpriced, set_kbit_dtypes, torchrun_env
from .deepspeed import read_nested
from .foreign_keys import SWIFT
from .hf_keys import REMOVED, SEQ2SEQ
from .training_args import KNOWN as TA_KNOWN
from .training_args import read as read_training_args
from .training_args import read_fsdp
from .training_args import write as write_training_args

FORMAT = "swift"
SYNTAX = "flags"
SUBCOMMANDS = ("sft", "pt")
KNOWN = SWIFT | TA_KNOWN | frozenset(SEQ2SEQ) | frozenset(REMOVED)
#: ms-swift's presets: zero stage, optimizer offload, parameter offload (swift/config/*.json; overlap_comm off in each)
DEEPSPEED = {"zero0": (0, False, False), "zero1": (1, False, False), "zero2": (2, False, False), "zero3": (3, False, False),
             "zero2_offload": (2, True, False), "zero3_offload": (3, True, True)}
#: its FSDP2 preset (swift/config/fsdp2.json)
FSDP2: dict[str, Any] = {"fsdp": "full_shard auto_wrap", "fsdp_config": {"fsdp_version": 2, "reshard_after_forward": True, "activation_checkpointing": True}}
UNPRICED = {"use_galore": "GaLore through ms-swift's own optimizer",
            "lisa_activated_layers": "LISA's layer sampling", "llamapro_num_new_blocks": "LLaMA Pro's added blocks",
            "deepspeed_autotp_size": "DeepSpeed AutoTP tensor parallelism"}
TORCH_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "bf16": "bf16", "fp16": "fp16", "fp32": "fp32"}
ATTENTION = {"flash_attn": "flash_attention_2", "flash_attention_2": "flash_attention_2", "sdpa": "sdpa", "eager": "eager",
             "flash_attention_3": "flash_attention_3"}
_OWN = frozenset({"deepspeed", "fsdp", "fsdp_config", "max_length", "packing", "padding_free", "gradient_checkpointing",
                  "per_device_train_batch_size", "gradient_accumulation_steps"})


def read_command(words: list[str], env: dict[str, str], base_dir: str) -> list[Reading]:
    """``swift sft [--flag value ...]`` with the environment words before it."""
    from .script_flags import parse

    sub = words[1] if len(words) > 1 else ""
    if sub not in SUBCOMMANDS:
        raise ConfigReadError(f"cannot read `swift {sub}`; accepted: `swift sft ...` and `swift pt ...` (rlhf, grpo and the "
                              "other ms-swift commands train objectives perfguide does not price)")
    col = Collector(FORMAT, f"swift {sub} flags")
    read(parse(words[2:]), col, base_dir=base_dir, env=env)
    return [col.reading()]


#: ms-swift's own entry scripts, which its multi-GPU and multi-node examples start under a launcher
#: (``accelerate launch --config_file fsdp2.json swift/cli/sft.py ...``, ``torchrun ... swift/cli/sft.py ...``)
CLI_SCRIPTS = ("swift/cli/sft.py", "swift/cli/pt.py")


def is_cli_script(path: str) -> bool:
    return path.replace("\\", "/").endswith(CLI_SCRIPTS)


def read_launched(words: list[str], processes: int, base_dir: str) -> Reading:
    """The flags of ``swift/cli/sft.py`` run by a launcher, whose readings give the process count."""
    from .script_flags import parse

    col = Collector(FORMAT, "swift/cli/sft.py flags")
    read(parse(words), col, base_dir=base_dir, processes=processes)
    return col.reading()


def read(data: dict[str, Any], col: Collector, base_dir: str | None = None, env: dict[str, str] | None = None,
         processes: int | None = None) -> None:
    """``processes``: the world size a launcher gave (its flags and config say the process count, not the environment)."""
    col.reject(sorted(k for k in data if k not in KNOWN), KNOWN)
    refuse_unpriced(data, col, UNPRICED, "ms-swift's LoRA, QLoRA and full fine-tuning")
    if data.get("sequence_parallel_size") not in (None, True):   # ms-swift's Ulysses (swift/sequence_parallel)
        col.set("sequence_parallel", as_int(data["sequence_parallel_size"], col.where("--sequence_parallel_size")), "--sequence_parallel_size")
    _head(data, col)
    _logits_to_keep(data, col)
    if data.get("optimizer") not in (None, True):
        raise ConfigReadError(f"{col.where('--optimizer')}={data['optimizer']!r}: ms-swift's own optimizer plugin is not priced; "
                              "perfguide check prices transformers' --optim")
    if data.get("model") not in (None, True):
        col.set_model(data["model"], "--model")
    world = processes if processes is not None else _processes(env or {}, col)
    ta = {k: v for k, v in data.items() if k in TA_KNOWN and k not in _OWN}
    read_training_args(ta, col, sft=False, base_dir=base_dir)
    col.ignore(*sorted(k for k in data if k in SWIFT and k not in ta and k not in _PRICED))
    _tuner(data, col)
    _precision(data, col)
    mb = as_int(data.get("per_device_train_batch_size", 1), col.where("--per_device_train_batch_size"))
    col.set("micro_batch_size", mb, "--per_device_train_batch_size" if "per_device_train_batch_size" in data else
            "per_device_train_batch_size (ms-swift default 1)")
    if data.get("gradient_accumulation_steps") not in (None, True):
        col.set("gradient_accumulation_steps", as_int(data["gradient_accumulation_steps"], col.where("--gradient_accumulation_steps")),
                "--gradient_accumulation_steps")
    else:
        col.set("gradient_accumulation_steps", max(1, math.ceil(16 / mb / world)),
                f"gradient_accumulation_steps (ms-swift default: ceil(16 / {mb} / {world} processes))")
    ckpt = as_bool(data.get("gradient_checkpointing", True), col.where("--gradient_checkpointing"))
    if processes is not None and not ckpt:   # off here; an accelerate config's FSDP checkpointing may still be on
        col.assume("gradient_checkpointing", False, "--gradient_checkpointing false (the launcher's FSDP config may checkpoint)")
    else:
        col.set("gradient_checkpointing", ckpt, "--gradient_checkpointing" if "gradient_checkpointing" in data else
                "gradient_checkpointing (ms-swift default True)")
    _sharding(data, col, base_dir)
    if data.get("max_length") not in (None, True):
        col.set("seq_len", as_int(data["max_length"], col.where("--max_length")), "--max_length")
        if not (data.get("packing") is not None and as_bool(data["packing"], col.where("--packing"))):
            col.note(f"{col.where('--max_length')} is ms-swift's truncation cap: batches pad to their longest sample (packing "
                     "fills rows to it), so a run on shorter data peaks lower; priced at the cap")
    else:
        col.note(f"{col.where('--max_length')} not set: ms-swift truncates at the model's own length and pads each batch to its "
                 "longest sample, so the step is as long as the data; pass --seq-len")
    for key in ("packing", "padding_free"):
        if data.get(key) is not None and as_bool(data[key], col.where(f"--{key}")):
            col.set("padding_free", True, f"--{key}")
    if data.get("attn_impl") not in (None, True):
        col.set("attn_implementation", choice(data["attn_impl"], col.where("--attn_impl"), ATTENTION), "--attn_impl")


_PRICED = frozenset({"model", "tuner_type", "train_type", "torch_dtype", "lora_rank", "lora_alpha", "lora_dropout", "target_modules",
                     "lora_dtype", "use_dora", "use_rslora", "quant_method", "quant_bits", "bnb_4bit_use_double_quant",
                     "bnb_4bit_quant_type", "attn_impl", "modules_to_save", "task_type", "num_labels", "sequence_parallel_size",
                     "use_logits_to_keep"}) | _OWN


def _logits_to_keep(data: dict[str, Any], col: Collector) -> None:
    """ms-swift's ``--use_logits_to_keep`` (None: on for a causal LM whose forward takes ``logits_to_keep``, off under
    sequence parallelism; swift/trainers/mixin.py get_use_logits_to_keep): the head runs only from the first labelled
    position (every labelled position at batch 1), which the data decides."""
    keep = data.get("use_logits_to_keep")
    sp = str(data.get("sequence_parallel_size", 1)) != "1"
    if keep is False or str(keep).lower() == "false" or sp or str(data.get("task_type", "causal_lm")).lower() != "causal_lm":
        return
    col.note(f"{col.where('--use_logits_to_keep')} ({'set' if keep is not None else 'ms-swift default: on'}): the LM head and "
             "the loss run only on the labelled positions (the responses), which the data decides; priced on every position, "
             "an upper bound on the logits")


def _head(data: dict[str, Any], col: Collector) -> None:
    """``--task_type``: the causal LM, or a classifier (``seq_cls``, and ``reranker``: a one-label score head,
    swift/model/register.py) of ``--num_labels`` (transformers' default 2) on the same model."""
    task = str(data.get("task_type", "causal_lm")).lower()
    if task == "causal_lm":
        return
    if task not in ("seq_cls", "reranker"):
        raise ConfigReadError(f"{col.where('--task_type')}={task!r}: the {task} head is not priced; accepted: causal_lm, seq_cls, "
                              "reranker")
    col.task = "seq-cls"
    labels = data.get("num_labels")
    col.num_labels = 1 if task == "reranker" else as_int(labels, col.where("--num_labels")) if labels not in (None, True) else None


def _processes(env: dict[str, str], col: Collector) -> int:
    """The world size: torchrun's processes per node times nodes, as ms-swift's cli starts them."""
    per_node, nodes, visible = torchrun_env(env, col)
    if per_node is not None:
        if visible > per_node:   # ms-swift's ddp_device_map: each process splits the model over its share
            raise ConfigReadError(f"CUDA_VISIBLE_DEVICES names {visible} GPUs for NPROC_PER_NODE={per_node}: each process "
                                  "splits the model over its share of them (device_map), which perfguide does not price; "
                                  "one GPU per process is")
        return per_node * nodes
    if visible > 1:
        raise ConfigReadError(f"CUDA_VISIBLE_DEVICES names {visible} GPUs and no NPROC_PER_NODE: swift sft splits the model "
                              "over them in one process (device_map), which perfguide does not price; set NPROC_PER_NODE="
                              f"{visible} for data parallelism (with --deepspeed / --fsdp to shard), or one GPU")
    col.set("num_gpus", 1, "CUDA_VISIBLE_DEVICES" if visible else "no NPROC_PER_NODE (ms-swift runs one process)")
    return nodes


def _tuner(data: dict[str, Any], col: Collector) -> None:
    key = "tuner_type" if "tuner_type" in data else "train_type"
    kind = str(data.get(key, "lora")).lower()
    if key == "train_type" and "train_type" in data:
        col.note(f"{col.where('--train_type')} is ms-swift 3.x's name of --tuner_type (4.0 still reads it); read as tuner_type")
    if kind not in ("lora", "full"):
        raise ConfigReadError(f"{col.where('--' + key)}={kind!r} is not priced; accepted: lora, full (and QLoRA: lora with "
                              "--quant_method bnb --quant_bits 4)")
    if str(data.get("tuner_backend", "peft")).lower() == "unsloth":
        raise ConfigReadError(f"{col.where('--tuner_backend')}=unsloth: Unsloth's kernels are not priced; perfguide check prices "
                              "ms-swift's PEFT backend")
    _quantized(data, col)
    if kind == "full":
        return
    targets = data.get("target_modules", "all-linear")
    targets = [targets] if isinstance(targets, str) else list(targets)
    lora: dict[str, Any] = {"r": as_int(data.get("lora_rank", 8), col.where("--lora_rank")),
                            "alpha": as_int(data.get("lora_alpha", 32), col.where("--lora_alpha")),
                            "dropout": as_float(data.get("lora_dropout", 0.05), col.where("--lora_dropout")),
                            "target_modules": "all-linear" if targets == ["all-linear"] else tuple(str(t) for t in targets)}
    for flag in ("use_dora", "use_rslora"):
        if data.get(flag) is not None:
            lora[flag] = as_bool(data[flag], col.where(f"--{flag}"))
    if data.get("lora_dtype") not in (None, True):
        lora["adapter_dtype"] = choice(data["lora_dtype"], col.where("--lora_dtype"), TORCH_DTYPES)
    if data.get("modules_to_save"):
        saved = data["modules_to_save"]
        lora["modules_to_save"] = (saved,) if isinstance(saved, str) else tuple(str(m) for m in saved)
    col.set("lora", lora, f"--{key}" if key in data else "tuner_type (ms-swift default: lora)")


def _quantized(data: dict[str, Any], col: Collector) -> None:
    if data.get("quant_bits") in (None, True):
        return
    method = str(data.get("quant_method", "bnb")).lower()
    if method != "bnb":
        raise ConfigReadError(f"{col.where('--quant_method')}={method!r} is not priced; accepted: bnb (bitsandbytes 4 / 8 bit)")
    col.set("weights_dtype", choice(data["quant_bits"], col.where("--quant_bits"), {"4": "nf4", "8": "int8"}), "--quant_bits")
    double = as_bool(data.get("bnb_4bit_use_double_quant", True), col.where("--bnb_4bit_use_double_quant"))
    col.set("nf4_double_quant", double, "--bnb_4bit_use_double_quant" if "bnb_4bit_use_double_quant" in data else
            "bnb_4bit_use_double_quant (ms-swift default True)")
    set_kbit_dtypes(col, "--quant_bits", "ms-swift runs no peft k-bit preparation: the embedding, head and norms stay in the load dtype")


def _precision(data: dict[str, Any], col: Collector) -> None:
    """The load dtype, and the AMP flag ms-swift derives from it where the flags set neither."""
    dtype = choice(data["torch_dtype"], col.where("--torch_dtype"), TORCH_DTYPES) if data.get("torch_dtype") not in (None, True) else None
    # DeepSpeed keeps fp32 master weights whatever the load dtype (the check assumes so where no dtype is set); its
    # own bf16_master_weights_and_grads says otherwise, read with the DeepSpeed config
    if dtype is not None and data.get("quant_bits") in (None, True) and data.get("deepspeed") in (None, True, ""):
        col.set("weights_dtype", dtype, "--torch_dtype")
    if "bf16" in data or "fp16" in data:
        return
    col.settings = [x for x in col.settings if not (x.assumed and x.field == "autocast")]   # TrainingArguments' bf16=False
    if dtype is None:
        col.assume("autocast", "bf16", "ms-swift turns on bf16 for a bfloat16 checkpoint (torch_dtype None reads config.json; "
                                       "fp16 for a float16 one): pass --torch_dtype to say")
    else:
        col.set("autocast", "bf16" if dtype == "bf16" else "fp16", "--torch_dtype (ms-swift _init_mixed_precision)")


def _sharding(data: dict[str, Any], col: Collector, base_dir: str | None) -> None:
    name = data.get("deepspeed")
    if name not in (None, True, ""):
        if str(name) in DEEPSPEED:
            stage, opt, params = DEEPSPEED[str(name)]
            zero: dict[str, Any] = {"stage": stage, "overlap_comm": False, "offload_optimizer": {"device": "cpu" if opt else "none"}}
            if stage == 3:
                zero["offload_param"] = {"device": "cpu" if params else "none"}
            read_nested({"zero_optimization": zero, "bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"}}, col, base_dir)
        else:
            read_nested(str(name), col, base_dir)
    fsdp = data.get("fsdp")
    if fsdp in (None, True, ""):
        return
    spec = FSDP2 if str(fsdp) == "fsdp2" else _fsdp_file(str(fsdp), base_dir)
    config = mapping(spec.get("fsdp_config") or {}, col.where("--fsdp: fsdp_config"))
    read_fsdp(spec.get("fsdp", "full_shard auto_wrap"), config, col)
    if config.get("activation_checkpointing"):   # sft_args._check_fsdp2_compatibility
        col.set("gradient_checkpointing", True, "--fsdp (fsdp_config.activation_checkpointing; ms-swift turns gradient_checkpointing off)")


def _fsdp_file(path: str, base_dir: str | None) -> dict[str, Any]:
    """ms-swift's ``--fsdp`` JSON (``fsdp`` and ``fsdp_config``), relative to where the command runs."""
    from . import load
    from .base import under

    return load(str(under(path, base_dir or ".")))


def write(changes: dict[str, Any], setup: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Setup changes as ``swift sft`` flags: its own names where it has one, transformers' otherwise."""
    own: dict[str, Any] = {}
    rest: dict[str, Any] = {}
    for field, value in changes.items():
        if field == "seq_len":
            own["--max_length"] = value
        elif field == "weights_dtype" and value in ("nf4", "int8"):
            own.update({"--quant_method": "bnb", "--quant_bits": 4 if value == "nf4" else 8})
        elif field == "weights_dtype":
            own["--torch_dtype"] = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[value]
        elif field == "nf4_double_quant":
            own["--bnb_4bit_use_double_quant"] = value
        elif field == "gradient_checkpointing":
            own["--gradient_checkpointing"] = value
        elif field == "padding_free":
            own["--padding_free"] = value
        elif field == "sequence_parallel":
            own["--sequence_parallel_size"] = value
        elif field == "lora" and value is not None:
            own.update({"--tuner_type": "lora", "--lora_rank": value["r"], "--lora_alpha": value["alpha"]})
        elif field == "strategy" and setup.is_deepspeed and setup.zero_stage in (0, 1, 2, 3):
            own["--deepspeed"] = f"zero{setup.zero_stage}" + ("_offload" if setup.offload_optimizer and setup.zero_stage >= 2 else "")
        else:
            rest[field] = value
    keys, rest = write_training_args(rest, setup)
    return {**own, **{f"--{k}": v for k, v in keys.items() if "." not in k}}, {**rest, **{k: v for k, v in keys.items() if "." in k}}
