"""bitsandbytes' short-lived 16-bit weight copies when serving with ``generate``, and the absmax layout the Setup names.

The HF blog 'Optimizing your LLM in production' (rows 3200-3204) printed ``torch.cuda.max_memory_allocated() / 1024**3``
for OctoCoder 15.5B after loading and a 20-token prompt + 60 new tokens: bf16 29.026, LLM.int8 15.219, 4-bit 9.544
GiB. Every byte count below is derived by hand from the StarCoder config (6144 x 40 blocks, MQA, FFN 24576, vocab
49152, 8192 positions, tied head), not read from perfguide.
"""

from __future__ import annotations

from helpers import assert_evaluated_as_values, load_bench, published_rows

from perfguide import Hardware, ModelSpec, Setup
from perfguide.memory import estimate_memory

GiB = 2**30
H, LAYERS, FFN, VOCAB, POS, KV = 6144, 40, 24576, 49152, 8192, 128
#: block Linears: c_attn (h -> h + 2 x 128, MQA), attn c_proj, mlp c_fc, mlp c_proj
LINEARS = [(H, H + 2 * KV), (H, H), (H, FFN), (FFN, H)]
LINEAR_ELEMENTS = LAYERS * sum(i * o for i, o in LINEARS)
#: everything bitsandbytes leaves 16-bit: token and position embeddings, biases, LayerNorms
REST = VOCAB * H + POS * H + LAYERS * (H + 2 * KV + H + FFN + H + 4 * H) + 2 * H
LARGEST = H * FFN


def _spec() -> ModelSpec:
    return ModelSpec.from_any(load_bench("accuracy_configs").CONFIGS["bigcode/octocoder"])


def _setup(weights: str, **kw: object) -> Setup:
    return Setup(task="infer", micro_batch_size=1, seq_len=20, new_tokens=60, weights_dtype=weights, optimizer=None,
                 attn_implementation="eager", **kw)


def test_the_hand_count_is_the_specs() -> None:
    assert _spec().total_params == LINEAR_ELEMENTS + REST == 15_517_456_384


def test_nf4_weights_follow_the_double_quant_the_setup_names() -> None:
    """One fp32 absmax per 64 weights without double quant (BitsAndBytesConfig's default in 2023); a uint8 absmax per
    64 plus an fp32 one per 256 blocks with it. Inference used to price double quant whatever the Setup said."""
    spec, hw = _spec(), Hardware.from_name("a100-40gb")
    plain = estimate_memory(spec, _setup("nf4", nf4_double_quant=False), hw).weights
    nested = estimate_memory(spec, _setup("nf4", nf4_double_quant=True), hw).weights
    assert plain == LINEAR_ELEMENTS // 2 + LINEAR_ELEMENTS // 64 * 4 + REST * 2
    assert abs(nested - (LINEAR_ELEMENTS // 2 + LINEAR_ELEMENTS // 64 + LINEAR_ELEMENTS // (64 * 256) * 4 + REST * 2)) < 64


def test_quantizing_at_load_peaks_at_one_16bit_copy_of_the_largest_linear() -> None:
    """LLM.int8 at a 20-token prompt: the load's fp16 copy of mlp.c_fc (6144 x 24576 x 2 B) beside the int8 weights
    and their fp32 row scales is above anything generate holds; a checkpoint saved quantized has no such copy."""
    spec, hw = _spec(), Hardware.from_name("a100-40gb")
    weights = LINEAR_ELEMENTS + LAYERS * sum(o for _, o in LINEARS) * 4 + REST * 2
    est = estimate_memory(spec, _setup("int8"), hw)
    assert est.weights == weights
    assert 0 <= est.peak_allocated - (weights + 2 * LARGEST) < 0.02 * GiB   # + the prompt's logits and small buffers
    saved = estimate_memory(spec, _setup("int8", checkpoint_format="int8"), hw)
    assert saved.peak_allocated - saved.weights < 0.02 * GiB


def test_a_4bit_matmul_over_several_rows_dequantizes_the_weight_one_token_does_not() -> None:
    """bnb.matmul_4bit: MatMul4Bit (a whole 16-bit weight) for a prefill or a decode batch above one, gemv_4bit for one
    token. Prefill vs a 1-token prompt at batch 1: the copy is the difference; at batch 2 decode steps make it too."""
    spec, hw = _spec(), Hardware.from_name("a100-40gb")
    one = Setup(task="infer", micro_batch_size=1, seq_len=1, new_tokens=1, weights_dtype="nf4", optimizer=None)
    est_one = estimate_memory(spec, one, hw)
    # one token in, one out: no dequantized copy; the load's 16-bit copy (2 B x the largest Linear) is the peak's transient
    assert abs(est_one.peak_allocated - est_one.weights - 2 * LARGEST) < 0.01 * GiB
    est = estimate_memory(spec, _setup("nf4"), hw)
    assert est.peak_allocated - est.weights >= 2 * LARGEST   # the prefill's copy at least as large as the load's
    two = estimate_memory(spec, one.replace(micro_batch_size=2, seq_len=1, new_tokens=8), hw)
    assert two.activations >= 2 * LARGEST


def test_the_blogs_rows_are_priced_within_their_reading() -> None:
    """bf16 and LLM.int8 within 2% (int8: bitsandbytes 0.41's Int8Params.cuda also kept CBt, one int8 copy more); the
    4-bit row 6.9% under: the blog ran BitsAndBytesConfig's 2023 default compute dtype float32, whose
    ``.to(A.dtype)`` adds a 4 B copy of the dequantized weight (6144 x 24576 x 4 B = 0.56 GiB) perfguide's plans never
    run (they set bnb_4bit_compute_dtype to the 16-bit dtype)."""
    assert_evaluated_as_values(("3200", "3201", "3202"))
    accuracy, rows = load_bench("accuracy"), published_rows()
    errors = {r: accuracy.evaluate(rows[r], []).err_pct for r in ("3200", "3201", "3202")}
    assert errors["3200"] < 2 and errors["3201"] < 2 and 4 < errors["3202"] < 10
    fp32_cast = LARGEST * 4 / GiB
    assert abs(accuracy.evaluate(rows["3202"], []).predicted + fp32_cast - 9.5436) < 0.15
    for r in ("3203", "3204"):   # the long prompt's token count is not printed
        assert accuracy.evaluate(rows[r], []).kind == "skip"
