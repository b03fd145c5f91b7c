"""ModelSpec resolution and exact parameter counts.

References are independent of perfguide's counters: the real transformers modules built on the meta device
(no weights, no download) and published totals (the Hub's safetensors parameter counts / model cards).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from perfguide import ModelSpec
from perfguide.errors import InvalidModelError, OfflineError, PerfGuideError
from perfguide.model.catalog import catalog_names, config_of, lookup
from perfguide.model.counting import spec_from_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# catalog name -> transformers auto class of the head its config's "architectures" names
REPRESENTATIVE = {
    "gpt2": "AutoModelForCausalLM", "bert-base-uncased": "AutoModelForMaskedLM", "t5-small": "AutoModelForSeq2SeqLM",
    "flan-t5-base": "AutoModelForSeq2SeqLM", "llama-3.2-1b": "AutoModelForCausalLM", "mistral-7b": "AutoModelForCausalLM",
    "mixtral-8x7b": "AutoModelForCausalLM", "qwen2.5-0.5b": "AutoModelForCausalLM", "phi-3-mini": "AutoModelForCausalLM",
    "gemma-2-2b": "AutoModelForCausalLM", "roberta-base": "AutoModelForMaskedLM", "opt-350m": "AutoModelForCausalLM",
    "pythia-70m": "AutoModelForCausalLM",
    # catalog entries added for the accuracy bench's models (counters for llama/opt/gpt_neox/t5; the rest are
    # counted through the meta module, so this also checks the catalog config builds the published shape)
    "stablelm-base-alpha-3b": "AutoModelForCausalLM", "tinyllama-1.1b": "AutoModelForCausalLM",
    "codellama-34b": "AutoModelForCausalLM", "opt-30b": "AutoModelForCausalLM", "T0pp": "AutoModelForSeq2SeqLM",
    "phi-1_5": "AutoModelForCausalLM", "falcon-7b": "AutoModelForCausalLM", "falcon-40b": "AutoModelForCausalLM",
    "gpt-j-6b": "AutoModelForCausalLM", "distilbert-base-uncased": "AutoModelForMaskedLM",
    "biogpt": "AutoModelForCausalLM", "gemma-2b": "AutoModelForCausalLM",
}

# Published totals (Hub safetensors metadata / model cards), not derived from perfguide's formulas.
PUBLISHED = {
    "gpt2": 124_439_808, "gpt2-xl": 1_557_611_200, "bert-base-uncased": 109_514_298, "roberta-base": 124_697_433,
    "t5-small": 60_506_624, "t5-base": 222_903_552, "flan-t5-base": 247_577_856, "flan-t5-xl": 2_849_757_184,
    "meta-llama/Llama-2-7b-hf": 6_738_415_616, "meta-llama/Llama-2-70b-hf": 68_976_648_192,
    "meta-llama/Llama-3.1-8B": 8_030_261_248, "meta-llama/Llama-3.1-70B": 70_553_706_496,
    "meta-llama/Llama-3.1-405B": 405_853_388_800, "meta-llama/Llama-3.2-1B": 1_235_814_400,
    "meta-llama/Llama-3.2-3B": 3_212_749_824, "mistralai/Mistral-7B-v0.1": 7_241_732_096,
    "mistralai/Mixtral-8x7B-v0.1": 46_702_792_704, "Qwen/Qwen2.5-0.5B": 494_032_768, "Qwen/Qwen2.5-7B": 7_615_616_512,
    "Qwen/Qwen2.5-72B": 72_706_203_648, "microsoft/Phi-3-mini-4k-instruct": 3_821_079_552,
    "google/gemma-2-2b": 2_614_341_888, "google/gemma-2-9b": 9_241_705_984, "facebook/opt-1.3b": 1_315_758_080,
    "EleutherAI/pythia-70m": 70_426_624, "EleutherAI/pythia-6.9b": 6_857_302_016,
    "EleutherAI/pythia-410m-deduped": 405_334_016,          # Pythia README total-params table
    "EleutherAI/gpt-neox-20b": 20_554_567_680,              # GPT-NeoX-20B paper, table 1
    "microsoft/phi-1_5": 1_418_270_720, "microsoft/phi-2": 2_779_683_840,
    "tiiuae/falcon-7b": 6_921_720_704,                      # unique params (the Hub's 7.22B counts the tied head twice)
    "distilbert/distilbert-base-uncased": 66_985_530, "microsoft/biogpt": 346_763_264,
    "codellama/CodeLlama-34b-hf": 33_743_970_304, "google/gemma-2b": 2_506_172_416, "google/gemma-7b": 8_537_680_896,
    "TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T": 1_100_048_384, "bigscience/T0pp": 11_135_332_352,
    "HuggingFaceTB/SmolLM2-135M": 134_515_008,               # the total a public printout of its config states
}


def _hf_config(name: str):
    config = config_of(lookup(name))
    return transformers.AutoConfig.for_model(config["model_type"], **{k: v for k, v in config.items() if k != "model_type"})


def _meta_model(name: str):
    with torch.device("meta"):
        model = getattr(transformers, REPRESENTATIVE[name]).from_config(_hf_config(name))
    if not config_of(lookup(name)).get("tie_word_embeddings", True) and model.config.model_type == "t5":
        # transformers 5 from_config ties T5's head always; from_pretrained unties it when the checkpoint holds
        # a distinct lm_head (T5 v1.1 / Flan-T5, tie_word_embeddings=false). Reproduce the loaded model.
        model.lm_head.weight = torch.nn.Parameter(torch.empty_like(model.lm_head.weight))
    return model


@pytest.fixture(scope="module")
def meta_models() -> dict:
    return {name: _meta_model(name) for name in REPRESENTATIVE}


def _unique_params(model) -> int:
    return sum(p.numel() for p in {id(p): p for _, p in model.named_parameters(remove_duplicate=False)}.values())


def _block_linear_weights(model) -> int:
    """Every Linear/Conv1D weight and MoE expert tensor inside the transformer blocks of ``model``."""
    lists = {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.ModuleList)}
    outermost = [m for n, m in lists.items() if not any(n.startswith(f"{other}.") for other in lists)]
    total = 0
    for blocks in outermost:
        for name, p in blocks.named_parameters():
            owner = blocks.get_submodule(name.rsplit(".", 1)[0])
            is_linear = isinstance(owner, torch.nn.Linear) or type(owner).__name__ in {"Conv1D", "MixtralTopKRouter"}
            if (name.endswith("weight") and is_linear and "relative_attention_bias" not in name) or "experts." in name:
                total += p.numel()
    return total


@pytest.mark.parametrize("name", list(REPRESENTATIVE))
def test_counts_match_the_real_module(name: str, meta_models: dict) -> None:
    model = meta_models[name]
    spec = ModelSpec.from_any(name)
    assert spec.total_params == _unique_params(model)
    assert spec.linear_params == _block_linear_weights(model)
    head = model.get_output_embeddings()
    tied = head.weight is model.get_input_embeddings().weight
    assert spec.lm_head_params == (0 if tied else head.weight.numel())
    assert spec.source == "catalog"


@pytest.mark.parametrize("name", list(REPRESENTATIVE))
def test_module_input_is_counted_from_the_module(name: str, meta_models: dict) -> None:
    model = meta_models[name]
    spec = ModelSpec.from_any(model)
    assert spec.total_params == _unique_params(model) == spec.trainable_params
    assert spec.architecture == type(model).__name__
    assert spec.source == "module"
    assert spec.hidden_size == ModelSpec.from_any(name).hidden_size


@pytest.mark.parametrize(("name", "published"), list(PUBLISHED.items()))
def test_published_totals(name: str, published: int) -> None:
    assert ModelSpec.from_any(name).total_params == published


def test_shapes_and_moe_active_params() -> None:
    mixtral = ModelSpec.from_any("mistralai/Mixtral-8x7B-v0.1")
    assert (mixtral.num_experts, mixtral.num_experts_per_tok, mixtral.family) == (8, 2, "mixtral")
    assert mixtral.active_params == 12_879_925_248  # 46.7B minus 6 idle experts x 32 layers x 3 x 4096 x 14336
    llama = ModelSpec.from_any("llama-3.1-8b")
    assert (llama.num_key_value_heads, llama.head_dim, llama.block_linears["self_attn.k_proj"]) == (8, 128, (4096, 1024))
    t5 = ModelSpec.from_any("t5-base")
    assert t5.is_encoder_decoder and (t5.num_layers, t5.num_decoder_layers) == (12, 12)
    assert "layer.1.EncDecAttention.q" in t5.decoder_block_linears and "layer.1.EncDecAttention.q" not in t5.block_linears
    assert ModelSpec.from_any("qwen2.5-7b").sliding_window is None  # named in config.json but switched off
    assert ModelSpec.from_any("mistral-7b").sliding_window == 4096
    gpt2 = ModelSpec.from_any("gpt2")
    assert gpt2.embedding_params == (50257 + 1024) * 768 and gpt2.tie_word_embeddings and not gpt2.gated_mlp


def test_qwq_is_qwen25_32bs_shape_as_its_cards_say() -> None:
    """QwQ-32B's card: 64 layers, 40 query / 8 KV heads, 32.5B parameters (31.0B without the embeddings), 131,072-token
    context; QwQ-32B-Preview's printed config: 32,768 positions, the same shape."""
    qwq, preview = ModelSpec.from_any("Qwen/QwQ-32B"), ModelSpec.from_any("qwq-32b-preview")
    for spec in (qwq, preview):
        assert (spec.num_layers, spec.num_attention_heads, spec.num_key_value_heads, spec.hidden_size) == (64, 40, 8, 5120)
        assert spec.total_params == pytest.approx(32.5e9, rel=0.01)
        assert spec.total_params - spec.embedding_params - spec.lm_head_params == pytest.approx(31.0e9, rel=0.01)
    assert (qwq.max_position_embeddings, preview.max_position_embeddings) == (131_072, 32_768)


