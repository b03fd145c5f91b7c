"""What sits between the last block and the loss at the loss peak, beyond the blocks' activations and the loss
buffers: the final norm's saved input, and the 16-bit copy of a quantized head that its matmul dequantizes.

Final norm. With checkpointing every block keeps only its input, and the last block's output is no block's input:
the final norm keeps it (or a copy) for its backward. HF's RMSNorms upcast first (LlamaRMSNorm
``hidden_states.to(torch.float32)``, Gemma2RMSNorm ``self._norm(x.float())``), so pow and mul save a 4-byte copy
whatever the stream's dtype; a LayerNorm (``F.layer_norm``) saves its input in the stream's dtype. A frozen head
(LoRA, QLoRA) saves no input (its matmul needs only the weight for the input gradient), and at the cross-entropy's
backward, the loss peak, the model's forward has returned, so the norm's output is gone. Traced
(scripts/trace_top_of_stack.py, perfguide's fake-tensor tracer, transformers 5.24, Llama / Gemma 2 / GPT-NeoX of
h 64 and 128, LoRA on the attention, checkpointed, at the start of the loss's backward, beyond the blocks' inputs):
4.06 / 4.03 B per hidden unit per token for Llama and Gemma 2 in bf16 and in fp32, GPT-NeoX 2.1 in bf16 and 4.1 in
fp32 (under bf16 autocast 0.9 B less, the adapters' casts autocast's cache frees as the forward ends); the fractions
are 4-8 B per token of per-row statistics (rsqrt, mean), left out. Without checkpointing the
per-block coefficient already counts one norm input per block, which the first block does not keep (its input, the
frozen embedding's output, needs no gradient), so the two cancel. Full fine-tuning adds what a trained norm weight
(the normalised product the weight multiplies) and a trained head (its input) keep, checkpointed or not (the first
block keeps its input too when the embedding trains), the same at the loss's forward and its backward; same trace,
full fine-tuning: Llama 8 B per hidden unit per token in bf16 and 12 in fp32 and under bf16 autocast, Gemma 2 10 /
12 / 12 (its ``output * (1 + weight.float())`` keeps an fp32 product), GPT-NeoX 4 / 8 / 8 (autocast figures from
the head phase: the backward one is lowered by the weight casts autocast frees as the forward ends).

Dequantized weights. bitsandbytes' MatMul4Bit dequantizes the whole weight for every forward and backward matmul
(``F.dequantize_4bit(B, quant_state).to(A.dtype)``) and frees it after; the result is in the dtype the weight was
quantized from (``quant_state.dtype``). transformers' bitsandbytes integration never quantizes the output embedding
(``get_keys_to_not_convert`` adds it to the modules to skip, in every release since 4.27), so after the last block
no 4-bit Linear runs and none is alive at the loss peak; a block's backward, where one is alive beside its
recompute, keeps it (analytic.py). litgpt's ``--quantize bnb.*`` goes through Lightning Fabric's
``BitsandbytesPrecision``, which replaces every ``torch.nn.Linear`` of litgpt's GPT (``ignore_modules`` empty as
litgpt calls it), lm_head included: its head is 4-bit, its backward dequantizes it next to the logits'
gradient (litgpt's loss peak), and Lightning quantizes each weight from fp16 (``_quantize_weight``:
``.to(device="cuda", dtype=torch.half)``), so under bf16 compute each dequantization is an fp16 tensor cast to bf16:
2 + 2 B per element at once.
"""

from __future__ import annotations

from ..model.linears import linear_shapes
from ..model.types import ModelSpec
from ..setup import QUANTIZED, Setup
from .activations import regime, stream_regime

#: families whose final norm upcasts its input to fp32 before normalising (HF RMSNorms); the others' (LayerNorm)
#: keep the stream's dtype. Aliases (data/activations.json) carry a model type into its family.
FP32_NORM_FAMILIES = ("llama", "gemma2")
#: full fine-tuning, bytes per hidden unit per token by regime (traced, module docstring): RMSNorm, LayerNorm, and
#: Gemma 2's norm, which keeps an fp32 product in bf16 models as well
TRAINED_TOP_BYTES: dict[str, dict[str, int]] = {"rms": {"half": 8, "amp": 12, "fp32": 12},
                                                "layer": {"half": 4, "amp": 8, "fp32": 8},
                                                "gemma2": {"half": 10, "amp": 12, "fp32": 12}}


def final_norm_bytes(spec: ModelSpec, setup: Setup, *, checkpointed: bool) -> int:
    """Bytes the final norm (and a trained head) keep for backward at the loss peak: with a frozen head, of a
    checkpointed step only; with a trained one, of every step."""
    if not (spec.generates and not spec.is_encoder_decoder):
        return 0
    rms = spec.family in FP32_NORM_FAMILIES
    if setup.lora is None:
        kind = spec.family if spec.family in TRAINED_TOP_BYTES else "rms" if rms else "layer"
        per_h = TRAINED_TOP_BYTES[kind][regime(setup)]
    elif checkpointed:
        per_h = 4 if rms or stream_regime(setup) != "half" else 2
    else:
        return 0
    return setup.micro_batch_size * setup.seq_len * spec.hidden_size * per_h


def quantized_head(setup: Setup) -> bool:
    """Whether the LM head is a k-bit Linear: litgpt's quantizer replaces it with the blocks', transformers' skips it."""
    return setup.weights_dtype in QUANTIZED and setup.kbit_quantizer == "litgpt"


def head_elements(spec: ModelSpec) -> int:
    """Elements of the LM head as a quantizer sees it: its own weight, or the vocabulary x hidden copy litgpt's GPT
    keeps where the Hub model ties it to the embedding."""
    return spec.lm_head_params or spec.vocab_size * spec.hidden_size


def dequant_bytes_per_element(setup: Setup) -> int:
    """Bytes alive per element while a k-bit weight is dequantized for a matmul: its 16-bit copy, plus the bf16 cast
    of Lightning's fp16-quantized 4-bit weights."""
    cast = setup.kbit_quantizer == "litgpt" and setup.weights_dtype == "nf4" and setup.compute_dtype == "bf16"
    return 4 if cast else 2


def largest_linear_elements(spec: ModelSpec) -> int:
    """Elements of the largest block Linear weight: the one whose dequantized or 16-bit copy sets a transient peak."""
    return max((i * o for _, i, o, _ in linear_shapes(spec)), default=0)


def block_dequant_bytes(spec: ModelSpec, setup: Setup) -> int:
    """The largest block Linear dequantized, alive during a block's forward or backward matmul; with quantized fused
    experts (``Setup.quantized_experts``), a MoE block's whole expert tensors, which bitsandbytes' parametrization
    dequantizes at once when the experts module reads them (and the matmul keeps for its input gradient)."""
    if setup.weights_dtype not in QUANTIZED:
        return 0
    experts = spec.fused_expert_params // max(1, spec.num_moe_layers or spec.total_layers) if setup.quantized_experts else 0
    return max(largest_linear_elements(spec), experts) * dequant_bytes_per_element(setup)


def loss_peak_dequant_bytes(spec: ModelSpec, setup: Setup) -> int:
    """The dequantized weight alive at the loss peak: the head's, where it is quantized (its backward runs next to
    the logits' gradient); none where the head stayed 16-bit."""
    if not (quantized_head(setup) and spec.head == "lm"):
        return 0
    return head_elements(spec) * dequant_bytes_per_element(setup)
