"""A LitGPT fine-tuning config (``litgpt finetune_lora CHECKPOINT --config lora.yaml [--train.micro_batch_size 2]``, or
the YAML alone) <-> Setup fields, as LitGPT (commit 26857050) runs it: ``litgpt/finetune/lora.py`` and ``full.py``.

- The model is litgpt's own GPT (``Setup.model_code='litgpt'``), from ``checkpoint_dir`` (``checkpoints/ORG/NAME``).
- ``precision``: ``bf16-true`` / ``16-true`` / ``32-true`` train in that dtype, ``*-mixed`` autocast over fp32 weights;
  None is ``get_default_supported_precision(training=True)``, bf16-mixed on a bf16 GPU.
- ``quantize: bnb.nf4`` (``-dq``: double quantization), ``bnb.fp4``, ``bnb.int8-training``: Lightning's
  BitsandbytesPrecision over every Linear, lm_head included, in the precision's dtype; not with a mixed precision or
  more than one device (both raise in ``setup``).
- LoRA: r 8, alpha 16, dropout 0.05 on query and value by default (``lora_query`` ... ``lora_mlp``); ``lora_head``
  adapts the LM head, which perfguide does not price.
- One device runs without checkpointing; more shard with FSDP (LoRA: FSDP2 ``fully_shard`` with every Block
  checkpointed; full: FSDPStrategy with the Block activation-checkpointing policy).
- ``train.global_batch_size`` 16 and ``micro_batch_size`` 1: accumulation ``global / processes / micro``;
  ``train.max_seq_length`` None is the longest sample of the data.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .base import Collector, ConfigReadError, Reading, as_bool, as_float, as_int, choice, mapping

FORMAT = "litgpt"
SYNTAX = "yaml"
COMMANDS = {"finetune": "lora", "finetune_lora": "lora", "finetune_full": "full"}
PRECISIONS = {"bf16-true": ("bf16", None), "16-true": ("fp16", None), "32-true": ("fp32", None), "bf16-mixed": ("fp32", "bf16"),
              "16-mixed": ("fp32", "fp16")}
QUANTIZE = {"bnb.nf4": ("nf4", False), "bnb.nf4-dq": ("nf4", True), "bnb.fp4": ("nf4", False), "bnb.fp4-dq": ("nf4", True),
            "bnb.int8-training": ("int8", False)}
#: LitGPT's optimizer names / class paths -> the optimizer whose state perfguide prices
OPTIMIZERS = {"adamw": "adamw_torch", "torch.optim.adamw": "adamw_torch", "adam": "adamw_torch", "torch.optim.adam": "adamw_torch",
              "sgd": "sgd", "torch.optim.sgd": "sgd", "bitsandbytes.optim.pagedadamw": "paged_adamw_32bit",
              "bitsandbytes.optim.pagedadamw8bit": "paged_adamw_8bit", "bitsandbytes.optim.adamw8bit": "adamw_bnb_8bit"}
#: lora_* switch -> the names the family's block Linears may carry for it (transformers' names; a fused q/k/v Linear answers
#: to each of query / key / value, and litgpt's own fused qkv is priced as such by model_code='litgpt')
TARGETS = {"lora_query": ("q_proj", "qkv_proj", "query_key_value"), "lora_key": ("k_proj", "qkv_proj", "query_key_value"),
           "lora_value": ("v_proj", "qkv_proj", "query_key_value"), "lora_projection": ("o_proj", "dense"),
           "lora_mlp": ("gate_proj", "up_proj", "down_proj", "gate_up_proj", "fc1", "fc2", "dense_h_to_4h", "dense_4h_to_h")}
DEFAULT_TARGETS = {"lora_query": True, "lora_key": False, "lora_value": True, "lora_projection": False, "lora_mlp": False}
KNOWN = frozenset({"checkpoint_dir", "out_dir", "precision", "quantize", "devices", "num_nodes", "lora_r", "lora_alpha", "lora_dropout",
                   "lora_head", "data", "train", "eval", "log", "optimizer", "logger_name", "seed", "access_token", "resume",
                   *TARGETS})
PRICED = frozenset({"checkpoint_dir", "precision", "quantize", "devices", "num_nodes", "lora_r", "lora_alpha", "lora_dropout", "train",
                    "optimizer", *TARGETS})


def read_command(words: list[str], base_dir: str) -> list[Reading]:
    """``litgpt finetune[_lora|_full] [CHECKPOINT] [--config FILE] [--key value | --a.b=value ...]``."""
    from . import load
    from .base import under
    from .script_flags import parse
    from .tool_commands import set_override

    sub = words[1] if len(words) > 1 else ""
    if sub not in COMMANDS:
        raise ConfigReadError(f"cannot read `litgpt {sub}`; accepted: `litgpt finetune_lora ...`, `litgpt finetune ...` (LoRA) and "
                              "`litgpt finetune_full ...` (adapter fine-tuning and pretraining are not priced)")
    rest = words[2:]
    checkpoint = rest.pop(0) if rest and not rest[0].startswith("-") else None
    flags = parse(rest)
    config = flags.pop("config", None)
    data: dict[str, Any] = load(str(under(str(config), base_dir))) if config not in (None, True) else {}
    for key, value in flags.items():   # jsonargparse: --train.micro_batch_size 2 sets the nested key, over the file
        set_override(data, key, value, "litgpt")
    if checkpoint is not None:
        data["checkpoint_dir"] = checkpoint
    col = Collector(FORMAT, f"litgpt {sub}" + (f" over {Path(str(config)).name}" if config not in (None, True) else ""))
    read(data, col, method=COMMANDS[sub])
    return [col.reading()]


def read(data: dict[str, Any], col: Collector, base_dir: str | None = None, method: str | None = None) -> None:
    """``method``: the command's (lora / full); a YAML alone is LoRA when it has LoRA keys."""
    col.reject(sorted(k for k in data if k not in KNOWN), KNOWN)
    col.ignore(*sorted(k for k in data if k in KNOWN and k not in PRICED))
    method = method or ("lora" if any(k.startswith("lora_") for k in data) else "full")
    col.set("model_code", "litgpt", "litgpt (its own GPT, not transformers' classes)")
    if data.get("checkpoint_dir"):
        col.set_model(_model_name(str(data["checkpoint_dir"])), "checkpoint_dir")
    processes = _processes(data, col)
    weights, autocast = _precision(data, col)
    _quantize(data, col, weights, autocast, processes)
    _train(data, col, processes)
    _optimizer(data, col)
    if processes > 1:
        col.set("strategy", "fsdp", "devices (more than one: FSDP)")
        col.set("fsdp_version", 2 if method == "lora" else 1, "devices (lora: fully_shard; full: FSDPStrategy)")
    col.set("gradient_checkpointing", processes > 1, "devices (LitGPT checkpoints every Block under FSDP only)")
    col.fixed = ("gradient_checkpointing", "liger_kernel", "strategy")   # no key: the device count decides them
    if method == "lora":
        _lora(data, col)