@pytest.mark.parametrize(("name", "dtype"), [("gpt2", "fp32"), ("t5-small", "bf16"), ("flan-t5-xl", "bf16"),
                                             ("gemma-2-2b", "bf16"), ("llama-2-7b", "fp16"), ("llama-3.1-8b", "bf16")])
def test_native_dtype(name: str, dtype: str) -> None:
    assert ModelSpec.from_any(name).native_dtype == dtype


@pytest.mark.parametrize(("query", "hub_id", "named"), [
    ("GPT2", "openai-community/gpt2", "openai-community/gpt2"),
    ("meta-llama/llama-3.1-8b-instruct", "meta-llama/Llama-3.1-8B", "meta-llama/llama-3.1-8b-instruct"),
    ("Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-8B"),
    ("mistralai/Mistral-7B-Instruct-v0.3", "mistralai/Mistral-7B-v0.3", "mistralai/Mistral-7B-Instruct-v0.3"),
    ("google/gemma-2-2b-it", "google/gemma-2-2b", "google/gemma-2-2b-it"),
    ("Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-7B", "Qwen/Qwen2.5-7B-Instruct"),
    ("meta-llama/Llama-2-7b-chat-hf", "meta-llama/Llama-2-7b-hf", "meta-llama/Llama-2-7b-chat-hf"),
    ("t5-small", "google-t5/t5-small", "google-t5/t5-small"),
])
def test_catalog_lookup(query: str, hub_id: str, named: str) -> None:
    """The catalog entry gives the shape; a repo id the user gave stays the model's name (what its code loads)."""
    assert lookup(query) == hub_id
    assert ModelSpec.from_any(query).name == named


