"""Unsloth's Gemma 2 blog rows (801-803) read as Unsloth's context-length method of the period states it (batch 1,
lengths on the publisher's reserved line at the card size the sentence names), and Gemma-2-27B's QLoRA step counted
by hand from the code of the releases the row ran: transformers 4.42.3 (Gemma2ForCausalLM, FA2 without the score
soft-cap), peft's prepare_model_for_kbit_training (every non-4-bit parameter upcast to fp32), bitsandbytes 0.43.1
(nf4 with double quant, 8-bit AdamW states)."""

from __future__ import annotations

from types import ModuleType

from helpers import load_bench

GiB = 2**30
V = 256000                         # Gemma 2 vocabulary (9B and 27B)
L, H, I = 46, 4608, 36864          # Gemma-2-27B: layers, hidden, MLP width
Q, KV = 32 * 128, 16 * 128         # 27B query and key/value widths (heads x head_dim)
R = 32                             # LoRA rank on q, k, v, o, gate, up, down


def test_rows_read_as_the_context_method(acc: ModuleType, rows: dict[str, dict[str, str]]) -> None:
    """Batch 1 (Unsloth's context method: 'a batch size of 1'), accumulation 4 as the blog states, rank 32 on all seven
    Linears, bnb nf4 with peft's upcast, bf16 autocast, FA2, checkpointing; each length on the reserved line at the
    card size the sentence names, read in GiB like rows 679-687."""
    reserved = load_bench("accuracy_reserved")
    cards = {"801": ("google/gemma-2-9b", 24), "802": ("google/gemma-2-27b", 40), "803": ("google/gemma-2-9b", 80)}
    for row_id, (model, card) in cards.items():
        row = rows[row_id]
        assert row["source_group"] == "unsloth_gemma2" and row["model_hf_id"] == model
        assert reserved.RESERVED_LINE in row["mem_metric"]
        setup = acc._train_setup(row, acc._spec(model))
        assert (setup.micro_batch_size, setup.gradient_accumulation_steps) == (1, 4)
        assert (setup.weights_dtype, setup.kbit_upcast, setup.autocast) == ("nf4", True, "bf16")
        assert setup.attn_implementation == "flash_attention_2" and setup.gradient_checkpointing
        assert setup.lora is not None and setup.lora.r == R
        assert {n.rsplit(".", 1)[-1] for n in setup.lora.target_modules} == {"q_proj", "k_proj", "v_proj", "o_proj",
                                                                            "gate_proj", "up_proj", "down_proj"}
        assert acc._transformers_version(row) == "4.42.3" and acc._bnb_version(row) == "0.43.1"
        hw = acc._hardware(row["gpu_type"], 1)
        assert hw is not None and hw.gpus[0].memory_total == card * GiB


def test_row_801_loss_path_by_hand(acc: ModuleType, rows: dict[str, dict[str, str]]) -> None:
    """4.42.3 at batch 1: logits = lm_head(h) (bf16 under autocast); / 30, tanh (saves its bf16 output: 2 B), * 30;
    logits.float() returned in the output (4); no shift copy (one row minus its last position is contiguous); the fp32
    log-softmax (4): 10 B per logit at the cross-entropy's forward. At its backward the output is dropped (Trainer's
    compute_loss returns only the loss): log-softmax output + its gradient + the input gradient (12) + the tanh output
    (2) = 14, the peak."""
    row = rows["801"]
    spec = acc._spec(row["model_hf_id"])
    setup = acc._train_setup(row, spec)
    assert acc._loss_bytes(row, spec, setup) == 2600 * V * (3 * 4 + 2)


