"""Gemma 2 / 3's recomputed block backward (memory/block_backward.py, data ``block_backward.post_mlp_norm``).

Gemma's block ends with an RMSNorm that computes in fp32 after the MLP, so its backward peaks at the larger of that
norm's fp32 backward and the gated product's, not where Llama's does. Hand counts from the ops, the price at real
Gemma 3 shapes, then real CPU tensors (scripts/trace_gemma_block_backward.py) at shapes the forms were not fitted on.
"""

from __future__ import annotations

from typing import Any

import pytest

from perfguide.memory import activations as act
from perfguide.memory.block_backward import block_backward_bytes
from perfguide.model.types import ModelSpec
from perfguide.setup import LoraSpec, Setup

try:
    from test_block_backward import ALL, _trace_script
except ImportError:  # run as a package
    from tests.test_block_backward import ALL, _trace_script

TOKENS = 4096


def gemma(model_type: str = "gemma3_text", h: int = 1152, i: int = 6912, heads: int = 4, kv: int = 1, head_dim: int = 256) -> ModelSpec:
    """google/gemma-3-1b-pt's text decoder by default (config.json: h 1152, FFN 6912, 4 heads of 256, 1 kv head);
    ``model_type``: the same dimensions read as another family's."""
    spec = ModelSpec.from_any({"model_type": "gemma3_text", "hidden_size": h, "intermediate_size": i, "num_attention_heads": heads,
                               "num_key_value_heads": kv, "head_dim": head_dim, "num_hidden_layers": 26, "vocab_size": 262144,
                               "max_position_embeddings": 32768, "hidden_activation": "gelu_pytorch_tanh"})
    return spec.model_copy(update={"model_type": model_type})


def setup(lora: bool = False, **update: Any) -> Setup:
    base: dict[str, Any] = dict(task="train", micro_batch_size=1, seq_len=TOKENS, weights_dtype="bf16", gradient_checkpointing=True,
                                optimizer="adamw_torch", attn_implementation="sdpa",
                                lora=LoraSpec(r=8, alpha=16, target_modules=ALL) if lora else None)
    return Setup(**{**base, **update})


def test_full_finetune_moments_are_the_hand_count() -> None:
    """Full fine-tuning, per hidden unit per token. The post-MLP norm's backward (Gemma3RMSNorm: x.float(), the pow /
    mean / rsqrt statistics, x * rsqrt, * (1 + w.float()), .type_as(x)) peaks in pow's backward: the mul path's fp32
    gradient of the upcast (4), mean's expanded fp32 gradient (4) and pow's three fp32 temporaries (x^1, 2 x^1, the
    product with the gradient: 12), less the fp32 normed product the weight's gradient kept (4), freed by then: 16;
    plus reentrant's recomputed block output (2 in 16 bits, 4 in fp32) less the block's input where the recompute
    saves it (an fp32 input norm's .float() returns it: 4, alive before the recompute). Non-reentrant: no block
    output, and the fp32 gradient its type_as backward made before the recompute started is freed (4; 0 in fp32,
    where type_as is a no-op). The gated product's backward: Llama's 2 tensors (4 / 8 per FFN unit) with the post-MLP
    norm's fp32 upcast and normed product freed (8), the block output and the early gradient as above."""
    full = act.activations_data().block_backward.post_mlp_norm.full
    output, saved_input = {"half": 2, "half_autocast": 2, "fp32_autocast": 4, "fp32": 4}, {"half": 0, "half_autocast": 0, "fp32_autocast": 4, "fp32": 4}
    early = act.activations_data().block_backward.post_mlp_norm.before_recompute["full"]
    assert early == {"half": 4, "half_autocast": 4, "fp32_autocast": 4, "fp32": 0}
    for case, moments in full.items():
        norm = 4 + 4 + 3 * 4 - 4
        assert moments["reentrant"]["norm"] == {"h": norm + output[case] - saved_input[case]}
        assert moments["non_reentrant"]["norm"] == {"h": norm - saved_input[case] - early[case]}
        per_i = (3 - 1) * (4 if case == "fp32" else 2)
        assert moments["reentrant"]["mlp"] == {"i": per_i, "h": output[case] - saved_input[case] - 8}
        assert moments["non_reentrant"]["mlp"] == {"i": per_i, "h": -saved_input[case] - 8 - early[case]}


def test_lora_norm_moment_is_the_hand_count() -> None:
    """LoRA: the norms' weights are frozen, so * (1 + w) keeps no normed product (nothing freed): the pow backward's
    16 + 4 = 20 of fp32 gradients, plus reentrant's 16-bit block output (2) on a 16-bit base; in peft's fp32 stream
    the stream is fp32, so the block output (4) is the input the recompute's first norm saves (-4). The gated
    product's per-FFN-unit terms are Llama's (the same MLP and peft code): 10, 6, 4."""
    data = act.activations_data().block_backward
    lora = data.post_mlp_norm.lora
    assert lora["half"]["reentrant"]["norm"]["h"] == lora["half_autocast"]["reentrant"]["norm"]["h"] == 4 + 4 + 12 + 2
    assert lora["fp32_stream"]["reentrant"]["norm"]["h"] == 4 + 4 + 12 + 4 - 4
    for case, moments in lora.items():
        for mode in ("reentrant", "non_reentrant"):
            assert moments[mode]["mlp"]["i"] == data.in_flight_per_token[case]["non_reentrant"]["i"]