def test_catalog_keys_do_not_collide() -> None:
    names = catalog_names()
    assert len(names) >= 50 and "meta-llama/Llama-3.1-8B" in names
    assert all(lookup(n) == n for n in names)
    assert lookup("someone/gpt2") is None  # an unknown organisation is not silently taken for the catalog model


def test_mirror_reuploads_resolve_to_the_original_shape() -> None:
    """Unsloth's re-uploads are the originals' config.json (plus the nf4 quantization_config of a '-bnb-4bit' name):
    the shape is the catalog entry's, the name stays the one the user's code loads; any other organisation's copy, a
    dynamic '-unsloth-bnb-4bit' quant (its 16-bit modules vary) or a GGUF file is not guessed."""
    from perfguide.model.quantized import checkpoint_format

    plain, original = ModelSpec.from_any("unsloth/Llama-3.2-1B-Instruct"), ModelSpec.from_any("meta-llama/Llama-3.2-1B")
    assert plain.name == "unsloth/Llama-3.2-1B-Instruct" and plain.total_params == original.total_params
    assert checkpoint_format(plain.config) is None
    # the upload's page: Meta-Llama-3-8B's 4096 x 32 layers, FFN 14336, 8 KV heads, vocab 128256, stored nf4
    nf4 = ModelSpec.from_any("unsloth/llama-3-8b-bnb-4bit")
    assert (nf4.hidden_size, nf4.num_layers, nf4.intermediate_size, nf4.num_key_value_heads, nf4.vocab_size) == (
        4096, 32, 14336, 8, 128256)
    assert checkpoint_format(nf4.config) == "nf4" and nf4.total_params == ModelSpec.from_any("meta-llama/Meta-Llama-3-8B").total_params
    for name in ("someone/Llama-3.2-1B", "unsloth/llama-3-8b-unsloth-bnb-4bit", "unsloth/Qwen3-8B-GGUF"):
        with pytest.raises(PerfGuideError):
            ModelSpec.from_any(name)


