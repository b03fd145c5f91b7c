"""Long-context rows 1000-1008 (issue 24): LLaMA-Factory's wiki table of VRAM against length for Llama-2-7B QLoRA
with FlashAttention-2 on one A100 40GB (LLaMA-Factory 171a029c5, 2024-04-16), and Unsloth's Llama 3 blog's HF + FA2
length for Llama-3-70B on an A100 80GB (2024-04-23), and Unsloth's long-context blog's HF + FA2 column for Mistral 7B
(2024-04-09, rows 1009-1015).

Each row reads back as the setup its source and the code of the release it ran state, and the terms that setup
fixes are counted here by hand: LLaMA-Factory's ``_prepare_model_for_training`` skips peft's
prepare_model_for_kbit_training (its ``upcast_layernorm`` / ``upcast_lmhead_output`` default False), so the
embedding, head and norms stay in the compute dtype (fp16, from Llama-2's config torch_dtype) and the residual
stream the checkpointed blocks keep is fp16; transformers 4.39's LlamaForCausalLM upcasts the logits with
``logits.float()`` and Trainer frees the output before backward, so the cross-entropy backward holds the fp32
log-softmax output, its gradient and the input gradient (12 B per logit). perfguide's errors on these rows are
reported by bench/accuracy.py, not tested here."""

from __future__ import annotations

from types import ModuleType

GiB = 2**30
L, H, I, V = 32, 4096, 11008, 32000   # Llama-2-7B config.json
R = 8                                 # the table's LoRA rank
LF_ROWS = [str(i) for i in range(1000, 1008)]
LENGTHS = [1024, 2048, 4096, 8192, 16384, 32768, 65536, 100000]
MISTRAL_ROWS = [str(i) for i in range(1009, 1016)]


def _hand_weights() -> int:
    """nf4 blocks (0.5 B per weight, a uint8 absmax per 64 and an fp32 absmax per 256 of those: double quant), the
    untied embedding and head and the 65 RMSNorms in fp16, the LoRA adapters in fp32 (LLaMA-Factory's adapter.py
    casts trainable parameters to float32)."""
    linear = L * (4 * H * H + 3 * H * I)
    blocks = linear // 64
    nf4 = linear // 2 + blocks + -(-blocks // 256) * 4
    rest = 2 * V * H + (2 * L + 1) * H
    lora = L * R * (4 * (H + H) + 3 * (H + I))
    return nf4 + 2 * rest + 4 * lora


def test_rows_are_in_the_long_context_range_and_name_their_sources(rows: dict[str, dict[str, str]]) -> None:
    ids = [i for i in rows if 1000 <= int(i) <= 1049]
    assert sorted(ids, key=int) == [*LF_ROWS, "1008", *MISTRAL_ROWS]
    for i in ids:
        assert "https://" in rows[i]["source"] and rows[i]["trust"] == "B" and rows[i]["notes"]
    assert {rows[i]["source_group"] for i in LF_ROWS} == {"llamafactory_wiki_performance"}
    kinds = [rows[i]["value_kind"] for i in LF_ROWS]
    assert kinds == ["measured"] * 6 + ["oom"] * 2
    published = [float(rows[i]["peak_mem_value"]) for i in LF_ROWS[:6]]
    assert published == [6, 7, 9, 12, 19, 32]   # the FlashAttention2 row as printed


def test_llamafactory_rows_read_as_its_code_ran_them(acc: ModuleType, rows: dict[str, dict[str, str]]) -> None:
    spec = acc._spec("meta-llama/Llama-2-7b-hf")
    assert (spec.num_layers, spec.hidden_size, spec.intermediate_size, spec.vocab_size) == (L, H, I, V)
    for rid, length in zip(LF_ROWS, LENGTHS):
        setup = acc._train_setup(rows[rid], spec)
        assert (setup.micro_batch_size, setup.seq_len, setup.gradient_accumulation_steps) == (1, length, 4)
        assert (setup.weights_dtype, setup.kbit_upcast, setup.nf4_double_quant, setup.autocast) == ("nf4", False, True, "fp16")
        assert setup.attn_implementation == "flash_attention_2" and setup.gradient_checkpointing
        assert setup.lora is not None and setup.lora.r == R and len(setup.lora.target_modules) == 7
        assert acc._hardware(rows[rid]["gpu_type"], 1).gpus[0].memory_total > 39 * GiB