def _model_name(path: str) -> str:
    """``checkpoints/meta-llama/Llama-2-7b-hf`` -> the hub id LitGPT downloaded it as (its last two parts)."""
    try:
        if (Path(path).expanduser() / "config.json").is_file():
            return str(Path(path).expanduser())
    except (OSError, ValueError, RuntimeError):   # too long, a NUL, an unknown ~user: not a local checkpoint
        pass
    parts = [p for p in Path(path).parts if p not in ("checkpoints", ".", "/")]
    return "/".join(parts[-2:]) if len(parts) >= 2 else path


def _processes(data: dict[str, Any], col: Collector) -> int:
    devices = data.get("devices", 1)
    if str(devices).lower() in ("auto", "-1"):
        col.spans_gpus = "LitGPT's devices 'auto' / -1 starts one process per visible GPU (--num-gpus N here)"
        return 2   # sharded: the count itself comes from the hardware
    count = as_int(devices, col.where("devices"))
    nodes = as_int(data.get("num_nodes", 1), col.where("num_nodes"))
    col.set("num_gpus", count, "devices")
    if nodes > 1:
        col.set("nodes", nodes, "num_nodes")
    return count * nodes


def _precision(data: dict[str, Any], col: Collector) -> tuple[str, str | None]:
    if data.get("precision") in (None, ""):
        weights, autocast = PRECISIONS["bf16-mixed"]
        col.assume("weights_dtype", weights, "LitGPT's default precision on a bf16 GPU: bf16-mixed (fp32 weights)")
        col.assume("autocast", autocast, "LitGPT's default precision on a bf16 GPU: bf16-mixed")
        return weights, autocast
    weights, autocast = choice(data["precision"], col.where("precision"), PRECISIONS)
    col.set("weights_dtype", weights, "precision")
    col.set("autocast", autocast, "precision")
    return weights, autocast


def _quantize(data: dict[str, Any], col: Collector, weights: str, autocast: str | None, processes: int) -> None:
    if data.get("quantize") in (None, ""):
        return
    if autocast is not None:
        raise ConfigReadError(f"{col.where('quantize')} with a mixed precision: LitGPT raises 'Quantization and mixed precision is "
                              "not supported'; use precision bf16-true")
    if processes > 1:
        raise ConfigReadError(f"{col.where('quantize')} on {processes} devices: LitGPT raises 'Quantization is currently not "
                              "supported for multi-GPU training'; use devices: 1")
    dtype, double = choice(data["quantize"], col.where("quantize"), QUANTIZE)
    col.set("weights_dtype", dtype, "quantize")
    col.set("nf4_double_quant", double, "quantize")
    col.set("kbit_quantizer", "litgpt", "quantize (Lightning's BitsandbytesPrecision: every Linear, the head included)")
    col.set("kbit_upcast", False, "quantize (no peft k-bit preparation: the rest stays in the precision's dtype)")
    if str(data["quantize"]).startswith("bnb.fp4"):
        col.set("bnb_4bit_quant_type", "fp4", "quantize")


