"""ZeRO-3's gathered window, ipg bucket and gradient in flight (perfguide/memory/zero3_window.py), each against a hand
count of what DeepSpeed 0.14.4's code does (runtime/zero/partitioned_param_coordinator.py, stage3.py,
partition_parameters.py) on toy traces, and the walk against DeepSpeed 0.14.4's own run of a tiny Llama on CPU."""

from __future__ import annotations

from typing import Any

import pytest

from perfguide.memory.ledger import ledger
from perfguide.memory.zero3_window import (
    DEEPSPEED_DEFAULT_KNOBS,
    Zero3Knobs,
    persistent_elements,
    stored_per_element,
    trainer_auto_knobs,
    zero3_buffer_bytes,
    zero3_live_elements,
    zero3_trace,
)
from perfguide.model.types import ModelSpec
from perfguide.setup import LoraSpec, Setup

BIG = 10**9


def _seq(*sizes: int) -> tuple[tuple[str, int], ...]:
    return tuple((f"p{i}", s) for i, s in enumerate(sizes))


def test_knobs_are_the_trainer_auto_values_and_deepspeed_defaults() -> None:
    # transformers trainer_config_finalize: hidden^2, int(0.9 hidden^2), 10 hidden; Qwen2-7B h = 3,584
    assert trainer_auto_knobs(3584) == Zero3Knobs(12_845_056, 11_560_550, 35_840, BIG, BIG)
    # deepspeed runtime/zero/config.py: reduce_bucket_size 5e8, prefetch 5e7, persistence 1e5, live / reuse 1e9
    assert DEEPSPEED_DEFAULT_KNOBS == Zero3Knobs(500_000_000, 50_000_000, 100_000, BIG, BIG)


def test_reuse_distance_keeps_a_parameter_used_again_within_it() -> None:
    # a(10) b(10) a(10), no prefetch (bucket 0): after a's first use the walk ahead meets b (10 elements) before a again;
    # kept when 10 < max_reuse_distance, so a and b are gathered together (20); else a is partitioned (peak 10)
    trace = (("a", 10), ("b", 10), ("a", 10))
    assert zero3_live_elements(trace, 3, Zero3Knobs(0, 0, 0, BIG, 11)) == (20, 0)
    assert zero3_live_elements(trace, 3, Zero3Knobs(0, 0, 0, BIG, 10)) == (10, 0)


def test_persistent_parameters_stay_gathered() -> None:
    # ds_persist: numel <= stage3_param_persistence_threshold is never partitioned again: a(10) + b(20) = 30
    trace = _seq(10, 20)
    assert zero3_live_elements(trace, 2, Zero3Knobs(0, 0, 10, BIG, 0)) == (30, 0)
    assert zero3_live_elements(trace, 2, Zero3Knobs(0, 0, 9, BIG, 0)) == (20, 0)


def test_prefetch_runs_ahead_to_max_live_and_overshoots_by_one() -> None:
    # six 10-element Linears, bucket 10, max_live 25; each entry fetches twice (its parent module, then itself), each
    # fetch prefetching while fewer than min(25 - count, 10) elements went out:
    # p0: parent gathers p0 (10), p0's own fetch p1 (20), p0 released (10)
    # p1: parent p2 (20), own fetch: budget min(5, 10) = 5 > 0 so p3 goes too (30: the overshoot), p1 released (20)
    # p2: parent: budget 5, p4 (30); own fetch: budget -5, none; then p3, p4, p5 likewise: the peak is 30
    assert zero3_live_elements(_seq(10, 10, 10, 10, 10, 10), 6, Zero3Knobs(0, 10, 0, 25, 0)) == (30, 0)


def test_the_embedding_released_by_step_is_uncounted() -> None:
    # the same six Linears, then the embedding's backward (10) last: step()'s release_and_reset_all subtracts it after
    # reset_step zeroed the count, so the forward starts the count at -10 and the window reaches 25 + 10 + 5 = 40:
    # p0: parent p0 (live 10, count 0), own p1 (20, 10), release p0 (10, 0)
    # p1: parent p2 (20, 10), own p3 (30, 20), release p1 (20, 10)
    # p2: parent p3 is out, p4 (30, 20), own: budget min(5, 10) = 5, p5 (40, 30): the peak
    trace = (*_seq(10, 10, 10, 10, 10, 10), ("embed", 10))
    assert zero3_live_elements(trace, 6, Zero3Knobs(0, 10, 0, 25, 0))[0] == 40


def test_coalesced_prefetch_keeps_its_flat_buffer_until_the_last_member() -> None:
    # a(4) b(4) c(4) d(20), bucket 8: p0's parent fetch gathers a and b in one all_gather_coalesced, its own fetch c and
    # d in another (24). At c's wait the handle cats c and d out of its flat buffer, which it keeps until d is waited
    # on: c + d (24) + the buffer (24) = 48 elements
    assert zero3_live_elements(_seq(4, 4, 4, 20), 4, Zero3Knobs(0, 8, 0, BIG, 0)) == (48, 0)


