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
        return "AutoModelForSpeechSeq2Seq" if spec.audio_input else "AutoModelForSeq2SeqLM"
    found = next((auto for suffix, auto in _LM_AUTO if arch.endswith(suffix)), None)
    return found or arch or "AutoModelForCausalLM"


def auto_class_call(spec: ModelSpec, kwargs: str) -> tuple[str, str]:
    """(class name, ``Class.from_pretrained(...)`` source) for the report's code lines; a classifier names its
    ``num_labels`` so the loaded head is the one the plan priced."""
    cls = auto_class(spec)
    labels = f", num_labels={spec.num_labels}" if spec.head in ("sequence_classification", "token_classification") and spec.num_labels else ""
    return cls, f"{cls}.from_pretrained({json.dumps(spec.name)}{labels}, **{kwargs})"


# --- task= : the head to plan for -------------------------------------------------------------

#: task -> (PEFT TaskType, the transformers mapping of model_type -> head class for it)
TASKS: dict[str, tuple[str, str]] = {
    "causal-lm": ("CAUSAL_LM", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),
    "seq-cls": ("SEQ_CLS", "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES"),
    "token-cls": ("TOKEN_CLS", "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES"),
    "qa": ("QUESTION_ANS", "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES"),
    "seq2seq": ("SEQ_2_SEQ_LM", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES"),
    "feature-extraction": ("FEATURE_EXTRACTION", "MODEL_MAPPING_NAMES"),
}
#: other spellings: PEFT's TaskType names and the transformers pipeline task names
_ALIASES = {
    **{peft.lower().replace("_", "-"): task for task, (peft, _) in TASKS.items()},
    "text-generation": "causal-lm", "text-classification": "seq-cls", "sequence-classification": "seq-cls",
    "token-classification": "token-cls", "question-answering": "qa", "text2text-generation": "seq2seq",
    "seq-2-seq": "seq2seq",
}
#: heads whose width is num_labels (transformers' default is 2 labels)
LABELLED = ("seq-cls", "token-cls")
DEFAULT_NUM_LABELS = 2


def normalize_task(value: object) -> object:
    """'SEQ_CLS', 'text-classification', 'Seq-Cls' -> 'seq-cls'; anything else passes on for the validator to refuse."""
    if not isinstance(value, str):
        return value
    key = value.strip().lower().replace("_", "-")
    return key if key in TASKS else _ALIASES.get(key, value)


def _transformers_head(task: str, model_type: str) -> str | None:
    """The head class transformers' own Auto mapping names for this model type and task, None where it has none."""
    from transformers.models.auto import modeling_auto

    found = getattr(modeling_auto, TASKS[task][1]).get(model_type)
    return found[0] if isinstance(found, (tuple, list)) else found


def _head_class(task: str, spec: ModelSpec) -> str:
    """The class transformers' own Auto mapping names for this model type and task."""
    from ..errors import InvalidModelError

    cls = _transformers_head(task, spec.model_type)
    if cls is None:
        has = [name for name in TASKS if _transformers_head(name, spec.model_type)]
        raise InvalidModelError(f"transformers has no {task} head for model_type {spec.model_type!r}; "
                                f"use one of the tasks it has: {', '.join(has) or 'none'}")
    return cls


def with_task(spec: ModelSpec, task: str | None, num_labels: int | None) -> ModelSpec:
    """The same model with the head ``task`` asks for (its class from transformers' Auto mapping, counted like any
    config), so the logits, the parameter count and the LoRA task type are that head's. Without ``task``, a
    ``num_labels`` resizes the classifier the model already has."""
    from ..errors import ConflictingConstraintsError, InvalidModelError
    from .counting import spec_from_config

    if task is None and num_labels is None:
        return spec
    if spec.config is None:
        raise InvalidModelError(f"task/num_labels need the model's config, which {spec.name!r} (from {spec.source}) does not carry; "
                                "pass a catalog name, hub id, config or config path, or an nn.Module built with the head you want")
    labelled = task in LABELLED or (task is None and spec.head in ("sequence_classification", "token_classification"))
    if num_labels is not None and not labelled:
        raise ConflictingConstraintsError(f"num_labels={num_labels} sizes a classifier, but the head is {task or spec.head}; "
                                          f"use task='seq-cls' or task='token-cls' with num_labels")
    config = dict(spec.config)
    if task is not None:
        config["architectures"] = [_head_class(task, spec)]
    if labelled:
        config["num_labels"] = num_labels or config.get("num_labels") or DEFAULT_NUM_LABELS
        config.pop("id2label", None)
        config.pop("label2id", None)
    return spec_from_config(config, spec.name, spec.source)


def _head_tasks(spec: ModelSpec) -> list[str]:
    """The tasks transformers has a head for on this model type, the one its pretraining suggests first: generation for
    an encoder-decoder or a decoder, classification for an encoder (a type with a masked-LM head, whose causal-LM head
    is a rarely used decoder mode). Without transformers, the first only."""
    try:
        from transformers.models.auto import modeling_auto
    except ImportError:
        return ["seq2seq" if spec.is_encoder_decoder else "causal-lm"]
    encoder = not spec.is_encoder_decoder and spec.model_type in modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES
    order = ("seq-cls", "token-cls", "qa") if encoder else ("seq2seq", "causal-lm", "seq-cls", "token-cls", "qa")
    return [t for t in order if _transformers_head(t, spec.model_type)]


def headless_training_note(spec: ModelSpec) -> str | None:
    """A base module (BartModel, BertModel, Qwen3Model) returns hidden states and no loss, so transformers' Trainer
    stops at its first step ("The model did not return a loss", trainer.py compute_loss): a training plan for it prices
    a step that plan's own Trainer lines cannot run, so it says so and names the ``task`` that plans a head."""
    if spec.head != "base":
        return None
    tasks = _head_tasks(spec)
    heads = (f"Pass task='{tasks[0]}' to plan the head you train" + (f" (task= also takes {', '.join(tasks[1:])})" if tasks[1:] else "")
             + ", or train" if tasks else "Train")
    return (f"{spec.name} loads as {spec.architecture or 'its base module'}, which has no head and returns no loss: "
            f"transformers' Trainer stops at the first step ('The model did not return a loss'), and this plan prices the "
            f"base alone. {heads} the base with a loss of your own (sentence-transformers' losses for an embedding model)")
