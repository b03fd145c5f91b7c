"""The two short-lived copies of a bitsandbytes weight that serving with ``generate`` allocates beside the model.

* **Quantizing at load.** ``from_pretrained(quantization_config=...)`` moves each 16-bit Linear weight to the GPU and
  quantizes it there (bitsandbytes ``Params4bit._quantize`` / ``Int8Params._quantize``: the fp16/bf16 weight, 2 B per
  element, alive beside its packed codes until the module keeps them). The last blocks are quantized when nearly every
  other weight is resident, so the load peaks at the weights plus one 16-bit copy of the largest Linear. A checkpoint
  saved quantized loads its packed codes directly: no copy.
* **The 4-bit matmul.** ``bnb.matmul_4bit`` runs ``MatMul4Bit``, whose forward is ``F.linear(A,
  dequantize_4bit(W).to(A.dtype).t())``: the whole weight dequantized to 16 bits for the matmul, whenever the input holds
  more than one token (a prefill, or a decode step of a batch above one); a single token takes ``gemv_4bit``, which
  dequantizes inside the kernel. LLM.int8's matmul quantizes the activations instead (``int8_vectorwise_quant``), so
  its weights are never dequantized there.

The HF blog 'Optimizing your LLM in production' measured OctoCoder 15.5B with ``torch.cuda.max_memory_allocated`` after
loading and a 20-token-prompt generation (bench rows 3201-3202): LLM.int8 15.22 GiB against 14.79 of weights, 4-bit 9.54
against 8.60 (docs/validation.md 78).
"""

from __future__ import annotations

from ..model.types import ModelSpec
from ..setup import Setup
from .top_of_stack import block_dequant_bytes, largest_linear_elements

#: bitsandbytes formats that ``from_pretrained`` quantizes from a 16-bit checkpoint
BNB_FORMATS = ("int8", "nf4")


def load_transient_bytes(spec: ModelSpec, setup: Setup, shards: int = 1) -> int:
    """The 16-bit copy of the largest Linear while bitsandbytes quantizes it at load (0 for other formats or a
    checkpoint saved quantized); under tensor parallelism each rank quantizes its own shard."""
    if setup.weights_dtype not in BNB_FORMATS or setup.checkpoint_format is not None:
        return 0
    return largest_linear_elements(spec) * 2 // shards


def matmul_dequant_bytes(spec: ModelSpec, setup: Setup, tokens: int, shards: int = 1) -> int:
    """The largest block Linear dequantized to 16 bits by a 4-bit matmul over ``tokens`` input rows (none for one);
    a rank's shard of it under tensor parallelism."""
    if setup.weights_dtype != "nf4" or tokens <= 1:
        return 0
    return block_dequant_bytes(spec, setup) // shards   # the training path's copy: one block Linear at a time