@pytest.mark.parametrize(("name", "arch"), [
    ("bert-base-uncased", "BertModel"), ("bert-base-uncased", "BertForPreTraining"), ("roberta-base", "RobertaModel"),
    ("t5-small", "T5Model"), ("t5-small", "T5EncoderModel"), ("gpt2", "GPT2Model"), ("llama-3.2-1b", "LlamaModel"),
    ("opt-350m", "OPTModel"), ("pythia-70m", "GPTNeoXModel"), ("gemma-2-2b", "Gemma2Model"),
])
def test_other_head_classes(name: str, arch: str) -> None:
    with torch.device("meta"):
        expected = _unique_params(getattr(transformers, arch)(_hf_config(name)))
    config = dict(config_of(lookup(name)), architectures=[arch])
    assert spec_from_config(config, name, "config").total_params == expected


def test_hf_config_and_dict_inputs() -> None:
    tiny = dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                vocab_size=1000, attention_bias=True, mlp_bias=True, tie_word_embeddings=False)
    config = transformers.LlamaConfig(**tiny)
    with torch.device("meta"):
        expected = _unique_params(transformers.LlamaForCausalLM(config))
    assert ModelSpec.from_any(config).total_params == expected
    assert ModelSpec.from_any({"model_type": "llama", **tiny}).total_params == expected
    # a transformers 5 T5Config reports tie_word_embeddings=True for Flan-T5 but remembers the untied head
    flan = _hf_config("flan-t5-base")
    assert ModelSpec.from_any(flan).total_params == PUBLISHED["flan-t5-base"]


def test_unsupported_head_and_type_fall_back_to_meta_instantiation() -> None:
    config = dict(config_of(lookup("bert-base-uncased")), architectures=["BertForSequenceClassification"], num_labels=3)
    with torch.device("meta"):
        expected = _unique_params(transformers.BertForSequenceClassification(
            transformers.BertConfig(**{k: v for k, v in config.items() if k != "model_type"})))
    assert spec_from_config(config, "bert-cls", "config").total_params == expected
    gptj = dict(model_type="gptj", n_embd=64, n_layer=2, n_head=4, vocab_size=500, n_positions=64, rotary_dim=8)
    with torch.device("meta"):
        expected = _unique_params(transformers.AutoModelForCausalLM.from_config(transformers.GPTJConfig(**{
            k: v for k, v in gptj.items() if k != "model_type"})))
    spec = ModelSpec.from_any(gptj)
    assert (spec.total_params, spec.num_layers, spec.hidden_size) == (expected, 2, 64)


