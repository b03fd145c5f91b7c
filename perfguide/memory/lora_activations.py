"""The activations a LoRA / DoRA adapter adds to a block: what each adapted Linear's branch saves for backward on top
of the frozen block (activations.layer_bytes prices the block with its Linears frozen). PEFT's own tensors, by the
adapters' dtype, autocast, dropout and DoRA's magnitude rescaling; traced in scripts/trace_block_backward.py and
tests/test_dora_activations.py."""

from __future__ import annotations

from ..setup import Setup
from .activations import engine_casts_to_16bit


def lora_layer_bytes(setup: Setup, lora_inputs_per_layer: int, lora_rank_total: int, dora_outputs_per_layer: int = 0) -> int:
    """Adapter tensors per block: the input each adapted Linear's ``lora_A`` keeps, plus its r-wide output.

    PEFT keeps adapters fp32 and casts a 16-bit input to fp32 before ``lora_A`` (``_cast_input_dtype``), so
    on a 16-bit base each adapted Linear keeps a 4-byte copy of its input; under autocast lora_A keeps its
    own 16-bit cast, on fp32 weights and on a 16-bit or k-bit base alike; in fp32 the (shared) input itself, counted per target (a small overcount). With
    ``lora_dropout`` > 0 the dropout (peft ``lora_A(dropout(x))``) also keeps its mask: one byte per input element
    (native_dropout's bool mask, ATen Dropout.cpp), and lora_A keeps the dropped copy instead of the input.

    DoRA (``dora_outputs_per_layer``: the adapted Linears' output widths) rescales both branches by the trainable
    magnitude (peft ``DoraLinearLayer.forward``: ``(m / ||W + sBA|| - 1) * base_result + m / ||.|| * lora_result *
    s``), and each product saves its full-width operand for the magnitude's gradient: the base layer's output (its
    compute dtype; with dropout the base matmul re-runs on the dropped, adapter-dtype input) and the adapter output
    (the adapters' compute dtype). Traced on real CPU tensors, peft 0.21 (tests/test_dora_activations.py).
    """
    if not lora_inputs_per_layer:
        return 0
    sixteen_bit_adapters = setup.kbit_recast_adapters or (setup.lora is not None and not setup.lora.autocast_adapter_dtype
                                                          and setup.weights_dtype in ("bf16", "fp16"))
    # under autocast (fp32 weights or a 16-bit / k-bit base alike) lora_A's matmul keeps autocast's 16-bit cast of its
    # input; the fp32 copy peft makes first is freed (traced, scripts/trace_block_backward.py: 2 B per input element)
    autocast_runs = setup.autocast is not None and not engine_casts_to_16bit(setup)
    nbytes = 2 if autocast_runs or sixteen_bit_adapters else 4  # 16-bit adapters: 16-bit inputs
    mask = 1 if setup.lora is not None and setup.lora.dropout > 0 else 0
    tokens = setup.micro_batch_size * setup.seq_len
    dora = dora_outputs_per_layer * (nbytes + (nbytes if mask else _base_output_bytes(setup, autocast_runs)))
    return int(tokens * ((lora_inputs_per_layer + lora_rank_total) * nbytes + lora_inputs_per_layer * mask + dora))


def _base_output_bytes(setup: Setup, autocast_runs: bool) -> int:
    """Bytes per element of a frozen base Linear's output: 16-bit under autocast, on a 16-bit base and from a k-bit
    base's 16-bit compute; fp32 weights without autocast give fp32."""
    return 2 if autocast_runs or setup.weights_dtype != "fp32" else 4
