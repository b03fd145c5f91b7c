"""Seconds saved when the eager chains of a Llama-family block (RMSNorm, rotary embedding, SwiGLU) run as one
fused kernel each (Liger's Triton kernels; under torch.compile, from the share of the eager bytes still charged).

transformers runs each chain as a dozen small ops (the fp32 upcast, pow, mean, rsqrt, the casts back...): their bytes
are traced in isolation (``data/traffic.json`` ``components``, scripts/fit_traffic.py). A fused kernel reads its inputs
and writes its outputs once (``data/techniques.json`` ``fused_*_bytes_per_element``, counted from Liger's kernels).
"""

from __future__ import annotations

from typing import Any

from ..data.techniques import constant
from .tiled_mlp import tiles_mlp


def chain_seconds_saved(spec: Any, setup: Any, bandwidth: float, eager_scale: float = 1.0) -> float:
    """Seconds per micro-step saved by running the three chains fused: per token and block, two norms, rotary on q
    and k, and the MLP's intermediate, each the eager bytes per element (times ``eager_scale``, the share of them
    the step model still charges) minus the fused kernel's. A checkpointed block's re-run forward is not counted."""
    from ..speed import traffic

    parts = traffic.coefficients(spec, setup).components
    if not parts:
        return 0.0
    regime = traffic.traffic_regime(setup)                       # the regime the eager bytes were read in
    wide = 2.0 if regime in ("fp32", "amp") else 1.0             # the norms see the fp32 residual stream under AMP
    narrow = 2.0 if regime == "fp32" else 1.0                    # q, k, gate and up leave 16-bit Linears under AMP
    qk = (spec.num_attention_heads + spec.num_key_value_heads) * spec.head_dim
    glu = spec.active_intermediate_size if spec.gated_mlp and not tiles_mlp(setup) else 0   # HF's MLP in a tiled MLP's shards
    per_token = (2 * spec.hidden_size * (eager_scale * parts["rmsnorm_per_h"] - wide * constant("fused_rmsnorm_bytes_per_element"))
                 + qk * (eager_scale * parts["rope_per_qk"] - narrow * constant("fused_rope_bytes_per_element"))
                 + glu * (eager_scale * parts["swiglu_per_i"] - narrow * constant("fused_swiglu_bytes_per_element")))
    tokens = setup.micro_batch_size * setup.seq_len
    return traffic.seconds(max(0.0, per_token) * tokens * spec.total_layers, bandwidth)
