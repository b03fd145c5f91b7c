"""Granite-4.0-H's and Bamba's Mamba-2 layers (perfguide/memory/linear_attention.py, ``mamba2``).

IBM's Granite-4.0-H models run a Mamba-2 mixer in 36 of their 40 layers and were priced as if every layer were an
attention block of the generic (llama) table. Without mamba-ssm, transformers runs its PyTorch reference code, which
works in fp32 and keeps every chunk's score matrices and state: at Granite-4.0-H-Micro's widths a Mamba block keeps
about six times an attention block's bytes. Checked here against what the installed transformers' real blocks save for
backward on CPU tensors (``saved_tensors_hooks``), at widths the fit (scripts/fit_mamba.py) never used, and the
kernels' path against a hand count of what mamba-ssm's fused autograd Function saves (its source, cited in the fit).
"""

from __future__ import annotations

from typing import Any

import pytest
from helpers import block_saved_bytes, cpu_plan_trains_a_step

from perfguide.errors import ConflictingConstraintsError, InvalidSetupError
from perfguide.memory.activations import layer_bytes
from perfguide.memory.linear_attention import linear_kind, linear_share, mamba2_dims
from perfguide.model.types import ModelSpec
from perfguide.setup import Setup

#: widths the fit (hidden 256-512, 2-4 attention heads, 8-16 Mamba heads, state 64-128, chunk 64-128) never used
H, HEADS, KV_HEADS = 192, 3, 1
M_HEADS, STATE, GROUPS, CHUNK = 6, 48, 2, 32
LENGTHS = (128, 256)   # four and eight 32-token chunks


def _config(model_type: str, kind: str, layers: int = 2) -> dict[str, Any]:
    common = dict(model_type=model_type, hidden_size=H, intermediate_size=320, num_attention_heads=HEADS,
                  num_key_value_heads=KV_HEADS, num_hidden_layers=layers, vocab_size=512, tie_word_embeddings=False,
                  mamba_expand=2, mamba_n_heads=M_HEADS, mamba_d_head=2 * H // M_HEADS, mamba_d_state=STATE,
                  mamba_n_groups=GROUPS, mamba_chunk_size=CHUNK, mamba_d_conv=4, use_cache=False, pad_token_id=0,
                  eos_token_id=1, bos_token_id=2)
    if model_type == "bamba":   # attention where attn_layer_indices say, a Mamba-2 mixer elsewhere
        return {**common, "attn_layer_indices": list(range(layers)) if kind == "attention" else [],
                "num_logits_to_keep": None}
    return {**common, "shared_intermediate_size": 320, "num_local_experts": 0, "num_experts_per_tok": 0,
            "position_embedding_type": "rope",
            "layer_types": [kind] * layers}


def _traced(model_type: str, kind: str) -> float:
    short, long = (block_saved_bytes(_config(model_type, kind), 1, s) for s in LENGTHS)
    return (long - short) / (LENGTHS[1] - LENGTHS[0])


def _priced(model_type: str, kind: str, kernels: str = "torch") -> float:
    spec = ModelSpec.from_any(_config(model_type, kind))
    a, b = (layer_bytes(spec, Setup(micro_batch_size=1, seq_len=s, weights_dtype="bf16", optimizer="sgd",
                                    linear_attention_kernels=kernels)) for s in LENGTHS)
    return (b - a) / (LENGTHS[1] - LENGTHS[0])


@pytest.mark.parametrize("model_type", ["granitemoehybrid", "bamba"])
def test_mamba_block_is_what_the_real_block_saves(model_type: str) -> None:
    # transformers' reference code, which is what this machine runs (neither mamba-ssm nor causal-conv1d is installed)
    traced, attention = _traced(model_type, "mamba"), _traced(model_type, "attention")
    assert traced > 3 * attention                          # the reference code keeps far more than attention does ...
    assert _priced(model_type, "mamba") == pytest.approx(traced, rel=0.02)   # ... and is priced so
    # the attention block through the generic table: Granite's within 1%; Bamba's partial rotary keeps one more
    # query-wide tensor (5% here; 3 of Bamba-9B's 32 layers are attention)
    assert _priced(model_type, "attention") == pytest.approx(attention, rel=0.01 if model_type == "granitemoehybrid" else 0.06)


def test_kernels_keep_what_their_autograd_function_saves() -> None:
    """mamba-ssm's MambaSplitConv1dScanCombinedFn takes the in-projection's output and runs the convolution, the scan,
    the gated RMSNorm and the out-projection; it saves zxbcdt (the in-projection's output, 2 B), the scan's output
    ``out_x`` (inner width, 2 B) and the norm's fp32 rstd (one per group) per token. The reference code instead keeps,
    from the in-projection's output to the out-projection's input, what this test counts on real CPU tensors; the
    out-projection's own saved input is the reference code's alone (the fused Function runs that Linear inside)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")

    inner = 2 * H
    proj = 2 * inner + 2 * GROUPS * STATE + M_HEADS
    kernels = proj * 2 + inner * 2 + GROUPS * 4
    seen: dict[int, int] = {}

    def pack(t: Any) -> Any:
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    def reference(seq: int) -> int:
        """Bytes saved from the in-projection's output through the out-projection (inclusive), the fused span."""
        seen.clear()
        torch.manual_seed(0)
        config = transformers.AutoConfig.for_model(**_config("granitemoehybrid", "mamba", layers=1))
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).train()
        mixer = model.model.layers[0].mamba
        params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        hooks = []
        state: dict[str, Any] = {}

        def start(module: Any, args: Any, out: Any) -> None:   # after in_proj: count from here
            state["ctx"] = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
            state["ctx"].__enter__()
            pack(out)   # zxbcdt itself, which the split path's views keep

        def stop(module: Any, args: Any, out: Any) -> None:     # after out_proj: stop
            state["ctx"].__exit__(None, None, None)

        hooks.append(mixer.in_proj.register_forward_hook(start))
        hooks.append(mixer.out_proj.register_forward_hook(stop))
        try:
            ids = torch.randint(0, 512, (1, seq))
            model(input_ids=ids, labels=ids, use_cache=False)
        finally:
            for h in hooks:
                h.remove()
        return sum(n for ptr, n in seen.items() if ptr not in params)

    short, long = (reference(s) for s in LENGTHS)
    reference_per_token = (long - short) / (LENGTHS[1] - LENGTHS[0])
    priced_gap = _priced("granitemoehybrid", "mamba", "torch") - _priced("granitemoehybrid", "mamba", "mamba_ssm")
    assert priced_gap == pytest.approx(reference_per_token - kernels, rel=0.01)


