"""PEFT's ``examples/sft/train.py``, the script PEFT's DeepSpeed and FSDP guides launch (``run_peft_qlora_fsdp.sh``:
Llama-2-70B QLoRA on two GPUs). It parses SFTConfig beside its own ModelArguments / DataTrainingArguments, whose
flags say the adapter and the load: read as the TRL ModelConfig keys they amount to, as its ``utils.py``
(``create_and_prepare_model``) builds the model:

- ``use_peft_lora`` -> a LoraConfig of ``lora_r`` (64), ``lora_alpha`` (16), ``lora_dropout`` (0.1) on
  ``lora_target_modules`` (comma-separated, or ``all-linear``; default the seven Llama projections);
- ``use_4bit_quantization`` -> bitsandbytes 4-bit of ``bnb_4bit_quant_type`` (nf4), ``use_nested_quant`` double
  quantization, and the model loaded in ``bnb_4bit_quant_storage_dtype`` where that is a float dtype, else float32
  (``dtype = quant_storage_dtype if ... is_floating_point else torch.float32``); ``use_8bit_quantization`` -> int8;
- ``use_flash_attn`` -> ``attn_implementation="flash_attention_2"``.

Its data flags are read, not priced. ``use_unsloth`` (Unsloth's own model and kernels) is refused: not priced.
Changes come back in the script's own flags; the load dtype, which the script derives and takes no flag for, comes
back as a perfguide.Setup change.
"""

from __future__ import annotations

from typing import Any

from . import script_flags
from .base import Collector, ConfigReadError, as_bool

FORMAT = "peft_example"
SYNTAX = "flags"

#: the script's own dataclasses' fields (ModelArguments, DataTrainingArguments) at PEFT's HEAD
MODEL_FIELDS = frozenset({"model_name_or_path", "chat_template_format", "lora_alpha", "lora_dropout", "lora_r", "lora_target_modules",
                          "use_nested_quant", "bnb_4bit_compute_dtype", "bnb_4bit_quant_storage_dtype", "bnb_4bit_quant_type",
                          "use_flash_attn", "use_peft_lora", "use_8bit_quantization", "use_4bit_quantization", "use_reentrant",
                          "use_unsloth"})
DATA_FIELDS = frozenset({"dataset_name", "append_concat_token", "add_special_tokens", "splits"})
#: what tells the script apart: fields no other parser has
MARKERS = ("use_peft_lora", "use_4bit_quantization", "bnb_4bit_quant_storage_dtype")
DEFAULT_TARGETS = "q_proj,k_proj,v_proj,o_proj,down_proj,up_proj,gate_proj"
_FLOAT_DTYPES = ("bfloat16", "float16", "float32")


def is_peft_example(source: str) -> bool:
    """The script (or a copy) defines the ModelArguments of PEFT's examples/sft/train.py."""
    return all(f"{name}:" in source for name in MARKERS)


def translate(flags: dict[str, Any], col: Collector) -> dict[str, Any]:
    """The script's flags as SFTConfig + TRL ModelConfig keys (``model_name_or_path`` kept, the rest translated)."""
    def on(key: str) -> bool:
        return key in flags and as_bool(flags[key], col.where(key))

    if on("use_unsloth"):
        raise ConfigReadError(f"{col.where('use_unsloth')}: Unsloth's model and kernels are not priced; drop it to price the "
                              "transformers model the script loads otherwise")
    out = {k: v for k, v in flags.items() if k not in MODEL_FIELDS | DATA_FIELDS or k == "model_name_or_path"}
    col.ignore(*sorted(k for k in flags if k in DATA_FIELDS or k in ("chat_template_format", "bnb_4bit_compute_dtype", "use_reentrant")))
    if on("use_peft_lora"):
        targets = str(flags.get("lora_target_modules", DEFAULT_TARGETS))
        out.update(use_peft=True, lora_r=flags.get("lora_r", 64), lora_alpha=flags.get("lora_alpha", 16),
                   lora_dropout=flags.get("lora_dropout", 0.1),
                   lora_target_modules=targets if targets == "all-linear" else [t.strip() for t in targets.split(",") if t.strip()])
    storage = str(flags.get("bnb_4bit_quant_storage_dtype", "uint8"))
    if on("use_4bit_quantization"):
        out.update(load_in_4bit=True, bnb_4bit_quant_type=flags.get("bnb_4bit_quant_type", "nf4"),
                   use_bnb_nested_quant=on("use_nested_quant"))
    elif on("use_8bit_quantization"):
        out["load_in_8bit"] = True
    out["dtype"] = storage if on("use_4bit_quantization") and storage in _FLOAT_DTYPES else "float32"
    if on("use_flash_attn"):
        out["attn_implementation"] = "flash_attention_2"
    return out


def read(data: dict[str, Any], col: Collector, base_dir: str | None = None) -> None:
    script_flags.read(translate(data, col), col, base_dir=base_dir, args_class="SFTConfig", model_config=False)


#: TRL ModelConfig flags -> the script's own
_OWN = {"--use_peft": "--use_peft_lora", "--load_in_4bit": "--use_4bit_quantization", "--load_in_8bit": "--use_8bit_quantization",
        "--use_bnb_nested_quant": "--use_nested_quant"}


def write(changes: dict[str, Any], setup: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """As script_flags writes them, in the script's names; what it has no flag for is handed back."""
    keys, rest = script_flags.write({k: v for k, v in changes.items() if k != "weights_dtype" or v in ("nf4", "int8")}, setup)
    if "weights_dtype" in changes and changes["weights_dtype"] not in ("nf4", "int8"):
        rest["weights_dtype"] = changes["weights_dtype"]   # the script loads float32, or a 4-bit base's storage dtype
    out: dict[str, Any] = {}
    for key, value in keys.items():
        if key == "--attn_implementation":
            if value not in ("flash_attention_2", "sdpa"):
                rest["attn_implementation"] = value
                continue
            key, value = "--use_flash_attn", value == "flash_attention_2"
        elif key == "--lora_target_modules" and isinstance(value, list | tuple):
            value = ",".join(value)
        out[_OWN.get(key, key)] = value
    return out, rest
