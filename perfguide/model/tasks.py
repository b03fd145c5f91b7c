"""The model's head as a task: which transformers Auto class loads it, and the words people use for it.

The head decides the logits the memory model counts (vocabulary for an LM head, ``num_labels`` for a classifier,
2 for QA) and the PEFT wrapper a LoRA adapter needs, so it is named once here and read by the report's code lines.
"""

from __future__ import annotations

import json

from .types import ModelSpec

#: ModelSpec.head -> the transformers Auto class that loads that head (transformers/models/auto/modeling_auto.py)
_HEAD_AUTO = {
    "sequence_classification": "AutoModelForSequenceClassification",
    "token_classification": "AutoModelForTokenClassification",
    "question_answering": "AutoModelForQuestionAnswering",
    "base": "AutoModel",
    "pretraining": "AutoModelForPreTraining",
}
_LM_AUTO = (("ForCausalLM", "AutoModelForCausalLM"), ("LMHeadModel", "AutoModelForCausalLM"),
            ("ForMaskedLM", "AutoModelForMaskedLM"))


def auto_class(spec: ModelSpec) -> str:
    """The class name that loads this head: an Auto class where one maps it, else the architecture's own class
    (a multimodal ``...ForConditionalGeneration``, a ``...DoubleHeadsModel``), which loads it exactly."""
    if spec.head in _HEAD_AUTO:
        return _HEAD_AUTO[spec.head]
    arch = spec.architecture or ""
    if spec.head == "lm" and spec.is_encoder_decoder:
        return "AutoModelForSeq2SeqLM"
    found = next((auto for suffix, auto in _LM_AUTO if arch.endswith(suffix)), None)
    return found or arch or "AutoModelForCausalLM"


def auto_class_call(spec: ModelSpec, kwargs: str) -> tuple[str, str]:
    """(class name, ``Class.from_pretrained(...)`` source) for the report's code lines; a classifier names its
    ``num_labels`` so the loaded head is the one the plan priced."""
    cls = auto_class(spec)
    labels = f", num_labels={spec.num_labels}" if spec.head in ("sequence_classification", "token_classification") and spec.num_labels else ""
    return cls, f"{cls}.from_pretrained({json.dumps(spec.name)}{labels}, **{kwargs})"
