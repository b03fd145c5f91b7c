"""MoE blocks' activations (data/activations.json's mixtral, qwen3_moe and qwen2_moe tables).

transformers 5 runs the experts of these models through ``grouped_mm`` by default (modeling_utils
``get_correct_experts_implementation``; integrations/moe.py ``grouped_mm_experts_forward``): per (token, expert) pair
it keeps a gathered copy of the hidden state and the expert's output, and the routing keeps fp32 probabilities and
int64 index tensors. The tables were the dense families' (aliases) until stop 37. Checked three ways: each table's
difference from its dense family by hand (read off the modules), the bytes the real block saves on CPU tensors
(``saved_tensors_hooks``, no tracer) at the same shapes, and the routed bytes' independence of how tokens split over
experts.
"""

from __future__ import annotations

from typing import Any

import pytest
from helpers import block_saved_bytes

from perfguide.memory.activations import block_dims, family_name, layer_bytes
from perfguide.memory.activations_data import activations_data
from perfguide.model.types import ModelSpec
from perfguide.setup import Setup

#: bytes per token per block a MoE block keeps beyond a dense FFN as wide as its active experts (same attention), by
#: dtype regime; dims as activations.block_dims: hk = hidden x top-k, ir = top-k x expert width, e = experts, k = top-k.
#: Mixtral (softmax in fp32, top-k renormalised in place, weights left fp32):
#: - hk: the gathered copy ``hidden_states[perm // k]`` (the up grouped_mm's saved input) and the experts' output (kept
#:   by the routing-weight multiply): 2 B each in bf16, 4 B in fp32 and under autocast (grouped_mm is on no autocast
#:   list, and transformers casts its input to the fp32 weight's dtype)
#: - ir, autocast only: the experts run in fp32 (gate_up output 8, act 4, product 4 = 16 B per unit) where a dense FFN
#:   keeps bf16 casts (8 B)
#: - h, autocast only: a dense FFN's gate_proj and up_proj keep a bf16 cast of the normed input each (4 B), the router
#:   one (2 B)
#: - e: the fp32 softmax output, 4 B per expert
#: - k: top-k indices (int64, 8), the renormalised weights (the in-place division's result, fp32, 4), the gather index
#:   perm // k (8), the permutation that sorts the weights (8), the sorted weights (fp32, 4, kept by the multiply) and
#:   the inverse permutation (8, kept by the reordering index): 40
#: - 1: the top-k sum (the division's fp32 divisor)
MIXTRAL = {
    "half": {"hk": 4, "e": 4, "k": 40, "1": 4},
    "amp": {"h": -2, "hk": 8, "ir": 8, "e": 4, "k": 40, "1": 4},
    "fp32": {"hk": 8, "e": 4, "k": 40, "1": 4},
}
#: Qwen3-MoE: Mixtral's, except that its router casts the renormalised weights back to the logits' dtype, so the sorted
#: weights the multiply keeps are 2 B where the logits are bf16 (half, and autocast's bf16 router Linear): k 38
QWEN3_MOE = {
    "half": {"hk": 4, "e": 4, "k": 38, "1": 4},
    "amp": {"h": -2, "hk": 8, "ir": 8, "e": 4, "k": 38, "1": 4},
    "fp32": {"hk": 8, "e": 4, "k": 40, "1": 4},
}
#: Qwen2-MoE (Qwen1.5-MoE-A2.7B: top-k not renormalised, so no division's result or divisor: k 40 - 4 and 1 - 4, and
#: the weights in the logits' dtype as Qwen3's); its shared expert is a dense FFN (i: nothing beyond the dense table),
#: whose output the sigmoid gate's multiply keeps (h: 2 B bf16, 4 B fp32) with the sigmoid's output (1: 2 or 4 B);
#: under autocast its gate_proj / up_proj, the router and the shared gate each keep a bf16 cast of the normed input
#: (4 casts, 8 B, against the dense FFN's 4 B: h + 4) and the shared output is bf16 (h + 2)
QWEN2_MOE = {
    "half": {"h": 2, "hk": 4, "e": 4, "k": 34, "1": 2},
    "amp": {"h": 6, "hk": 8, "ir": 8, "e": 4, "k": 34, "1": 2},
    "fp32": {"h": 4, "hk": 8, "e": 4, "k": 36, "1": 4},
}
#: frozen FFN weights (LoRA elsewhere): the gathered copy is kept only for the experts' weight gradient (hk: its 2 or
#: 4 B); under autocast the routed product is fp32 (ir: 4 B against a dense FFN's 2) and fewer casts are dropped than a
#: dense FFN drops (Mixtral / Qwen3: the router's one against gate_proj's and up_proj's two, h - 2; Qwen2-MoE: the
#: router's, the shared gate's and the shared expert's two, h + 4)
FROZEN = {
    "half": {"hk": 2},
    "amp": {"h": -2, "hk": 4, "ir": 2},
    "fp32": {"hk": 4},
}


