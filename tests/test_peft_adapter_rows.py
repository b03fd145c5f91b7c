"""Bench rows read with the adapter width of the peft release they ran (``LoraSpec.autocast_adapter_dtype``) and
the single-GPU rows 900-916 read as their notebooks and threads state them.

peft 0.6.0 to 0.11.x cast every new LoRA adapter to its base weight's dtype (LoraLayer.update_layer); 0.3-0.5 left it
fp32 and 0.12.0 upcasts bf16/fp16 adapters to fp32 again (get_peft_model's autocast_adapter_dtype=True).
"""

from __future__ import annotations

import csv
from pathlib import Path

from helpers import load_bench

from perfguide.memory.ledger import ledger

ROOT = Path(__file__).resolve().parents[1]
ROWS = {r["row_id"]: r for r in csv.DictReader((ROOT / "bench" / "data" / "published_measurements.csv").open(encoding="utf-8"))}


def _setup(row_id: str):  # type: ignore[no-untyped-def]
    setup_mod = load_bench("accuracy_setup")
    row = ROWS[row_id]
    spec = load_bench("accuracy_spec")._spec(row["model_hf_id"])
    return spec, setup_mod._train_setup(row, spec)


def test_qwen_profiling_rows_ran_peft_0_6_bf16_adapters_by_hand() -> None:
    """Qwen's README table (2023-11-30: peft 0.6.2 current): Qwen-7B r=64 on every block Linear in bf16. The bench
    prices Qwen-1 as the Qwen2 config of its shape (bench/accuracy_configs.py), whose q/k/v are three Linears where
    Qwen-1 fuses them in c_attn: 32 x 64 x (3 x (4096 + 4096) + (4096 + 4096) + 2 x (4096 + 11008) + (11008 + 4096))
    = 159,907,840 adapter elements (Qwen-1's fused c_attn has 16,777,216 fewer). Each takes 2 bytes for the parameter
    and its gradient and 4 for the two AdamW moments: 8 less than fp32's 16."""
    spec, setup = _setup("702")
    assert setup.lora is not None and not setup.lora.autocast_adapter_dtype
    led = ledger(spec, setup)
    adapters = 32 * 64 * (3 * (4096 + 4096) + (4096 + 4096) + 2 * (4096 + 11008) + (11008 + 4096))
    assert led.trainable_params == adapters == 159_907_840
    assert led.param_bytes == 2
    upcast = ledger(spec, setup.replace(lora=setup.lora.model_copy(update={"autocast_adapter_dtype": True})))
    assert upcast.weight_bytes - led.weight_bytes == adapters * 2


def test_releases_outside_0_6_to_0_11_keep_fp32_adapters() -> None:
    # llama-recipes PR #41 (2023-07-25: peft 0.4, adapters only moved to the device) and LLaMA-Factory #4311 (peft 0.11.1 stated)
    _, old = _setup("966")
    assert old.lora is not None and old.lora.autocast_adapter_dtype
    _, stated = _setup("770")
    assert stated.lora is not None and not stated.lora.autocast_adapter_dtype


def test_single_gpu_rows_read_as_their_sources_state() -> None:
    _, trl_cast = _setup("903")          # trl 0.9.6 SFTTrainer + peft_config, 4-bit, bf16: the recast, adapters left fp32
    assert trl_cast.kbit_recast_bf16 and not trl_cast.kbit_recast_adapters and trl_cast.weights_dtype == "nf4" and trl_cast.kbit_upcast
    _, trl_old = _setup("902")           # trl 0.7.10: its recast casts the adapters too (0.7.5-0.8.6)
    assert trl_old.kbit_recast_bf16 and trl_old.kbit_recast_adapters
    _, own_peft = _setup("900")          # trl 0.4.7 given a PeftModel the notebook built: no recast
    assert not own_peft.kbit_recast_bf16 and own_peft.micro_batch_size == 4 and own_peft.seq_len == 2048
    _, liger = _setup("916")             # 2025 blog: Liger, modules_to_save embed and head, batch 4 x 1024
    assert liger.liger_kernel and liger.lora is not None and set(liger.lora.modules_to_save) == {"lm_head", "embed_tokens"}
    assert (liger.micro_batch_size, liger.seq_len, liger.attn_implementation) == (4, 1024, "flash_attention_2")
    _, int8 = _setup("912")              # llama-recipes quick start: int8 base, checkpointing switched on by peft
    assert int8.weights_dtype == "int8" and int8.gradient_checkpointing


def test_qwen_lora_emb_rows_train_bf16_copies_of_wte_and_lm_head_by_hand() -> None:
    """Qwen's 'LoRA (emb)' rows (base checkpoints: finetune.py sets modules_to_save ["wte", "lm_head"]) add two trained
    151,936 x 4096 copies to Qwen-7B's adapters, in the base's bf16 like the adapters (peft 0.6)."""
    spec, setup = _setup("923")
    assert setup.lora is not None and set(setup.lora.modules_to_save) == {"wte", "lm_head"}
    _, plain = _setup("702")   # the same table's LoRA row on the chat checkpoint: no saved modules
    led, base = ledger(spec, setup), ledger(spec, plain)
    assert led.trainable_params - base.trainable_params == 2 * 151936 * 4096 == 1_244_659_712
    assert led.param_bytes == base.param_bytes == 2


def test_deepspeed_fused_adam_rows_carry_no_parameter_sized_temporary() -> None:
    """A ds config with an AdamW "optimizer" section runs DeepSpeed's FusedAdam (one multi-tensor kernel), not torch's
    foreach AdamW: Qwen-1.8B's full-parameter rows (ZeRO-2 on one A100) read as the fused optimizer, whose step keeps
    no 1.84B-element fp32 temporary (7.4 GB)."""
    _, full = _setup("935")
    assert (full.strategy, full.optimizer, full.lora) == ("zero2", "adamw_torch_fused", None)
