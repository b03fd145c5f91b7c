"""The model as litgpt's own GPT builds it (Setup.model_code, perfguide/model/code.py), against litgpt's parameter
count traced on real CPU tensors (scripts/trace_litgpt.py, litgpt 0.4.12) and hand counts of a tied model's head copy."""

from __future__ import annotations

from perfguide.memory.analytic import training_memory
from perfguide.memory.ledger import ledger
from perfguide.model.code import built_by
from perfguide.model.types import ModelSpec
from perfguide.setup import LoraSpec, Setup

#: scripts/trace_litgpt.py's Gemma-shaped case, one block: litgpt 0.4.12's GPT (Config.from_name("Gemma-2b", n_layer=1,
#: n_embd=256, n_head=4, n_query_groups=1, head_size=64, intermediate_size=1024, padded_vocab_size=1024), LoRA r 8 on
#: query, key, value, projection, mlp and head) has 1,529,600 parameters, 262,144 of them its lm_head
TRACED_PARAMS, TRACED_HEAD = 1_529_600, 1024 * 256
#: its LoRA tensors by hand (litgpt/lora.py): the fused qkv's lora_A (3 x 8, 256) and lora_B (256 + 64 + 64, 8); proj,
#: fc_1, fc_2, mlp.proj and lm_head each 8 x (in + out)
TRACED_LORA = 24 * 256 + 384 * 8 + 8 * (256 + 256) + 3 * 8 * (256 + 1024) + 8 * (256 + 1024)

GEMMA_SMALL = dict(model_type="gemma", hidden_size=256, intermediate_size=1024, num_attention_heads=4, num_key_value_heads=1,
                   head_dim=64, num_hidden_layers=1, vocab_size=1024, tie_word_embeddings=True, max_position_embeddings=2048)


def test_litgpt_holds_a_tied_models_head_twice_as_traced() -> None:
    """The Hub count of a tied Gemma block plus litgpt's head copy is what litgpt's GPT holds, adapters aside."""
    spec = ModelSpec.from_any(GEMMA_SMALL)
    built = built_by(spec, "litgpt")
    assert spec.lm_head_params == 0 and built.lm_head_params == TRACED_HEAD
    assert built.total_params + TRACED_LORA == TRACED_PARAMS
    assert built_by(spec, "transformers") is spec


def test_full_fine_tuning_trains_the_copy() -> None:
    """Gemma-2B, bf16 full fine-tuning with torch AdamW on one GPU: the 256000 x 2048 copy adds its bf16 weight,
    its bf16 gradient and two bf16 moments (AdamW's states take the parameter's dtype): 2 + 2 + 4 bytes each."""
    spec = ModelSpec.from_any("google/gemma-2b")
    setup = Setup(task="train", weights_dtype="bf16", optimizer="adamw_torch", micro_batch_size=1, seq_len=512)
    hf, lit = training_memory(spec, setup), training_memory(spec, setup.replace(model_code="litgpt"))
    copy = 256000 * 2048
    assert lit.weights - hf.weights == 2 * copy
    assert lit.gradients - hf.gradients == 2 * copy
    assert lit.optimizer_states - hf.optimizer_states == 4 * copy


def test_lora_freezes_the_copy_and_untied_models_keep_their_layout() -> None:
    """Under LoRA the copy is a frozen bf16 weight only; an untied model (Llama-2-7B) holds the same weights either way.
    Compared with PEFT's adapters kept 16-bit too (autocast_adapter_dtype=False), as litgpt creates them."""
    setup = Setup(task="train", weights_dtype="bf16", optimizer="adamw_torch", micro_batch_size=1, seq_len=512,
                  lora=LoraSpec(r=32, alpha=16, target_modules=("q_proj", "v_proj"), autocast_adapter_dtype=False))
    tied = ModelSpec.from_any("meta-llama/Llama-3.2-1B")
    hf, lit = training_memory(tied, setup), training_memory(tied, setup.replace(model_code="litgpt"))
    assert lit.weights - hf.weights == 2 * 128256 * 2048
    assert (lit.gradients, lit.optimizer_states) == (hf.gradients, hf.optimizer_states)
    untied = ModelSpec.from_any("meta-llama/Llama-2-7b-hf")
    assert training_memory(untied, setup.replace(model_code="litgpt")).weights == training_memory(untied, setup).weights


def test_litgpt_quantized_head_is_counted_once() -> None:
    """litgpt's bitsandbytes layout already quantizes its own vocabulary x hidden head (kbit_quantizer='litgpt'):
    building the untied model first must not add a second copy."""
    lora = LoraSpec(r=8, alpha=16, target_modules=("q_proj", "v_proj"))
    setup = Setup(task="train", weights_dtype="nf4", lora=lora, kbit_upcast=False, kbit_quantizer="litgpt",
                  optimizer="adamw_torch", micro_batch_size=1, seq_len=512)
    spec = ModelSpec.from_any("google/gemma-2b")
    assert ledger(built_by(spec, "litgpt"), setup).weight_bytes == ledger(spec, setup).weight_bytes


def test_transformers_configs_refuse_a_litgpt_priced_plan() -> None:
    """A plan priced as litgpt's own GPT has no TrainingArguments / LoraConfig / accelerate file to write: one line
    names the field and what to plan with, as the kbit_quantizer guard does."""
    import pytest
    from helpers import make_rec

    from perfguide.errors import InvalidSetupError

    rec = make_rec({"weights_dtype": "bf16", "lora": {}, "model_code": "litgpt"})
    for emit in (lambda: rec.training_args(output_dir="out"), rec.lora_config, rec.accelerate_config):
        with pytest.raises(InvalidSetupError, match="model_code='transformers'"):
            emit()
    make_rec({"weights_dtype": "bf16", "lora": {}}).lora_config()   # the same plan with transformers' code writes it


def test_litgpt_lora_head_skips_the_final_soft_cap() -> None:
    """litgpt 0.4.12's LoRA step runs the head in chunks (finetune/lora.py lm_head_chunk_size=128), and lora.GPT.forward
    returns those chunks before the final-logit soft-cap line; transformers' Gemma 2 and litgpt's unchunked full step
    keep the cap's tanh output: b x s x vocab in the head's 2 bytes."""
    from perfguide.memory.softcap import final_softcap_bytes

    spec = ModelSpec.from_any("google/gemma-2-2b")
    lora = LoraSpec(r=8, alpha=16, target_modules=("q_proj", "v_proj"))
    setup = Setup(task="train", weights_dtype="bf16", optimizer="adamw_torch", micro_batch_size=2, seq_len=512, lora=lora)
    capped = 2 * 512 * 256000 * 2
    assert final_softcap_bytes(spec, setup) == capped
    assert final_softcap_bytes(spec, setup.replace(model_code="litgpt")) == 0
    assert final_softcap_bytes(spec, setup.replace(model_code="litgpt", lora=None)) == capped