def test_llamafactory_weights_and_loss_path_by_hand(acc: ModuleType, rows: dict[str, dict[str, str]]) -> None:
    """At 32,768 tokens: weights 3.67 GiB (nf4 3.11, fp16 embedding + head 0.49, adapters 0.07); the checkpointed
    blocks keep their fp16 inputs, 2 B x 4096 per token per block (8.0 GiB); the loss backward 12 B per logit
    (11.72 GiB)."""
    from perfguide.memory.activations import checkpoint_boundary_bytes

    row = rows["1005"]
    spec = acc._spec(row["model_hf_id"])
    setup = acc._train_setup(row, spec)
    est = acc._verdict_estimate(row, spec, setup, acc._hardware(row["gpu_type"], 1))
    s = 32768
    assert est.weights == _hand_weights()
    assert 3.67 < _hand_weights() / GiB < 3.68
    assert checkpoint_boundary_bytes(spec, setup) == s * H * 2
    assert est.logits == 12 * s * V


def test_unsloth_llama3_row_reads_as_the_llama_3_3_row(acc: ModuleType, rows: dict[str, dict[str, str]]) -> None:
    """Row 1008 (Llama-3-70B, 7,500 tokens) is read as row 685 is (same publisher, same method: batch 1, padded,
    QLoRA r=32 on all seven Linears, the publisher's reserved line at the card's GiB); only the model's release and
    the length differ, and Meta-Llama-3-70B has Llama-3.1-70B's shape."""
    new, old = rows["1008"], rows["685"]
    a, b = acc._spec(new["model_hf_id"]), acc._spec(old["model_hf_id"])
    assert (a.num_layers, a.hidden_size, a.intermediate_size, a.vocab_size, a.num_key_value_heads) == \
           (b.num_layers, b.hidden_size, b.intermediate_size, b.vocab_size, b.num_key_value_heads)
    sa, sb = acc._train_setup(new, a), acc._train_setup(old, b)
    assert sa.replace(seq_len=sb.seq_len) == sb
    assert acc.RESERVED_LINE in new["mem_metric"] and new["value_kind"] == "max_seq_fit" and sa.seq_len == 7500


def test_unsloth_mistral_rows_are_one_line_read_at_the_nominal_sizes(acc: ModuleType, rows: dict[str, dict[str, str]]) -> None:
    """The blog's HF + FA2 lengths grow by the same 3,101 tokens per 4 GB (to within one token) from 8 to 80 GB: one
    straight line of memory against length solved at each nominal size, so each row is judged on that size in GiB
    (the GPU names are labels), with the setup rows 679-687 take from the same publisher."""
    sizes = [8, 12, 16, 24, 40, 48, 80]
    lengths = [int(rows[i]["peak_mem_value"]) for i in MISTRAL_ROWS]
    steps = {round((b - a) / ((y - x) / 4)) for (x, a), (y, b) in zip(zip(sizes, lengths), zip(sizes[1:], lengths[1:]))}
    assert steps <= {3100, 3101}
    spec = acc._spec(rows["1009"]["model_hf_id"])
    assert (spec.num_layers, spec.hidden_size, spec.intermediate_size, spec.vocab_size) == (32, 4096, 14336, 32000)
    for rid, gb, n in zip(MISTRAL_ROWS, sizes, lengths):
        row = rows[rid]
        assert acc._hardware(row["gpu_type"], 1).gpus[0].memory_total == gb * GiB
        setup = acc._train_setup(row, spec)
        assert (setup.micro_batch_size, setup.seq_len, setup.optimizer) == (1, n, "adamw_bnb_8bit")
        assert (setup.weights_dtype, setup.kbit_upcast, setup.autocast, setup.attn_implementation) == ("nf4", True, "bf16", "flash_attention_2")
        assert acc.RESERVED_LINE in row["mem_metric"] and row["value_kind"] == "max_seq_fit"
