"""Analytic training memory: every expected number is hand-computed from the tiny config below or taken
from the real library (transformers / peft), never from perfguide's own output."""

from __future__ import annotations

import os

import pytest

from perfguide.memory.activations import fp32_mlp_bytes
from perfguide.memory.analytic import training_memory as estimate_memory
from perfguide.memory.ledger import ledger
from perfguide.memory.optimizers import TensorGroup, optimizer_cost, state_bytes_per_param
from perfguide.model.types import ModelSpec
from perfguide.setup import LoraSpec, Setup

os.environ.setdefault("HF_HUB_OFFLINE", "1")

H, L, V, I, HEADS = 64, 2, 128, 128, 4
LINEARS = {
    "self_attn.q_proj": (H, H), "self_attn.k_proj": (H, H), "self_attn.v_proj": (H, H), "self_attn.o_proj": (H, H),
    "mlp.gate_proj": (H, I), "mlp.up_proj": (H, I), "mlp.down_proj": (I, H),
}
# hand count: per layer 4*64*64 + 3*64*128 = 40960 Linear weights, 2 RMSNorms of 64; final norm 64;
# untied embedding and lm_head 128*64 each
LINEAR_PARAMS = 2 * 40960
NORM_PARAMS = 2 * 2 * 64 + 64
TOTAL = LINEAR_PARAMS + 2 * V * H + NORM_PARAMS  # 98624


def tiny(**kw: object) -> ModelSpec:
    base = dict(name="tiny-llama", model_type="llama", family="llama", hidden_size=H, num_layers=L,
                num_attention_heads=HEADS, num_key_value_heads=HEADS, head_dim=H // HEADS, intermediate_size=I,
                vocab_size=V, total_params=TOTAL, embedding_params=V * H, lm_head_params=V * H, block_linears=LINEARS)
    base.update(kw)
    return ModelSpec(**base)  # type: ignore[arg-type]


def _hf_tiny():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=H, intermediate_size=I, num_hidden_layers=L, num_attention_heads=HEADS,
                                   num_key_value_heads=HEADS, vocab_size=V, tie_word_embeddings=False)
    return transformers.AutoModelForCausalLM.from_config(cfg)


def test_hand_count_matches_real_hf_model() -> None:
    model = _hf_tiny()
    assert sum(p.numel() for p in model.parameters()) == TOTAL == 98624


@pytest.mark.parametrize("dtype,nbytes", [("fp32", 4), ("bf16", 2), ("fp16", 2)])
def test_weights_grads_adamw_plain_dtypes(dtype: str, nbytes: int) -> None:
    est = estimate_memory(tiny(), Setup(weights_dtype=dtype, optimizer="adamw_torch_fused"))
    assert est.weights == TOTAL * nbytes
    assert est.gradients == TOTAL * nbytes
    # torch AdamW keeps exp_avg and exp_avg_sq in the parameter dtype
    assert est.optimizer_states == 2 * TOTAL * nbytes


def test_amp_fp32_master_is_16_bytes_per_param_of_model_states() -> None:
    est = estimate_memory(tiny(), Setup(weights_dtype="fp32", autocast="bf16"))
    assert est.weights + est.gradients + est.optimizer_states == 16 * TOTAL


def test_int8_and_nf4_weight_bytes() -> None:
    rest = (TOTAL - LINEAR_PARAMS) * 4  # embeddings, lm_head, norms: fp32 after prepare_model_for_kbit_training
    rows = L * (4 * 64 + 2 * 128 + 64)  # one fp32 scale per output row of each Linear
    lora = LoraSpec(r=4, target_modules=("q_proj",))
    adapters = L * 4 * (64 + 64) * 4  # fp32 adapters
    int8 = ledger(tiny(), Setup(weights_dtype="int8", lora=lora))
    assert int8.weight_bytes == LINEAR_PARAMS + rows * 4 + rest + adapters
    nf4 = ledger(tiny(), Setup(weights_dtype="nf4", lora=lora))
    blocks = LINEAR_PARAMS // 64  # 8-bit absmax per 64 weights, fp32 absmax per 256 blocks (double quant)
    assert nf4.weight_bytes == LINEAR_PARAMS // 2 + blocks + (-(-blocks // 256)) * 4 + rest + adapters


def test_lora_dropout_keeps_a_one_byte_mask_per_adapted_input() -> None:
    base = Setup(weights_dtype="bf16", micro_batch_size=2, seq_len=64, lora=LoraSpec(r=4, target_modules=("q_proj", "o_proj")))
    dropped = base.replace(lora=base.lora.model_copy(update={"dropout": 0.05}))
    diff = estimate_memory(tiny(), dropped).activations - estimate_memory(tiny(), base).activations
    assert diff == L * 2 * 64 * (H + H)  # tokens x (q_proj + o_proj inputs) x 1 byte, every block


