"""Model reading per family kind: dense, MoE (three families), MLA, encoder-decoder, encoders with each head,
sliding/global mixes.

References are independent of perfguide's readers: parameter counts from the module transformers builds on the
meta device, expert counts by the hand formula from the config values, and KV cache bytes from the real cache
tensors after a CPU ``generate`` on tiny random models.
"""

from __future__ import annotations

from typing import Any

import pytest

from perfguide import ModelSpec
from perfguide.errors import InvalidModelError
from perfguide.memory.inference import cached_tokens, kv_cache_bytes, logits_bytes
from perfguide.setup import Setup

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

H, L, V = 64, 4, 256
QWEN3_MOE = dict(model_type="qwen3_moe", hidden_size=H, num_hidden_layers=L, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=16, intermediate_size=128, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
                 vocab_size=V, decoder_sparse_step=1, mlp_only_layers=[0], max_position_embeddings=128)
DEEPSEEK_V3 = dict(model_type="deepseek_v3", hidden_size=H, num_hidden_layers=L, num_attention_heads=4, num_key_value_heads=4,
                   intermediate_size=128, moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=2,
                   n_shared_experts=1, first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8,
                   qk_nope_head_dim=16, v_head_dim=16, vocab_size=V, n_group=2, topk_group=1, max_position_embeddings=128)
GPT_OSS = dict(model_type="gpt_oss", hidden_size=H, num_hidden_layers=L, num_attention_heads=4, num_key_value_heads=2,
               head_dim=16, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2, vocab_size=V, sliding_window=8,
               max_position_embeddings=128)
MIXTRAL = dict(model_type="mixtral", hidden_size=H, num_hidden_layers=L, num_attention_heads=4, num_key_value_heads=2,
               intermediate_size=32, num_local_experts=4, num_experts_per_tok=2, vocab_size=V, max_position_embeddings=128)
QWEN3 = dict(model_type="qwen3", hidden_size=H, num_hidden_layers=L, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
             intermediate_size=128, vocab_size=V, max_position_embeddings=128)
GEMMA2 = dict(model_type="gemma2", hidden_size=H, num_hidden_layers=L, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              intermediate_size=128, vocab_size=V, sliding_window=8, max_position_embeddings=128)
BART = dict(model_type="bart", d_model=H, encoder_layers=2, decoder_layers=3, encoder_attention_heads=4, decoder_attention_heads=4,
            encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=V, max_position_embeddings=64,
            architectures=["BartForConditionalGeneration"])
BERT = dict(model_type="bert", hidden_size=H, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, vocab_size=V,
            max_position_embeddings=64)


def _module(config: dict[str, Any], device: str = "meta") -> Any:
    hf = transformers.AutoConfig.for_model(**{k: v for k, v in config.items() if k != "architectures"})
    arch = (config.get("architectures") or [None])[0]
    cls = getattr(transformers, arch) if arch else transformers.AutoModelForCausalLM
    with torch.device(device):
        torch.manual_seed(0)
        return cls._from_config(hf) if arch else cls.from_config(hf)


def _numel(module: Any, where: str | None = None) -> int:
    return sum(p.numel() for n, p in module.named_parameters() if where is None or where in n.split("."))


# --- MoE: total vs active ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(("config", "per_expert", "moe_layers"), [
    (QWEN3_MOE, 3 * H * 32, L - 1),            # gate+up+down of width moe_intermediate_size; layer 0 is mlp_only
    (DEEPSEEK_V3, 3 * H * 32, L - 1),          # first_k_dense_replace=1
    (GPT_OSS, 3 * H * 32 + 2 * 32 + H, L),     # GPT-OSS experts carry biases (gate_up 2*I, down H)
    (MIXTRAL, 3 * H * 32, L),
])
def test_moe_total_and_active_params(config: dict[str, Any], per_expert: int, moe_layers: int) -> None:
    spec = ModelSpec.from_any(config)
    module = _module(config)
    experts, k = spec.num_experts, config["num_experts_per_tok"]
    assert spec.total_params == _numel(module)
    assert spec.expert_params == experts * per_expert * moe_layers == _numel(module, "experts")
    assert spec.active_params == spec.total_params - (experts - k) * per_expert * moe_layers
    assert spec.is_moe and (spec.num_moe_layers or L) == moe_layers


