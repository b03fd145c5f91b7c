"""Layers priced whole by kind (perfguide/memory/linear_attention.py ``kind_mean_per_token``): NVIDIA Nemotron-H's four
kinds and Falcon-H1's hybrid layer.

Nemotron-H (Nemotron-3 Nano / Super / Ultra) stacks single-mixer layers of four kinds: a Mamba-2 mixer, attention, a
dense ReLU^2 MLP, a MoE block. Each layer was priced as a whole attention-and-FFN block of the generic table. For
Nemotron-3-Nano-30B-A3B that was 161 KB per token per layer where transformers' reference code keeps 303 (its 23 Mamba
layers 520 KB each) and mamba-ssm's kernels 99. Checked here against what the installed transformers' real layers save
for backward on CPU tensors (``saved_tensors_hooks``), at widths scripts/fit_layer_kinds.py never used.

Falcon-H1 runs attention and a Mamba-2 mixer side by side in every layer: Falcon-H1-7B was priced at 151 KB per token
per layer, where transformers' reference code keeps 472 (a fake-tensor trace at its released widths; now 466).
"""

from __future__ import annotations

from typing import Any

import pytest
from helpers import saved_in_block

from perfguide.memory.activations import layer_bytes
from perfguide.memory.linear_attention import kind_dims, layer_kinds
from perfguide.model.types import ModelSpec
from perfguide.setup import Setup

LENGTHS = (96, 192)   # three and six 32-token chunks


def _config(kinds: list[str], latent: int | None = None) -> dict[str, Any]:
    """A Nemotron-H config at widths the fit (hidden 256-512, heads of 64-128, chunk 64-128) never used."""
    return dict(model_type="nemotron_h", hidden_size=160, layers_block_type=kinds, vocab_size=512,
                tie_word_embeddings=False, num_attention_heads=5, num_key_value_heads=1, head_dim=48,
                intermediate_size=224, mamba_num_heads=5, mamba_head_dim=40, ssm_state_size=24, n_groups=1,
                chunk_size=32, conv_kernel=4, n_routed_experts=6, num_experts_per_tok=3, moe_intermediate_size=40,
                moe_shared_expert_intermediate_size=96, n_shared_experts=1, moe_latent_size=latent, n_group=1, topk_group=1,
                use_cache=False, pad_token_id=0, eos_token_id=1, bos_token_id=2)


