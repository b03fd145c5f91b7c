"""A quantized base under ZeRO-3 is whole on every GPU while it loads (transformers skips zero.Init for bitsandbytes;
huggingface/peft#2016), and DeepSpeed's bf16 engine casts peft's fp32 upcast back (memory/kbit.py)."""

import pytest

import perfguide
from perfguide import ModelSpec, Setup
from perfguide.memory.analytic import zero3_load_bytes
from perfguide.memory.kbit import kbit_fp32_parts

# Llama-2-70B by hand: 80 blocks of q, o (8192^2), k, v (8192 x 1024) and gate, up, down (8192 x 28672); 32000-token
# embedding and head; two norms per block and a final one
LINEAR = 80 * (2 * 8192**2 + 2 * 8192 * 1024 + 3 * 8192 * 28672)
REST = 2 * 32000 * 8192 + (2 * 80 + 1) * 8192
NF4_DQ = 0.5 + 1 / 64 + 4 / (64 * 256)   # packed nibbles, uint8 absmax per 64, fp32 per 256 absmax blocks
# LoRA r=8 on the seven Linears (get_peft_model runs before the Trainer hands the model to DeepSpeed): fp32 A and B
ADAPTERS = 80 * 8 * (2 * (8192 + 8192) + 2 * (8192 + 1024) + 3 * (8192 + 28672))


def _setup(**kw: object) -> Setup:
    base = dict(weights_dtype="nf4", autocast="bf16", strategy="zero3", num_gpus=2, seq_len=2048, micro_batch_size=1,
                gradient_checkpointing=True, lora={"r": 8})
    return Setup(**{**base, **kw})


def test_the_load_peak_is_the_whole_quantized_model_per_gpu():
    spec = ModelSpec.from_any("meta-llama/Llama-2-70b-hf")
    hand = LINEAR * NF4_DQ + REST * 2 + ADAPTERS * 4   # the rest in bf16: the engine casts peft's upcast back
    assert zero3_load_bytes(spec, _setup()) == pytest.approx(hand, rel=0.01)
    assert zero3_load_bytes(spec, _setup(strategy="fsdp")) == 0   # FSDP loads shard by shard (cpu_ram_efficient_loading)


def test_the_engine_casts_the_upcast_back():
    assert not kbit_fp32_parts(_setup()) and kbit_fp32_parts(_setup(strategy="fsdp"))
    assert kbit_fp32_parts(_setup(strategy="zero2", autocast=None))   # no 16-bit engine mode: the fp32 parts stay


def test_a_70b_qlora_zero3_does_not_load_on_24_gb_cards():
    # 36 GB of 4-bit weights on each 24 GB card before partitioning: the plan says so instead of "fits"
    rec = perfguide.recommend("meta-llama/Llama-2-70b-hf", "train_gpu_many", hardware="rtx4090:2", finetune="qlora",
                              strategy="zero3")
    assert not rec.fits and any("before ZeRO-3 partitions it" in n for n in rec.memory.notes)
    best = perfguide.recommend("meta-llama/Llama-2-70b-hf", "train_gpu_many", hardware="rtx4090:2", finetune="qlora")
    assert best.fits and best.setup.strategy != "zero3"
