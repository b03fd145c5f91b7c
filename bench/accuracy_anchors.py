"""The estimators perfguide is compared against on the same rows: accelerate estimate-memory's formula and
DeepSpeed's ZeRO model-states formula (no activations), as their users would apply them."""

from __future__ import annotations

from perfguide.memory.sharding import deepspeed_zero2_estimate, deepspeed_zero3_estimate
from perfguide.model.linears import linear_shapes
from perfguide.model.types import ModelSpec
from perfguide.setup import Setup


def accelerate_anchor(spec: ModelSpec, setup: Setup) -> int:
    """accelerate estimate-memory: fp32 size S (AutoModel, no untied head), training = max stage = 4S (fp32)
    or 2S ("float16" mixed); inference = S / k."""
    s = 4 * (spec.total_params - spec.lm_head_params)
    if setup.task == "infer":
        return s // {"fp32": 1, "bf16": 2, "fp16": 2, "int8": 4, "nf4": 8}[setup.weights_dtype]
    return 4 * s if setup.weights_dtype == "fp32" and not setup.autocast else 2 * s


def deepspeed_anchor(spec: ModelSpec, setup: Setup) -> int:
    """DeepSpeed model-states estimator (no activations): ZeRO-3 for sharded runs, ZeRO-2 formula otherwise."""
    n = setup.world_size
    if setup.strategy in ("zero3", "fsdp"):
        largest = max(spec.embedding_params, spec.lm_head_params, max((i * o for _, i, o, _ in linear_shapes(spec)), default=0))
        return deepspeed_zero3_estimate(spec.total_params, largest, n, 1, setup.offload_optimizer, setup.offload_params)[1]
    return deepspeed_zero2_estimate(spec.total_params, n, 1, setup.offload_optimizer)[1]
