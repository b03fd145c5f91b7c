"""Model types that had no activation table of their own (stop 72, bench/family_audit.py).

An unknown type resolved to the generic (dense Llama) table. For a MoE type that table has no term for the router,
the routed copies or the top-k indices: ERNIE-4.5-21B-A3B kept 1.75x and Trinity-Mini 2.3x what perfguide priced per
token at their released widths (fake-tensor traces), and ERNIE's shared experts were not read at all
(``moe_num_shared_experts``). Dense types with other blocks were off both ways: Apertus (xIELU, q/k norms) 0.73 at
Apertus-8B's widths, HyperCLOVA X (post-norms) 0.80, EXAONE 4 (q/k norms, post-norms) 0.83, and Arcee's AFM (a plain
ReLU^2 MLP) 1.55. Checked against what the real block saves on CPU tensors (``saved_tensors_hooks``, no tracer) at
widths none of the fits used.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import block_saved_bytes

import perfguide
from perfguide.memory.activations import layer_bytes, spec_family, widest_layer_excess
from perfguide.model.types import ModelSpec
from perfguide.setup import Setup

H, IE, E, K, HEADS, KV_HEADS, HD = 96, 48, 6, 3, 6, 2, 16
B, S = 2, 32
COMMON = {"hidden_size": H, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HD,
          "num_hidden_layers": 2, "vocab_size": 512, "max_position_embeddings": 1024, "tie_word_embeddings": False,
          "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2}
DENSE = {**COMMON, "intermediate_size": 320}
#: shapes the fits did not use; the MoE types with every layer routed and one shared expert of the routed width
CONFIGS: dict[str, dict[str, Any]] = {
    "ernie4_5_moe": {**COMMON, "model_type": "ernie4_5_moe", "intermediate_size": 4 * H, "moe_intermediate_size": IE,
                     "moe_num_experts": E, "moe_k": K, "moe_num_shared_experts": 1, "moe_layer_start_index": 0,
                     "moe_layer_end_index": 1, "moe_layer_interval": 1, "use_bias": False},
    "afmoe": {**COMMON, "model_type": "afmoe", "intermediate_size": 4 * H, "moe_intermediate_size": IE, "num_experts": E,
              "num_experts_per_tok": K, "num_shared_experts": 1, "num_dense_layers": 0,
              "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 4096},
    "apertus": {**DENSE, "model_type": "apertus"},
    "arcee": {**DENSE, "model_type": "arcee"},
    "hyperclovax": {**DENSE, "model_type": "hyperclovax", "use_post_norm": True, "residual_multiplier": 0.25},
    # EXAONE 4's global layers rotate q and k too where no sliding window is set (its 1.2B): both blocks rotate
    "exaone4": {**DENSE, "model_type": "exaone4", "layer_types": ["full_attention"] * 2, "sliding_window": None},
}


def _per_token(config: dict[str, Any]) -> tuple[float, float]:
    """(priced, saved) bytes per token of one block: two batch sizes differenced, so per-call constants cancel."""
    setup = Setup(task="train", micro_batch_size=B, seq_len=S, weights_dtype="bf16", optimizer="sgd")
    priced = layer_bytes(ModelSpec.from_any(config), setup) / (B * S)
    saved = (block_saved_bytes(config, 2 * B, S) - block_saved_bytes(config, B, S)) / (B * S)
    return priced, saved


def _tracer_ratio(config: dict[str, Any], spec: ModelSpec) -> float:
    """Priced over traced bytes per token of one block at the config's widths: the tracer (CUDA's kernel choice
    emulated) at 64 and 128 tokens, differenced, so per-block constants cancel."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    from fit_activations import block_bytes

    setups = [Setup(micro_batch_size=1, seq_len=s, optimizer="sgd", weights_dtype="bf16") for s in (64, 128)]
    traced = [block_bytes(config, setup) for setup in setups]
    priced = [layer_bytes(spec, setup) for setup in setups]
    return (priced[1] - priced[0]) / (traced[1] - traced[0])


@pytest.mark.parametrize("model_type", sorted(CONFIGS))
def test_priced_block_is_what_the_real_block_saves(model_type: str) -> None:
    # block 1 of the AFMoE config is a global-attention layer, which does not rotate q and k: the same bytes in bf16
    # as the sliding layers the table was fitted on
    priced, saved = _per_token(CONFIGS[model_type])
    assert priced == pytest.approx(saved, abs=0.5)


def test_ernie_shared_experts_are_read() -> None:
    """Ernie4_5_MoeSparseMoeBlock builds its shared experts as one MLP of moe_intermediate_size x
    moe_num_shared_experts, run on every token beside the top-6 of 64."""
    spec = ModelSpec.from_any("baidu/ERNIE-4.5-21B-A3B-PT")
    assert (spec.num_experts, spec.num_experts_per_tok, spec.num_shared_experts) == (64, 6, 2)
    assert spec.active_intermediate_size == 6 * 1536 + 2 * 1536


