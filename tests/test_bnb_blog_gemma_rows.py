"""Rows 2300-2315: three public training sources new to bench/data, added whole (issue 24).

The HF blog '4-bit transformers and bitsandbytes' (QLoRA release, 2023-05-24) tables fourteen fine-tuning runs of
LLaMA-7B / 13B on T4s as OOM / no OOM; the Gemma launch post (2024-02-21) trains Gemma-7B with QLoRA on one A10G
and the Mixtral launch post (2023-12-11) Mixtral-8x7B on one A100, both with TRL's sft.py. Each row reads back as the setup the source and the code at the stated commit give; the byte
counts checked here are derived by hand from the config shapes, not taken from perfguide's output. perfguide's
verdicts on them are reported by bench/accuracy.py.
"""

from __future__ import annotations

import pytest
from helpers import load_bench, published_rows, read_row

from perfguide.memory.ledger import ledger

ROWS = published_rows()
BLOG = tuple(str(i) for i in range(2300, 2314))
INT8 = ("2300", "2301", "2307", "2308")

#: LLaMA-1 13B by hand (5120 x 40 layers, FFN 13824, vocab 32000, untied head, two RMSNorms a block and a final one)
LLAMA13_LINEAR = 40 * (4 * 5120**2 + 3 * 5120 * 13824)
LLAMA13 = LLAMA13_LINEAR + 2 * 32000 * 5120 + 40 * 2 * 5120 + 5120
#: Gemma-7B by hand (3072 x 28 layers, 16 heads of 256, FFN 24576, vocab 256000 tied to the head)
GEMMA7 = 28 * (3 * 3072 * 4096 + 4096 * 3072 + 3 * 3072 * 24576 + 2 * 3072) + 256000 * 3072 + 3072
#: the command's LoRA: r 16 on q_proj, k_proj, v_proj (3072 -> 4096) and o_proj (4096 -> 3072) of 28 blocks
GEMMA_ADAPTERS = 28 * 16 * 4 * (3072 + 4096)
#: Mixtral-8x7B by hand (4096 x 32 layers, 32 query / 8 KV heads of 128, 8 experts of FFN 14336 with a 4096 x 8 router,
#: vocab 32000, untied head)
MIXTRAL = 32 * (2 * 4096**2 + 2 * 4096 * 1024 + 8 * 3 * 4096 * 14336 + 4096 * 8 + 2 * 4096) + 2 * 32000 * 4096 + 4096
#: r 16 on q_proj (4096 -> 4096), k_proj / v_proj (4096 -> 1024) and o_proj (4096 -> 4096) of 32 blocks
MIXTRAL_ADAPTERS = 32 * 16 * (2 * (4096 + 4096) + 2 * (4096 + 1024))



def test_rows_are_the_two_posts_whole_in_their_range() -> None:
    rows = [ROWS[i] for i in BLOG]
    assert {r["source_group"] for r in rows} == {"hf_blog_4bit_bitsandbytes"} and all(r["trust"] == "C" for r in rows)
    assert [r["value_kind"] for r in rows] == ["fits", "oom", "fits", "fits", "oom", "oom", "fits", "fits", "oom", "oom",
                                               "oom", "fits", "oom", "fits"]
    assert all(r["notes"].startswith("table row: 'decapoda-research/llama-") for r in rows)
    gemma = ROWS["2314"]
    assert gemma["source_group"] == "hf_blog_gemma_trl" and gemma["value_kind"] == "fits" and gemma["trust"] == "B"
    mixtral = ROWS["2315"]
    assert mixtral["source_group"] == "hf_blog_mixtral_trl" and mixtral["value_kind"] == "fits" and mixtral["trust"] == "B"
    groups = ("hf_blog_4bit_bitsandbytes", "hf_blog_gemma_trl", "hf_blog_mixtral_trl")
    assert not any(r["source_group"] in groups for i, r in ROWS.items() if not 2300 <= int(i) <= 2315)


def test_llama_13b_reupload_has_llama_1_13b_shape() -> None:
    _, spec, _ = read_row("2312")
    assert spec.total_params == LLAMA13 == 13_015_864_320