def test_gemma_3_1b_prices_the_larger_moment() -> None:
    """Gemma 3 1B (FFN = 6 h): a bf16 full fine-tune under transformers 4.x (reentrant) holds max(18 h, 4 i - 6 h) =
    20,736 B per token, both moments equal at i = 6 h; Llama's coefficients priced 4 i + 2 h = 29,952. Gemma 3 4B's
    FFN is 4 h: the norm moment (18 h) is the larger. Non-reentrant (5.x): max(12 h, 4 i - 12 h) + 4 h before the
    recompute. Gemma 2 has the same block; Gemma 1 (two norms, the last before the MLP) keeps Llama's terms."""
    h, i = 1152, 6912
    assert block_backward_bytes(gemma(), setup(), "4.39.3") == TOKENS * max(18 * h, 4 * i - 6 * h) == TOKENS * 20736
    assert block_backward_bytes(gemma("llama"), setup(), "4.39.3") == TOKENS * (4 * i + 2 * h)
    assert block_backward_bytes(gemma(), setup(), "5.24.0") == TOKENS * (max(12 * h, 4 * i - 12 * h) + 4 * h)
    four_b = gemma(h=2560, i=10240, heads=8, kv=4)
    assert block_backward_bytes(four_b, setup(), "4.39.3") == TOKENS * 18 * 2560
    assert block_backward_bytes(gemma("gemma2"), setup(), "4.39.3") == block_backward_bytes(gemma("gemma3"), setup(), "4.39.3")
    assert block_backward_bytes(gemma("gemma"), setup(), "4.39.3") == block_backward_bytes(gemma("llama"), setup(), "4.39.3")
    # LoRA on a bf16 base under autocast: the gated product (6 i + 6 h) beats the norm (22 h) at 1B's FFN
    assert block_backward_bytes(gemma(), setup(lora=True, autocast="bf16"), "4.39.3") == TOKENS * (6 * i + 6 * h)


@pytest.mark.parametrize(("arch", "case", "update"), [
    ("gemma3", "full_half", {}), ("gemma3", "full_fp32_autocast", {"weights_dtype": "fp32", "autocast": "bf16"}),
    ("gemma3", "fp32_stream", {"lora": True, "weights_dtype": "nf4", "autocast": "bf16", "kbit_upcast": True}),
    ("gemma2", "full_half", {})])
def test_real_tensors_at_shapes_not_fitted(arch: str, case: str, update: dict[str, Any]) -> None:
    """Real CPU tensors, both checkpoint variants, at shapes the forms were not fitted on: h 80, FFN 480 (6 h, both
    moments near each other) with 5 heads of 16 and 5 kv heads, a global middle block, and h 112, FFN 336 (3 h,
    the norm's moment) with 7 heads of 32, 1 kv head and a local (sliding) middle block: the priced term is the
    traced rise above the recompute's saved storages (node by node, two lengths) to 1%, and at the global block those
    saved storages are what activations.layer_bytes prices to 1% in 16 bits (5% under fp32 weights with autocast:
    3.5% here, CUDA's SDPA kernel emulated where CPU's ran; test_block_backward allows 10% there), so recompute + term
    is the block's peak."""
    if case == "fp32_stream":
        pytest.importorskip("bitsandbytes")
    trace = _trace_script("trace_gemma_block_backward")
    from trace_models import model_config

    lora = bool(update.pop("lora", False))
    for h, i, dims in ((80, 480, {"heads": 5, "kv": 5, "head_dim": 16}), (112, 336, {"heads": 7, "kv": 1, "head_dim": 32, "middle": "sliding_attention"})):
        spec = ModelSpec.from_any(model_config(arch, h, i, dims))
        got = trace.in_flight(case, arch, h, i, dims)
        for mode, release in (("reentrant", "4.39.3"), ("non_reentrant", "5.24.0")):
            priced = block_backward_bytes(spec, setup(lora, seq_len=1000, **update), release) / 1000
            traced = got[mode][0] + (got["before"] if mode == "non_reentrant" else 0)   # above the start less its early gradients
            assert priced == pytest.approx(traced, rel=0.01), (h, i, mode)
        if not lora and "middle" not in dims:   # a local block's saved mask / bias is masks.py's (s x s), not layer_bytes'
            saved = trace.node_peaks(case, arch, h, i, True, dims, (128, 256))[2]
            assert act.layer_bytes(spec, setup(lora, seq_len=1000, **update)) / 1000 == pytest.approx(saved, rel=0.01 if case == "full_half" else 0.05)