def test_unlisted_moe_type_takes_the_generic_moe_table() -> None:
    """A MoE type with no table of its own (HunYuan-v3 here) is priced by a MoE table, not the dense fallback: within
    15% of its real block, where the dense table priced 0.62 of it (bench/family_audit.py at stop 71)."""
    config = {**COMMON, "model_type": "hy_v3", "intermediate_size": 4 * H, "moe_intermediate_size": IE,
              "num_experts": E, "num_experts_per_tok": K, "num_shared_experts": 1}
    spec = ModelSpec.from_any(config)
    assert spec.is_moe and spec_family(spec) == "qwen3_moe"
    priced, saved = _per_token(config)
    assert 0.85 < priced / saved < 1.15


def test_moe_type_whose_every_layer_is_dense_is_priced_dense() -> None:
    """AFMoE with num_dense_layers = its depth routes no layer: a dense model. Its expert keys made it a MoE of no
    MoE layer, whose LoRA pricing divided by that zero."""
    config = {**CONFIGS["afmoe"], "num_dense_layers": 2}
    spec = ModelSpec.from_any(config)
    assert not spec.is_moe and spec.num_moe_layers in (None, 0)
    setup = Setup(device="cpu", optimizer="adamw_torch", micro_batch_size=2, seq_len=16, lora={"r": 8})
    assert perfguide.estimate(spec, setup).activations > 0


MLA = {"kv_lora_rank": 32, "q_lora_rank": 48, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16, "v_head_dim": 16}


