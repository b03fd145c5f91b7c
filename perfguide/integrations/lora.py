"""Setup.lora -> ``peft.LoraConfig``: the adapter the plan priced, for ``get_peft_model`` or ``SFTTrainer(peft_config=)``.

Two things must match the plan, or the run differs from what was priced:

* the task type comes from the model's head: PEFT wraps the model in a task class
  (``PeftModelForSequenceClassification`` ...) that calls the head's own methods; a CAUSAL_LM wrapper around a
  BERT classifier fails (``prepare_inputs_for_generation``), and a T5 is a SEQ_2_SEQ_LM, not a causal LM;
* the targets: ``"all-linear"`` in PEFT also adapts Linears outside the blocks (BERT's pooler, a token
  classifier), which the memory model does not price. The plan names the block Linears it priced instead, by
  their paths inside a block (``attention.output.dense``), which PEFT matches as module-name suffixes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import InvalidSetupError
from ..model.recurrent import fused_out_proj
from .adapter_facts import require_transformers_code

if TYPE_CHECKING:
    import peft

    from ..model.types import ModelSpec
    from ..recommendation import Recommendation
    from ..setup import LoraSpec

#: transformers head-class suffix -> PEFT TaskType name (peft/utils/peft_types.py), first match wins
HEAD_TASKS: tuple[tuple[str, str], ...] = (
    ("ForCausalLM", "CAUSAL_LM"),
    ("LMHeadModel", "CAUSAL_LM"),
    ("ForSequenceClassification", "SEQ_CLS"),
    ("ForTokenClassification", "TOKEN_CLS"),
    ("ForQuestionAnswering", "QUESTION_ANS"),
    ("Model", "FEATURE_EXTRACTION"),   # a bare backbone (BertModel): hidden states out
)


def task_type(spec: ModelSpec) -> str | None:
    """The PEFT task of the model's head; None for heads PEFT has no task class for (masked LM, multiple choice),
    which get the plain ``PeftModel`` wrapper. Whisper gets it too: PeftModelForSeq2SeqLM hands the decoder
    ``input_ids`` where Whisper reads ``input_features``, and its first step fails ("got multiple values for keyword
    argument 'input_ids'"; huggingface/peft#1988, whose answer is no task type), as PEFT's own Whisper notebooks set
    none."""
    if spec.audio_input is not None:
        return None
    arch = spec.architecture or ""
    if arch.endswith(("ForConditionalGeneration", "ForSeq2SeqLM")):
        # T5/BART generate through an encoder-decoder; LLaVA-style "ForConditionalGeneration" models are decoders
        return "SEQ_2_SEQ_LM" if spec.is_encoder_decoder else "CAUSAL_LM"
    if not arch:
        return "SEQ_2_SEQ_LM" if spec.is_encoder_decoder else "CAUSAL_LM"
    return next((task for suffix, task in HEAD_TASKS if arch.endswith(suffix)), None)


def target_modules(spec: ModelSpec, lora: LoraSpec) -> list[str] | str:
    """The Linears the plan priced: the user's names as given, or every block Linear by its path in a block.

    Fused MoE experts are parameters, not Linear modules (transformers 5), so no module name reaches them;
    a spec without block Linears (a bare size such as "7b") keeps PEFT's own "all-linear". A Mamba-2 hybrid's
    out-projection is left out: mamba-ssm's fused kernel reads its weight directly and peft refuses it for Nemotron-H
    and Falcon-H1.
    """
    if lora.target_modules != "all-linear":
        return list(lora.target_modules)
    fused = fused_out_proj(spec.model_type)   # a Mamba-2 out-projection LoRA cannot adapt (model/recurrent.py)
    names = sorted({p for p in spec.linear_paths if not p.startswith("experts.") and p != fused})
    return names or "all-linear"


def lora_config_kwargs(rec: Recommendation) -> dict[str, Any]:
    """``LoraConfig`` kwargs as plain data (``task_type`` as its name); raises when the plan has no adapter."""
    require_transformers_code(rec)
    lora = rec.setup.lora
    if lora is None:
        raise InvalidSetupError(f"this plan trains without adapters ({rec.setup.label}); use recommend(..., finetune='lora') "
                             "or finetune='qlora' for a plan with a LoraConfig")
    return {
        "r": lora.r,
        "lora_alpha": lora.alpha,
        "lora_dropout": lora.dropout,
        "target_modules": target_modules(rec.model, lora),
        "use_dora": lora.use_dora,
        "use_rslora": lora.use_rslora,
        "modules_to_save": list(lora.modules_to_save) or None,
        **({"target_parameters": list(lora.target_parameters)} if lora.target_parameters else {}),
        "bias": "none",   # the memory model prices no trainable biases
        "task_type": task_type(rec.model),
    }


def lora_config(rec: Recommendation, **overrides: Any) -> peft.LoraConfig:
    """A real ``peft.LoraConfig`` for the plan's adapter; ``overrides`` (modules_to_save, ...) win."""
    from peft import LoraConfig

    return LoraConfig(**{**lora_config_kwargs(rec), **overrides})
