"""The pre-flight of ``PerfGuideCallback``: the run a Trainer (or TRL's SFTTrainer) is about to start, priced on
the machine it runs on, before the first step.

It reads what the Trainer actually has, not what a plan said: its TrainingArguments / SFTConfig, its world size and
device, the model object (the dtype its parameters are in, bitsandbytes quantization, PEFT adapters, checkpointing)
and the length of its training samples.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ...errors import PerfGuideError
from ...hardware.types import Hardware
from ...model.adapted import TORCH_DTYPE_NAMES
from . import read_object
from .combine import Combined
from .verdict import Check

if TYPE_CHECKING:
    from ...model.types import ModelSpec



class WillNotFitError(PerfGuideError):
    """The run the Trainer is about to start does not fit this machine (raised before the first step)."""


def model_fields(model: Any, spec: ModelSpec) -> dict[str, Any]:
    """Setup fields the model object itself decides: the load dtype, quantization, LoRA (as ``ModelSpec.from_any``
    read it from the module: block-relative targets, whatever form peft stored them in, and the adapters' dtype),
    checkpointing."""
    out: dict[str, Any] = {}
    params = [p for p in model.parameters()] if hasattr(model, "parameters") else []
    if params:
        frozen = [p for p in params if not p.requires_grad] or params   # a LoRA base: the frozen weights say the dtype
        out["weights_dtype"] = TORCH_DTYPE_NAMES.get(str(frozen[0].dtype), "fp32")
    if getattr(model, "is_loaded_in_4bit", False):
        out["weights_dtype"] = "nf4"
    elif getattr(model, "is_loaded_in_8bit", False):
        out["weights_dtype"] = "int8"
    if spec.adapter is not None:
        out["lora"] = spec.adapter.to_dict()
    if out.get("weights_dtype") in ("nf4", "int8") and not _fp32_frozen(params):
        # no peft k-bit preparation ran (TRL >= 0.26, axolotl, prepare_model on a perfguide plan): the embedding,
        # head and norms are in the load dtype, which the Setup's default (peft's fp32 upcast) would over-price
        out["kbit_upcast"] = False
    if getattr(model, "is_gradient_checkpointing", False):
        out["gradient_checkpointing"] = True
    return out


def _fp32_frozen(params: list[Any]) -> bool:
    """Whether any frozen floating parameter is fp32: peft's k-bit upcast (or TRL's old recast, which keeps the norms
    fp32) left it so. bitsandbytes' packed storage is uint8 / int8, or the 16-bit quant_storage dtype."""
    return any(not p.requires_grad and str(p.dtype) == "torch.float32" for p in params)


def sample_length(dataloader: Any) -> int | None:
    """Tokens of the first training sample, read from the dataset (never by iterating the loader: that would move
    its sampler's random state and change the run)."""
    try:
        row = dataloader.dataset[0]
        ids = row["input_ids"]
        return int(ids.shape[-1]) if hasattr(ids, "shape") else len(ids)
    except Exception:  # noqa: BLE001 - an iterable dataset or a custom row: the length then comes from the config or a default
        return None


def limited(hw: Hardware, device: str, memory_limit: int | None) -> Hardware:
    """The machine with ``memory_limit`` bytes per device (GPU memory, or host RAM for a CPU run)."""
    if memory_limit is None:
        return hw
    if device == "cpu" or not hw.gpus:
        cpu = hw.cpu.model_copy(update={"ram_total": memory_limit, "ram_available": memory_limit})
        return hw.model_copy(update={"cpu": cpu})
    gpus = tuple(g.model_copy(update={"memory_total": memory_limit, "memory_free": memory_limit, "memory_reserved": 0})
                 for g in hw.gpus)  # the limit is what the run may allocate: no driver reserve comes off it
    return hw.model_copy(update={"gpus": gpus})


def trainer_check(args: Any, model: Any, *, hardware: Hardware | None = None, memory_limit: int | None = None,
                  seq_len: int | None = None, train_dataloader: Any = None) -> Check:
    """The verdict on the Trainer's run as it stands; the fit change is in TrainingArguments keys."""
    from ...model.types import ModelSpec
    from .pricing import verdict

    reading = read_object(args)
    device = "cuda" if getattr(getattr(args, "device", None), "type", "cpu") == "cuda" else "cpu"
    world = int(getattr(args, "world_size", 1) or 1)
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world) or world)
    spec = ModelSpec.from_any(model)
    overrides: dict[str, Any] = {"device": device, "num_gpus": per_node, **model_fields(model, spec)}
    if world > per_node:
        overrides["nodes"] = world // per_node
    length = seq_len or (None if any(s.field == "seq_len" and not s.assumed for s in reading.settings) else sample_length(train_dataloader))
    if length:
        overrides["seq_len"] = length
    hw = limited(hardware or Hardware.probe(), device, memory_limit)
    result, _ = verdict(spec, hw, Combined([reading], overrides))
    return result


def refusal(c: Check) -> str:
    """One line: the need, the room, and the change that fits, in TrainingArguments keys."""
    m = c.memory
    room = f"{m.capacity / 2**30:.2f} GiB" if m.capacity else "the memory"
    fit = c.change("fit")
    change = "; ".join(e.text() for e in fit.edits) if fit and fit.edits else (fit.reason if fit else "")
    return (f"perfguide pre-flight: this run needs {m.device_total / 2**30:.2f} GiB per device but {room} is available on "
            f"{c.hardware} ({c.setup.label}); to fit: {change or 'a larger machine or LoRA / QLoRA'}. "
            "PerfGuideCallback(preflight=False) skips this check")
