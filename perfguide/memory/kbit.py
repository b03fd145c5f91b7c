"""What peft's k-bit preparation leaves in fp32 through training.

peft's ``prepare_model_for_kbit_training`` upcasts a quantized base's other parameters (embeddings, head, norms) to
fp32 (``Setup.kbit_upcast``); DeepSpeed's fp16/bf16 engine undoes it: ``_configure_distributed_model`` calls
``module.half()`` / ``module.bfloat16()`` on a model not built under zero.Init (deepspeed/runtime/engine.py, 0.14.4),
and transformers loads a bitsandbytes model without zero.Init, so under ZeRO those parameters train in 16 bits
again (the same cast ``activations.engine_casts_to_16bit`` prices for fp32 weights).
"""

from __future__ import annotations

from ..setup import Setup


def kbit_fp32_parts(setup: Setup) -> bool:
    """A quantized base's non-quantized parameters are fp32 while it trains (upcast, and no 16-bit engine cast)."""
    return setup.quantized and setup.kbit_upcast and not (setup.is_deepspeed and setup.autocast in ("bf16", "fp16"))