def _hand_27b(s: int) -> dict[str, int]:
    """Gemma-2-27B QLoRA at batch 1 x ``s`` tokens, byte by byte from the releases' code.

    Block Linears (bnb Linear4bit; lm_head is skipped, tied to embed_tokens): 0.5 B per weight + one uint8 absmax per
    64 + one fp32 absmax per 256 of those (double quant). The rest (embedding 256000 x 4608, 4 RMSNorms per block
    and the final one) fp32 after peft's upcast; adapters fp32, their gradients fp32 (accumulation 4 keeps them
    through the forward), bnb AdamW8bit: two uint8 states + two fp32 absmax per 2048 (optimizer.py init_state).
    At the loss backward: every checkpointed block's input (the residual stream is fp32: the fp32 embedding output
    times the normalizer, fp32 norms), the bf16 cast of the fp32 tied head that the head's matmul saves under
    autocast, the loss path (14 B per logit, test above) and the final norm's saved input (Gemma2RMSNorm's
    ``x.float()``: the fp32 stream itself, 4 B per hidden unit per token; the frozen head saves no input). No
    dequantized weight: transformers leaves the head unquantized, so no 4-bit Linear runs after the last block."""
    linear = L * (H * Q + H * KV * 2 + Q * H + 3 * H * I)
    blocks = linear // 64
    nf4 = linear // 2 + blocks + -(-blocks // 256) * 4
    rest = V * H + (4 * L + 1) * H
    lora = L * R * (2 * (H + Q) + 2 * (H + KV) + 3 * (H + I))
    # lora_A (r x in) and lora_B (out x r) of q, k, v, o, gate, up, down
    lora_blocks = L * sum(-(-R * n // 2048) for n in (H, Q, H, KV, H, KV, Q, H, H, I, H, I, I, H))
    weights = nf4 + 4 * rest + 4 * lora
    grads = 4 * lora
    optim = 2 * lora + 2 * 4 * lora_blocks
    acts = L * s * H * 4 + 2 * V * H
    logits = s * V * (3 * 4 + 2)
    norm = s * H * 4
    return {"weights": weights, "gradients": grads, "optimizer_states": optim, "acts": acts, "logits": logits,
            "peak_allocated": weights + grads + optim + acts + logits + norm}


def test_gemma2_27b_step_by_hand(acc: ModuleType, rows: dict[str, dict[str, str]]) -> None:
    """Row 802's setup at the published 3,000 tokens: every term of perfguide's loss-phase peak against the hand
    count (weights 19.07 GB, of which the fp32 embedding 4.72 and the nf4 blocks 13.44; loss path 10.75 GB)."""
    row = rows["802"]
    spec = acc._spec(row["model_hf_id"])
    assert (spec.num_layers, spec.hidden_size, spec.intermediate_size, spec.vocab_size) == (L, H, I, V)
    assert spec.tie_word_embeddings and not spec.lm_head_params
    setup = acc._train_setup(row, spec)
    est = acc._verdict_estimate(row, spec, setup, acc._hardware(row["gpu_type"], 1))
    hand = _hand_27b(3000)
    assert est.weights == hand["weights"]
    assert est.gradients == hand["gradients"]
    assert abs(est.optimizer_states - hand["optimizer_states"]) <= 0.001 * hand["optimizer_states"]
    assert est.logits == hand["logits"]
    assert abs(est.peak_allocated - hand["peak_allocated"]) <= 0.001 * hand["peak_allocated"]
    assert "peak in forward/loss" in est.notes


def test_gemma2_27b_length_on_the_line_by_hand(acc: ModuleType, rows: dict[str, dict[str, str]]) -> None:
    """The longest length on the publisher's line, solved by hand: steady-state reserved (the training ratio of
    calibration.json times the hand peak) plus the freed 16-bit head logits block (2 B per logit: the bf16 `* cap`
    output freed by logits.float(), smaller than every later 4-byte request of the loss) reaches the 40 GiB card.
    The peak is linear in s, so two hand counts give its fixed part and its bytes per token."""
    from perfguide._data import fact_value

    ratio = fact_value("calibration", "reserved_over_allocated_training")
    fixed = 2 * _hand_27b(1000)["peak_allocated"] - _hand_27b(2000)["peak_allocated"]
    per_token = (_hand_27b(2000)["peak_allocated"] - _hand_27b(1000)["peak_allocated"]) // 1000
    assert per_token == (L + 1) * H * 4 + 14 * V
    by_hand = (40 * GiB - ratio * fixed) / (ratio * per_token + 2 * V)
    row = rows["802"]
    spec = acc._spec(row["model_hf_id"])
    setup = acc._train_setup(row, spec)
    longest = acc.max_context(row, spec, setup, acc._hardware(row["gpu_type"], 1))
    assert -1 <= by_hand - longest <= 17   # max_context searches to 16 tokens