def _minus(table: str, base: str, regime: str, part: str = "per_token") -> dict[str, float]:
    families = activations_data().families
    a = getattr(families[table].regimes[regime], part)  # type: ignore[index]
    b = getattr(families[base].regimes[regime], part)  # type: ignore[index]
    out = {k: a.get(k, 0.0) - b.get(k, 0.0) for k in {*a, *b}}
    return {k: v for k, v in out.items() if v}


@pytest.mark.parametrize("regime", ["half", "amp", "fp32"])
@pytest.mark.parametrize(("table", "base", "hand"), [("mixtral", "llama", MIXTRAL), ("qwen3_moe", "qwen3", QWEN3_MOE),
                                                     ("qwen2_moe", "llama", QWEN2_MOE)])
def test_moe_table_is_dense_plus_hand_counted_moe_terms(table: str, base: str, hand: Any, regime: str) -> None:
    assert _minus(table, base, regime) == hand[regime]
    frozen = {**FROZEN[regime], **({"h": 4} if table == "qwen2_moe" and regime == "amp" else {})}
    assert _minus(table, base, regime, "frozen_linear_inputs_per_token") == frozen


@pytest.mark.parametrize("model_type", ["mixtral", "qwen2_moe", "qwen3_moe"])
def test_moe_families_have_their_own_tables(model_type: str) -> None:
    assert family_name("llama", model_type) == model_type
    assert model_type not in activations_data().aliases


H, IE, E, K, HEADS, KV_HEADS, HD = 96, 48, 6, 3, 6, 2, 16
B, S = 2, 32


def _config(model_type: str) -> dict[str, Any]:
    """Shapes none of the fit's points used (h 96, expert width 48, 6 experts, top-3)."""
    common = {"model_type": model_type, "hidden_size": H, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
              "head_dim": HD, "num_hidden_layers": 2, "vocab_size": 512, "max_position_embeddings": 1024,
              "tie_word_embeddings": False, "num_experts_per_tok": K}
    if model_type == "mixtral":
        return {**common, "intermediate_size": IE, "num_local_experts": E}
    if model_type == "olmoe":   # intermediate_size is the expert width
        return {**common, "intermediate_size": IE, "num_experts": E, "norm_topk_prob": False}
    extra = {"shared_expert_intermediate_size": 80, "norm_topk_prob": False} if model_type == "qwen2_moe" else {"norm_topk_prob": True}
    return {**common, "intermediate_size": 4 * H, "moe_intermediate_size": IE, "num_experts": E, **extra}


@pytest.mark.parametrize("model_type", ["mixtral", "qwen2_moe", "qwen3_moe", "olmoe"])
def test_priced_moe_block_is_what_the_real_block_saves(model_type: str) -> None:
    setup = Setup(task="train", micro_batch_size=B, seq_len=S, weights_dtype="bf16", optimizer="sgd")
    priced = layer_bytes(ModelSpec.from_any(_config(model_type)), setup) / (B * S)
    saved = (block_saved_bytes(_config(model_type), 2 * B, S) - block_saved_bytes(_config(model_type), B, S)) / (B * S)
    # OLMoE extends Qwen3's table, whose per-head q/k norms keep one 4-byte rsqrt per head where OLMoE's norms over
    # the whole projections keep one per token each
    over = 4 * (HEADS + KV_HEADS - 2) if model_type == "olmoe" else 0
    assert priced - over == pytest.approx(saved, abs=0.5)


def test_block_dims_of_a_moe_spec() -> None:
    dims = block_dims(ModelSpec.from_any(_config("qwen2_moe")))
    assert (dims["i"], dims["ir"], dims["hk"], dims["e"], dims["k"]) == (K * IE + 80, K * IE, H * K, E, K)
    dense = block_dims(ModelSpec.from_any({**_config("mixtral"), "model_type": "mistral", "intermediate_size": 128}))
    assert (dense["hk"], dense["ir"], dense["e"], dense["k"]) == (0, 0, 0, 0)


