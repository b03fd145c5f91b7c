"""A checkpoint's quantization_config is read in one place (perfguide/model/quantized.py) and the same way for
training, ``generate`` and the serving engines; ``generate`` prices a pre-quantized checkpoint in its own format
and ``model_kwargs`` loads it as it is.

Hand-derived weight bytes: GPTQ 4-bit (group 128) stores ``qweight`` as int32 words of eight 4-bit codes
(0.5 B/weight), an fp16 ``scales`` row and a packed 4-bit ``qzeros`` row per group of 128 inputs
(2/128 + 0.5/128 B/weight); embeddings, lm_head and norms stay 16-bit (auto-gptq / gptqmodel QuantLinear layout).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import perfguide
from perfguide.errors import ConflictingConstraintsError, PerfGuideError
from perfguide.model.quantized import checkpoint_format

PACKAGE = Path(perfguide.__file__).parent

# Llama-3.1-8B's shape (config.json of meta-llama/Llama-3.1-8B)
H, I, L, V, KV, HEADS = 4096, 14336, 32, 128256, 8, 32
LLAMA = {"model_type": "llama", "hidden_size": H, "intermediate_size": I, "num_hidden_layers": L, "num_attention_heads": HEADS,
         "num_key_value_heads": KV, "vocab_size": V, "max_position_embeddings": 8192, "tie_word_embeddings": False}

# (quantization_config as the hub checkpoints write it, the format read)
FORMATS = {
    "bnb-4bit": ({"quant_method": "bitsandbytes", "_load_in_4bit": True, "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}, "nf4"),
    "bnb-8bit": ({"quant_method": "bitsandbytes", "_load_in_8bit": True, "load_in_8bit": True}, "int8"),
    "bnb-old": ({"load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}, "nf4"),     # saved before quant_method existed
    "gptq": ({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False}, "gptq"),
    "awq": ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm", "zero_point": True}, "awq"),
    "compressed-tensors-fp8": ({"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {
        "group_0": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}}}, "fp8"),
    "compressed-tensors-w4a16": ({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {
        "group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "group_size": 128}}}}, "w4a16"),
    "fp8-block": ({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}, "fp8_block"),
    "mxfp4": ({"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]}, "mxfp4"),
}


@pytest.mark.parametrize("name", FORMATS)
def test_each_format_is_read_the_same_at_top_level_and_in_text_config(name: str) -> None:
    qc, fmt = FORMATS[name]
    assert checkpoint_format({**LLAMA, "quantization_config": qc}) == fmt
    # a multimodal wrapper keeps it beside its language model's config
    assert checkpoint_format({"model_type": "gemma3", "text_config": {**LLAMA, "quantization_config": qc}}) == fmt
    assert checkpoint_format(LLAMA) is None


@pytest.mark.parametrize("qc", [{"quant_method": "hqq"}, {"quant_method": "gptq", "bits": 8}, {"quant_method": "bitsandbytes"},
                                {"quant_method": "compressed-tensors", "config_groups": ["not", "a", "dict"]},
                                {"quant_method": "compressed-tensors", "config_groups": {"g": 7}}, {"quant_method": ["x"] * 99}])
def test_a_format_it_cannot_price_is_one_line(qc: dict) -> None:
    with pytest.raises(PerfGuideError) as e:
        checkpoint_format({**LLAMA, "quantization_config": qc})
    assert "\n" not in str(e.value) and "accepted:" in str(e.value)


@pytest.mark.parametrize("junk", [None, 7, "x", [], {"quantization_config": "nf4"}, {"quantization_config": {}}])
def test_no_config_or_a_non_dict_one_is_unquantized(junk: object) -> None:
    assert checkpoint_format(junk) is None


def _reads_the_key(path: Path) -> list[int]:
    """Lines where ``path`` reads ``x["quantization_config"]`` or ``x.get("quantization_config")``."""
    hits = []
    for node in ast.walk(ast.parse(path.read_text())):
        key = None
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and isinstance(node.slice, ast.Constant):
            key = node.slice.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" and node.args \
                and isinstance(node.args[0], ast.Constant):
            key = node.args[0].value
        if key == "quantization_config":
            hits.append(node.lineno)
    return hits


def test_one_module_reads_quantization_config() -> None:
    readers = {p.relative_to(PACKAGE).as_posix(): lines for p in PACKAGE.rglob("*.py") if (lines := _reads_the_key(p))}
    assert set(readers) == {"model/quantized.py"}, readers


@pytest.mark.parametrize("name", FORMATS)
def test_training_and_serving_see_the_same_format(name: str) -> None:
    qc, fmt = FORMATS[name]
    cfg = {**LLAMA, "quantization_config": qc}
    if fmt == "nf4":  # a bnb 4-bit checkpoint trains as QLoRA, loaded as saved
        rec = perfguide.recommend(cfg, hardware="a100-80gb")
        assert rec.setup.weights_dtype == "nf4" and rec.setup.lora is not None
        assert "quantization_config" not in rec.model_kwargs()
    elif fmt == "mxfp4":  # trained as the bf16 weights transformers dequantizes it to (tests/test_mxfp4_training.py)
        rec = perfguide.recommend(cfg, hardware="a100-80gb")
        assert rec.setup.weights_dtype != "mxfp4" and rec.model_kwargs()["quantization_config"].dequantize is True
    else:             # every other stored format is refused for training, naming the format read
        with pytest.raises(ConflictingConstraintsError) as e:
            perfguide.recommend(cfg, hardware="a100-80gb")
        assert fmt in str(e.value) and "\n" not in str(e.value)
    # generate (transformers) on an H100 (cc 9.0: FP8 and MXFP4 run as stored)
    gen = perfguide.recommend(cfg, hardware="h100-80gb", scenario="infer_gpu_one")
    assert gen.setup.checkpoint_format == fmt and "quantization_config" not in gen.model_kwargs()
    # the serving engines read the same format (vLLM has no bitsandbytes checkpoints in its format table; SGLang has nf4)
    engine = "sglang" if fmt == "nf4" else "vllm"
    if fmt != "int8":
        served = perfguide.recommend(cfg, hardware="h100-80gb", scenario="infer_gpu_one", engine=engine)
        assert served.setup.serving is not None and served.setup.serving.checkpoint_format == fmt


def _gptq_bytes() -> float:
    block_linears = H * H * 2 + H * (KV * H // HEADS) * 2 + 3 * H * I     # q, o, k, v, gate, up, down
    per_weight = 0.5 + 2 / 128 + 0.5 / 128
    rest = 2 * V * H + (2 * L + 1) * H                                    # embeddings, lm_head, norms at 16-bit
    return block_linears * L * per_weight + rest * 2


def test_generate_prices_a_gptq_checkpoint_in_its_format() -> None:
    cfg = {**LLAMA, "quantization_config": FORMATS["gptq"][0]}
    gptq = perfguide.recommend(cfg, hardware="a100-80gb", scenario="infer_gpu_one")
    plain = perfguide.recommend(LLAMA, hardware="a100-80gb", scenario="infer_gpu_one")
    assert gptq.memory.weights == pytest.approx(_gptq_bytes(), rel=0.002)       # 5.73 GB, was priced as 16-bit
    assert plain.memory.weights == pytest.approx(2 * (L * (H * H * 2 + H * H // 2 + 3 * H * I) + 2 * V * H + (2 * L + 1) * H), rel=0.002)
    assert gptq.memory.weights < 0.4 * plain.memory.weights
    kw = gptq.model_kwargs()
    assert "quantization_config" not in kw and str(kw["dtype"]) == "torch.bfloat16"


def test_fp8_on_a_gpu_below_cc_8_9_is_priced_dequantized() -> None:
    """transformers 5.24 quantizer_finegrained_fp8.py: below compute capability 8.9 it dequantizes to 16-bit."""
    cfg = {**LLAMA, "quantization_config": FORMATS["fp8-block"][0]}
    a100 = perfguide.recommend(cfg, hardware="a100-80gb", scenario="infer_gpu_one")
    h100 = perfguide.recommend(cfg, hardware="h100-80gb", scenario="infer_gpu_one")
    assert a100.setup.checkpoint_format is None and h100.setup.checkpoint_format == "fp8_block"
    assert h100.memory.weights < 0.6 * a100.memory.weights
    why = next(d.reason for d in a100.decisions if d.setting == "quantization_config")
    assert "8.9" in why


def test_a_bnb_checkpoint_is_not_given_a_second_bitsandbytes_config() -> None:
    cfg = {**LLAMA, "quantization_config": FORMATS["bnb-4bit"][0]}
    rec = perfguide.recommend(cfg, hardware="a100-80gb", scenario="infer_gpu_one")
    assert rec.setup.weights_dtype == "nf4" and "quantization_config" not in rec.model_kwargs()
    # the bnb layout (4-bit codes + double-quantized absmax), not 16-bit
    assert rec.memory.weights < 0.4 * perfguide.recommend(LLAMA, hardware="a100-80gb", scenario="infer_gpu_one").memory.weights


def test_another_quantization_on_a_quantized_checkpoint_is_one_line() -> None:
    cfg = {**LLAMA, "quantization_config": FORMATS["gptq"][0]}
    with pytest.raises(ConflictingConstraintsError) as e:
        perfguide.recommend(cfg, hardware="a100-80gb", scenario="infer_gpu_one", quantization="nf4")
    assert "gptq" in str(e.value) and "\n" not in str(e.value)