def test_moe_shared_experts_and_width() -> None:
    spec = ModelSpec.from_any(DEEPSEEK_V3)
    assert (spec.num_shared_experts, spec.moe_intermediate_size) == (1, 32)
    assert spec.active_intermediate_size == 32 * 2 + 32  # two routed + one shared expert of the expert width


def test_moe_ddp_flag_follows_how_the_experts_are_stored() -> None:
    """transformers 5 fuses a layer's experts (tests/test_moe_ddp.py runs them under real DDP): no unused-parameter walk."""
    from perfguide import recommend

    spec = ModelSpec.from_any(QWEN3_MOE)
    assert spec.is_moe and not spec.separate_expert_modules
    rec = recommend(QWEN3_MOE, "train_gpu_many", hardware="a100-80gb:2", seq_len=64, global_batch_size=8, strategy="ddp")
    assert rec.setup.strategy == "ddp" and rec.training_args_dict()["ddp_find_unused_parameters"] is False


# --- dense families without a hand counter -----------------------------------------------------------------------
def test_dense_qwen3_counts_like_its_module() -> None:
    spec = ModelSpec.from_any(QWEN3)
    assert spec.total_params == _numel(_module(QWEN3))
    assert spec.active_params == spec.total_params and not spec.is_moe and spec.head_dim == 32


GEMMA3N = dict(model_type="gemma3n_text", hidden_size=H, num_hidden_layers=L, num_attention_heads=4, num_key_value_heads=2,
               head_dim=16, intermediate_size=[128, 192, 128, 128], vocab_size=V, vocab_size_per_layer_input=V,
               hidden_size_per_layer_input=8, laurel_rank=4, altup_num_inputs=4, num_kv_shared_layers=2, sliding_window=8,
               layer_types=["sliding_attention", "full_attention"] * 2, activation_sparsity_pattern=[0.0] * L,
               max_position_embeddings=128, architectures=["Gemma3nForCausalLM"])


def test_per_layer_mlp_widths_read_as_the_widest() -> None:
    """Gemma 3n writes ``intermediate_size`` once per layer; the widest layer sets the MLP's largest tensors, and the
    count is the module's own (per-layer embeddings, AltUp and LAuReL included)."""
    spec = ModelSpec.from_any(GEMMA3N)
    assert spec.intermediate_size == 192 and spec.num_layers == L
    config = transformers.Gemma3nTextConfig(**{k: v for k, v in GEMMA3N.items() if k not in ("model_type", "architectures")})
    with torch.device("meta"):
        module = transformers.Gemma3nForCausalLM(config)
    assert spec.total_params == sum(p.numel() for p in module.parameters())


# --- KV cache against real tensors after generate ----------------------------------------------------------------
def _cache_bytes(cache: Any) -> int:
    caches = [cache.self_attention_cache, cache.cross_attention_cache] if hasattr(cache, "cross_attention_cache") else [cache]
    return sum(t.numel() * t.element_size() for c in caches for layer in c.layers
               for t in (getattr(layer, "keys", None), getattr(layer, "values", None)) if t is not None)


@pytest.mark.parametrize("config", [DEEPSEEK_V3, GEMMA2, GPT_OSS, QWEN3, BART], ids=lambda c: c["model_type"])
def test_kv_cache_matches_generate(config: dict[str, Any]) -> None:
    model = _module(config, "cpu").eval()
    batch, prompt, new = 2, 20, 5  # prompt longer than the sliding window of 8
    ids = torch.randint(3, 200, (batch, prompt))
    out = model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, return_dict_in_generate=True, pad_token_id=0)
    spec = ModelSpec.from_any(config)
    setup = Setup(task="infer", device="cpu", micro_batch_size=batch, seq_len=prompt, new_tokens=new, weights_dtype="fp32")
    cross = prompt if spec.is_encoder_decoder else 0
    assert kv_cache_bytes(spec, batch, cached_tokens(setup, spec), 4, cross_tokens=cross) == _cache_bytes(out.past_key_values)


