"""Issue 26, model configs: every model type transformers ships is planned or refused in one line.

References are independent of perfguide: parameter counts come from transformers' own model classes built on
the meta device, and the optimizer bytes from AdamW's two fp32 states per trainable parameter (torch.optim.AdamW
keeps exp_avg and exp_avg_sq, each the parameter's size).
"""

from __future__ import annotations

import signal
from contextlib import contextmanager

import pytest

import perfguide
from perfguide.errors import ConflictingConstraintsError, InvalidModelError, PerfGuideError

NAMED = ("albert", "dory", "edgetam_video", "hrm_text", "maskformer", "sam2", "sam2_video")
IMAGE_MODELS = ("edgetam_video", "maskformer", "sam2", "sam2_video")
LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 512, "num_hidden_layers": 4,
         "num_attention_heads": 8, "num_key_value_heads": 8, "intermediate_size": 1376, "vocab_size": 32000}


@contextmanager
def no_hang(seconds: int = 120):
    """A hang becomes a test failure (not a stuck CI job); no wall-clock number is asserted."""
    def stop(*_):
        raise AssertionError(f"still running after {seconds} s: hung")
    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def plan_or_refuse(model, scenario: str):
    """A Recommendation, or None when refused in one line; anything else fails."""
    try:
        return perfguide.recommend(model, scenario, hardware="a100-80gb")
    except PerfGuideError as exc:
        assert "\n" not in str(exc) and str(exc), str(exc)
        return None


@pytest.mark.slow
@pytest.mark.parametrize("model_type", NAMED)
def test_the_seven_default_configs_that_crashed_now_plan(model_type):
    """The three that read tokens plan; the four image models (their first input pixel_values) are refused in one
    line, as every model that reads no token ids is (tests/test_model_inputs.py): they had planned as language models."""
    from transformers import CONFIG_MAPPING

    config = CONFIG_MAPPING[model_type]()
    for scenario in ("train_gpu_one", "infer_gpu_one"):
        if model_type in IMAGE_MODELS:
            with pytest.raises(InvalidModelError, match="reads 'pixel_values' \\(images\\), not token ids"):
                perfguide.recommend(config, scenario, hardware="a100-80gb")
            continue
        rec = plan_or_refuse(config, scenario)
        assert rec is not None and rec.memory.weights > 0 and rec.memory.device_total > 0
        assert rec.memory.weights <= rec.model.total_params * 4  # never more than fp32 of every parameter


def test_albert_shared_layer_is_counted_once():
    """ALBERT runs one stored layer num_hidden_layers times: its weights, gradients and AdamW states are those of
    the parameters it stores (transformers' AlbertModel counted on meta), not 12 copies."""
    import torch
    from transformers import AlbertConfig, AlbertModel

    config = AlbertConfig(embedding_size=64, hidden_size=256, num_hidden_layers=12, num_attention_heads=4,
                          intermediate_size=1024, vocab_size=1000)
    with torch.device("meta"):
        stored = sum(p.numel() for p in AlbertModel(config).parameters())
    est = perfguide.estimate(config, {"task": "train", "device": "cuda", "seq_len": 128, "micro_batch_size": 1,
                                      "weights_dtype": "fp32", "optimizer": "adamw_torch"})
    assert est.optimizer_states == pytest.approx(8 * stored, rel=0.02)   # was 11x: one copy per use of the layer
    assert est.weights == pytest.approx(4 * stored, rel=0.02)


def test_a_shared_encoder_decoder_embedding_is_counted_once():
    """BART-family models (BlenderBot, BART, Pegasus) give the encoder and the decoder an nn.Embedding each that share
    the model's one `shared` table: by hand, vocab x d_model once, plus a learned position table per stack (BART's
    offset of 2 rows). It was counted three times, which pushed the non-embedding (Linear) count 2 x 1,600 low."""
    from transformers import BartConfig

    config = BartConfig(vocab_size=100, d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
                        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32)
    spec = perfguide.ModelSpec.from_any(config)
    assert spec.embedding_params == 100 * 16 + 2 * (32 + 2) * 16


