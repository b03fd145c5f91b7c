"""ZeRO-3's optimizer step: it converts its gradients to fp32 and runs the optimizer one sub-group at a time (ZeRO-1/2
the whole partition), and it holds no gathered parameter.

Read in DeepSpeed 0.16.5 runtime/zero/stage3.py: ``step()`` first calls ``_partition_all_parameters``
(``release_and_reset_all``: every gathered parameter partitioned again; persistent ones are never partitioned), then
runs ``_prepare_sub_group`` (``flatten(averaged_gradients[i]).to(fp32)``: a flat 16-bit copy, then the fp32 one), the
update (``_optimizer_step`` hands the optimizer that sub-group's flat fp32 partition alone), then ``_release_sub_group`` ("get rid of the fp32 gradients. Not needed anymore"), sub-group by sub-group;
``_create_fp16_sub_groups`` closes a sub-group once its parameters' partition elements reach ``sub_group_size``
(config default 1e9). The ipg bucket (``torch.empty(reduce_bucket_size)`` in ``__init__``) stays to ``destroy()``.

Hand counts, Qwen2.5-7B (7,615,616,512 parameters; embedding and untied head 152,064 x 3,584 = 544,997,376 each) fully
fine-tuned under ZeRO-3 on 4 GPUs: a rank's partition is 1,903,904,128 elements; a sub-group holds at most 1e9 plus the
crossing parameter's partition, bounded by the largest tensor's 136,249,344: 1,136,249,344 elements. The step's
temporaries per element: the fp32 gradient (4 B) with the flat 16-bit copy beside it (2 B), and torch AdamW's foreach
``exp_avg_sq_sqrt`` (4 B): 10 B, so 11,362,493,440 B for the sub-group against 19,039,041,280 B for the whole
partition, 7,676,547,840 B less at the optimizer step. What the step still holds of ZeRO-3's
buffers: the persistent tensors (numel <= the "auto" threshold 10 x 3,584 = 35,840: 57 RMSNorm weights x 3,584 =
204,288 and 28 layers' q/k/v biases x (3,584 + 512 + 512) = 129,024, 333,312 elements) and the ipg bucket ("auto":
3,584^2 = 12,845,056 elements), in bf16: 2 x 13,178,368 = 26,356,736 B.
"""

from __future__ import annotations

import pytest

from perfguide.memory import analytic, zero_runtime
from perfguide.memory.analytic import training_memory
from perfguide.memory.ledger import ledger
from perfguide.memory.zero3_window import persistent_elements, zero3_buffer_bytes, zero3_knobs, zero3_step_release
from perfguide.memory.zero_runtime import step_only_fp32_grads, sub_group_step_bytes
from perfguide.model.types import ModelSpec
from perfguide.setup import Setup

QWEN_PARTITION_FP32 = 4 * 1_903_904_128          # 7,615,616,512 B
SUB_GROUP_STEP = 10 * (10**9 + 136_249_344)      # 11,362,493,440 B: fp32 gradient + 16-bit flat copy + foreach temp
WHOLE_STEP = 10 * 1_903_904_128                   # 19,039,041,280 B
STEP_HELD = 2 * (333_312 + 12_845_056)             # 26,356,736 B: persistent tensors + ipg bucket, bf16


def _setup(strategy: str, seq_len: int = 8192) -> Setup:
    # ms-swift's liger/sft.sh run (row 2400): bf16 autocast over fp32 master weights, the Trainer's foreach AdamW, 4 GPUs
    return Setup(micro_batch_size=1, seq_len=seq_len, gradient_accumulation_steps=2, weights_dtype="fp32", autocast="bf16", optimizer="adamw_torch",
                 gradient_checkpointing=True, attn_implementation="flash_attention_2", strategy=strategy, num_gpus=4,
                 liger_kernel=True)


def test_zero3_steps_one_sub_group_zero2_the_whole_partition() -> None:
    qwen = ModelSpec.from_any("Qwen/Qwen2.5-7B")
    z3, z2 = _setup("zero3"), _setup("zero2")
    trainable = ledger(qwen, z3).trainable
    assert step_only_fp32_grads(z3, qwen.total_params) == QWEN_PARTITION_FP32
    assert sub_group_step_bytes(z3, qwen.total_params, trainable, WHOLE_STEP) == SUB_GROUP_STEP == 11_362_493_440
    assert sub_group_step_bytes(z2, qwen.total_params, trainable, WHOLE_STEP) == WHOLE_STEP == 19_039_041_280


def test_a_partition_under_one_sub_group_is_stepped_whole() -> None:
    pythia = ModelSpec.from_any("EleutherAI/pythia-160m")
    z3 = _setup("zero3")
    assert sub_group_step_bytes(z3, pythia.total_params, ledger(pythia, z3).trainable, 10**9) == 10**9


def test_the_zero3_step_holds_the_persistent_tensors_and_the_bucket_only() -> None:
    qwen = ModelSpec.from_any("Qwen/Qwen2.5-7B")
    setup, knobs = _setup("zero3"), zero3_knobs(qwen)
    assert persistent_elements(qwen, (), knobs) == 333_312 and knobs.reduce_bucket_size == 12_845_056
    trainable = ledger(qwen, setup).trainable
    window = zero3_buffer_bytes(qwen, setup, trainable, knobs, checkpointed=True)
    assert window - zero3_step_release(qwen, setup, trainable, window, checkpointed=True) == STEP_HELD
    assert zero3_step_release(qwen, _setup("zero2"), trainable, window, checkpointed=True) == 0


def test_the_zero3_step_peak_holds_one_sub_group_and_no_gathered_parameter(monkeypatch: pytest.MonkeyPatch) -> None:
    qwen = ModelSpec.from_any("Qwen/Qwen2.5-7B")
    setup = _setup("zero3", seq_len=2048)   # short enough that the step is the peak however it is priced
    trainable = ledger(qwen, setup).trainable
    released = zero3_buffer_bytes(qwen, setup, trainable, zero3_knobs(qwen), checkpointed=True) - STEP_HELD
    priced = training_memory(qwen, setup)
    assert "peak in optimizer step" in priced.notes
    monkeypatch.setattr(zero_runtime, "SUB_GROUP_ELEMENTS", 10**12)   # stage3.py's own signature default: one sub-group
    whole = training_memory(qwen, setup)
    assert whole.peak_allocated - priced.peak_allocated == WHOLE_STEP - SUB_GROUP_STEP == 7_676_547_840
    monkeypatch.setattr(zero_runtime, "SUB_GROUP_ELEMENTS", 10**9)
    monkeypatch.setattr(analytic, "zero3_step_release", lambda *args, **kwargs: 0)   # the window kept through the step
    assert training_memory(qwen, setup).peak_allocated - priced.peak_allocated == released
