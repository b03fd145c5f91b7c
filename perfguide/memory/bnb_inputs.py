"""The inputs bitsandbytes' matmuls keep for backward, and how long they live.

bitsandbytes' ``MatMul4Bit`` (up to 0.43.1) and ``MatMul8bitLt`` (every release to 0.50) keep the layer input
``A`` although a frozen weight needs no gradient, and they keep it as a plain attribute of the autograd context
(``ctx.tensors = (A, B)`` / ``(CAt, subA, A)``), not through ``ctx.save_for_backward``. That changes its lifetime:
autograd releases saved tensors as each node's backward runs, while a context attribute lives as long as the node,
that is as long as anything still references the step's graph (its loss, or the model output whose ``grad_fn``
chains back through every layer). Checked on real CPU tensors (``tests/test_bnb_inputs.py``): after
``loss.backward()`` an attribute-kept input is alive while ``loss`` is referenced and freed with it; a saved one is
freed by backward.

A loop that rebinds its output name only when the next forward returns (litgpt's ``logits = model(input_ids)``)
therefore holds the previous micro-step's inputs through the whole next forward.
"""

from __future__ import annotations

from ..model.types import ModelSpec
from ..setup import Setup
from .loss_path import version_tuple
from .seq2seq import stack_activation_bytes

#: bitsandbytes release whose MatMul4Bit stops keeping the input of a frozen 4-bit Linear (bnb PR #1270,
#: "delete useless buffered activation", merged 2024-07-16; before it ``ctx.tensors = (A, B)``)
BNB_4BIT_DROPS_INPUTS = (0, 43, 2)


def quantized_matmul_keeps_inputs(setup: Setup, bnb_version: str | None) -> bool:
    """Whether a frozen int8/nf4 Linear keeps its 16-bit input for backward although no weight grad needs it.

    bnb's MatMul8bitLt keeps ``(CAt, subA, A)`` whenever an input needs grad (bitsandbytes/autograd/
    _functions.py, still in 0.50); MatMul4Bit kept ``(A, B)`` up to 0.43.1 and ``(None, B)`` since 0.43.2.
    ``bnb_version`` None means a current release.
    """
    if setup.lora is None or setup.weights_dtype not in ("int8", "nf4"):
        return False
    if setup.weights_dtype == "int8":
        return True
    return bnb_version is not None and version_tuple(bnb_version) < BNB_4BIT_DROPS_INPUTS


def kept_input_bytes(spec: ModelSpec, setup: Setup, bnb_version: str | None) -> int:
    """Bytes of one micro-step's frozen k-bit Linear inputs that bitsandbytes keeps as context attributes.

    These are the block Linears' distinct inputs (the normed hidden states, the attention output, the MLP's inner
    activation) the activation model adds when the matmul keeps them (``keeps_frozen_inputs``), so the figure is
    that model's own difference, per stack and dtype regime; 0 where nothing is kept. The LM head's input is left
    out (a quantized head keeps ``b x s x h`` more: 8 MB for Llama-2-7B at 1,024 tokens).
    """
    if not quantized_matmul_keeps_inputs(setup, bnb_version):
        return 0
    kept, _ = stack_activation_bytes(spec, setup, 0, True)
    dropped, _ = stack_activation_bytes(spec, setup, 0, False)
    return max(kept - dropped, 0)