def test_an_encoder_decoder_config_is_counted_with_both_stacks():
    """A BartConfig without `architectures` was built as BartForCausalLM (the decoder alone): bart-large's shape
    counted 254M parameters. By hand: the shared table and two position tables, 12 encoder layers (4 d^2 attention +
    2 d f FFN, their biases, 2 LayerNorms), 12 decoder layers (a cross-attention and a third LayerNorm more), and
    each stack's embedding LayerNorm: 406,291,456, the published bart-large size."""
    from transformers import BartConfig

    d, f, v, p = 1024, 4096, 50265, 1024
    config = BartConfig(vocab_size=v, d_model=d, encoder_layers=12, decoder_layers=12, encoder_attention_heads=16,
                        decoder_attention_heads=16, encoder_ffn_dim=f, decoder_ffn_dim=f, max_position_embeddings=p)
    attention, ffn, norm = 4 * (d * d + d), 2 * d * f + f + d, 2 * d
    encoder = 12 * (attention + ffn + 2 * norm) + norm
    decoder = 12 * (2 * attention + ffn + 3 * norm) + norm
    spec = perfguide.ModelSpec.from_any(config)
    assert spec.total_params == v * d + 2 * (p + 2) * d + encoder + decoder == 406_291_456
    assert spec.is_encoder_decoder and spec.num_decoder_layers == 12


@pytest.mark.parametrize("scenario", ["train_gpu_one", "infer_gpu_one"])
def test_a_hundred_million_layers_is_refused_not_hung(scenario):
    with no_hang(), pytest.raises(InvalidModelError) as exc:
        perfguide.recommend({**LLAMA, "num_hidden_layers": 10**8}, scenario, hardware="a100-80gb")
    assert "num_hidden_layers" in str(exc.value) and "\n" not in str(exc.value)


def test_a_large_but_real_layer_count_still_plans():
    rec = perfguide.recommend({**LLAMA, "num_hidden_layers": 200}, "infer_gpu_one", hardware="a100-80gb")
    assert rec.model.num_layers == 200


@pytest.mark.parametrize("kv", [3, 5, 16])
def test_kv_heads_that_do_not_divide_the_heads_are_refused(kv):
    with pytest.raises(InvalidModelError) as exc:
        perfguide.recommend({**LLAMA, "num_key_value_heads": kv}, hardware="a100-80gb")
    assert "num_key_value_heads" in str(exc.value) and "\n" not in str(exc.value)


def test_kv_heads_that_divide_are_planned():
    assert perfguide.recommend({**LLAMA, "num_key_value_heads": 2}, hardware="a100-80gb").model.num_key_value_heads == 2


BNB4 = {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_compute_dtype": "bfloat16"}


def test_a_bnb_4bit_checkpoint_trains_as_qlora_only():
    rec = perfguide.recommend({**LLAMA, "quantization_config": BNB4}, hardware="a100-80gb")
    assert rec.setup.weights_dtype == "nf4" and rec.setup.lora is not None  # was a full fine-tune plan
    with pytest.raises(ConflictingConstraintsError) as exc:
        perfguide.recommend({**LLAMA, "quantization_config": BNB4}, hardware="a100-80gb", finetune="full")
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("qc", [{"quant_method": "gptq", "bits": 4, "group_size": 128},
                                {"quant_method": "awq", "bits": 4, "version": "gemm"},
                                {"quant_method": "bitsandbytes", "load_in_8bit": True}])
def test_a_gptq_awq_or_8bit_checkpoint_is_refused_for_training_in_one_line(qc):
    with pytest.raises(ConflictingConstraintsError) as exc:
        perfguide.recommend({**LLAMA, "quantization_config": qc}, hardware="a100-80gb")
    assert "\n" not in str(exc.value) and "quantiz" in str(exc.value)


#: model types the CI walk plans (a seeded sample; bench/fuzz.py walks every one, training and inference)
CI_SAMPLE = 6


def _sample_types() -> list[str]:
    import random

    from transformers import CONFIG_MAPPING

    types = sorted(CONFIG_MAPPING.keys())
    return sorted(random.Random(26).sample([t for t in types if t not in NAMED], CI_SAMPLE))


@pytest.mark.slow
def test_model_types_transformers_ships_are_planned_or_refused_in_one_line():
    """The cheap path over a seeded sample of CONFIG_MAPPING (the full walk is bench/fuzz.py's model-type family):
    each type's default config read into a ModelSpec, then one training and one inference plan."""
    from fuzz_inputs import walk_model_type

    failures = [f for model_type in _sample_types() for f in walk_model_type(model_type)]
    assert failures == []


@pytest.mark.parametrize("ram", [float("nan"), float("inf"), -float("inf"), 1e30])
def test_host_ram_that_is_not_a_finite_size_is_one_line(ram):
    with pytest.raises(PerfGuideError) as exc:
        perfguide.recommend("gpt2", hardware="a100-80gb", host_ram=ram)
    assert "host_ram" in str(exc.value) and "\n" not in str(exc.value)