def test_trainable_params_and_plain_module() -> None:
    config = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=100, n_positions=16)
    model = transformers.GPT2LMHeadModel(config)
    for p in model.transformer.h[0].parameters():
        p.requires_grad_(False)
    spec = ModelSpec.from_any(model)
    frozen = sum(p.numel() for p in model.transformer.h[0].parameters())
    assert spec.trainable_params == spec.total_params - frozen

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = torch.nn.MultiheadAttention(32, 4)
            self.up, self.down = torch.nn.Linear(32, 128), torch.nn.Linear(128, 32)

    class Plain(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding(100, 32)
            self.blocks = torch.nn.ModuleList(Block() for _ in range(3))

    plain = ModelSpec.from_any(Plain())
    assert (plain.num_layers, plain.hidden_size, plain.num_attention_heads, plain.intermediate_size) == (3, 32, 4, 128)
    assert plain.total_params == sum(p.numel() for p in Plain().parameters())
    with pytest.raises(InvalidModelError, match="cannot infer the shape"):
        ModelSpec.from_any(torch.nn.Linear(4, 4))


def test_local_path_reads_json_only(tmp_path: Path) -> None:
    marker = tmp_path / "executed"
    evil = f"open({str(marker)!r}, 'w').write('pwned')\n"
    for sub, model_type in (("known", "llama"), ("custom", "evil_model")):
        folder = tmp_path / sub
        folder.mkdir()
        (folder / "modeling_evil.py").write_text(evil)
        (folder / "configuration_evil.py").write_text(evil)
        config = dict(config_of(lookup("llama-3.2-1b")), model_type=model_type,
                      auto_map={"AutoConfig": "configuration_evil.EvilConfig", "AutoModelForCausalLM": "modeling_evil.Evil"})
        (folder / "config.json").write_text(json.dumps(config))
    spec = ModelSpec.from_any(str(tmp_path / "known"), trust_remote_code=True)
    assert spec.total_params == PUBLISHED["meta-llama/Llama-3.2-1B"] and spec.source == "path"
    assert ModelSpec.from_any(tmp_path / "known" / "config.json").total_params == spec.total_params
    with pytest.raises(InvalidModelError, match="evil_model"):
        ModelSpec.from_any(tmp_path / "custom", trust_remote_code=True)
    assert not marker.exists()
    with pytest.raises(InvalidModelError, match="no config.json"):
        ModelSpec.from_any(str(tmp_path))


def test_hub_id_offline_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(OfflineError) as err:
        ModelSpec.from_any("some-org/some-unlisted-model")
    message = str(err.value)
    assert "\n" not in message
    for option in ("config.json", "PretrainedConfig", "catalog", "7b"):
        assert option in message


def test_hub_failure_becomes_offline_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # '--' is an invalid repo name: huggingface_hub rejects it before any request is made
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    with pytest.raises(OfflineError, match="could not fetch|HF_HUB_OFFLINE"):
        ModelSpec.from_any("some-org/bad--name")


@pytest.mark.parametrize(("text", "shape_of"), [("7b", "Llama-2-7b-hf"), ("70B", "Llama-3.1-70B"), ("8b", "Llama-3.1-8B"),
                                                   ("350m", "SmolLM2-360M"), ("125M", "SmolLM2-135M")])
def test_size_strings_pick_a_catalog_llama(text: str, shape_of: str) -> None:
    spec = ModelSpec.from_any(text)
    assert shape_of in spec.name and spec.source == "size" and spec.model_type == "llama"


@pytest.mark.parametrize("text", ["250m", "1.5B", "20b", "90M"])
def test_size_strings_synthesize_near_the_size(text: str) -> None:
    target = float(text[:-1]) * {"m": 1e6, "b": 1e9}[text[-1].lower()]
    spec = ModelSpec.from_any(text)
    assert abs(spec.total_params / target - 1) < 0.12
    assert spec.head_dim == 128 and spec.hidden_size == 128 * spec.num_attention_heads


@pytest.mark.parametrize("bad", [42, 3.5, ["gpt2"], object(), True, None, "", "not a model!", "/no/such/dir"])
def test_bad_inputs_name_the_accepted_kinds(bad: object) -> None:
    with pytest.raises(InvalidModelError) as err:
        ModelSpec.from_any(bad)
    assert "\n" not in str(err.value) and isinstance(err.value, PerfGuideError)


@pytest.mark.parametrize(("config", "missing"), [({"hidden_size": 8}, "model_type"),
                                                 ({"model_type": "llama", "num_hidden_layers": 2}, "hidden_size"),
                                                 ({"model_type": "t5", "d_model": 8, "d_kv": 2, "d_ff": 8}, "num_layers")])
def test_missing_config_keys_are_named(config: dict, missing: str) -> None:
    with pytest.raises(InvalidModelError, match=missing):
        ModelSpec.from_any(config)


@pytest.mark.slow
def test_import_and_catalog_stay_light() -> None:
    code = ("import sys, perfguide; s = perfguide.ModelSpec.from_any('llama-3.1-8b'); perfguide.ModelSpec.from_any('3b');"
            "assert s.total_params == 8030261248; heavy = {'torch', 'transformers'} & set(sys.modules); assert not heavy, heavy")
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120)


@pytest.mark.parametrize("variant", [
    dict(multi_query=True, new_decoder_architecture=False),                  # falcon-7b: one shared kv head
    dict(multi_query=False, new_decoder_architecture=False),                 # plain multi-head
    dict(new_decoder_architecture=True, num_kv_heads=2),                     # falcon-40b's grouped layout
])
def test_falcon_kv_heads_and_mlp_width_from_the_module(variant: dict) -> None:
    """Falcon's configs name no num_key_value_heads and no intermediate_size, so both come from the module tree; its
    fused query_key_value is wider than the hidden size too. The reference is the built module's own attention and
    MLP (transformers' FalconAttention.num_kv_heads, dense_h_to_4h.out_features), not perfguide's reading."""
    from transformers import FalconConfig, FalconForCausalLM

    config = FalconConfig(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=8, **variant)
    module = FalconForCausalLM(config)
    block = module.transformer.h[0]
    spec = ModelSpec.from_any(module)
    assert spec.num_key_value_heads == block.self_attention.num_kv_heads
    assert spec.intermediate_size == block.mlp.dense_h_to_4h.out_features == 4 * 64
