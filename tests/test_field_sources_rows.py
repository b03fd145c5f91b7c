"""Rows 1150-1166 (issue 24, sources the model had never been checked on) read back as their sources state them: the
PEFT README's 'GPU memory required' table (the example scripts of PEFT @61c577fc4) and the HF blog 'Accelerate Large
Model Training using DeepSpeed'. The config dicts' parameter counts are counted here by hand from the shapes in
their sources, not read off perfguide; the README's unit is checked against the README's own log of the same run."""

from __future__ import annotations

from types import ModuleType

from helpers import load_bench


def test_bloomz_and_mt0_config_dicts_count_the_published_parameters() -> None:
    spec_mod = load_bench("accuracy_spec")
    # BLOOM-7b1: word embeddings + their LayerNorm, 30 blocks (fused qkv, dense, 4h MLP, all with bias; 2 LayerNorms),
    # final LayerNorm; the head is tied
    h, v = 4096, 250880
    block = (h * 3 * h + 3 * h) + (h * h + h) + (h * 4 * h + 4 * h) + (4 * h * h + h) + 2 * 2 * h
    assert spec_mod._spec("bigscience/bloomz-7b1").total_params == v * h + 2 * h + 30 * block + 2 * h == 7_069_016_064
    # mT5-XXL (t5x mt5 xxl.gin): shared embedding and an untied head, 24 encoder blocks (self-attention + gated FFN,
    # 2 RMSNorms), 24 decoder blocks (self + cross attention + gated FFN, 3 RMSNorms), one relative bias per stack
    d, ff, heads, vocab = 4096, 10240, 64, 250112
    attn, ffn = 4 * d * d, 3 * d * ff
    encoder, decoder = 24 * (attn + ffn + 2 * d), 24 * (2 * attn + ffn + 3 * d)
    total = 2 * vocab * d + encoder + decoder + 2 * (32 * heads) + 2 * d
    assert spec_mod._spec("bigscience/mt0-xxl").total_params == total == 12_921_057_280


def test_peft_readme_rows_read_as_the_example_scripts(acc: ModuleType, rows: dict[str, dict[str, str]]) -> None:
    t0 = rows["1151"]
    spec = acc._spec(t0["model_hf_id"])
    assert (spec.model_type, spec.hidden_size, spec.num_layers, spec.num_decoder_layers) == ("t5", 2048, 24, 24)
    setup = acc._train_setup(t0, spec)
    assert (setup.micro_batch_size, setup.weights_dtype, setup.autocast, setup.strategy) == (8, "fp32", None, "single")
    assert setup.lora is not None and setup.lora.r == 8 and setup.lora.dropout == 0.1
    assert all(name.endswith((".q", ".v")) for name in setup.lora.target_modules)   # pet's t5 default ['q', 'v']
    bloom = rows["1158"]
    setup = acc._train_setup(bloom, acc._spec(bloom["model_hf_id"]))
    assert setup.lora is not None and setup.lora.target_modules == ("self_attention.query_key_value",)
    assert (setup.strategy, setup.offload_params, setup.offload_optimizer, setup.seq_len) == ("zero3", True, True, 64)
    # torch 1.13 (the notes): per-tensor AdamW, gradients kept through zero_grad
    assert acc._pre_torch2(bloom) and setup.optimizer == "adamw_torch_fused"


def test_peft_readme_offload_rows_run_deepspeeds_default_zero3_knobs(rows: dict[str, dict[str, str]]) -> None:
    """accelerate's DeepSpeed plugin (no config file) leaves the three sizes out, so DeepSpeed's defaults run."""
    runtime = load_bench("accuracy_runtime")
    import perfguide.memory.analytic as analytic
    from perfguide.memory.zero3_window import DEEPSPEED_DEFAULT_KNOBS

    with runtime.deepspeed_runtime(rows["1152"]):
        assert analytic.zero3_knobs(None) == DEEPSPEED_DEFAULT_KNOBS   # type: ignore[arg-type]


