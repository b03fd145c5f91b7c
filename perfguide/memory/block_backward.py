"""What a recomputed block's backward holds beyond the tensors its recompute saved: the gradients in flight.

With checkpointing, the peak of the backward pass is inside one block: every block's input, the block's recomputed
activations, and the activation gradients its backward is building. The recompute term (activations.layer_bytes)
prices only the saved tensors; this module prices the rest, as traced on real tensors (data/activations.json
``block_backward``: scripts/trace_block_backward.py, the source text has the hand count of each FFN coefficient).

Where it matters: a small vocabulary. Mistral-7B or Llama-2-7B (32,000 logits per token: 12 B each at the loss's
backward, 0.37 MiB per token) hold less at the loss peak than one block's recompute plus its gradients (under peft's
kbit preparation the MLP intermediates and their gradients are fp32: 14 B saved + 10 B in flight per FFN unit, 0.33
MiB per token at 14,336 FFN units), so their peak is the block backward; Llama-3.1-8B (128,256 logits) keeps its
peak at the loss and does not move.

Scope, as traced: LoRA on a frozen base (full fine-tuning adds weight-gradient temporaries the trace did not cover),
gated MLPs (SwiGLU / GeGLU) as HF runs them (Liger's fused SwiGLU, whose backward writes its gradients into its saved
gate and up buffers, holds the same in flight: traced, scripts/trace_block_backward.py --liger; what it saves less is
its technique hook's); the MLP's gradients come at another moment than eager attention's s x s backward
(masks.eager_backward_transient_bytes), so the block backward holds the larger of the two (analytic.py). Other setups
get nothing here, as before.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .._data import DataModel
from ..model.types import ModelSpec
from ..setup import Setup

Case = Literal["fp32_stream", "half_autocast", "half"]
Mode = Literal["reentrant", "non_reentrant"]


class BlockBackward(DataModel):
    """data/activations.json ``block_backward``: bytes per token in flight, per FFN unit ("i") and hidden unit ("h")."""

    source: str = Field(min_length=10)
    reentrant_before: str   # the first transformers release whose gradient checkpointing is non-reentrant by default
    in_flight_per_token: dict[Case, dict[Mode, dict[Literal["i", "h"], float]]]


def stream_case(setup: Setup) -> Case | None:
    """Which traced case a setup is: the dtype its MLP intermediates are in and whether autocast runs (None: not traced).

    A quantized base prepared by peft (``kbit_upcast``) under autocast keeps an fp32 stream, and bitsandbytes' k-bit
    Linears return their input's dtype, so the MLP runs in fp32 (activations.stream_regime); a 16-bit base keeps
    16-bit intermediates, with or without autocast. fp32 weights and DeepSpeed's 16-bit casts were not traced."""
    from .activations import engine_casts_to_16bit, kbit_fp32_stream

    if setup.weights_dtype == "fp32" or engine_casts_to_16bit(setup):
        return None
    if kbit_fp32_stream(setup):
        return "fp32_stream"
    return "half_autocast" if setup.autocast else "half"


def checkpoint_mode(release: str | None) -> Mode:
    """transformers' default checkpoint variant at ``release`` (None: a current one)."""
    from .activations import activations_data
    from .loss_path import version_tuple

    first = activations_data().block_backward.reentrant_before
    return "reentrant" if release is not None and version_tuple(release) < version_tuple(first) else "non_reentrant"


def block_backward_bytes(spec: ModelSpec, setup: Setup, release: str | None = None) -> int:
    """Bytes one checkpointed block's backward holds beyond its recompute's saved tensors (call it only when the
    blocks are checkpointed). ``release``: the transformers release that trains (its checkpoint variant)."""
    case = stream_case(setup)
    if case is None or setup.lora is None or not spec.gated_mlp or spec.is_encoder_decoder:
        return 0
    from .activations import activations_data

    coef = activations_data().block_backward.in_flight_per_token[case][checkpoint_mode(release)]
    per_token = coef["i"] * spec.active_intermediate_size + coef["h"] * spec.hidden_size
    return max(0, int(setup.micro_batch_size * setup.seq_len * per_token))
