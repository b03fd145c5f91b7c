"""Qwen3.5's gated-DeltaNet layers (perfguide/memory/linear_attention.py).

Qwen3.5 and Qwen3-Next were priced as if every layer were a full-attention block of the generic (llama) table. Three
layers in four run gated DeltaNet, and without flash-linear-attention and causal-conv1d transformers runs its PyTorch
reference code, which keeps fp32 copies and every 64-token chunk's state: at Qwen3.5-9B's widths a DeltaNet block keeps
about twice an attention block's bytes. Checked here against what the installed transformers' real blocks save for
backward on CPU tensors (``saved_tensors_hooks``), at widths the fit never used, and the kernels' path against a hand
count of what flash-linear-attention's and causal-conv1d's autograd Functions save (their source, cited in the fit).
"""

from __future__ import annotations

from typing import Any

import pytest
from helpers import block_saved_bytes, cpu_plan_trains_a_step

from perfguide.errors import InvalidSetupError
from perfguide.memory.activations import layer_bytes
from perfguide.memory.linear_attention import deltanet_dims, deltanet_share, linear_block_excess, linear_extra_bytes
from perfguide.model.types import ModelSpec
from perfguide.setup import Setup

#: widths the fit (scripts/fit_linear_attention.py: hidden 256-512, heads of 128, DeltaNet heads of 64-128) never used
H, HEADS, KV_HEADS, HEAD_DIM = 192, 3, 1, 64
HK, HV, DK, DV = 3, 6, 32, 48
LENGTHS = (128, 256)   # two and four 64-token chunks: the reference code's first chunk keeps less


def _config(kind: str) -> dict[str, Any]:
    return dict(model_type="qwen3_5_text", hidden_size=H, intermediate_size=320, num_attention_heads=HEADS,
                num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM, num_hidden_layers=2, layer_types=[kind, kind],
                vocab_size=512, tie_word_embeddings=False, linear_num_key_heads=HK, linear_num_value_heads=HV,
                linear_key_head_dim=DK, linear_value_head_dim=DV, linear_conv_kernel_dim=4, use_cache=False,
                pad_token_id=0, eos_token_id=1, bos_token_id=2)


def _per_token(kind: str) -> float:
    short, long = (block_saved_bytes(_config(kind), 1, s) for s in LENGTHS)
    return (long - short) / (LENGTHS[1] - LENGTHS[0])


def _priced(kind: str, kernels: str = "torch") -> float:
    spec = ModelSpec.from_any(_config(kind))
    a, b = (layer_bytes(spec, Setup(micro_batch_size=1, seq_len=s, weights_dtype="bf16", optimizer="sgd",
                                    linear_attention_kernels=kernels)) for s in LENGTHS)
    return (b - a) / (LENGTHS[1] - LENGTHS[0])


def test_full_attention_block_is_what_the_real_block_saves() -> None:
    # Qwen3.5's gated attention (a q_proj twice as wide, its sigmoid gate, q/k norms): its own table now
    assert _priced("full_attention") == pytest.approx(_per_token("full_attention"), rel=0.01)


def test_deltanet_block_is_what_the_real_block_saves() -> None:
    # transformers' reference code, which is what this machine runs (neither fla nor causal-conv1d is installed here)
    traced, full = _per_token("linear_attention"), _per_token("full_attention")
    assert traced > 1.5 * full                         # the reference code keeps far more than attention does ...
    assert _priced("linear_attention") == pytest.approx(traced, rel=0.02)   # ... and is priced so


