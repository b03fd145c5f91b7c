"""Models that arrive adapted, partly frozen or quantized are planned as they are: a PeftModel as the adapter it has
(round trip: the plan's LoraConfig rebuilds the same adapter on a fresh base), frozen parameters as frozen, a
bitsandbytes module as quantized. And QLoRA memory is what ``prepare_model`` really leaves: bytes measured on a
real 4-bit / 8-bit CPU model after PEFT's kbit preparation."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
pytest.importorskip("bitsandbytes")

try:  # tests/ as a plain folder or as a package
    from helpers import make_rec, one_line, tiny_model
except ImportError:  # pragma: no cover
    from tests.helpers import make_rec, one_line, tiny_model

import perfguide  # noqa: E402
from perfguide import ModelSpec, Setup  # noqa: E402
from perfguide.errors import ConflictingConstraintsError  # noqa: E402
from perfguide.memory.ledger import ledger  # noqa: E402

QV = dict(r=8, lora_alpha=16, lora_dropout=0.1, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")


def adapted_names(model) -> set[str]:
    return {n.removeprefix("base_model.model.") for n, m in model.named_modules() if isinstance(m, peft.tuners.lora.LoraLayer)}


def trainable(model) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def test_peft_model_is_planned_as_the_adapter_it_has_and_round_trips():
    base_count = sum(p.numel() for p in tiny_model().parameters())
    have = peft.get_peft_model(tiny_model(), peft.LoraConfig(**QV))
    rec = perfguide.recommend(have, "train_cpu", seq_len=16, global_batch_size=4)
    lora = rec.setup.lora
    assert lora is not None and (lora.r, lora.alpha, lora.dropout) == (8, 16, 0.1)
    assert set(lora.target_modules) == {"self_attn.q_proj", "self_attn.v_proj"}
    assert rec.model.total_params == base_count  # the base, not base + adapters
    assert ledger(rec.model, rec.setup).trainable_params == trainable(have)
    # round trip: the plan's LoraConfig on a fresh base builds the same adapter
    again = peft.get_peft_model(tiny_model(), rec.lora_config())
    assert adapted_names(again) == adapted_names(have) and trainable(again) == trainable(have)
    assert rec.prepare_model(have) is have  # the plan's own adapter is kept, not wrapped again


def test_a_different_adapter_in_the_request_conflicts_with_the_one_the_model_has():
    have = peft.get_peft_model(tiny_model(), peft.LoraConfig(**QV))
    with pytest.raises(ConflictingConstraintsError) as info:
        perfguide.recommend(have, "train_cpu", seq_len=16, lora={"r": 4})
    one_line(info, "r=8", "get_base_model")
    with pytest.raises(ConflictingConstraintsError) as info:
        perfguide.recommend(have, "train_cpu", seq_len=16, finetune="full")
    one_line(info, "finetune='full'")


def test_frozen_parameters_get_no_gradients_or_optimizer_state():
    model = tiny_model()
    for p in [*model.model.embed_tokens.parameters(), *model.model.layers[0].parameters()]:
        p.requires_grad_(False)
    spec = ModelSpec.from_any(model)
    want = trainable(model)
    assert spec.trainable_params == want < spec.total_params
    est = perfguide.estimate(model, Setup(device="cpu", optimizer="adamw_torch", micro_batch_size=2, seq_len=16))
    assert est.gradients == want * 4 and est.optimizer_states == 2 * want * 4  # fp32 grads, two fp32 AdamW moments
    full = perfguide.estimate(tiny_model(), Setup(device="cpu", optimizer="adamw_torch", micro_batch_size=2, seq_len=16))
    assert full.gradients == spec.total_params * 4  # control: nothing frozen, everything priced


def _quantized(tmp_path, weights_dtype, spec, **setup):
    rec = make_rec({"device": "cpu", "weights_dtype": weights_dtype, "lora": {"r": 4}, "optimizer": "adamw_torch", **setup}, spec=spec)
    return rec, transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base", **rec.model_kwargs())


def _bytes(model) -> int:
    """Every stored byte of the model's parameters, bnb's quantization state included (absmax, nested absmax, SCB)."""
    def nbytes(t):
        return t.numel() * t.element_size()

    total = 0
    for p in model.parameters():
        total += nbytes(p)
        state = getattr(p, "quant_state", None)
        if state is not None:
            total += nbytes(state.absmax) + (nbytes(state.state2.absmax) if state.state2 is not None else 0)
        if getattr(p, "SCB", None) is not None:
            total += nbytes(p.SCB)
    return total


@pytest.mark.parametrize("weights_dtype", ["nf4", "int8"])
def test_qlora_memory_is_what_prepare_model_leaves(tmp_path, weights_dtype):
    """bnb 0.50.2 quantizes on CPU for real (Params4bit uint8 / Int8Params int8); PEFT's kbit preparation then casts
    every other parameter (embeddings, head, norms) to fp32, doubling them."""
    base = tiny_model(vocab_size=512, hidden_size=64, intermediate_size=128)
    base.save_pretrained(tmp_path / "base")
    spec = ModelSpec.from_any(base)
    rec, model = _quantized(tmp_path, weights_dtype, spec)
    loaded = _bytes(model)
    prepared = rec.prepare_model(model)
    measured = _bytes(prepared)
    stored = {p.dtype for n, p in prepared.named_parameters() if "lora_" not in n and "layers" in n and "proj" in n}
    assert stored == ({torch.uint8} if weights_dtype == "nf4" else {torch.int8})
    linear = sum(m.weight.numel() for m in base.modules() if isinstance(m, torch.nn.Linear) and m is not base.lm_head)
    rest = spec.total_params - linear
    assert measured - loaded >= rest * 2  # the upcast: every non-quantized 16-bit parameter doubled (+adapters)
    priced = ledger(spec, rec.setup).weight_bytes
    # nf4: absmax blocks are rounded per tensor in bnb, over all Linears at once here (a few bytes)
    assert abs(measured - priced) <= 64, (measured, priced)
    assert priced - rest * 2 < measured * 0.7  # control: 16-bit non-quantized weights would miss a third


@pytest.mark.parametrize("weights_dtype", ["nf4", "int8"])
def test_a_run_without_kbit_preparation_keeps_the_rest_16_bit(tmp_path, weights_dtype):
    """kbit_upcast=False (litgpt-style runs): prepare_model freezes the base without peft's fp32 cast, and the plan
    prices exactly the bytes that leaves, the non-quantized parameters at their loaded 16 bits."""
    base = tiny_model(vocab_size=512, hidden_size=64, intermediate_size=128)
    base.save_pretrained(tmp_path / "base")
    spec = ModelSpec.from_any(base)
    rec, model = _quantized(tmp_path, weights_dtype, spec, kbit_upcast=False)
    loaded = _bytes(model)
    prepared = rec.prepare_model(model)
    adapters = sum(p.numel() * p.element_size() for n, p in prepared.named_parameters() if "lora_" in n)
    assert _bytes(prepared) - adapters == loaded  # nothing upcast
    assert {p.dtype for n, p in prepared.named_parameters() if "norm" in n} == {torch.bfloat16}
    priced = ledger(spec, rec.setup).weight_bytes
    assert abs(_bytes(prepared) - priced) <= 64, (_bytes(prepared), priced)
    upcast = ledger(spec, rec.setup.replace(kbit_upcast=True)).weight_bytes
    linear = sum(m.weight.numel() for m in base.modules() if isinstance(m, torch.nn.Linear) and m is not base.lm_head)
    assert upcast - priced == (spec.total_params - linear) * 2  # control: the cast doubles every other parameter


def test_a_quantized_module_is_planned_quantized(tmp_path):
    base = tiny_model(vocab_size=512, hidden_size=64, intermediate_size=128)
    base.save_pretrained(tmp_path / "base")
    for dtype in ("nf4", "int8"):
        _, model = _quantized(tmp_path, dtype, ModelSpec.from_any(base))
        spec = ModelSpec.from_any(model)
        assert spec.quantization == dtype and spec.total_params == ModelSpec.from_any(base).total_params
    qlora = perfguide.recommend(ModelSpec.from_any(_quantized(tmp_path, "nf4", ModelSpec.from_any(base))[1]), hardware="a100-80gb", seq_len=32)
    assert qlora.setup.weights_dtype == "nf4" and qlora.setup.lora is not None
    int8 = ModelSpec.from_any(_quantized(tmp_path, "int8", ModelSpec.from_any(base))[1])
    served = perfguide.recommend(int8, "infer_gpu_one", hardware="a100-80gb", seq_len=32)
    assert served.setup.weights_dtype == "int8"
    with pytest.raises(ConflictingConstraintsError) as info:
        perfguide.recommend(int8, hardware="a100-80gb", seq_len=32)
    one_line(info, "8-bit")


def test_dora_trains_a_magnitude_per_adapted_linear():
    """PEFT's DoRA adds one trainable vector of out_features per adapted Linear to the LoRA pair: the ledger counts
    what get_peft_model(use_dora=True) leaves trainable on a real model (the PEFT method comparison's DoRA run prints
    9,289,728 on Llama-3.2-3B: 9,175,040 for rank 32 on q/v plus 28 x (3072 + 1024))."""
    have = peft.get_peft_model(tiny_model(), peft.LoraConfig(**QV, use_dora=True))
    spec = ModelSpec.from_any(tiny_model())
    lora = {"r": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj"], "use_dora": True}
    dora = ledger(spec, Setup(task="train", lora=lora))
    assert dora.trainable_params == trainable(have) > ledger(spec, Setup(task="train", lora={**lora, "use_dora": False})).trainable_params


def test_a_peft_model_of_a_type_counted_on_its_module_keeps_its_base_linears() -> None:
    """Qwen3 has no analytic counter, so its Linears are read off the module's blocks. Under get_peft_model those blocks
    also hold PEFT's base_layer and lora_A / lora_B Linears, which had been read as more block Linears: q_proj and v_proj
    counted twice, and every Linear scaled down to fit the stored parameters (73,728 -> 43,904)."""
    config = transformers.Qwen3Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, head_dim=16, vocab_size=256)
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(config)
    base = ModelSpec.from_any(model)
    adapted = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    spec = ModelSpec.from_any(adapted)
    # the model's own Linears: PEFT's wrapper is no nn.Linear, the base_layer inside it is
    real = sum(m.weight.numel() for n, m in model.model.layers.named_modules() if isinstance(m, torch.nn.Linear) and "lora_" not in n)
    assert spec.block_linears == base.block_linears and spec.linear_params == base.linear_params == real
    trainable = sum(p.numel() for p in adapted.parameters() if p.requires_grad)
    assert ledger(spec, Setup(micro_batch_size=1, seq_len=16, lora=spec.adapter)).trainable_params == trainable


def test_a_peft_model_with_target_parameters_prices_its_expert_adapters() -> None:
    """A live MoE PeftModel whose LoraConfig names the fused expert stacks (target_parameters): peft's ParamWrapper
    modules are no Linears, their adapters are no expert weights, and the adapter read back trains what peft trains."""
    from helpers import moe_config

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**moe_config("qwen3_moe", 80, 56, 5, 2)),
                                                          dtype=torch.float32)
    base = ModelSpec.from_any(model)
    stacks = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
    adapted = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"], target_parameters=stacks))
    spec = ModelSpec.from_any(adapted)
    assert (spec.block_linears, spec.expert_params) == (base.block_linears, base.expert_params)
    assert spec.adapter is not None and set(spec.adapter.target_parameters) == set(stacks)
    trainable = sum(p.numel() for p in adapted.parameters() if p.requires_grad)
    assert ledger(spec, Setup(micro_batch_size=1, seq_len=16, weights_dtype="fp32", lora=spec.adapter)).trainable_params == trainable
