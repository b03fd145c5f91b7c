"""The bytes between the last block and the loss (perfguide/memory/top_of_stack.py), against hand counts from the
code of transformers' bitsandbytes integration, Lightning's BitsandbytesPrecision (litgpt) and HF's norms."""

from __future__ import annotations

from perfguide.memory.analytic import training_memory
from perfguide.memory.ledger import LORA_ADAPTER_BYTES, ledger
from perfguide.memory.top_of_stack import block_dequant_bytes, final_norm_bytes, loss_peak_dequant_bytes
from perfguide.model.types import ModelSpec
from perfguide.setup import LoraSpec, Setup

LORA = LoraSpec(r=8, alpha=16, target_modules=("q_proj", "v_proj"))


def _qlora(**kw: object) -> Setup:
    fields: dict[str, object] = dict(weights_dtype="nf4", lora=LORA, micro_batch_size=1, seq_len=512, optimizer="adamw_torch")
    fields.update(kw)
    return Setup(**fields)  # type: ignore[arg-type]


def _nf4(elements: int) -> int:
    """bnb nf4 with double quant: 0.5 B per weight, one uint8 absmax per 64, one fp32 absmax per 256 of those."""
    blocks = -(-elements // 64)
    return elements // 2 + blocks + -(-blocks // 256) * 4


def test_transformers_leaves_no_dequantized_weight_at_the_loss_peak() -> None:
    """HF keeps lm_head 16-bit (get_keys_to_not_convert), so no 4-bit matmul runs after the last block; a block's
    matmul still dequantizes its weight (Llama-3.1-8B's largest, 4096 x 14336, at 2 B)."""
    spec = ModelSpec.from_any("meta-llama/Llama-3.1-8B")
    setup = _qlora(autocast="bf16")
    assert loss_peak_dequant_bytes(spec, setup) == 0
    assert block_dequant_bytes(spec, setup) == 4096 * 14336 * 2


def test_litgpt_dequantizes_its_head_at_the_loss_peak() -> None:
    """Lightning quantizes every Linear from fp16, lm_head too; under bf16 compute the fp16 dequantization and its
    bf16 cast coexist: 4 B per element of the 128256 x 4096 head (2.10 GB); int8 dequantizes to fp16 only."""
    spec = ModelSpec.from_any("meta-llama/Llama-3.1-8B")
    litgpt = _qlora(kbit_upcast=False, kbit_quantizer="litgpt")
    assert loss_peak_dequant_bytes(spec, litgpt) == 128256 * 4096 * 4
    assert block_dequant_bytes(spec, litgpt) == 4096 * 14336 * 4
    assert loss_peak_dequant_bytes(spec, litgpt.replace(weights_dtype="int8")) == 128256 * 4096 * 2
    # the loss-phase estimate differs by exactly that copy (nothing checkpointed, so no final-norm term either way);
    # the weights differ by the head's storage, which the ledger test below counts
    hf = training_memory(spec, litgpt.replace(kbit_quantizer="transformers"))
    lit = training_memory(spec, litgpt)
    assert "peak in forward/loss" in hf.notes and "peak in forward/loss" in lit.notes
    assert lit.other - hf.other == 128256 * 4096 * 4


def test_litgpt_stores_its_own_quantized_head() -> None:
    """Llama-2-7B (untied): block Linears and the 32000 x 4096 head in nf4, the embedding and 65 norms bf16.
    Gemma-2B (tied on the Hub): litgpt's GPT keeps lm_head as its own Linear, so a 256000 x 2048 nf4 copy is added
    and the embedding stays once in bf16."""
    gemma_block = 2 * 2048 * 2048 + 2 * 2048 * 256 + 3 * 2048 * 16384    # q, o; k, v (1 KV head x 256); MLP
    for hub, linear, head, rest in (
            ("meta-llama/Llama-2-7b-hf", 32 * (4 * 4096 * 4096 + 3 * 4096 * 11008), 32000 * 4096, 32000 * 4096 + 65 * 4096),
            ("google/gemma-2b", 18 * gemma_block, 256000 * 2048, 256000 * 2048 + 37 * 2048)):
        spec = ModelSpec.from_any(hub)
        setup = _qlora(kbit_upcast=False, kbit_quantizer="litgpt")
        led = ledger(spec, setup)
        assert led.weight_bytes - led.trainable_params * LORA_ADAPTER_BYTES == _nf4(linear + head) + 2 * rest, hub
        hf = ledger(spec, setup.replace(kbit_quantizer="transformers"))
        assert hf.weight_bytes - hf.trainable_params * LORA_ADAPTER_BYTES == _nf4(linear) + 2 * (spec.total_params - linear), hub


def test_final_norm_keeps_its_input_in_checkpointed_lora_steps() -> None:
    """Checkpointed LoRA at the cross-entropy's backward (scripts/trace_top_of_stack.py): HF's RMSNorm keeps a 4-byte
    copy of its input in every regime; a LayerNorm (GPT-NeoX) keeps the stream's own dtype: 2 B in bf16, 4 B when
    the stream is fp32 (autocast, or peft's kbit upcast). Without checkpointing, or with a head that trains, nothing
    is added here."""
    llama, neox = ModelSpec.from_any("meta-llama/Llama-3.1-8B"), ModelSpec.from_any("EleutherAI/pythia-1.4b")
    ckpt = dict(micro_batch_size=2, seq_len=3000, lora=LORA, gradient_checkpointing=True)
    for kw in ({"weights_dtype": "bf16"}, {"autocast": "bf16"}, {"weights_dtype": "nf4", "autocast": "bf16"}):
        assert final_norm_bytes(llama, Setup(**ckpt, **kw), checkpointed=True) == 2 * 3000 * 4096 * 4
    pythia_lora = LoraSpec(r=8, alpha=16, target_modules=("query_key_value",))
    half = Setup(micro_batch_size=2, seq_len=3000, lora=pythia_lora, weights_dtype="bf16", gradient_checkpointing=True)
    assert final_norm_bytes(neox, half, checkpointed=True) == 2 * 3000 * 2048 * 2
    assert final_norm_bytes(neox, half.replace(weights_dtype="fp32", autocast="bf16"), checkpointed=True) == 2 * 3000 * 2048 * 4
    assert final_norm_bytes(llama, Setup(**ckpt, weights_dtype="bf16"), checkpointed=False) == 0


def test_a_trained_head_and_norm_keep_more() -> None:
    """Full fine-tuning (same trace): the trained norm weight keeps its normalised input and the trained head its
    input. Llama bf16: the fp32 copy 4 + the bf16 product 2 + the head's input 2 = 8; fp32: the stream 4 + the
    product 4 + the head's input 4 = 12; Gemma 2 bf16 keeps an fp32 product (output * (1 + weight.float())): 10;
    GPT-NeoX's LayerNorm bf16: its input 2 + the head's input 2 = 4. Checkpointed or not."""
    llama, gemma2, neox = (ModelSpec.from_any(h) for h in ("meta-llama/Llama-3.1-8B", "google/gemma-2-9b", "EleutherAI/pythia-1.4b"))
    tokens = 2 * 1000
    for ckpt in (True, False):
        half = Setup(micro_batch_size=2, seq_len=1000, weights_dtype="bf16", gradient_checkpointing=ckpt)
        assert final_norm_bytes(llama, half, checkpointed=ckpt) == tokens * 4096 * 8
        assert final_norm_bytes(llama, half.replace(weights_dtype="fp32"), checkpointed=ckpt) == tokens * 4096 * 12
        assert final_norm_bytes(gemma2, half, checkpointed=ckpt) == tokens * 3584 * 10
        assert final_norm_bytes(neox, half, checkpointed=ckpt) == tokens * 2048 * 4


def test_litgpt_double_quant_saving_matches_the_published_pairs(rows: dict[str, dict[str, str]]) -> None:
    """litgpt's resource tables measure each model under bnb.nf4 and bnb.nf4-dq (same run otherwise): the published
    difference is what double quant saves on the absmax, 4/64 - (1/64 + 4/16384) B per quantized weight (blocks and
    litgpt's own head). Rows 155/156 (StableLM-3B), 160/161 (Llama-2-7B), 165/166 (Llama-2-13B): 0.16 / 0.30 / 0.59 GB
    published (https://github.com/Lightning-AI/litgpt/blob/main/tutorials/resource-tables.md)."""
    from helpers import load_bench

    acc = load_bench("accuracy")
    for plain, dq in (("155", "156"), ("160", "161"), ("165", "166")):
        a, b = acc.evaluate(rows[plain], []), acc.evaluate(rows[dq], [])
        assert a.kind == b.kind == "value" and a.predicted is not None and b.predicted is not None
        published = float(rows[plain]["peak_mem_value"]) - float(rows[dq]["peak_mem_value"])
        assert abs((a.predicted - b.predicted) - published) <= 0.015, (plain, a.predicted - b.predicted, published)


def test_the_transformers_config_follows_the_priced_quantizer() -> None:
    """The BitsAndBytesConfig a plan emits is the layout it priced: double quant as ``nf4_double_quant`` says; a setup
    priced as litgpt's (a quantized head) is refused with one line, as transformers keeps the head 16-bit."""
    import pytest
    from helpers import make_rec

    from perfguide.errors import InvalidSetupError

    plain = make_rec({"weights_dtype": "nf4", "lora": {}, "autocast": "bf16", "nf4_double_quant": False}).model_kwargs()
    assert plain["quantization_config"].bnb_4bit_use_double_quant is False
    with pytest.raises(InvalidSetupError, match="kbit_quantizer='transformers'"):
        make_rec({"weights_dtype": "nf4", "lora": {}, "autocast": "bf16", "kbit_quantizer": "litgpt"}).model_kwargs()