def _saved_per_layer(config: dict[str, Any]) -> list[float]:
    """Bytes per token each real layer saves for backward (bf16, transformers' reference code), two lengths differenced."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")

    def run(seq: int) -> list[int]:
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config),
                                                              dtype=torch.bfloat16).train()
        ids = torch.randint(0, 512, (1, seq))
        return [saved_in_block(model, block, ids) for block in model.model.layers]

    short, long = (run(s) for s in LENGTHS)
    return [(b - a) / (LENGTHS[1] - LENGTHS[0]) for a, b in zip(short, long)]


def _priced(config: dict[str, Any], kernels: str = "torch") -> float:
    spec = ModelSpec.from_any(config)
    a, b = (layer_bytes(spec, Setup(micro_batch_size=1, seq_len=s, weights_dtype="bf16", optimizer="sgd",
                                    linear_attention_kernels=kernels)) for s in LENGTHS)
    return (b - a) / (LENGTHS[1] - LENGTHS[0])


@pytest.mark.parametrize("kind", ["mamba", "attention", "mlp", "moe"])
def test_each_kind_is_what_the_real_layer_saves(kind: str) -> None:
    traced = _saved_per_layer(_config([kind, kind]))[1]
    assert _priced(_config([kind, kind])) == pytest.approx(traced, rel=0.02)


def test_latent_moe_is_what_the_real_layer_saves() -> None:
    # Nemotron-3 Super / Ultra route in a latent space (moe_latent_size): the dispatch copies are latent-wide
    config = _config(["moe", "moe"], latent=64)
    assert _priced(config) == pytest.approx(_saved_per_layer(config)[1], rel=0.02)


def test_a_mixed_stack_is_the_mean_of_its_layers() -> None:
    # the depth's mean against every real layer of a stack of all four kinds (layer_bytes is the mean per layer)
    kinds = ["mamba", "moe", "mamba", "attention", "mlp", "mamba"]
    per_layer = _saved_per_layer(_config(kinds))
    assert _priced(_config(kinds)) * len(kinds) == pytest.approx(sum(per_layer), rel=0.02)
    assert max(per_layer) > 3 * min(per_layer)   # the kinds differ: one block's table could not price them


def test_catalog_nano_kinds_and_widths() -> None:
    spec = ModelSpec.from_any("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16")
    kinds = layer_kinds(spec)
    assert kinds is not None and len(kinds) == 52
    assert (kinds.count("mamba"), kinds.count("moe"), kinds.count("attention")) == (23, 23, 6)
    config, dims = spec.config, kind_dims(spec)
    assert dims["md"] == config["mamba_num_heads"] * config["mamba_head_dim"]
    assert dims["si"] == config["moe_shared_expert_intermediate_size"]            # 3,712: the shared expert's width
    assert dims["ir"] == config["num_experts_per_tok"] * config["moe_intermediate_size"]
    assert layer_kinds(ModelSpec.from_any("ibm-granite/granite-4.0-h-micro")) is None


def test_plan_prices_the_reference_code_and_names_the_kernels() -> None:
    import perfguide

    rec = perfguide.recommend("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "train_gpu_one", hardware="h100",
                              seq_len=4096, finetune="lora")
    decision = next(d for d in rec.decisions if d.setting == "linear_attention_kernels")
    assert decision.value == "torch" and decision.alternatives[0].value == "mamba_ssm"
    spec = ModelSpec.from_any("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16")
    torch_bytes, kernel_bytes = (layer_bytes(spec, Setup(micro_batch_size=1, seq_len=4096, weights_dtype="bf16",
                                                         linear_attention_kernels=k)) for k in ("torch", "mamba_ssm"))
    # 23 of 52 layers keep the reference code's chunk matrices: the mean layer keeps about three times the kernels'
    assert 2.5 < torch_bytes / kernel_bytes < 3.5


def _falcon(layers: int = 2) -> dict[str, Any]:
    """A Falcon-H1 config at widths the fit (hidden 256-512, attention heads of 64-128, chunk 64-128) never used."""
    return dict(model_type="falcon_h1", hidden_size=160, num_hidden_layers=layers, vocab_size=512,
                tie_word_embeddings=False, num_attention_heads=5, num_key_value_heads=1, head_dim=48,
                intermediate_size=224, mamba_n_heads=5, mamba_d_head=40, mamba_d_ssm=200, mamba_d_state=24,
                mamba_n_groups=1, mamba_chunk_size=32, mamba_d_conv=4, use_cache=False, pad_token_id=0, eos_token_id=1,
                bos_token_id=2)


def test_falcon_h1_layer_is_what_the_real_layer_saves() -> None:
    traced = _saved_per_layer(_falcon())[1]
    assert _priced(_falcon()) == pytest.approx(traced, rel=0.02)
    assert _priced(_falcon()) > 1.5 * _priced(_falcon(), "mamba_ssm")   # the kernels keep far less


def test_catalog_falcon_h1_is_every_layer_hybrid() -> None:
    spec = ModelSpec.from_any("tiiuae/Falcon-H1-7B-Base")
    kinds = layer_kinds(spec)
    assert kinds == ["hybrid"] * spec.num_layers
    dims = kind_dims(spec)
    assert dims["md"] == spec.config["mamba_d_ssm"] == spec.config["mamba_n_heads"] * spec.config["mamba_d_head"]
    assert dims["mhl"] == spec.config["mamba_n_heads"] * spec.config["mamba_chunk_size"]


@pytest.mark.parametrize("model", ["granite", "bamba", "nemotron", "falcon"])
def test_lora_plan_leaves_the_fused_out_proj_out(model: str) -> None:
    """mamba-ssm's fused kernel takes a Mamba-2 mixer's out_proj.weight directly (the module's forward never runs),
    and peft refuses LoRA on it for Nemotron-H and Falcon-H1: the plan's LoraConfig must build on the real model, and
    the adapter perfguide prices must be the one peft builds (its trainable count)."""
    transformers = pytest.importorskip("transformers")
    import test_mamba2 as g

    import perfguide
    from perfguide.speed.rates import trainable_params

    config = {"granite": {**g._config("granitemoehybrid", "mamba", layers=4), "layer_types": ["mamba"] * 3 + ["attention"]},
              "bamba": {**g._config("bamba", "mamba", layers=3), "attn_layer_indices": [2]},
              "nemotron": _config(["mamba", "moe", "mamba", "attention", "mlp", "mamba"]), "falcon": _falcon()}[model]
    rec = perfguide.recommend(config, "train_gpu_one", hardware="a100-80gb", seq_len=1024, finetune="lora")
    assert not any(t.endswith("out_proj") for t in rec.lora_config().target_modules)
    prepared = rec.prepare_model(transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config)))
    built = sum(p.numel() for p in prepared.parameters() if p.requires_grad)
    assert trainable_params(rec.model, rec.setup) == built


def test_listed_out_proj_is_refused_where_peft_refuses_it() -> None:
    import perfguide
    from perfguide.errors import ConflictingConstraintsError, InvalidSetupError

    with pytest.raises((InvalidSetupError, ConflictingConstraintsError), match="out_proj"):
        perfguide.recommend(_falcon(), "train_gpu_one", hardware="a100-80gb", seq_len=1024, finetune="lora",
                            lora={"r": 8, "target_modules": ("q_proj", "out_proj")})


@pytest.mark.parametrize(("model", "packing", "kernels"), [
    ("Qwen/Qwen3.5-0.8B", True, "fla"), ("Qwen/Qwen3.5-0.8B", False, "torch"),
    ("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", True, "mamba_ssm"), ("ibm-granite/granite-4.0-h-micro", False, "torch"),
])
def test_check_reads_the_kernels_a_packed_run_needs(model: str, packing: bool, kernels: str, tmp_path: Any) -> None:
    """No config key names what runs a hybrid's recurrent layers. A packed run (axolotl's sample_packing) only runs
    with the kernels installed (transformers' reference code raises on the packed rows' cu_seqlens / seq_idx), so
    ``perfguide check`` prices it with them and says so; an unpacked one gets the reference code, as a plan would."""
    import perfguide

    path = tmp_path / "run.yml"
    path.write_text(f"base_model: {model}\nsequence_len: 2048\nsample_packing: {str(packing).lower()}\nmicro_batch_size: 1\n"
                    "adapter: lora\nlora_r: 16\nlora_target_modules: [q_proj, v_proj]\nbf16: true\n"
                    "flash_attention: true\n", encoding="utf-8")
    c = perfguide.check(model, path, hardware="a100-80gb")
    assert c.setup.linear_attention_kernels == kernels and c.setup.padding_free == packing
    said = next(s for s in c.read if s.field == "linear_attention_kernels")
    assert ("only with" in said.source) == packing