# hybrids: raw config.json keys (layer_types derived the way each config class derives them), tiny shapes
QWEN3_NEXT = dict(model_type="qwen3_next", hidden_size=H, num_hidden_layers=L, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=16, intermediate_size=128, moe_intermediate_size=32, shared_expert_intermediate_size=32,
                  num_experts=4, num_experts_per_tok=2, vocab_size=V, linear_num_value_heads=4, linear_num_key_heads=2,
                  linear_key_head_dim=8, linear_value_head_dim=12, linear_conv_kernel_dim=4, full_attention_interval=4,
                  max_position_embeddings=128)
BAMBA = dict(model_type="bamba", hidden_size=H, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=128, vocab_size=V, attn_layer_indices=[1], mamba_n_heads=4, mamba_d_head=32, mamba_d_state=16,
             mamba_n_groups=1, mamba_d_conv=4, mamba_expand=2, max_position_embeddings=128)
NEMOTRON_H = dict(model_type="nemotron_h", hidden_size=H, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=16, intermediate_size=128, vocab_size=V, hybrid_override_pattern="M*-", mamba_num_heads=4,
                  mamba_head_dim=32, ssm_state_size=16, n_groups=1, conv_kernel=4, expand=2, max_position_embeddings=128,
                  n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1)  # no 'E' layer: unused
LFM2 = dict(model_type="lfm2", hidden_size=H, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, vocab_size=V, full_attn_idxs=[1], conv_L_cache=3, max_position_embeddings=128)


def _state_bytes(cache: Any) -> int:
    return sum(t.numel() * t.element_size() for layer in cache.layers
               for states in (getattr(layer, "conv_states", {}), getattr(layer, "recurrent_states", {}))
               for t in states.values() if t is not None)


@pytest.mark.parametrize("config", [QWEN3_NEXT, BAMBA, NEMOTRON_H, LFM2], ids=lambda c: c["model_type"])
def test_hybrid_cache_matches_generate(config: dict[str, Any]) -> None:
    """Linear-attention, Mamba-2 and convolution layers keep a fixed state (bf16 conv state, fp32 recurrent state) and
    no K/V; only the attention layers grow with the sequence: the cache a bf16 ``generate`` leaves, to the byte."""
    model = _module(config, "cpu").to(torch.bfloat16).eval()
    batch, prompt, new = 2, 20, 5
    ids = torch.randint(3, 200, (batch, prompt))
    out = model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, return_dict_in_generate=True, pad_token_id=0)
    spec = ModelSpec.from_any(config)
    setup = Setup(task="infer", device="cpu", micro_batch_size=batch, seq_len=prompt, new_tokens=new, weights_dtype="bf16")
    cache = out.past_key_values
    assert kv_cache_bytes(spec, batch, cached_tokens(setup, spec), 2) == _cache_bytes(cache) + _state_bytes(cache)
    assert _state_bytes(cache) > 0 and kv_cache_bytes(spec, batch, 1000, 2) < kv_cache_bytes(ModelSpec.from_any(
        {**config, "model_type": "llama", "architectures": ["LlamaForCausalLM"]}), batch, 1000, 2) / 2


def test_nemotron_h_pattern_says_which_layers_are_moe() -> None:
    """A dense Nemotron-H config.json has no expert keys (its pattern has no 'E'), which transformers' class fills with
    defaults that size nothing: read as dense, counted as its module; an 'E' in the pattern is the one MoE layer."""
    dense = {k: v for k, v in NEMOTRON_H.items() if k not in ("n_routed_experts", "num_experts_per_tok",
                                                              "moe_intermediate_size", "n_shared_experts")}
    spec = ModelSpec.from_any(dense)
    assert not spec.is_moe and spec.total_params == _numel(_module(dense))
    moe = {**NEMOTRON_H, "hybrid_override_pattern": "M*E"}
    spec = ModelSpec.from_any(moe)
    assert spec.is_moe and spec.num_moe_layers == 1 and spec.total_params == _numel(_module(moe))


