"""Unsloth's Llama-3.3-70B row (685: HF + FA2 baseline, QLoRA r=32 on all seven Linears, A100 80GB, ~6,916 tokens
at batch 1) counted by hand from the code of the releases it ran, as tests/test_unsloth_gemma2_rows.py counts the
Gemma-2-27B: transformers ~4.47 (LlamaForCausalLM, untied fp32 head after peft's kbit preparation, the loss upcast
inside ForCausalLMLoss), peft's prepare_model_for_kbit_training, bitsandbytes nf4 with double quant and 8-bit AdamW.

perfguide's loss-phase peak equals the hand count to the byte; the row stays a miss on the publisher's reserved line
(82.0 GiB at the published length against the 80 GiB card, 6,463 tokens against 6,916), see the report in
docs/validation.md section 15."""

from __future__ import annotations

from types import ModuleType

GiB = 2**30
L, H, I, V = 80, 8192, 28672, 128256   # Llama-3.3-70B (Llama-3.1-70B's config.json shape)
Q, KV = 64 * 128, 8 * 128              # query and key/value widths (heads x head_dim)
R = 32


def _hand_70b(s: int) -> dict[str, int]:
    """Bytes at the cross-entropy's backward, batch 1 x ``s`` tokens.

    nf4 blocks: 0.5 B per weight + uint8 absmax per 64 + fp32 absmax per 256 of those. Embedding, head (untied) and
    the 161 RMSNorms fp32 (peft's upcast); fp32 adapters. bnb AdamW8bit: two uint8 states + two fp32 absmax per 2048.
    No gradient is held at the loss peak (no accumulation; Trainer frees them at zero_grad). Held for backward: the 80
    checkpointed blocks' inputs in the fp32 stream, the head's bf16 cast under autocast (saved by its matmul for the
    input gradient), the final norm's input (the fp32 stream itself); the loss path at 4.47 with batch 1: the fp32
    log-softmax output, its gradient and the input gradient (12 B per logit; the model's bf16 logits are freed with
    the outputs before backward). Alive from the forward to the end of backward: the fp32 rotary cos / sin (one
    [1, s, 128] pair: the stream's dtype) and the int64 input ids, labels, attention mask and position ids. No
    dequantized weight: the head is not 4-bit."""
    linear = L * (H * Q + 2 * H * KV + Q * H + 3 * H * I)
    blocks = linear // 64
    nf4 = linear // 2 + blocks + -(-blocks // 256) * 4
    rest = 2 * V * H + (2 * L + 1) * H
    lora = L * R * ((H + Q) + 2 * (H + KV) + (Q + H) + 2 * (H + I) + (I + H))
    lora_blocks = L * sum(-(-R * n // 2048) for n in (H, Q, H, KV, H, KV, Q, H, H, I, H, I, I, H))
    weights = nf4 + 4 * rest + 4 * lora
    optim = 2 * lora + 2 * 4 * lora_blocks
    acts = L * s * H * 4 + 2 * V * H + s * H * 4 + 2 * 128 * 4 * s + 4 * 8 * s
    logits = s * V * 12
    return {"weights": weights, "optimizer_states": optim, "logits": logits, "gradients": 4 * lora,
            "peak_allocated": weights + optim + acts + logits}


def test_llama_70b_step_by_hand(acc: ModuleType, rows: dict[str, dict[str, str]]) -> None:
    """Row 685's setup at the published 6,916 tokens (weights 45.38 GB: nf4 blocks 35.31, fp32 embedding and head
    8.41, adapters 1.66; loss path 10.64 GB; peak 77.32 GB = 72.01 GiB)."""
    row = rows["685"]
    spec = acc._spec(row["model_hf_id"])
    assert (spec.num_layers, spec.hidden_size, spec.intermediate_size, spec.vocab_size) == (L, H, I, V)
    assert spec.lm_head_params == V * H
    setup = acc._train_setup(row, spec)
    assert (setup.micro_batch_size, setup.seq_len, setup.gradient_accumulation_steps) == (1, 6916, 1)
    assert (setup.weights_dtype, setup.kbit_upcast, setup.kbit_quantizer, setup.autocast) == ("nf4", True, "transformers", "bf16")
    est = acc._verdict_estimate(row, spec, setup, acc._hardware(row["gpu_type"], 1))
    hand = _hand_70b(6916)
    for term in ("weights", "optimizer_states", "logits", "gradients", "peak_allocated"):
        assert getattr(est, term) == hand[term], term
    assert "peak in forward/loss" in est.notes
    assert 71.9 < hand["peak_allocated"] / GiB < 72.1
