"""Which code runs a hybrid model's recurrent layers (Qwen3.5's gated DeltaNet, Granite-4.0-H's Mamba-2):
``Setup.linear_attention_kernels``.

transformers runs the packages' kernels when they import on the training machine (flash-linear-attention's chunk kernel
with causal-conv1d's convolution for DeltaNet, mamba-ssm's fused kernel for Mamba-2), else its PyTorch reference code,
which keeps fp32 copies and every chunk's state for backward (memory/linear_attention.py). So, as for flash-attn
(rules_attention.py): the kernels are assumed only where the plan targets this machine and the packages are installed
here; for a named GPU the planning machine's packages say nothing about the target's, and the plan prices the reference
code, the larger of the two, and says what the kernels would save. A forced value is honoured, or refused in one line
where it cannot run (the other kind's kernels, fla on fp32 inputs, any kernel on CPUs).
"""

from __future__ import annotations

import importlib.util

from .. import sources
from ..decisions import Alternative, Decision
from ..errors import ConflictingConstraintsError
from ..memory.activations import layer_bytes
from ..memory.linear_attention import KERNEL_PATHS, Kind, linear_kind, linear_share
from ..model.types import ModelSpec
from ..setup import Setup


def kernels_available(kind: Kind = "gated_deltanet") -> bool:
    """Whether the kind's kernel packages all import on this (the planning) machine."""
    return all(importlib.util.find_spec(p) is not None for p in KERNEL_PATHS[kind].packages)


def _saved_per_token(spec: ModelSpec, kernels: str, seq_len: int) -> float:
    """What one block keeps per token (the depth's mean), in bf16: what the two paths are compared by."""
    setup = Setup(micro_batch_size=1, seq_len=seq_len, weights_dtype="bf16", optimizer="sgd",
                  linear_attention_kernels=kernels)
    return layer_bytes(spec, setup) / seq_len


def _refuse_forced(spec: ModelSpec, kind: Kind, forced: str | None, compute: str | None, cpu: bool) -> None:
    path = KERNEL_PATHS[kind]
    fast = path.value
    if forced not in (None, "torch", fast):
        raise ConflictingConstraintsError(f"linear_attention_kernels={forced!r} does not run {spec.name}'s {path.layers} "
                                          f"layers; accepted: 'torch' or {fast!r}")
    if forced == fast and cpu:
        raise ConflictingConstraintsError(f"linear_attention_kernels={fast!r} runs {path.names}' GPU kernels; the plan "
                                          "trains on CPUs: use 'torch'")
    if forced == fast and compute is None and path.fp32_refused_by:
        raise ConflictingConstraintsError(f"linear_attention_kernels={fast!r} needs 16-bit compute ({path.fp32_refused_by} "
                                          "refuses fp32 inputs), but the plan runs in fp32; use 'torch' or precision='bf16'")


def decide_linear_kernels(spec: ModelSpec, forced: str | None, compute: str | None, *, local: bool,
                          seq_len: int, cpu: bool = False) -> tuple[dict[str, str], tuple[Decision, ...]]:
    """(the base Setup's field, its decision) for a model with recurrent layers perfguide prices; nothing for any other
    model. ``compute``: the plan's 16-bit matmul dtype, None for fp32. ``cpu``: the plan trains on CPUs, where the
    packages' kernels do not run."""
    kind = linear_kind(spec)
    if kind is None or not linear_share(spec):
        return {}, ()
    _refuse_forced(spec, kind, forced, compute, cpu)
    path = KERNEL_PATHS[kind]
    fast = path.value
    if cpu:
        compute, local = None, True
    torch_bytes, fast_bytes = (_saved_per_token(spec, k, seq_len) for k in ("torch", fast))
    gap = {"number": (torch_bytes - fast_bytes) * seq_len * spec.num_layers,
           "unit": "bytes per sample the reference code keeps beyond the kernels (all layers, no checkpointing)"}
    source = sources.LINEAR_ATTENTION_KERNELS
    if forced:
        return {"linear_attention_kernels": forced}, (Decision(
            setting="linear_attention_kernels", value=forced, source=source, **gap,
            reason=f"linear_attention_kernels={forced!r} was requested"),)
    if local and (compute is not None or not path.fp32_refused_by) and not cpu and kernels_available(kind):
        return {"linear_attention_kernels": fast}, (Decision(
            setting="linear_attention_kernels", value=fast, source=source, **gap,
            reason=f"{path.names} are installed here, so transformers runs them for the {path.layers} layers: the "
                   "chunk states are recomputed in backward, not kept",
            alternatives=(Alternative(value="torch", why_not="transformers' reference code runs only without the packages"),)),)
    why = (f"{path.names}' kernels do not run on CPUs" if cpu else
           f"whether {path.names} are installed on the target is unknown (a named GPU)"
           if not local else f"{path.names} are not both installed here"
           if compute is not None or not path.fp32_refused_by else
           f"the plan computes in fp32, which {path.fp32_refused_by} refuses")
    return {"linear_attention_kernels": "torch"}, (Decision(
        setting="linear_attention_kernels", value="torch", source=source, **gap,
        reason=f"{why}: priced as transformers' PyTorch reference code for the {path.layers} layers, which keeps "
               f"{path.keeps} for backward",
        alternatives=(Alternative(value=fast, why_not=why if cpu else f"{why}; pip install {path.install} and pass "
                                  f"linear_attention_kernels={fast!r}: less memory, faster"),)),)