def test_kernels_keep_what_their_autograd_functions_save() -> None:
    """The fla path replaces the reference code's saved tensors inside the two kernel calls by what the kernels save:
    causal-conv1d's CausalConv1dFn its input x (conv channels, 2 B in bf16; the fused SiLU output is recomputed),
    fla's ChunkGatedDeltaRuleFunction q and k L2-normalised (key width each, 2 B), their fp32 inverse norms (one per
    key head each), the contiguous copy of v (value width, 2 B), g after the chunk cumsum (fp32 per value head), and A
    (64 per value head, 2 B). beta is sigmoid's output, already kept for its own backward (same storage)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.models.qwen3_5 import modeling_qwen3_5 as m

    lk, lv, conv = HK * DK, HV * DV, 2 * HK * DK + HV * DV
    kernels = conv * 2 + 2 * lk * 2 + 2 * HK * 4 + lv * 2 + HV * 4 + 64 * HV * 2
    # what the reference code saves inside the same two calls, per token, counted on real CPU tensors
    seen: dict[int, int] = {}

    def pack(t: Any) -> Any:
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    def counted(fn: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                return fn(*args, **kwargs)
        return run

    def reference(seq: int) -> int:
        seen.clear()
        torch.manual_seed(0)
        config = transformers.AutoConfig.for_model(**{**_config("linear_attention"), "num_hidden_layers": 1,
                                                      "layer_types": ["linear_attention"]})
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).train()
        inputs = {p.untyped_storage().data_ptr() for p in model.parameters()}
        saved = m.torch_chunk_gated_delta_rule, m.causal_conv1d_fn
        m.torch_chunk_gated_delta_rule, m.causal_conv1d_fn = (counted(f) for f in saved)
        try:
            ids = torch.randint(0, 512, (1, seq))
            model(input_ids=ids, labels=ids, use_cache=False)
        finally:
            m.torch_chunk_gated_delta_rule, m.causal_conv1d_fn = saved
        return sum(n for ptr, n in seen.items() if ptr not in inputs)

    short, long = (reference(s) for s in LENGTHS)
    reference_per_token = (long - short) / (LENGTHS[1] - LENGTHS[0])
    priced_gap = _priced("linear_attention", "torch") - _priced("linear_attention", "fla")
    # the inputs the reference code saves that are the kernels' inputs too (the conv's, beta) are in both counts
    assert priced_gap == pytest.approx(reference_per_token - kernels, rel=0.005)


def test_hybrid_share_and_catalog_widths() -> None:
    spec = ModelSpec.from_any("Qwen/Qwen3.5-9B")
    dims = deltanet_dims(spec)
    assert dims is not None and deltanet_share(spec) == 0.75      # full_attention_interval 4: 24 of 32 layers
    config = spec.config["text_config"]
    assert dims["lk"] == config["linear_num_key_heads"] * config["linear_key_head_dim"]
    assert dims["lv"] == config["linear_num_value_heads"] * config["linear_value_head_dim"]
    llama = ModelSpec.from_any("meta-llama/Llama-3.1-8B")
    assert deltanet_dims(llama) is None and linear_extra_bytes(llama, Setup(), "fp32") == 0


def test_fla_refuses_fp32() -> None:
    # ChunkGatedDeltaRuleFunction: "does not support float32. Please use bfloat16."
    spec = ModelSpec.from_any("Qwen/Qwen3.5-0.8B")
    with pytest.raises(InvalidSetupError, match="fp32"):
        layer_bytes(spec, Setup(micro_batch_size=1, seq_len=256, linear_attention_kernels="fla"))


def test_recompute_peak_is_one_deltanet_block() -> None:
    # layer_bytes is the depth's mean; a checkpointed block's recompute holds one whole block, here a DeltaNet one:
    # mean + (1 - share) x its excess, i.e. the attention block's bytes plus the whole excess
    spec = ModelSpec.from_any(_config("linear_attention") | {"num_hidden_layers": 4,
                                                               "layer_types": ["linear_attention"] * 3 + ["full_attention"]})
    setup = Setup(micro_batch_size=1, seq_len=256, weights_dtype="bf16")
    mean_extra = linear_extra_bytes(spec, setup, "half")
    assert deltanet_share(spec) == 0.75 and mean_extra > 0
    assert linear_block_excess(spec, setup, "half") == pytest.approx(mean_extra / 0.75 - mean_extra, abs=1)


def test_plan_names_the_kernels_and_honours_them() -> None:
    import perfguide
    from perfguide.errors import ConflictingConstraintsError

    rec = perfguide.recommend("Qwen/Qwen3.5-9B", "train_gpu_one", hardware="a100-80gb", seq_len=4096)
    decision = next(d for d in rec.decisions if d.setting == "linear_attention_kernels")
    assert decision.value == "torch" and rec.setup.linear_attention_kernels == "torch"
    assert "fla" in decision.alternatives[0].value and decision.number and decision.number > 2**30   # GiB per sample
    forced = perfguide.recommend("Qwen/Qwen3.5-9B", "train_gpu_one", hardware="a100-80gb", seq_len=4096,
                                 linear_attention_kernels="fla")
    assert forced.setup.linear_attention_kernels == "fla"
    with pytest.raises(ConflictingConstraintsError, match="fp32"):
        perfguide.recommend("Qwen/Qwen3.5-0.8B", "train_gpu_one", hardware="a100-80gb", seq_len=1024, precision="fp32",
                            linear_attention_kernels="fla")
    llama = perfguide.recommend("meta-llama/Llama-3.2-1B", "train_gpu_one", hardware="a100-80gb", seq_len=1024)
    assert all(d.setting != "linear_attention_kernels" for d in llama.decisions)


@pytest.mark.parametrize("model_type", ["qwen3_5_moe_text", "qwen3_next"])
def test_moe_hybrid_attention_block_is_what_the_real_block_saves(model_type: str) -> None:
    # Qwen3.5-MoE's and Qwen3-Next's full-attention blocks: Qwen3.5's gated attention and a Qwen2-MoE-style block (a
    # sigmoid-gated shared expert); both priced through the generic (llama) table until stop 70
    config = {**_config("full_attention"), "model_type": model_type, "moe_intermediate_size": 40, "num_experts": 6,
              "num_experts_per_tok": 3, "shared_expert_intermediate_size": 72, "norm_topk_prob": True}
    short, long = (block_saved_bytes(config, 1, s) for s in LENGTHS)
    spec = ModelSpec.from_any(config)
    a, b = (layer_bytes(spec, Setup(micro_batch_size=1, seq_len=s, weights_dtype="bf16", optimizer="sgd")) for s in LENGTHS)
    assert (b - a) == pytest.approx(long - short, rel=0.01)


@pytest.mark.parametrize("finetune", ["full", "lora"])
def test_hybrid_plan_trains_a_step(finetune: str, tmp_path: Any) -> None:
    # the plan's TrainingArguments and prepare_model through transformers' Trainer on a tiny Qwen3.5 (three DeltaNet
    # layers and one attention layer, transformers' reference code: what this machine runs)
    config = {**_config("linear_attention"), "num_hidden_layers": 4, "layer_types": ["linear_attention"] * 3 + ["full_attention"]}
    rec = cpu_plan_trains_a_step(config, finetune, tmp_path)
    assert rec.setup.linear_attention_kernels == "torch"


def test_padding_free_needs_the_kernels_on_deltanet_layers() -> None:
    # transformers hands a packed row's cu_seqlens to the DeltaNet layer; only flash-linear-attention takes them (its
    # reference code raises: integrations/hub_kernels.py), so a padding-free plan on the reference code is not offered
    import perfguide
    from perfguide.errors import ConflictingConstraintsError, InvalidSetupError

    plan = perfguide.recommend("Qwen/Qwen3.5-9B", "train_gpu_one", hardware="h100", seq_len=4096, avg_seq_len=1000)
    assert plan.setup.linear_attention_kernels == "torch" and not plan.setup.padding_free
    fla = perfguide.recommend("Qwen/Qwen3.5-9B", "train_gpu_one", hardware="h100", seq_len=4096, avg_seq_len=1000,
                              linear_attention_kernels="fla")
    assert fla.setup.padding_free
    with pytest.raises(ConflictingConstraintsError, match="flash-linear-attention"):
        perfguide.recommend("Qwen/Qwen3.5-9B", "train_gpu_one", hardware="h100", seq_len=4096, avg_seq_len=1000,
                            padding_free=True)
    with pytest.raises(InvalidSetupError, match="flash-linear-attention"):
        perfguide.estimate("Qwen/Qwen3.5-9B", {"seq_len": 4096, "padding_free": True, "avg_seq_len": 1000,
                                               "weights_dtype": "bf16"}, hardware="h100")
    llama = perfguide.recommend("meta-llama/Llama-3.1-8B", "train_gpu_one", hardware="h100", seq_len=4096, avg_seq_len=1000)
    assert llama.setup.padding_free
