"""autocast's 16-bit copies of fp32 weights: which ones a training step holds, and for how long.

torch.autocast casts an fp32 weight each time an op on its lists uses it, and caches the cast of every fp32 leaf that
requires grad until the outermost region exits (aten autocast_mode.cpp ``cached_cast``). accelerate and HF Trainer
wrap the model's ``forward`` in that region, and HF computes its loss inside it, so the cached copies live to the
model's return, beside the loss's forward but not its backward (loss_path.loss_path_phases). What autograd saves of
them lives on into backward. Three cases are priced here: a full fine-tune's Linears under checkpointing, the fp32 LM
head's saved copy, and PEFT's fp32 adapters.
"""

from __future__ import annotations

from ..model.linears import linear_params
from ..model.types import ModelSpec
from ..setup import Setup
from . import activations as act
from .kbit import kbit_fp32_parts
from .lora_activations import adapter_dtype_bytes


def autocast_cached_casts(spec: ModelSpec, setup: Setup, priced: int) -> int:
    """The trainable block Linears' 16-bit copies autocast's weight cache keeps to the end of a checkpointed forward,
    beyond the one block's copies ``priced`` already holds.

    torch.autocast caches the cast of every fp32 leaf weight that requires grad until the outermost autocast region
    exits (``cached_cast``'s ``can_try_cache``; ``clear_autocast_cache`` at exit), whether or not autograd saves it,
    so a checkpointed forward ends with every trainable Linear's copy alive, through an HF model's loss inside that
    region. The recompute in backward enters a region of its own per block, so backward holds one block's copies.
    Frozen weights (LoRA's base) are not cached. Traced on CPU (tests/test_autocast_cache.py); reported in the field
    as layer-by-layer build-up under checkpointing (ecmwf/anemoi-core issue #134).
    """
    if setup.lora is not None or act.regime(setup) != "amp":
        return 0
    return max(linear_params(spec) * 2 - priced, 0)


def head_cast_bytes(spec: ModelSpec, setup: Setup) -> int:
    """The 16-bit copy of an fp32 LM head that autocast makes and the head's matmul saves for backward.

    Under autocast ``F.linear(hidden, W_fp32)`` runs on a bf16/fp16 cast of ``W``; the matmul saves that cast to
    compute the input gradient, so it lives from the forward to the head's backward (across the loss peak). The
    head is fp32 for fp32 weights and for a k-bit base after peft's prepare_model_for_kbit_training (it upcasts
    every non-quantized parameter; bitsandbytes leaves the head unquantized). The block Linears' casts are
    ``weight_casts``; this is the head's (Llama-3.1-8B: 128256 x 4096 x 2 B = 1.05 GB).
    """
    fp32_head = setup.weights_dtype == "fp32" or (kbit_fp32_parts(setup) and not setup.kbit_recast_bf16)
    if not (setup.autocast and fp32_head and spec.head == "lm") or setup.computes_on_16bit_copy:
        return 0   # DeepSpeed's 16-bit module, FSDP's param_dtype gather: the head is 16-bit before autocast sees it
    return 2 * spec.vocab_size * spec.hidden_size


def adapter_cast_bytes(setup: Setup, adapter_params: int) -> int:
    """autocast's 16-bit copies of fp32 adapters, alive together at the end of the forward (and the loss inside it).

    PEFT's ``lora_A`` / ``lora_B`` are fp32 leaves that require grad, so ``F.linear`` under autocast casts each weight
    once and autocast's cache keeps the copy until the outermost region exits (aten autocast_mode.cpp ``cached_cast``:
    ``can_try_cache`` for fp32 leaves requiring grad), saved for backward or not. Without checkpointing the matmuls
    also save them into backward; with it the cache alone holds them to the forward's end. (litgpt's adapters,
    which its bf16-mixed runs keep fp32, multiply by transposed views autocast does not cache; but its finetune
    scripts checkpoint only under FSDP, which casts first, and without checkpointing the matmuls save the copies.)
    2 B per adapter element (Llama-3.1-8B, r=64 on every Linear: 0.34 GB). Traced on a real peft model on CPU
    (tests/test_adapter_casts.py). None where autocast finds 16-bit adapters (16-bit adapters, DeepSpeed's 16-bit
    module, FSDP's param_dtype gather)."""
    plain_amp = setup.autocast in ("bf16", "fp16") and not (setup.is_fsdp or setup.is_deepspeed)
    return 2 * adapter_params if setup.lora is not None and plain_amp and adapter_dtype_bytes(setup) == 4 else 0