def test_peft_readme_gb_is_1e9_bytes_by_its_own_log(rows: dict[str, dict[str, str]]) -> None:
    """The README logs the T0_3B offload run's peak as 9404 (b2mb: 2**20-byte units) and tables it as '9.8GB':
    9404 MiB is 9.86e9 bytes (truncated to 9.8), 9.18 GiB, so the table's GB is 1e9 bytes."""
    row = rows["1152"]
    logged = int(row["peak_mem_alt"].split()[0]) * 2**20
    assert int(logged / 1e8) / 10 == float(row["peak_mem_value"])
    assert int(logged / 2**30 * 10) / 10 != float(row["peak_mem_value"])


def test_accelerate_deepspeed_blog_rows(acc: ModuleType, rows: dict[str, dict[str, str]]) -> None:
    ddp, zero2 = rows["1159"], rows["1160"]
    for row, strategy, weights in ((ddp, "ddp", "fp32"), (zero2, "zero2", "fp32")):
        spec = acc._spec(row["model_hf_id"])
        setup = acc._train_setup(row, spec)
        assert (setup.strategy, setup.num_gpus, setup.weights_dtype, setup.autocast) == (strategy, 2, weights, "fp16")
        assert setup.seq_len == 128 and setup.attn_implementation == "eager"
    assert acc._hardware(ddp["gpu_type"], 2).smallest_gpu.memory_total == int(23.65 * 2**30)
    # generate with --num_beams 10 keeps ten sequences per prompt: not a Setup, so not priced
    for row_id in ("1162", "1164"):
        result = acc.evaluate(rows[row_id], [])
        assert result.kind == "skip" and "10 beams" in result.reason


def test_flan_t5_deepspeed_rows_read_as_the_notebook_ran(acc: ModuleType, rows: dict[str, dict[str, str]]) -> None:
    """philschmid's FLAN-T5 table (rows 1167-1176): ZeRO-3 with or without offload per the DS offload column, fp32 on
    V100s (the script enables bf16 only on compute capability 8.x), DeepSpeed bf16 on A100 / A10G, 500-token sources,
    gradient checkpointing on (the script's default), an 'OOM' batch read at 1."""
    read = {}
    for row_id in map(str, range(1167, 1177)):
        row = rows[row_id]
        setup = acc._train_setup(row, acc._spec(row["model_hf_id"]))
        read[row_id] = (setup.strategy, setup.offload_params, setup.weights_dtype, setup.autocast, setup.num_gpus,
                        setup.micro_batch_size)
        assert setup.seq_len == 500 and setup.gradient_checkpointing
    assert read["1167"] == ("zero3", False, "fp32", None, 4, 1)          # XL, no offload, 4x V100, OOM
    assert read["1169"] == ("zero3", False, "fp32", "bf16", 8, 72)       # XL, no offload, 8x A100, bf16
    assert read["1174"] == ("zero3", True, "fp32", None, 8, 1)           # XXL, offload, 8x V100, OOM
    assert read["1175"] == ("zero3", True, "fp32", "bf16", 4, 24)        # XXL, offload, 4x A10G, bf16
    assert acc._hardware(rows["1175"]["gpu_type"], 4).smallest_gpu.name == "a10g"
    assert acc._hardware(rows["1174"]["gpu_type"], 8).smallest_gpu.name == "v100-16gb"


def test_torchtune_lora_tutorial_rows(acc: ModuleType, rows: dict[str, dict[str, str]]) -> None:
    """Q and V at rank 64 reads as the config; the 'all layers' lines adapt the LM head too (apply_lora_to_output),
    which a LoraSpec of block Linears cannot hold, so they are listed as not expressible rather than priced without it."""
    row = rows["1178"]
    setup = acc._train_setup(row, acc._spec(row["model_hf_id"]))
    assert setup.lora is not None and (setup.lora.r, setup.lora.alpha) == (64, 128)
    assert setup.lora.target_modules == ("self_attn.q_proj", "self_attn.v_proj")
    assert (setup.micro_batch_size, setup.seq_len, setup.weights_dtype, setup.gradient_checkpointing) == (2, 512, "bf16", True)
    for row_id in ("1177", "1179"):
        result = acc.evaluate(rows[row_id], [])
        assert result.kind == "skip" and "output projection" in result.reason
