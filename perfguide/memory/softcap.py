"""Bytes that tanh soft-capping keeps for backward (Gemma 2): on the attention scores and on the final logits.

Gemma 2's modeling code (transformers 4.42 to 5.x) caps both with ``x / cap; tanh; * cap``. Dividing or multiplying
by a Python scalar saves nothing for backward, but ``tanh`` saves its output (its gradient is ``1 - tanh^2``), so
each cap keeps one more tensor the size of what it caps, in that tensor's dtype, from its forward to its backward:

* eager attention (``attn_logit_softcapping``): one b x heads x s x s tensor per block, on top of the fp32 softmax
  output and its 16-bit cast that every eager block keeps (flash-attn >= 2.6 applies the cap inside the kernel and
  keeps no s x s tensor; SDPA cannot cap at all);
* the head (``final_logit_softcapping``): one b x s x vocab tensor in the head's output dtype
  (loss_path.head_bytes), alive from the forward through the cross-entropy's backward, so at the loss peak of every
  release and loop (the loss upcasts and shifts its own copies of the capped logits, the tanh output stays).

The per-element sizes and the config-class defaults are data/activations.json ``softcap``, traced with
scripts/trace_softcap.py.
"""

from __future__ import annotations

from pydantic import Field

from .._data import DataModel
from ..model.types import ModelSpec
from ..setup import Setup


class Softcap(DataModel):
    """data/activations.json ``softcap``: bytes per capped element by dtype regime, and the caps a config class
    sets when its config.json omits the key."""

    source: str = Field(min_length=10)
    attn_per_head_s2: dict[str, float]     # regime -> bytes per (b x heads x s^2) of eager attention, per block
    final_defaults: dict[str, float]       # HF model_type -> final_logit_softcapping of its config class
    attn_defaults: dict[str, float]        # HF model_type -> attn_logit_softcapping of its config class


def _cap(spec: ModelSpec, key: str, defaults: dict[str, float]) -> float | None:
    """The model's cap: its config's value (null switches it off), else its config class's default."""
    config = spec.config or {}
    value = config[key] if key in config else defaults.get(spec.model_type)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value else None


def _data() -> Softcap:
    from .activations_data import activations_data

    return activations_data().softcap


def attention_softcap_bytes(spec: ModelSpec, setup: Setup) -> int:
    """Bytes one block's eager attention keeps for its score soft-cap (the tanh output), one micro-batch."""
    if setup.attn_implementation != "eager":
        return 0
    data = _data()
    cap = spec.attn_logit_softcapping or _cap(spec, "attn_logit_softcapping", data.attn_defaults)
    if cap is None:
        return 0
    from .activations import regime

    b, s = setup.micro_batch_size, setup.seq_len
    return int(b * spec.num_attention_heads * s * s * data.attn_per_head_s2[regime(setup)])


def final_softcap_bytes(spec: ModelSpec, setup: Setup) -> int:
    """Bytes of the final-logit soft-cap's tanh output (b x positions x logits width in the head's dtype) alive at
    the loss peak; nothing for models without the cap or without a generating head, nor for litgpt's LoRA step,
    whose chunked head (lm_head_chunk_size > 0 in finetune/lora.py) returns before the cap line (litgpt 0.4.12
    lora.GPT.forward, traced: scripts/fit_litgpt.py)."""
    if not spec.generates or _cap(spec, "final_logit_softcapping", _data().final_defaults) is None:
        return 0
    if setup.model_code == "litgpt" and setup.lora is not None and setup.task == "train":
        return 0
    from .loss_path import head_bytes

    positions = 1 if spec.logits_per_sequence else setup.seq_len
    return setup.micro_batch_size * positions * spec.logits_width * head_bytes(setup)