def test_nf4_double_quant_is_about_4_127_bits() -> None:
    big = tiny(block_linears={"w": (8192, 8192)}, num_layers=1, total_params=8192 * 8192 + 1, embedding_params=0,
               lm_head_params=0)
    led = ledger(big, Setup(weights_dtype="nf4", lora=LoraSpec(r=1, target_modules=("w",))))
    bits = (led.weight_bytes - 4 - (8192 + 8192) * 4) * 8 / (8192 * 8192)  # minus the fp32 rest and adapters
    assert bits == pytest.approx(4.127, abs=0.001)


def test_lora_trainable_count_matches_peft() -> None:
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(_hf_tiny(), peft.LoraConfig(r=8, target_modules="all-linear"))
    real = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert real == L * (4 * 8 * (64 + 64) + 3 * 8 * (64 + 128))  # hand count: 17408
    led = ledger(tiny(), Setup(lora=LoraSpec(r=8, target_modules="all-linear")))
    assert led.trainable_params == real
    qv = ledger(tiny(), Setup(lora=LoraSpec(r=8, target_modules=("q_proj", "v_proj"))))
    assert qv.trainable_params == L * 2 * 8 * 128


def test_lora_grads_and_states_only_for_adapters() -> None:
    est = estimate_memory(tiny(), Setup(weights_dtype="bf16", lora=LoraSpec(r=8, target_modules=("q_proj",))))
    n = L * 8 * 128
    assert est.gradients == 4 * n and est.optimizer_states == 8 * n


def test_unknown_lora_target_is_one_line_error() -> None:
    from perfguide.errors import InvalidSetupError

    with pytest.raises(InvalidSetupError, match="match no Linear"):
        estimate_memory(tiny(), Setup(lora=LoraSpec(target_modules=("query_key_value",))))


def _groups() -> list[TensorGroup]:
    return [TensorGroup(1, V, H, "embedding"), TensorGroup(1, V, H, "linear"),
            TensorGroup(8, H, H), TensorGroup(4, I, H), TensorGroup(2, H, I), TensorGroup(5, H, 1, "other")]


def test_optimizer_state_bytes_by_name() -> None:
    groups = _groups()
    assert sum(g.total for g in groups) == TOTAL
    assert optimizer_cost("sgd", groups, 4).states == 0
    assert optimizer_cost("adagrad", groups, 4).states == 4 * TOTAL
    assert optimizer_cost("lion_32bit", groups, 2).states == 4 * TOTAL  # bnb 32-bit state is fp32 always
    assert optimizer_cost("ademamix", groups, 4).states == 12 * TOTAL
    # adafactor: rows+cols per matrix (+4 B RMS scalar), full vector for 1-D
    fact = (V + H) * 2 + 8 * (H + H) + 4 * (I + H) + 2 * (H + I)
    assert optimizer_cost("adafactor", groups, 4).states == 4 * (fact + 5 * H) + 4 * (1 + 1 + 8 + 4 + 2 + 5)