def _train(data: dict[str, Any], col: Collector, processes: int) -> None:
    train = mapping(data.get("train") or {}, col.where("train"))
    micro = as_int(train.get("micro_batch_size") or 1, col.where("train.micro_batch_size"))
    total = as_int(train.get("global_batch_size") or 16, col.where("train.global_batch_size"))
    col.set("micro_batch_size", micro, "train.micro_batch_size" if "micro_batch_size" in train else "train.micro_batch_size (default 1)")
    if col.spans_gpus:   # devices 'auto': the process count, and with it the accumulation, is the machine's
        col.note(f"{col.where('train.global_batch_size')}={total}: accumulation is global / processes / micro, and devices "
                 "'auto' leaves the process count to the machine; priced at one accumulation step per optimizer step")
    else:
        col.set("gradient_accumulation_steps", max(1, total // processes // micro),
                "train.global_batch_size / processes / micro_batch_size (TrainArgs.gradient_accumulation_iters)")
    if train.get("max_seq_length") not in (None, ""):
        col.set("seq_len", as_int(train["max_seq_length"], col.where("train.max_seq_length")), "train.max_seq_length")
        col.note(f"{col.where('train.max_seq_length')} is LitGPT's cap: it trains at min(the cap, the data's longest sample), "
                 "batches padded to their longest; priced at the cap")
    else:
        col.note(f"{col.where('train.max_seq_length')} not set: LitGPT trains at the data's longest sample; pass --seq-len")


def _optimizer(data: dict[str, Any], col: Collector) -> None:
    opt = data.get("optimizer", "AdamW")
    name = opt.get("class_path") if isinstance(opt, dict) else opt
    col.set("optimizer", choice(str(name).lower(), col.where("optimizer"), OPTIMIZERS), "optimizer")


def _lora(data: dict[str, Any], col: Collector) -> None:
    if data.get("lora_head") is not None and as_bool(data["lora_head"], col.where("lora_head")):
        col.note(f"{col.where('lora_head')}: the LM head's adapter is not priced (r x (hidden + vocabulary) parameters and the "
                 "dropout mask of the head's input: megabytes beside the head's own logits)")
    words = [n for key, default in DEFAULT_TARGETS.items() if as_bool(data.get(key, default), col.where(key)) for n in TARGETS[key]]
    linears = _block_linears(col.model)
    names = tuple(sorted({n for n in linears if n.rsplit(".", 1)[-1] in words})) if linears else tuple(dict.fromkeys(words))
    if not names:
        raise ConfigReadError(f"{col.where('lora_query')}: the lora_* switches on adapt none of the model's block Linears")
    col.set("lora", {"r": as_int(data.get("lora_r", 8), col.where("lora_r")), "alpha": as_int(data.get("lora_alpha", 16), col.where("lora_alpha")),
                     "dropout": as_float(data.get("lora_dropout", 0.05), col.where("lora_dropout")), "target_modules": names},
            "lora_r / lora_* (LitGPT finetune_lora)")


def _block_linears(model: str | None) -> tuple[str, ...]:
    """The model's block Linear names, to map the switches onto its family's (empty where it does not resolve here: the
    check's own model lookup then says why)."""
    if model is None:
        return ()
    from ...errors import PerfGuideError
    from ...model import spec_from_any

    try:
        return tuple(spec_from_any(model).block_linears)
    except PerfGuideError:
        return ()


def write(changes: dict[str, Any], setup: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Setup changes as LitGPT config keys (dotted for ``train``)."""
    keys: dict[str, Any] = {}
    rest: dict[str, Any] = {}
    for field, value in changes.items():
        if field == "micro_batch_size":
            keys.update({"train.micro_batch_size": value, "train.global_batch_size": setup.global_batch_size})
        elif field == "gradient_accumulation_steps":
            keys["train.global_batch_size"] = setup.global_batch_size
        elif field == "seq_len":
            keys["train.max_seq_length"] = value
        elif field in ("weights_dtype", "autocast") and (setup.weights_dtype, setup.autocast) in PRECISIONS.values():
            keys["precision"] = next(k for k, v in PRECISIONS.items() if v == (setup.weights_dtype, setup.autocast))
        elif field == "num_gpus":
            keys["devices"] = value
        elif field == "lora" and value is not None:
            keys.update({"lora_r": value["r"], "lora_alpha": value["alpha"]})
        else:
            rest[field] = value
    return keys, rest
