"""Reading HF config dicts: required keys, head class, native dtype, activation family.

Kept apart from the counters so every model type reads its config the same way and fails the same way.
"""

from __future__ import annotations

from typing import Any

from ..errors import InvalidModelError
from .types import Dtype, Head

_DTYPES: dict[str, Dtype] = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16",
                             "fp32": "fp32", "bf16": "bf16", "fp16": "fp16"}
_LM_SUFFIXES = ("ForCausalLM", "LMHeadModel", "ForMaskedLM", "ForConditionalGeneration")


def need(config: dict[str, Any], *keys: str) -> int:
    """The first of ``keys`` present in ``config``, as an int; a missing one is an error, never a silent default.

    HF config classes default e.g. ``hidden_size`` to a 7B model's value; guessing that for a dict that simply
    lacks the key would give a confidently wrong plan.
    """
    for key in keys:
        value = config.get(key)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise InvalidModelError(f"config key {key!r} must be a positive integer, got {value!r}.")
            return value
    model_type = config.get("model_type", "?")
    raise InvalidModelError(f"config for model_type {model_type!r} is missing required key {keys[0]!r}"
                            + (f" (or {', '.join(map(repr, keys[1:]))})" if len(keys) > 1 else "") + ".")


def optional(config: dict[str, Any], key: str, default: int) -> int:
    """An optional positive int (``None`` in the config means the documented default, as in transformers)."""
    value = config.get(key)
    return default if value is None else need(config, key)


def widest(value: Any) -> int | None:
    """A width a config gives once or per layer: Gemma 3n lists ``intermediate_size`` layer by layer (equal in the
    released E2B / E4B checkpoints). The widest layer sets the largest MLP tensors; the parameter counts come from
    the built module, so no layer's weights are priced at another's width."""
    if isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return max(value)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def architecture(config: dict[str, Any]) -> str | None:
    archs = config.get("architectures") or []
    return str(archs[0]) if archs else None


_TASK_HEADS: tuple[tuple[str, Head], ...] = (
    ("ForSequenceClassification", "sequence_classification"), ("ForTokenClassification", "token_classification"),
    ("ForQuestionAnswering", "question_answering"), ("ForPreTraining", "pretraining"),
)


def head_kind(config: dict[str, Any]) -> Head:
    """Which head sits on the blocks, from ``architectures[0]``; no architecture means the LM head.

    ``"lm"`` (CausalLM / LMHeadModel / MaskedLM / ConditionalGeneration), the three task heads, ``"base"`` (the
    bare ``...Model``), ``"pretraining"`` (BERT's MLM + NSP) or ``"other"``. The analytic counters know ``lm`` and
    ``base`` (BERT also ``pretraining``); every other head is counted by building its class on the meta device.
    """
    arch = architecture(config)
    if arch is None or arch.endswith(_LM_SUFFIXES):
        return "lm"
    for suffix, head in _TASK_HEADS:
        if arch.endswith(suffix):
            return head
    if arch.endswith("Model") and not any(t in arch for t in ("For", "Head", "Encoder", "Decoder")):
        return "base"  # not T5EncoderModel / GPT2DoubleHeadsModel, whose trees differ
    return "other"


def num_labels(config: dict[str, Any]) -> int | None:
    """Classifier width: ``num_labels`` if given, else the size of ``id2label`` (transformers' own rule), else None."""
    value = config.get("num_labels")
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    labels = config.get("id2label")
    return len(labels) if isinstance(labels, dict) and labels else None


def native_dtype(config: dict[str, Any]) -> Dtype:
    """The dtype to train/serve in without changing numerics.

    Rule: model types listed in ``architectures.json`` ``bf16_native_model_types`` (pre-trained in bf16 and
    known to overflow in fp16: T5/mT5, Gemma) are bf16 whatever their config says (T5 checkpoints are stored
    in fp32); otherwise the config's ``torch_dtype``/``dtype``; otherwise fp32 (old configs such as GPT-2 and
    BERT name none, and were trained in fp32).
    """
    from .catalog import catalog_file  # here: the catalog's schema imports this module

    if config.get("model_type") in catalog_file().bf16_native_model_types.value:
        return "bf16"
    raw = config.get("dtype") or config.get("torch_dtype")
    return _DTYPES.get(str(raw).removeprefix("torch."), "fp32") if raw else "fp32"


def family(model_type: str) -> str:
    """Key into the activation coefficients; unknown types are 'generic'."""
    from .catalog import catalog_file

    return catalog_file().families.get(model_type, "generic")