CONFIG: dict[str, Any] = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 256,
                          "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 4,
                          "num_key_value_heads": 4, "vocab_size": 8000, "tie_word_embeddings": False, "use_cache": False}


@pytest.fixture(scope="module")
def tiny() -> ModelSpec:
    return ModelSpec.from_any(CONFIG)


def test_trace_order(tiny: ModelSpec) -> None:
    # forward: embedding, 4 x 7 Linears, head (30); backward: head, per block its recompute and its reverse (4 x 14),
    # the embedding its input-grad hook gathers (58)
    trace, backward_from = zero3_trace(tiny, checkpointed=True, embedding_trainable=False)
    assert (backward_from, len(trace)) == (30, 88)
    assert trace[0] == ("embed", 8000 * 256) and trace[29] == ("head", 8000 * 256) and trace[-1][0] == "embed"
    assert trace[31:38] == trace[22:29] and trace[38:45] == trace[22:29][::-1]   # block 3: recompute, then reverse
    plain, back = zero3_trace(tiny, checkpointed=False, embedding_trainable=False)
    assert len(plain) - back == 1 + 4 * 7   # head, the blocks in reverse; no embedding backward


LORA_QV = Setup(task="train", strategy="zero3", num_gpus=2, weights_dtype="bf16",
                lora=LoraSpec(r=8, alpha=16, target_modules=("q_proj", "v_proj")))
TRACED = Zero3Knobs(256 * 256, int(0.9 * 256 * 256), 2560, 1_500_000, 1_500_000)


def test_persistent_elements_are_what_deepspeed_printed(tiny: ModelSpec) -> None:
    # 2 x 4 + 1 RMSNorms of 256 and, per block, q/v's lora_A (8 x 256) and lora_B (256 x 8), all under 10 x 256:
    # 9 x 256 + 4 x 4 x 2048 = 35,072 in 25 tensors, DeepSpeed 0.14.4's own log line in the traced run
    # ("Parameter Offload: Total persistent parameters: 35072 in 25 params")
    assert persistent_elements(tiny, ledger(tiny, LORA_QV).trainable, TRACED) == 9 * 256 + 4 * 4 * 2048 == 35_072


def test_walk_matches_deepspeed_0_14_4_on_cpu(tiny: ModelSpec) -> None:
    """scripts/trace_zero3_window.py ran DeepSpeed 0.14.4 (sdist) on two gloo ranks with this model, PEFT LoRA r 8 on
    q/v, reentrant checkpointing, bf16, the Trainer's "auto" sizes for h 256 and max_live = max_reuse = 1.5e6, and
    summed ds_numel over every parameter not NOT_AVAILABLE after each fetch of step 3: 4,049,152 elements at the forward
    peak, 4,704,512 at the backward one (the same with lm_head trained: a frozen head is gathered as a trained one).
    The walk gives the backward peak to the element; in forward the LoRA wrappers' extra fetches prefetch further
    than the walk's two per Linear (3,655,936: 10% under)."""
    persistent = persistent_elements(tiny, ledger(tiny, LORA_QV).trainable, TRACED)
    forward, backward = zero3_live_elements(*zero3_trace(tiny, checkpointed=True, embedding_trainable=False), TRACED,
                                            persistent)
    assert backward == 4_704_512
    assert forward == pytest.approx(4_049_152, rel=0.1)


def test_buffer_bytes_add_the_ipg_bucket_and_one_gradient(tiny: ModelSpec) -> None:
    # stage3.py __init__: torch.empty(reduce_bucket_size, dtype=self.dtype) (bf16: 2 B); the largest trainable tensor's
    # autograd gradient in the same dtype until the reduce hook takes it (here a 2,048-element adapter); fp32
    # training: 4 B for both and the gathers
    knobs = trainer_auto_knobs(256)
    adapters = ledger(tiny, LORA_QV).trainable
    window = max(zero3_live_elements(*zero3_trace(tiny, True, False), knobs, persistent_elements(tiny, adapters, knobs)))
    assert zero3_buffer_bytes(tiny, LORA_QV, adapters, knobs, checkpointed=True) == 2 * (window + 256 * 256 + 2048)
    fp32 = LORA_QV.replace(weights_dtype="fp32")
    assert zero3_buffer_bytes(tiny, fp32, adapters, knobs, checkpointed=True) == 4 * (window + 256 * 256 + 2048)


QLORA_QV = Setup(task="train", strategy="zero3", num_gpus=2, weights_dtype="nf4", autocast="bf16",
                 lora=LoraSpec(r=8, alpha=16, target_modules=("q_proj", "v_proj")))