def test_mla_cache_is_the_compressed_latent() -> None:
    spec = ModelSpec.from_any(DEEPSEEK_V3)
    assert spec.is_mla and spec.kv_elements_per_token() == 16 + 8  # kv_lora_rank + qk_rope_head_dim
    assert spec.head_dim == 16 + 8  # query/key head dim: nope + rope


def test_sliding_and_global_layers_alternate() -> None:
    assert ModelSpec.from_any(GEMMA2).cache_layer_types() == ("sliding_attention", "full_attention") * 2
    # the same rule transformers' config class applies
    assert tuple(transformers.AutoConfig.for_model(**GEMMA2).layer_types) == ModelSpec.from_any(GEMMA2).cache_layer_types()


# --- encoder-decoder stacks ----------------------------------------------------------------------------------------
def test_bart_counted_on_meta_keeps_both_stacks() -> None:
    spec = ModelSpec.from_any(BART)
    assert spec.total_params == _numel(_module(BART))
    assert (spec.is_encoder_decoder, spec.num_layers, spec.num_decoder_layers) == (True, 2, 3)
    assert any("encoder_attn" in k for k in spec.decoder_block_linears) and spec.generates


# --- encoders with each head -------------------------------------------------------------------------------------
@pytest.mark.parametrize(("arch", "head", "width", "per_sequence"), [
    ("BertForMaskedLM", "lm", V, False),
    ("BertForSequenceClassification", "sequence_classification", 3, True),
    ("BertForTokenClassification", "token_classification", 3, False),
    ("BertForQuestionAnswering", "question_answering", 2, False),
    ("BertModel", "base", 0, False),
])
def test_encoder_heads(arch: str, head: str, width: int, per_sequence: bool) -> None:
    config = {**BERT, "architectures": [arch], **({"num_labels": 3} if "Classification" in arch else {})}
    spec = ModelSpec.from_any(config)
    model = _module(config, "cpu").eval()
    assert spec.total_params == _numel(model)
    assert (spec.head, spec.logits_width, spec.generates) == (head, width, False)
    batch, seq = 2, 16
    with torch.no_grad():
        out = model(input_ids=torch.randint(3, 200, (batch, seq)))
    produced = sum(v.numel() for k, v in out.items() if "logits" in k)
    setup = Setup(task="infer", device="cpu", micro_batch_size=batch, seq_len=seq, weights_dtype="fp32")
    assert logits_bytes(spec, setup, 4) == produced * 4
    assert cached_tokens(setup, spec) == 0 and kv_cache_bytes(spec, batch, 0, 4) == 0


def test_roberta_default_length_is_within_usable_positions() -> None:
    spec = ModelSpec.from_any("roberta-base")
    assert (spec.max_position_embeddings, spec.usable_positions) == (514, 512)


# --- refusing incomplete configs ---------------------------------------------------------------------------------
def test_bare_deepseek_v3_is_refused_with_what_is_missing() -> None:
    with pytest.raises(InvalidModelError) as exc:
        ModelSpec.from_any({"model_type": "deepseek_v3"})
    text = str(exc.value)
    for key in ("hidden_size", "num_hidden_layers", "n_routed_experts", "kv_lora_rank", "moe_intermediate_size"):
        assert repr(key) in text
    assert "\n" not in text


def test_one_missing_moe_key_is_named() -> None:
    with pytest.raises(InvalidModelError, match="'num_experts_per_tok'"):
        ModelSpec.from_any({k: v for k, v in QWEN3_MOE.items() if k != "num_experts_per_tok"})