@pytest.mark.parametrize(("model_type", "family", "was"), [
    # MiniCPM3: latent attention over a dense FFN; priced by the dense generic table at 0.77 of its block (stop 71)
    ("minicpm3", "mla", 0.77),
    # DeepSeek-V3.2: DeepSeek-V3's block plus its lightning indexer; the catalog's family had it on the mixtral table
    ("deepseek_v32", "deepseek_v3", 0.81),
])
def test_latent_attention_types_take_a_latent_attention_table(model_type: str, family: str, was: float) -> None:
    """An unknown type with latent attention takes the mla table (generic_mla), DeepSeek-V3.2 DeepSeek-V3's. Their
    values are narrower than queries and keys, which sends CPU SDPA down another kernel than CUDA's, so the check is
    the tracer (CUDA's kernel choice emulated) at the config class's widths (MiniCPM3-4B's; DeepSeek-V3.2's with 8
    experts): within 5%, where the tables they had priced ``was`` of it (bench/family_audit.py at stop 71)."""
    transformers = pytest.importorskip("transformers")
    config = {**transformers.AutoConfig.for_model(model_type).to_dict(), "num_hidden_layers": 2, "vocab_size": 512,
              "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2}
    config.pop("mlp_layer_types", None)
    if model_type == "deepseek_v32":
        config.update({"n_routed_experts": 8, "mlp_layer_types": ["sparse"] * 2, "layer_types": ["indexed_attention"] * 2,
                       "n_group": 1, "topk_group": 1})   # 8 experts: one routing group
    spec = ModelSpec.from_any(config)
    assert spec.is_mla and spec_family(spec) == family
    assert 0.95 < _tracer_ratio(config, spec) < 1.05


def test_traced_depth_cuts_every_per_layer_list() -> None:
    """The tracer builds one- and two-block models of a config; transformers 5 validates ``mlp_layer_types`` (GLM-4.7-
    Flash, DeepSeek-V3.2) against the depth as it does ``layer_types``, so both lists are cut to the depth."""
    transformers = pytest.importorskip("transformers")
    from perfguide.memory.tracing.build import with_depth

    config = {**COMMON, **MLA, "model_type": "deepseek_v32", "num_hidden_layers": 3, "num_key_value_heads": HEADS,
              "layer_types": ["indexed_attention"] * 3, "mlp_layer_types": ["dense", "sparse", "sparse"],
              "index_head_dim": 16, "index_n_heads": 2, "index_topk": 16, "n_routed_experts": E, "num_experts_per_tok": K}
    cut = with_depth(config, 2)
    assert cut["mlp_layer_types"] == ["dense", "sparse"] and cut["layer_types"] == ["indexed_attention"] * 2
    built = transformers.AutoConfig.for_model(**{k: v for k, v in cut.items()})
    assert built.num_hidden_layers == 2


def test_granite_moe_priced_as_the_mixtral_block_it_runs() -> None:
    """Granite-3 MoE: Llama's attention, a softmax top-k router and grouped_mm experts, Mixtral's block; the generic MoE
    table (Qwen3-MoE's per-head q/k norms) priced it 9% over at the audit's widths, so it shares Mixtral's table."""
    config = {**COMMON, "model_type": "granitemoe", "intermediate_size": IE, "num_local_experts": E,
              "num_experts_per_tok": K}
    assert spec_family(ModelSpec.from_any(config)) == "mixtral"
    priced, saved = _per_token(config)
    assert priced == pytest.approx(saved, rel=0.01)


def test_phi35_moe_priced_on_the_safe_side_of_its_block() -> None:
    """Phi-3.5-MoE at its released widths (the tracer, one routed block): the generic table priced it at 0.92 of its
    block, the generic MoE table 1.24; Mixtral's table, whose block it runs bar its LayerNorms, biases and sparsemixer
    router, 1.08."""
    spec = ModelSpec.from_any("microsoft/Phi-3.5-MoE-instruct")
    config = {**spec.config, "num_hidden_layers": 2, "vocab_size": 512, "pad_token_id": 0, "eos_token_id": 1,
              "bos_token_id": 2}
    small = ModelSpec.from_any(config)
    assert spec_family(small) == "mixtral"
    assert 1.0 < _tracer_ratio(config, small) < 1.1


@pytest.mark.parametrize(("keys", "routed"), [
    ({"moe_layer_start_index": 1, "moe_layer_end_index": 27, "moe_layer_interval": 1}, 27),   # ERNIE-4.5-21B-A3B
    ({"moe_layer_start_index": 1, "moe_layer_end_index": -1, "moe_layer_interval": 2}, 14),   # every other, to the end
    ({"moe_layer_start_index": 0, "moe_layer_end_index": 9, "moe_layer_interval": 1}, 10),
])
def test_ernie_moe_layers_counted_by_its_own_keys(keys: dict[str, int], routed: int) -> None:
    """Ernie4_5_MoeDecoderLayer routes layer i when (i + 1) % moe_layer_interval == 0 and moe_layer_start_index <= i <=
    moe_layer_end_index (-1: the last layer); counted by hand over 28 layers."""
    from perfguide.model.shape import moe_fields

    config = {"model_type": "ernie4_5_moe", "moe_num_experts": 64, "moe_k": 6, **keys}
    assert moe_fields(config, 28)["num_moe_layers"] == routed


def test_gemma4_stack_priced_at_its_mean_layer() -> None:
    """Gemma-4-31B at its released widths (the tracer, bf16): 50 sliding blocks of 16 K/V heads of 256 and 10 full
    ones of 4 K/V heads of 512 whose keys double as values. Through Gemma 3's table at the config's head_dim the stack
    was priced at 0.94 of the traced (stop 72); gemma4_text's table at the mean layer's widths within 2%. Per kind it is
    not exact (the sliding blocks 1.02, the full ones 0.92: heads of 512 leave flash attention, whose grouped K/V the
    memory-efficient kernel gets expanded), which a checkpointed recompute of a full block would see."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    from fit_activations import block_bytes

    from perfguide.memory.tracing.build import with_depth
    from perfguide.memory.tracing.step import run_step

    spec = ModelSpec.from_any("google/gemma-4-31B-it")
    text = {**spec.config["text_config"], "vocab_size": 512, "vocab_size_per_layer_input": 512}
    setups = [Setup(micro_batch_size=1, seq_len=s, optimizer="sgd", weights_dtype="bf16") for s in (64, 128)]
    three = {**text, "num_hidden_layers": 3, "layer_types": ["sliding_attention"] * 2 + ["full_attention"]}

    def activations(config: dict[str, Any], setup: Setup) -> int:
        return int(run_step(config, setup).phases["head"].parts["activations"])

    sliding = [activations(with_depth(three, 3), st) - activations(with_depth(three, 2), st) for st in setups]
    full = [block_bytes({**text, "num_hidden_layers": 2, "layer_types": ["full_attention"] * 2}, st) for st in setups]
    traced = [(50 * a + 10 * b) / 60 for a, b in zip(sliding, full)]
    priced = [layer_bytes(spec, st) for st in setups]
    assert spec_family(spec) == "gemma4_text"
    assert 0.98 < (priced[1] - priced[0]) / (traced[1] - traced[0]) < 1.02
    # a checkpointed recompute holds one block: the widest, a full one, 0.83 of it at the mean layer; at the full
    # layer's widths 0.92 (the expanded K/V left open)
    widest = [layer_bytes(spec, st) + widest_layer_excess(spec, st) for st in setups]
    assert 0.90 < (widest[1] - widest[0]) / (full[1] - full[0]) < 0.95