def test_catalog_widths_and_share() -> None:
    spec = ModelSpec.from_any("ibm-granite/granite-4.0-h-small")
    dims = mamba2_dims(spec)
    assert dims is not None and linear_kind(spec) == "mamba2" and linear_share(spec) == 36 / 40
    config = spec.config
    assert dims["md"] == config["mamba_n_heads"] * config["mamba_d_head"] == config["mamba_expand"] * config["hidden_size"]
    assert dims["mhl"] == config["mamba_n_heads"] * config["mamba_chunk_size"]
    assert mamba2_dims(ModelSpec.from_any("meta-llama/Llama-3.1-8B")) is None


def test_kernel_of_the_other_kind_is_refused() -> None:
    spec = ModelSpec.from_any("ibm-granite/granite-4.0-h-micro")
    with pytest.raises(InvalidSetupError, match="accepted: 'torch' or 'mamba_ssm'"):
        layer_bytes(spec, Setup(micro_batch_size=1, seq_len=256, weights_dtype="bf16", linear_attention_kernels="fla"))
    # mamba-ssm's Triton kernels take fp32 inputs: priced, unlike fla
    assert layer_bytes(spec, Setup(micro_batch_size=1, seq_len=256, linear_attention_kernels="mamba_ssm")) > 0


def test_plan_names_the_kernels_and_honours_them() -> None:
    import perfguide

    rec = perfguide.recommend("ibm-granite/granite-4.0-h-micro", "train_gpu_one", hardware="a100-80gb", seq_len=4096)
    decision = next(d for d in rec.decisions if d.setting == "linear_attention_kernels")
    assert decision.value == "torch" and rec.setup.linear_attention_kernels == "torch"
    assert decision.alternatives[0].value == "mamba_ssm" and "mamba-ssm" in decision.alternatives[0].why_not
    # 36 Mamba layers x 4,096 tokens x (the reference code's per-token bytes less the kernels'): well over 10 GiB
    assert decision.number and decision.number > 10 * 2**30
    forced = perfguide.recommend("ibm-granite/granite-4.0-h-micro", "train_gpu_one", hardware="a100-80gb",
                                 seq_len=4096, linear_attention_kernels="mamba_ssm")
    assert forced.setup.linear_attention_kernels == "mamba_ssm"
    with pytest.raises(ConflictingConstraintsError, match="does not run .* Mamba-2 layers"):
        perfguide.recommend("ibm-granite/granite-4.0-h-micro", "train_gpu_one", hardware="a100-80gb", seq_len=4096,
                            linear_attention_kernels="fla")
    with pytest.raises(ConflictingConstraintsError, match="does not run .* gated-DeltaNet layers"):
        perfguide.recommend("Qwen/Qwen3.5-0.8B", "train_gpu_one", hardware="a100-80gb", seq_len=1024,
                            linear_attention_kernels="mamba_ssm")


def test_padding_free_needs_the_kernels_on_mamba_layers() -> None:
    # transformers' reference code raises on a packed row's seq_idx (integrations/hub_kernels.py): only mamba-ssm keeps
    # packed sequences apart, so padding-free packing is offered with the kernels only
    import perfguide

    plan = perfguide.recommend("ibm-granite/granite-4.0-h-micro", "train_gpu_one", hardware="h100", seq_len=4096,
                               avg_seq_len=1000)
    assert plan.setup.linear_attention_kernels == "torch" and not plan.setup.padding_free
    with pytest.raises(ConflictingConstraintsError, match="mamba-ssm"):
        perfguide.recommend("ibm-granite/granite-4.0-h-micro", "train_gpu_one", hardware="h100", seq_len=4096,
                            avg_seq_len=1000, padding_free=True)


@pytest.mark.parametrize("finetune", ["full", "lora"])
def test_hybrid_plan_trains_a_step(finetune: str, tmp_path: Any) -> None:
    # the plan's TrainingArguments and prepare_model through transformers' Trainer on a tiny Granite-4.0-H (three Mamba
    # layers and one attention layer, transformers' reference code: what this machine runs)
    config = {**_config("granitemoehybrid", "mamba", layers=4), "layer_types": ["mamba"] * 3 + ["attention"]}
    rec = cpu_plan_trains_a_step(config, finetune, tmp_path)
    assert rec.setup.linear_attention_kernels == "torch"