def test_roberta_plans_and_refuses_at_512() -> None:
    from perfguide import recommend
    from perfguide.errors import ConflictingConstraintsError

    assert recommend("roberta-base", "train_gpu_one", hardware="a100-80gb").setup.seq_len == 512
    with pytest.raises(ConflictingConstraintsError, match="reserved"):
        recommend("roberta-base", "train_gpu_one", hardware="a100-80gb", seq_len=514)


@pytest.mark.parametrize("scenario", ["train_gpu_one", "infer_gpu_one"])
def test_softcapping_models_get_an_attention_their_class_accepts(scenario: str) -> None:
    from perfguide import recommend
    from perfguide.errors import ConflictingConstraintsError

    rec = recommend(GEMMA2, scenario, hardware="a100-80gb", seq_len=64, global_batch_size=8)
    impl = rec.setup.attn_implementation
    assert impl in ("eager", "flash_attention_2")
    # the class itself is the reference: transformers refuses sdpa and accepts what was chosen
    hf = transformers.AutoConfig.for_model(**GEMMA2)
    with torch.device("meta"):
        transformers.AutoModelForCausalLM.from_config(hf, attn_implementation=impl)
        with pytest.raises(ValueError):
            transformers.AutoModelForCausalLM.from_config(hf, attn_implementation="sdpa")
    with pytest.raises(ConflictingConstraintsError, match="'eager'"):
        recommend(GEMMA2, scenario, hardware="a100-80gb", seq_len=64, global_batch_size=8, attn_implementation="sdpa")


def _bert_large(arch: str, **extra: Any) -> dict[str, Any]:
    from perfguide.model.catalog import config_of

    return {**config_of("google-bert/bert-large-uncased"), "architectures": [arch], **extra}


def test_classification_head_is_not_charged_vocabulary_logits() -> None:
    from perfguide import estimate

    setup = {"micro_batch_size": 8, "seq_len": 512}
    cls = estimate(_bert_large("BertForSequenceClassification", num_labels=2), setup)
    mlm = estimate(_bert_large("BertForMaskedLM"), setup)
    # hand reference: HF CE buffers are a few b x positions x width fp32 tensors; 8 x 1 x 2 is bytes, 8 x 512 x 30522 is GiB
    assert cls.logits < 2**20 < 2**30 < mlm.logits


def test_serving_an_encoder_is_one_forward_pass() -> None:
    from perfguide import recommend

    rec = recommend(_bert_large("BertForSequenceClassification", num_labels=2), "infer_gpu_one", hardware="a100-80gb")
    assert rec.memory.kv_cache == 0 and rec.setup.new_tokens == 0
    assert rec.generation_kwargs() == {}


def test_bart_activations_cover_both_stacks_against_the_trace() -> None:
    """Traced on fake tensors (the real module's saved tensors): counting only the decoder halved the activations."""
    from perfguide import estimate

    config = {**BART, "d_model": 128, "encoder_layers": 3, "decoder_layers": 3, "encoder_ffn_dim": 512, "decoder_ffn_dim": 512,
              "vocab_size": 1024, "max_position_embeddings": 256}
    setup = {"micro_batch_size": 4, "seq_len": 128, "weights_dtype": "fp32"}
    analytic, traced = estimate(config, setup, method="analytic"), estimate(config, setup, method="trace")
    assert analytic.activations == pytest.approx(traced.activations, rel=0.35)
    assert analytic.peak_allocated == pytest.approx(traced.peak_allocated, rel=0.15)


def test_whisper_counts_both_stacks() -> None:
    config = dict(model_type="whisper", d_model=64, encoder_layers=2, decoder_layers=3, encoder_attention_heads=4,
                  decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=V, num_mel_bins=16,
                  max_source_positions=32, max_target_positions=32, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                  decoder_start_token_id=1, architectures=["WhisperForConditionalGeneration"])
    spec = ModelSpec.from_any(config)
    assert spec.total_params == _numel(_module(config))
    assert (spec.is_encoder_decoder, spec.num_layers, spec.num_decoder_layers, spec.generates) == (True, 2, 3, True)