def test_qlora_gathers_the_packed_storage(tiny: ModelSpec) -> None:
    # bnb_4bit_quant_storage=bf16: Params4bit holds in x out / 2 bytes as in x out / 4 bf16 elements, and DeepSpeed
    # sets ds_numel = param.numel() of that tensor (partition_parameters.py _convert_to_zero_parameters), so a packed
    # q_proj (256 x 256) is 16,384 elements and gate_proj (256 x 512) 32,768; the embedding and lm_head stay 16-bit
    # (8,000 x 256 each: bitsandbytes quantizes neither). scripts/trace_zero3_qlora_numel.py ran it: DeepSpeed 0.14.4
    # gives a packed 256 x 512 Linear4bit ds_numel 32,768 and leaves its 2,048-element absmax whole on the parameter
    assert (stored_per_element(QLORA_QV), stored_per_element(LORA_QV)) == (4, 1)
    packed, backward_from = zero3_trace(tiny, checkpointed=True, embedding_trainable=False, pack=4)
    assert backward_from == 30 and packed[0] == ("embed", 2_048_000) and packed[29] == ("head", 2_048_000)
    assert dict(packed[1:8]) == {"0.self_attn.q_proj.0": 16_384, "0.self_attn.k_proj.0": 16_384,
                                 "0.self_attn.v_proj.0": 16_384, "0.self_attn.o_proj.0": 16_384,
                                 "0.mlp.gate_proj.0": 32_768, "0.mlp.up_proj.0": 32_768, "0.mlp.down_proj.0": 32_768}
    # the window, bucket and persistence threshold count those packed elements; bytes are 2 B elements (bf16 storage),
    # the ipg bucket 2 B and the largest adapter's (2,048-element) gradient 2 B, as for a bf16 base
    knobs = trainer_auto_knobs(256)
    adapters = ledger(tiny, QLORA_QV).trainable
    window = max(zero3_live_elements(packed, backward_from, knobs, persistent_elements(tiny, adapters, knobs)))
    assert zero3_buffer_bytes(tiny, QLORA_QV, adapters, knobs, checkpointed=True) == 2 * (window + 256 * 256 + 2048)


def test_qlora_absmax_stays_whole_on_every_zero3_rank(tiny: ModelSpec) -> None:
    # DeepSpeed partitions and offloads parameters only; bnb's absmax is Params4bit.quant_state, an attribute. Tiny
    # Llama's 4-bit Linears: 4 x (4 x 256^2 + 3 x 256 x 512) = 2,621,440 weights; /64 = 40,960 uint8 absmax, /256 =
    # 160 fp32 second-level ones (640 B): 41,600 B per GPU, of which the ledger's even split gave each of 2 ranks half
    from perfguide.memory.analytic import replicated_quant_state, training_memory
    from perfguide.memory.ledger import nf4_quant_state_bytes

    assert nf4_quant_state_bytes(tiny) == 40_960 + 640 == 41_600
    assert replicated_quant_state(tiny, QLORA_QV, offloaded=False) == 41_600 - 20_800
    assert replicated_quant_state(tiny, QLORA_QV, offloaded=True) == 41_600   # offload_param: all of it on the GPU
    assert replicated_quant_state(tiny, QLORA_QV.replace(strategy="zero2"), offloaded=False) == 0   # whole anyway
    # offloading the optimizer alone leaves the weights, and so the absmax's even split, on the GPU
    opt_only = QLORA_QV.replace(offload_optimizer=True)
    assert training_memory(tiny, opt_only).weights == training_memory(tiny, QLORA_QV).weights


def test_qlora_under_deepspeed_16bit_trains_the_upcast_params_in_16_bit(acc: Any, rows: dict[str, dict[str, str]]) -> None:
    # peft's prepare_model_for_kbit_training upcasts embeddings, head and norms to fp32, but DeepSpeed's engine, given
    # a model that was not built under zero.Init (transformers skips it for a quantized model), runs module.bfloat16()
    # (or .half()) in _configure_distributed_model (deepspeed runtime/engine.py 0.14.4): row 969 (ZeRO-3, DeepSpeed
    # bf16) trains them in 16 bit (memory/kbit.kbit_fp32_parts False); 805 (ZeRO-2 whose config has no fp16 section: no cast)
    # and a single-GPU HF + PEFT QLoRA row (943) keep fp32
    from perfguide.memory.kbit import kbit_fp32_parts

    spec = acc._spec(rows["969"]["model_hf_id"])
    z3 = acc._train_setup(rows["969"], spec)
    assert (z3.weights_dtype, z3.strategy, z3.kbit_upcast, kbit_fp32_parts(z3)) == ("nf4", "zero3", True, False)
    assert kbit_fp32_parts(acc._train_setup(rows["805"], acc._spec(rows["805"]["model_hf_id"])))
    assert kbit_fp32_parts(acc._train_setup(rows["943"], acc._spec(rows["943"]["model_hf_id"])))
    # so each of its 80 checkpointed blocks keeps a bf16 input: 2 x 2,048 tokens x 8,192 x 2 B = 67,108,864 B
    from perfguide.memory.activations import checkpoint_boundary_bytes

    assert checkpoint_boundary_bytes(spec, z3) == 2 * 2048 * 8192 * 2
    assert checkpoint_boundary_bytes(spec, z3.replace(strategy="fsdp")) == 2 * 2048 * 8192 * 4   # no engine cast
