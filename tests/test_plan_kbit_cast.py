"""perfguide's own QLoRA plans leave the non-quantized parameters in their 16-bit load dtype, as TRL's SFTTrainer does
(no peft prepare_model_for_kbit_training), and say what the fp32 upcast would have cost on the same plan.

The bytes are checked against a hand count from Llama-3.1-8B's config (vocabulary 128,256, hidden 4,096, 32 blocks,
untied head): the upcast adds 2 bytes to every embedding and head weight, so the saving is at least
2 x 2 x 128,256 x 4,096 = 2.10 GB, plus the fp32 residual stream the fp32 norms make."""

from __future__ import annotations

import pytest

import perfguide

VOCAB, HIDDEN = 128_256, 4_096
EMBED_AND_HEAD_UPCAST = 2 * 2 * VOCAB * HIDDEN   # two matrices, 4 - 2 bytes each


def _decision(rec, setting):
    return next(d for d in rec.decisions if d.setting == setting)


@pytest.fixture(scope="module")
def one_gpu():
    return perfguide.recommend("meta-llama/Llama-3.1-8B", "train_gpu_one", hardware="rtx4090", seq_len=4096, finetune="qlora")


def test_the_plan_keeps_the_rest_16_bit_and_prices_the_upcast_it_leaves_out(one_gpu) -> None:
    assert one_gpu.setup.quantized and one_gpu.setup.kbit_upcast is False
    d = _decision(one_gpu, "kbit_upcast")
    assert d.value is False and "prepare_model_for_kbit_training" in d.reason and "trl" in d.source.lower()
    # at least the weights' own bytes, and not more than the weights plus an fp32 copy of every block input at
    # this plan's shape (the residual stream the fp32 norms make: 2 more bytes per hidden value per block)
    s = one_gpu.setup
    stream = 2 * s.micro_batch_size * s.seq_len * HIDDEN * (32 + 1)
    assert EMBED_AND_HEAD_UPCAST <= d.number <= EMBED_AND_HEAD_UPCAST + stream + 0.5 * 2**30, d.number
    # the number is the priced difference: the same Setup with the upcast needs exactly that much more
    from perfguide.memory import estimate_memory
    upcast = estimate_memory(one_gpu.model, s.replace(kbit_upcast=True), one_gpu.hardware)
    assert upcast.needed - one_gpu.memory.needed == pytest.approx(d.number, rel=1e-9)


def test_a_sharded_qlora_plan_skips_the_upcast_as_trl_does_for_fsdp() -> None:
    rec = perfguide.recommend("meta-llama/Llama-3.1-70B", "train_gpu_many", hardware="rtx4090:2", seq_len=1024, finetune="qlora")
    assert rec.setup.shards_params and rec.setup.kbit_upcast is False
    assert _decision(rec, "kbit_upcast").number > 0


def test_a_plan_without_a_quantized_base_says_nothing_of_the_cast() -> None:
    rec = perfguide.recommend("meta-llama/Llama-3.1-8B", "train_gpu_one", hardware="a100-80gb", seq_len=2048, finetune="lora")
    assert not rec.setup.quantized
    assert all(d.setting != "kbit_upcast" for d in rec.decisions)
