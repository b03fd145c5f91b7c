"""Which code runs a hybrid model's gated-DeltaNet layers (Qwen3.5, Qwen3-Next): ``Setup.linear_attention_kernels``.

transformers runs flash-linear-attention's chunk kernel and causal-conv1d's convolution when both packages import on
the training machine, else its PyTorch reference code, which keeps fp32 copies and every 64-token chunk's state for
backward (memory/linear_attention.py). So, as for flash-attn (rules_attention.py): the kernels are assumed only where
the plan targets this machine and both are installed here; for a named GPU the planning machine's packages say nothing
about the target's, and the plan prices the reference code, the larger of the two, and says what the kernels would
save. A forced value is honoured, or refused in one line where it cannot run (fla refuses fp32 inputs).
"""

from __future__ import annotations

import importlib.util

from .. import sources
from ..decisions import Alternative, Decision
from ..errors import ConflictingConstraintsError
from ..memory.activations import layer_bytes
from ..memory.linear_attention import deltanet_share
from ..model.types import ModelSpec
from ..setup import Setup

PACKAGES = ("fla", "causal_conv1d")


def kernels_available() -> bool:
    """Whether flash-linear-attention and causal-conv1d both import on this (the planning) machine."""
    return all(importlib.util.find_spec(p) is not None for p in PACKAGES)


def _saved_per_token(spec: ModelSpec, kernels: str, seq_len: int) -> float:
    """What one block keeps per token (the depth's mean), in bf16: what the two paths are compared by."""
    setup = Setup(micro_batch_size=1, seq_len=seq_len, weights_dtype="bf16", optimizer="sgd",
                  linear_attention_kernels=kernels)
    return layer_bytes(spec, setup) / seq_len


def decide_linear_kernels(spec: ModelSpec, forced: str | None, compute: str | None, *, local: bool,
                          seq_len: int, cpu: bool = False) -> tuple[dict[str, str], tuple[Decision, ...]]:
    """(the base Setup's field, its decision) for a model with gated-DeltaNet layers; nothing for any other model.
    ``compute``: the plan's 16-bit matmul dtype, None for fp32. ``cpu``: the plan trains on CPUs, where the packages'
    Triton kernels do not run."""
    if not deltanet_share(spec):
        return {}, ()
    if forced == "fla" and cpu:
        raise ConflictingConstraintsError("linear_attention_kernels='fla' runs flash-linear-attention's Triton kernels, "
                                          "which need a GPU; the plan trains on CPUs: use 'torch'")
    if cpu:
        compute, local = None, True
    if forced == "fla" and compute is None:
        raise ConflictingConstraintsError("linear_attention_kernels='fla' needs 16-bit compute (flash-linear-attention "
                                          "refuses fp32 inputs), but the plan runs in fp32; use 'torch' or precision='bf16'")
    torch_bytes, fla_bytes = (_saved_per_token(spec, k, seq_len) for k in ("torch", "fla"))
    gap = {"number": (torch_bytes - fla_bytes) * seq_len * spec.num_layers,
           "unit": "bytes per sample the reference code keeps beyond the kernels (all layers, no checkpointing)"}
    if forced:
        return {"linear_attention_kernels": forced}, (Decision(
            setting="linear_attention_kernels", value=forced, source=sources.LINEAR_ATTENTION_KERNELS, **gap,
            reason=f"linear_attention_kernels={forced!r} was requested"),)
    if local and compute is not None and kernels_available():
        return {"linear_attention_kernels": "fla"}, (Decision(
            setting="linear_attention_kernels", value="fla", source=sources.LINEAR_ATTENTION_KERNELS, **gap,
            reason="flash-linear-attention and causal-conv1d are installed here, so transformers runs them for the "
                   "gated-DeltaNet layers: the chunk states are recomputed in backward, not kept",
            alternatives=(Alternative(value="torch", why_not="transformers' reference code runs only without the packages"),)),)
    why = ("flash-linear-attention's Triton kernels do not run on CPUs" if cpu else
           "whether flash-linear-attention and causal-conv1d are installed on the target is unknown (a named GPU)"
           if not local else "flash-linear-attention and causal-conv1d are not both installed here"
           if compute is not None else "the plan computes in fp32, which flash-linear-attention refuses")
    return {"linear_attention_kernels": "torch"}, (Decision(
        setting="linear_attention_kernels", value="torch", source=sources.LINEAR_ATTENTION_KERNELS, **gap,
        reason=f"{why}: priced as transformers' PyTorch reference code for the gated-DeltaNet layers, which keeps every "
               "64-token chunk's state and fp32 copies for backward",
        alternatives=(Alternative(value="fla", why_not=why if cpu else f"{why}; pip install flash-linear-attention "
                                  "causal-conv1d and pass linear_attention_kernels='fla': less memory, faster"),)),)