def _experts_saved(torch: Any, block: Any, x: Any) -> int:
    """Bytes the MoE block's forward saves for backward, its parameters and its input left out."""
    params = {p.untyped_storage().data_ptr() for p in block.parameters()} | {x.untyped_storage().data_ptr()}
    seen: dict[int, int] = {}

    def pack(t: Any) -> Any:
        if t.untyped_storage().data_ptr() not in params:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        block(x)
    return sum(seen.values())


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_routed_bytes_do_not_depend_on_the_split(dtype: str) -> None:
    """Every routed tensor has tokens x top-k rows, so a router that sends every token to the same k experts keeps what
    a spread one keeps, and both what the hand count says: per token 2 x n x h x k (copy and output) + 4 x n per
    routed FFN unit (gate_up output, act, product) + 4 E + 40 k + 4, plus the int32 offsets (4 B per expert) once."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    config = transformers.MixtralConfig(hidden_size=H, intermediate_size=IE, num_local_experts=E, num_experts_per_tok=K)
    config._experts_implementation = "grouped_mm"
    torch.manual_seed(0)
    dt = getattr(torch, dtype)
    block = MixtralSparseMoeBlock(config).to(dt)
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.02)
    tokens = 96
    spread = _experts_saved(torch, block, torch.randn(1, tokens, H, dtype=dt, requires_grad=True))
    with torch.no_grad():   # positive inputs and only the first k router rows positive: every token to experts 0..k-1
        block.gate.weight.zero_()
        block.gate.weight[:K] = 1.0
    skewed = _experts_saved(torch, block, (torch.rand(1, tokens, H) + 1).to(dt).requires_grad_())
    n = 2 if dtype == "bfloat16" else 4
    assert spread == skewed == tokens * (2 * n * H * K + 4 * n * IE * K + 4 * E + 40 * K + 4) + 4 * E


def test_moe_family_keeps_its_dense_family_attention_tables() -> None:
    """The eager backward's transient scores are keyed by family: a Mixtral block's attention is Mistral's code, so it
    is priced with the llama entry as when mixtral was an alias of llama."""
    from perfguide.memory.masks import eager_backward_transient_bytes

    setup = Setup(task="train", micro_batch_size=B, seq_len=S, weights_dtype="bf16", optimizer="sgd", attn_implementation="eager")
    moe = ModelSpec.from_any(_config("mixtral"))
    dense = ModelSpec.from_any({**_config("mixtral"), "model_type": "mistral", "intermediate_size": K * IE})
    assert eager_backward_transient_bytes(moe, setup) == eager_backward_transient_bytes(dense, setup) > 0


#: fms-acceleration a100_80gb.csv @24bdadb, framework_config baseline-peft-bnb, Mixtral lines:
#: row_id -> (GPUs, per-device batch, mem_peak_torch_mem_alloc_in_bytes)
FMS_QLORA = {"1301": (1, 4, 42794268160), "1302": (2, 2, 21129981952), "1303": (1, 8, 60545920512),
             "1304": (2, 4, 28146350592)}


@pytest.mark.parametrize("row_id", sorted(FMS_QLORA))
def test_fms_mixtral_qlora_rows_read_as_the_table_and_loader(acc: Any, rows: Any, row_id: str) -> None:
    """HF from_pretrained with nf4 double quant, LoRA r 16 on the attention projections, packed 4096 tokens, --bf16
    autocast; one GPU: TRL's prepare_model_for_kbit_training and bf16 recast; two: FSDP, no kbit preparation."""
    gpus, batch, peak = FMS_QLORA[row_id]
    row = rows[row_id]
    assert float(row["peak_mem_value"]) == pytest.approx(peak / 2**30, abs=0.005) and row["peak_mem_unit"] == "GiB"
    setup = acc._train_setup(row, acc._spec(row["model_hf_id"]))
    assert (setup.num_gpus, setup.micro_batch_size, setup.seq_len) == (gpus, batch, 4096)
    assert (setup.weights_dtype, setup.nf4_double_quant, setup.autocast, setup.gradient_checkpointing) == ("nf4", True, "bf16", True)
    assert setup.lora is not None and (setup.lora.r, setup.lora.alpha, setup.lora.dropout) == (16, 16, 0.1)
    assert set(setup.lora.target_modules) == {f"self_attn.{p}_proj" for p in "qkvo"}
    assert (setup.strategy == "fsdp", setup.kbit_upcast, setup.kbit_recast_bf16) == (gpus == 2, gpus == 1, gpus == 1)
