"""FSDP's side-stream pools under CPU offload: every expected byte count is derived by hand from the models' configs
(tests/test_memory.py's tiny Llama, Llama-2-70B and Llama-3-70B as published), never from perfguide's output."""

from __future__ import annotations

from test_memory import LINEAR_PARAMS, TOTAL, H, L, V, tiny

from perfguide.memory.analytic import training_memory
from perfguide.memory.overhead import reserved_from_allocated
from perfguide.memory.sharding import offload_staging_bytes
from perfguide.model.types import ModelSpec
from perfguide.setup import LoraSpec, Setup

# Llama-2-70B (config.json): hidden 8192, 80 layers, 64 heads / 8 KV heads of 128, MLP 28672, vocab 32000, untied
LLAMA2_70B_LINEARS = {"self_attn.q_proj": (8192, 8192), "self_attn.k_proj": (8192, 1024), "self_attn.v_proj": (8192, 1024),
                      "self_attn.o_proj": (8192, 8192), "mlp.gate_proj": (8192, 28672), "mlp.up_proj": (8192, 28672),
                      "mlp.down_proj": (28672, 8192)}


def _llama70b(vocab: int) -> ModelSpec:
    emb = vocab * 8192
    linears = 80 * (2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28672)
    norms = 80 * 2 * 8192 + 8192
    return ModelSpec(name=f"llama-70b-v{vocab}", model_type="llama", family="llama", hidden_size=8192, num_layers=80,
                     num_attention_heads=64, num_key_value_heads=8, head_dim=128, intermediate_size=28672,
                     vocab_size=vocab, total_params=linears + 2 * emb + norms, embedding_params=emb, lm_head_params=emb,
                     block_linears=LLAMA2_70B_LINEARS)


QLORA = dict(weights_dtype="nf4", kbit_upcast=False, lora=LoraSpec(r=8, alpha=16, target_modules="all-linear"),
             gradient_checkpointing=True, seq_len=2048, micro_batch_size=2)


def test_root_shard_of_llama2_70b_qlora_on_two_gpus() -> None:
    """PEFT docs' FSDP + QLoRA recipe: the root unit holds embed_tokens and lm_head (32000 x 8192 each, bf16 since
    TRL skips the kbit upcast): 2 x 262,144,000 x 2 B = 1,048,576,000 B, half per rank. A block's packed nf4 weights
    (855,638,016 x 0.5 B = 427,819,008 B) are smaller, so the root's shard is the largest copy staged."""
    setup = Setup(strategy="fsdp", num_gpus=2, offload_params=True, offload_optimizer=True, **QLORA)
    assert offload_staging_bytes(_llama70b(32000), setup, params_offloaded=True) == 524_288_000


def test_root_shard_of_llama3_70b_qlora_on_four_gpus() -> None:
    """philschmid's Llama-3-70B run on 4 x A10G: vocab 128256 -> 1,050,673,152 parameters each for the embedding and
    the head, 2 B each, a quarter per rank = 1,050,673,152 B."""
    setup = Setup(strategy="fsdp", num_gpus=4, offload_params=True, offload_optimizer=True, **QLORA)
    assert offload_staging_bytes(_llama70b(128256), setup, params_offloaded=True) == 2 * 128256 * 8192 * 2 // 4 == 1_050_673_152


def test_a_block_larger_than_the_root_sets_the_pool() -> None:
    """tiny Llama with a 16-token vocabulary: root 2 x 16 x 64 = 2,048 fp32 parameters (8,192 B), one block's Linears
    40,960 parameters (163,840 B): the block's shard is the largest, 81,920 B on 2 ranks."""
    spec = tiny(vocab_size=16, embedding_params=16 * H, lm_head_params=16 * H, total_params=LINEAR_PARAMS + 2 * 16 * H + 320)
    setup = Setup(strategy="fsdp", num_gpus=2, offload_params=True, offload_optimizer=True)
    assert offload_staging_bytes(spec, setup, params_offloaded=True) == LINEAR_PARAMS // L * 4 // 2 == 81_920


def test_nothing_staged_without_parameter_offload() -> None:
    """Only FSDP's own parameter offload stages through its side stream; the estimate reads it off the placement."""
    assert offload_staging_bytes(tiny(), Setup(strategy="fsdp", num_gpus=2), params_offloaded=False) == 0
    zero3 = Setup(strategy="zero3", num_gpus=2, offload_params=True, offload_optimizer=True)
    assert offload_staging_bytes(tiny(), zero3, params_offloaded=True) == 0
    plain = training_memory(tiny(), Setup(strategy="fsdp", num_gpus=2))
    assert not any("staged" in n for n in plain.notes)


def test_staging_pool_is_reserved_not_allocated() -> None:
    """The copies die before the compute stream peaks: allocated is unchanged, reserved grows by exactly the pool
    (tiny Llama fp32 on 2 GPUs: root 2 x 128 x 64 x 4 B / 2 = 32,768 B; a block 40,960 x 4 / 2 = 81,920 B), and, the
    peak being the loss, by the all-gather stream's blocks of the two decoder units resharded after their forward
    (2 x 40,960 x 4 B, fsdp_window.Window.idle_pool)."""
    spec = tiny()
    on = training_memory(spec, Setup(strategy="fsdp", num_gpus=2, offload_params=True, offload_optimizer=True))
    assert on.notes[0] == "peak in forward/loss"
    assert on.peak_reserved == (reserved_from_allocated(on.peak_allocated, "train") + max(2 * V * H * 4, LINEAR_PARAMS // L * 4) // 2
                                + 2 * LINEAR_PARAMS // L * 4)
    assert on.device_total - on.peak_reserved == on.cuda_context + on.nccl_buffers  # NCCL outside the allocator


def test_fsdp2_accumulation_without_sync_holds_every_gradient() -> None:
    """FSDP2 under accelerate's accumulate: ``set_requires_gradient_sync(False)`` keeps the unsharded gradients until
    the last micro-step, like FSDP1's no_sync. Pure bf16 tiny Llama on 4 GPUs: TOTAL x 2 B held, not a quarter."""
    one = training_memory(tiny(), Setup(weights_dtype="bf16", strategy="fsdp", num_gpus=4, fsdp_version=2))
    acc = training_memory(tiny(), Setup(weights_dtype="bf16", strategy="fsdp", num_gpus=4, fsdp_version=2,
                                        gradient_accumulation_steps=4))
    assert one.gradients == TOTAL * 2 // 4 and acc.gradients == TOTAL * 2