def test_no_double_quant_is_read_from_the_quantization_words() -> None:
    """The table's NQ column: 2312 and 2313 differ only in it. Without double quant bnb keeps one fp32 absmax per
    64 weights; with it one uint8 per 64 plus one fp32 per 256 of those: for LLaMA-13B's 12,687,769,600 Linear
    weights that is 198,246,400 x 4 against 198,246,400 + 774,400 x 4 bytes."""
    _, spec, plain = read_row("2312")
    _, _, nested = read_row("2313")
    assert not plain.nf4_double_quant and nested.nf4_double_quant
    assert plain.replace(nf4_double_quant=True) == nested
    blocks = LLAMA13_LINEAR // 64
    hand = blocks * 4 - (blocks + -(-blocks // 256) * 4)
    assert hand == 591_641_600
    bench = load_bench("accuracy")
    hw = load_bench("accuracy_hardware")._hardware(ROWS["2312"]["gpu_type"], 1)
    assert bench.estimate_memory(spec, plain, hw).weights - bench.estimate_memory(spec, nested, hw).weights == hand
    for row_id in BLOG:
        if row_id not in INT8 and row_id != "2313":
            assert not read_row(row_id)[2].nf4_double_quant, row_id


def test_blog_rows_read_as_the_sft_trainer_of_that_day_ran_them() -> None:
    """TRL 5fb5af7c's SFTTrainer prepares 8-bit models only (prepare_model_for_int8_training: fp32 non-int8 parameters,
    checkpointing on); its 4-bit models keep transformers' fp16 non-quantized weights. LLaMA had no SDPA path in
    transformers 4.30 (eager), and the adapters stay fp32 under peft 0.4."""
    for row_id in BLOG:
        if row_id == "2307":
            continue
        row, _, setup = read_row(row_id)
        int8 = row_id in INT8
        assert setup.weights_dtype == ("int8" if int8 else "nf4") and setup.kbit_upcast is int8
        assert setup.autocast is None and setup.attn_implementation == "eager"
        assert (setup.micro_batch_size, setup.gradient_accumulation_steps) == (1, 4) and setup.seq_len in (512, 1024)
        assert setup.gradient_checkpointing is (row["grad_checkpointing"] != "no") and not setup.kbit_recast_bf16
        assert setup.lora is not None and setup.lora.r == 16 and setup.lora.autocast_adapter_dtype
    assert [read_row(i)[2].gradient_checkpointing for i in ("2302", "2304", "2306", "2309", "2311")] == [False, False, True,
                                                                                                        False, True]


def test_two_t4_row_is_a_layer_split_not_priced() -> None:
    """device_map 'auto' over two T4s splits one model's layers (no data parallelism): not a strategy perfguide prices."""
    setup_mod = load_bench("accuracy_setup")
    row = ROWS["2307"]
    assert row["num_gpus"] == "2" and "naive pipeline" in row["parallelism"]
    with pytest.raises(setup_mod.Skip, match="pipeline"):
        setup_mod._train_setup(row, load_bench("accuracy_spec")._spec(row["model_hf_id"]))


def test_gemma_row_reads_as_the_posts_command() -> None:
    """sft.py at 4f97fb4a under multi_gpu.yaml (mixed_precision bf16) with --load_in_4bit: nf4 without double quant,
    the kbit preparation's fp32 non-quantized weights (the tied 256000 x 3072 embedding among them), no checkpointing,
    packed 512-token rows, two a step; r 16 adapters on q/k/v/o in fp32 (peft 0.8.2 keeps a 4-bit base's adapters fp32)."""
    _, spec, setup = read_row("2314")
    assert spec.total_params == GEMMA7 == 8_537_680_896
    assert setup.weights_dtype == "nf4" and not setup.nf4_double_quant and setup.kbit_upcast and not setup.kbit_recast_bf16
    assert setup.autocast == "bf16" and not setup.gradient_checkpointing and setup.attn_implementation == "sdpa"
    assert (setup.micro_batch_size, setup.seq_len, setup.gradient_accumulation_steps) == (2, 512, 1)
    led = ledger(spec, setup)
    assert led.trainable_params == GEMMA_ADAPTERS == 12_845_056 and led.param_bytes == 4


def test_mixtral_row_reads_as_the_posts_command() -> None:
    """sft.py at 8f0fc4c8: BitsAndBytesConfig(load_in_4bit=True) takes bnb's defaults (fp4 codes, the same 4-bit layout
    as nf4, no double quant), torch_dtype bfloat16 then the kbit preparation's fp32; bf16 autocast from multi_gpu.yaml;
    batch 2 x 512, no checkpointing; r 16 adapters on q/k/v/o in fp32; the post's own A100s are 80GB cards."""
    row, spec, setup = read_row("2315")
    assert spec.total_params == MIXTRAL == 46_702_792_704
    assert row["quantization"].startswith("bnb fp4") and setup.weights_dtype == "nf4" and not setup.nf4_double_quant
    assert setup.kbit_upcast and not setup.kbit_recast_bf16 and setup.autocast == "bf16"
    assert not setup.gradient_checkpointing and (setup.micro_batch_size, setup.seq_len) == (2, 512)
    led = ledger(spec, setup)
    assert led.trainable_params == MIXTRAL_ADAPTERS == 13_631_488 and led.param_bytes == 4
    hw = load_bench("accuracy_hardware")._hardware(row["gpu_type"], 1)
    assert hw is not None and hw.gpus[0].memory_total > 79 * 2**30