def test_bnb_8bit_keeps_small_and_embedding_state_32bit() -> None:
    def q8(n: int) -> int:  # two uint8 states + fp32 absmax per 2048-block
        return 2 * (n + -(-n // 2048) * 4)

    expected = (8 * V * H  # embedding: Trainer registers a 32-bit override
                + q8(V * H) + 8 * q8(H * H) + 4 * q8(I * H) + 2 * q8(H * I)
                + 8 * 5 * H)  # norms (< 4096 elements) stay 32-bit
    assert optimizer_cost("adamw_bnb_8bit", _groups(), 4).states == expected
    assert state_bytes_per_param("adamw_8bit") == pytest.approx(2 + 8 / 2048)


def test_foreach_adamw_step_temporary_and_fused_none() -> None:
    g = _groups()
    assert optimizer_cost("adamw_torch", g, 4).step_temp == 4 * TOTAL
    assert optimizer_cost("adamw_torch_fused", g, 4).step_temp == 0


def test_logits_are_fp32_loss_buffers() -> None:
    est = estimate_memory(tiny(), Setup(micro_batch_size=3, seq_len=16))
    # Trainer.compute_loss drops the model output before backward, so the fp32 logits are freed; what coexists at
    # the loss peak is log_softmax's saved output, the gradient flowing into it and the logits gradient: 3 x 4 bytes
    # (the fake-tensor trace of the real HF loss measures the same; see tests/test_trace.py)
    # (the committed coefficient is fitted from traces, so it carries the allocator's 512-byte rounding: 12.001)
    assert est.logits == pytest.approx(3 * 16 * V * 12, rel=1e-3)


def test_step_peak_is_20_bytes_per_param_with_foreach_adamw() -> None:
    big = tiny(total_params=TOTAL * 1000)  # parameters dominate: peak in the foreach step
    est = estimate_memory(big, Setup(optimizer="adamw_torch", seq_len=1))
    assert est.peak_allocated == 20 * TOTAL * 1000


def test_gradient_accumulation_holds_grads_through_forward() -> None:
    one = estimate_memory(tiny(), Setup(micro_batch_size=8, seq_len=256))
    acc = estimate_memory(tiny(), Setup(micro_batch_size=8, seq_len=256, gradient_accumulation_steps=4))
    assert acc.peak_allocated > one.peak_allocated


def test_checkpointing_and_eager_attention_direction() -> None:
    base = Setup(micro_batch_size=8, seq_len=512, weights_dtype="bf16", autocast="bf16")
    plain = estimate_memory(tiny(), base)
    ckpt = estimate_memory(tiny(), base.replace(gradient_checkpointing=True))
    eager = estimate_memory(tiny(), base.replace(attn_implementation="eager"))
    assert ckpt.activations < plain.activations < eager.activations
    assert ckpt.logits == plain.logits  # checkpointing leaves the loss buffers alone


@pytest.mark.parametrize("field", ["micro_batch_size", "seq_len"])
def test_monotonic_in_batch_and_sequence(field: str) -> None:
    for setup in (Setup(), Setup(weights_dtype="bf16", gradient_checkpointing=True, attn_implementation="eager"),
                  Setup(weights_dtype="nf4", lora=LoraSpec(r=8))):
        peaks = [estimate_memory(tiny(), setup.model_copy(update={field: v})).peak_allocated for v in (1, 2, 4, 64, 512)]
        assert peaks == sorted(peaks) and peaks[0] < peaks[-1]


def test_reserved_and_device_total_ordering() -> None:
    est = estimate_memory(tiny(), Setup(micro_batch_size=4))
    assert est.peak_allocated <= est.peak_reserved <= est.device_total


def test_inference_dispatches_to_inference_model() -> None:
    """The task is dispatched once, at the entry; the training model refuses an inference Setup."""
    from perfguide.errors import InvalidSetupError
    from perfguide.memory import estimate_memory as entry

    infer = Setup(task="infer", weights_dtype="bf16", optimizer=None, new_tokens=8)
    est = entry(tiny(), infer)
    assert est.gradients == 0 and est.optimizer_states == 0 and est.weights >= 2 * TOTAL * 0.99
    with pytest.raises(InvalidSetupError, match="training_memory prices training steps, not task='infer'"):
        estimate_memory(tiny(), infer)


def test_training_with_inference_strategy_is_rejected() -> None:
    from perfguide.errors import InvalidSetupError

    with pytest.raises(InvalidSetupError, match="for inference"):
        estimate_memory(tiny(), Setup(strategy="tp", num_gpus=2))


def test_loss_bytes_replace_the_loss_path_buffers() -> None:
    """A framework loss path (litgpt chunked CE, a benchmark's logits.sum()) swaps HF's fp32 CE buffers out:
    the peak is then resident state + activations + exactly those bytes, in the forward/loss phase."""
    setup = Setup(micro_batch_size=4, seq_len=256, weights_dtype="bf16", optimizer="sgd")
    small, big = 4 * 4 * 256 * V, 64 * 4 * 256 * V     # 2+2 bytes per b*s*V (16-bit logits + their grad), and 16x that
    a, b = (estimate_memory(tiny(), setup, loss_bytes=x) for x in (small, big))
    assert a.logits == small and b.logits == big
    assert b.peak_allocated - a.peak_allocated == big - small  # both peak with the loss buffers alive
    # hand count of the rest: bf16 weights, SGD without momentum keeps no state, the lm_head grad (bf16) is born
    # while the loss buffers live
    # + what the final norm and the trained head keep (8 B per hidden unit per token in bf16, top_of_stack.py)
    assert a.peak_allocated == 2 * TOTAL + a.activations + small + 2 * V * H + 4 * 256 * H * 8
    assert estimate_memory(tiny(), setup).logits != small  # the default is HF's fp32 cross-entropy path


def test_checkpoint_recompute_and_loss_buffers_never_coincide() -> None:
    """Non-reentrant checkpointing recomputes the top block when backward first unpacks its saved tensors, after
    the loss and head backward freed their buffers: peak = max(boundaries + loss, boundaries + one block + the
    gradients its backward holds in flight). Full fine-tuning in bf16, non-reentrant (test_block_backward.py): the
    gated product's gradient and its factors' less the product down_proj kept (2 x 2 B per FFN unit); nothing per
    hidden unit beyond the saved tensors (the block's output is never recomputed, the bf16 input is not saved)."""
    setup = Setup(micro_batch_size=4, seq_len=256, weights_dtype="bf16", optimizer="sgd", gradient_checkpointing=True)
    plain = setup.replace(gradient_checkpointing=False)
    block = estimate_memory(tiny(), plain, loss_bytes=0).activations // L   # one block's full activations
    boundaries = L * 4 * 256 * H * 2                                          # each block's bf16 input
    for loss in (0, 10 * block):
        est = estimate_memory(tiny(), setup, loss_bytes=loss)
        assert est.activations == boundaries + block
        top = 4 * 256 * H * 8   # the final norm's and the trained head's inputs, beside the loss buffers (top_of_stack.py)
        in_flight = 4 * 256 * 4 * I
        # from the forward on (test_backward_phases.py): the rotary cos / sin (one [1, s, head_dim] bf16 pair), the
        # batch's int64 ids, labels and mask and the position ids (one row); as a recompute starts also the block's
        # incoming bf16 gradient
        steps = 2 * (H // HEADS) * 2 * 256 + 8 * (3 * 4 + 1) * 256
        held = 4 * 256 * H * 2 + steps
        start = boundaries + max(loss + top + steps, block + in_flight + held) + 2 * V * H   # loss, or the top block's recompute
        # at block 0's peak a first micro-step has made every gradient but block 0's (q, k, v, o 64 x 64, gate, up
        # 64 x 128, two norms; down_proj's is there) and the untied embedding's (128 x 64)
        pending = 4 * H * H + 2 * H * I + 2 * H + V * H
        end = 2 * (TOTAL - pending) + block + in_flight + held + boundaries // L   # block 0's recompute and input
        assert est.peak_allocated == 2 * TOTAL + max(start, end)


def test_fsdp1_lora_frozen_weights_get_sharded_grads_and_keep_inputs() -> None:
    """FSDP1 use_orig_params with LoRA, its adapters in their block's unit (accelerate's plain transformer wrap, not
    the HF Trainer's peft wrap): each block's FlatParameter requires grad, so every frozen weight of a block
    gets a (sharded) gradient and every frozen Linear keeps its input, as in full fine-tuning; the root unit
    (embedding and head, 2 x V x H, all frozen) gets none (traced: tests/test_fsdp_live_peak.py). FSDP2 shards per
    parameter: frozen weights get none, as under DDP (divided by the ranks)."""
    n, r = 2, 4
    lora = LoraSpec(r=r, target_modules=("q_proj",))
    common = dict(weights_dtype="bf16", strategy="fsdp", num_gpus=n, lora=lora, micro_batch_size=2, seq_len=64)
    fsdp = estimate_memory(tiny(), Setup(**common, fsdp_version=1, fsdp_adapter_units=False))
    trainer = estimate_memory(tiny(), Setup(**common, fsdp_version=1))   # the HF Trainer wraps the adapters apart
    assert trainer.gradients == estimate_memory(tiny(), Setup(**common)).gradients
    adapters = L * (r * H + H * r)                   # lora_A (r x 64) + lora_B (64 x r) per block
    assert fsdp.gradients == (adapters * 4 + (TOTAL - 2 * V * H) * 2) // n  # fp32 adapter grads + bf16 grads of the blocks' weights
    assert estimate_memory(tiny(), Setup(**common)).gradients == adapters * 4 // n
    ddp = estimate_memory(tiny(), Setup(weights_dtype="bf16", strategy="ddp", num_gpus=n, lora=lora, micro_batch_size=2, seq_len=64))
    assert ddp.gradients == adapters * 4                 # DDP: only the adapters
    full = estimate_memory(tiny(), Setup(weights_dtype="bf16", micro_batch_size=2, seq_len=64))
    # full fine-tuning's activations plus the adapter branch: PEFT casts q_proj's input to fp32 for lora_A and
    # keeps the r-wide lora_A output (fp32) for lora_B
    assert fsdp.activations == full.activations + L * 2 * 64 * (H + r) * 4


def test_old_bitsandbytes_4bit_keeps_frozen_inputs() -> None:
    """bnb MatMul4Bit saved its input A for backward until 0.43.2 (PR #1270); int8 MatMul8bitLt still does."""
    setup = Setup(weights_dtype="nf4", micro_batch_size=2, seq_len=64, lora=LoraSpec(r=4, target_modules=("q_proj",)))
    new, old = estimate_memory(tiny(), setup), estimate_memory(tiny(), setup, bnb_version="0.41.1")
    assert estimate_memory(tiny(), setup, bnb_version="0.43.2").activations == new.activations
    bf16 = estimate_memory(tiny(), setup.replace(weights_dtype="bf16"))
    # a k-bit base in peft's fp32 stream keeps its gated MLP's intermediates in fp32 (test_block_backward.py)
    fp32_mlp = fp32_mlp_bytes(tiny(), setup) * tiny().num_layers
    assert old.activations > new.activations == bf16.activations + fp32_mlp > bf16.activations
    int8 = estimate_memory(tiny(), setup.replace(weights_dtype="int8"))
    assert int8.activations == old.activations
