"""Rows 3100-3105: axolotl's example READMEs' memory figures (issue 24; out of sample, docs/validation.md 75): Mistral
Small 3.1 fine-tunes, two of them with the Cut Cross-Entropy plugin, and the llama-3 examples of April 2024.

The values checked are the READMEs' and yamls' own (at the commit that wrote each figure) and counts by hand from
Mistral Small's config, not perfguide's output.
"""

from __future__ import annotations

from helpers import load_bench, published_rows, read_row

from perfguide.memory.ledger import ledger

ROWS = published_rows()
#: row -> (README, the figure, optimizer, the CCE plugin listed in the yaml, lora_dropout)
READMES = {
    "3100": ("examples/devstral/README.md @8c6a6ea6e", "21", "adamw_torch", True, 0.0),
    "3101": ("examples/magistral/README.md @eac4a61f5", "24", "adamw_bnb_8bit", False, 0.05),
    "3102": ("examples/magistral/think/README.md @09959fac7", "19.1", "adamw_bnb_8bit", True, 0.05),
}
#: Mistral Small 3 by hand: 5120 wide, 40 blocks, q / o 5120 <-> 4096 (32 heads of 128), k / v 5120 -> 1024 (8 heads),
#: FFN 32768; vocabulary 131072 with an untied head
BLOCK_LINEARS = ((5120, 4096), (5120, 1024), (5120, 1024), (4096, 5120), (5120, 32768), (5120, 32768), (32768, 5120))
#: LoRA r=32 on every block Linear: r x (in + out) each
ADAPTERS = 40 * 32 * sum(i + o for i, o in BLOCK_LINEARS)


#: the llama-3 README (one line for three yamls): row -> (yaml, the figure, GPUs, trust)
LLAMA3 = {"3103": ("qlora-fsdp-70b.yaml", "21", "2", "B"), "3104": ("lora-8b.yml", "11", "1", "C"), "3105": ("fft-8b.yaml", "48", "1", "C")}


#: the gpt-oss README (device_mem_reserved(gib), stated): row -> (its figure, GPUs, strategy, CPU offload)
GPT_OSS = {"3106": ("44", "1", "single", False), "3107": ("21", "2", "fsdp", True), "3108": ("36", "8", "fsdp", False),
           "3109": ("46", "4", "fsdp", False), "3112": ("47", "1", "single", False)}


#: the qwen3-next README at e672d37f3 ('~47 GiB (no target experts) and ~71GiB (target experts)'): row -> its figure,
#: whether the yaml's commented lora_target_parameters block is set
QWEN3_NEXT = {"3110": ("47", False), "3111": ("71", True)}


#: GLM-4.5-Air, GLM-4.7-Flash and Ministral-8B (docs/validation.md 91): row -> (README at the commit that wrote the
#: figure, the figure, GPUs, strategy, the base's storage, LoRA rank, accumulation, experts quantized on load)
RECENT = {"3113": ("examples/glm45/README.md @753906cfc", "63.4", "1", "single", "nf4", 16, 2, True),
          "3114": ("examples/glm47-flash/README.md @753906cfc", "24", "1", "single", "nf4", 32, 4, True),
          "3115": ("examples/glm47-flash/README.md @753906cfc", "35", "1", "single", "int8", 32, 4, True),
          "3116": ("examples/ministral/README.md @2b66ee189", "8.76", "1", "single", "nf4", 32, 4, False),
          "3117": ("examples/glm47-flash/README.md @753906cfc", "29", "2", "fsdp", "nf4", 32, 4, True),
          "3118": ("examples/glm47-flash/README.md @753906cfc", "43", "2", "fsdp", "int8", 32, 4, True)}
#: LFM2-350M's full fine-tune (docs/validation.md 92): its README's figure at the commit that wrote it
LFM2 = {"3119": ("examples/LiquidAI/README.md @130ef7c51", "25")}


#: stop 70 (docs/validation.md 99): row -> (README at the commit that wrote the figure, the figure as quoted; None: OOM)
STOP70 = {"3520": ("examples/glm47-flash/README.md @753906cfc", "~34GiB"), "3521": ("examples/glm47-flash/README.md @753906cfc", None),
          "3557": ("examples/qwen3.5/README.md @c11938233", "~47 GiB"), "3558": ("examples/qwen3.5/README.md @113d275bd", "~61 GiB"),
          "3560": ("examples/granite4/README.md @49b810798", "40.8"), "3561": ("examples/LiquidAI/README.md @ab63b92c3", "16.2"),
          "3562": ("examples/jamba/README.md @05b398a07", "~51GiB"), "3563": ("examples/jamba/README.md @05b398a07", "35GiB"),
          "3564": ("examples/jamba/README.md @05b398a07", "56GiB"), "3565": ("examples/jamba/README.md @05b398a07", "67")}


def test_stop70_rows_quote_their_readmes() -> None:
    for row_id, (readme, quoted) in STOP70.items():
        row = ROWS[row_id]
        assert readme in row["source"], row_id
        if quoted is None:
            assert row["value_kind"] == "oom" and "OOM" in row["source"], row_id
        else:
            assert quoted in row["source"] and quoted.strip("~ GiB") == row["peak_mem_value"], row_id


def test_rows_are_the_readmes_figures() -> None:
    assert sorted(r for r, row in ROWS.items() if row["source_group"] == "axolotl_example_readmes") == sorted(
        {**READMES, **LLAMA3, **GPT_OSS, **QWEN3_NEXT, **RECENT, **LFM2, **STOP70})
    for row_id, (yaml_name, value, gpus, trust) in LLAMA3.items():
        row = ROWS[row_id]
        assert "examples/llama-3/README.md @15f7910d3" in row["source"] and f"({yaml_name})" in row["source"].replace("./", "")
        assert (row["peak_mem_value"], row["num_gpus"], row["trust"]) == (value, gpus, trust), row_id
    for row_id, (readme, value, optimizer, _, _) in READMES.items():
        row = ROWS[row_id]
        assert readme in row["source"] and row["peak_mem_value"] == value and row["optimizer"].startswith(optimizer), row_id
        assert row["value_kind"] == "measured" and "reserved" in row["mem_metric"] and row["trust"] == "B"


def test_recent_rows_read_as_their_yamls_ran() -> None:
    """The yamls at the READMEs' commits: 2 x 2,048 packed tokens, checkpointing, the CCE plugin, the norms,
    embedding and head cast back to bf16; GLM's experts quantized on load (quantize_moe_experts), FSDP2 over two GPUs
    where the README says 2x48GB."""
    for row_id, (readme, value, gpus, strategy, storage, rank, accumulation, experts) in RECENT.items():
        row = ROWS[row_id]
        assert readme in row["source"] and (row["peak_mem_value"], row["num_gpus"]) == (value, gpus), row_id
        assert row["value_kind"] == "measured" and "reserved" in row["mem_metric"] and row["trust"] == "B", row_id
        _, _, setup = read_row(row_id)
        assert (setup.strategy, setup.num_gpus, setup.weights_dtype, setup.quantized_experts) == (strategy, int(gpus), storage,
                                                                                                  experts), row_id
        assert setup.lora is not None and setup.lora.r == rank and not setup.kbit_upcast and not setup.offload_params, row_id
        assert (setup.micro_batch_size, setup.seq_len, setup.gradient_accumulation_steps) == (2, 2048, accumulation), row_id
        assert setup.gradient_checkpointing and setup.cut_cross_entropy, row_id


def test_lfm2_row_reads_as_its_yaml_ran() -> None:
    """lfm2-350m-fft.yaml at 130ef7c51: every weight trained in bf16, 4 x 4,096 packed tokens (rows padded to it), accumulation 2, no
    checkpointing, and axolotl's chunked cross-entropy as the loss (no CCE plugin then)."""
    for row_id, (readme, value) in LFM2.items():
        row, spec, setup = read_row(row_id)
        assert readme in row["source"] and row["peak_mem_value"] == value and row["trust"] == "B", row_id
        assert spec.vocab_size == 65536 and spec.total_params == 354_483_968
        assert setup.lora is None and setup.weights_dtype == "bf16" and not setup.gradient_checkpointing
        assert (setup.micro_batch_size, setup.seq_len, setup.gradient_accumulation_steps) == (4, 4096, 2)
        assert setup.chunked_cross_entropy and not setup.cut_cross_entropy and setup.optimizer == "adamw_torch_fused"


def test_rows_read_as_the_yamls_ran() -> None:
    """axolotl's QLoRA: nf4 Linears, the norms, embedding and head cast back to bf16, LoRA r 32 / alpha 16 on every
    Linear, checkpointing, 2 x 2048 packed tokens; the plugin's loss where the yaml lists it."""
    for row_id, (_, _, optimizer, cce, dropout) in READMES.items():
        _, spec, setup = read_row(row_id)
        assert setup.weights_dtype == "nf4" and not setup.kbit_upcast and setup.autocast == "bf16", row_id
        assert setup.lora is not None and (setup.lora.r, setup.lora.alpha, setup.lora.dropout) == (32, 16, dropout), row_id
        assert (setup.micro_batch_size, setup.seq_len, setup.gradient_accumulation_steps) == (2, 2048, 4), row_id
        assert setup.gradient_checkpointing and setup.optimizer == optimizer and setup.cut_cross_entropy is cce, row_id
        assert ledger(spec, setup).trainable_params == ADAPTERS == 184_811_520


def test_mistral_small_is_its_config() -> None:
    _, spec, _ = read_row("3100")
    blocks = 40 * (sum(i * o for i, o in BLOCK_LINEARS) + 2 * 5120)
    assert spec.total_params == 2 * 131072 * 5120 + blocks + 5120 == 23_572_403_200


def test_llama3_rows_read_as_the_yamls_ran() -> None:
    """The 70B QLoRA: r 8 on every Linear of Llama-3-70B, 512 tokens, FSDP full shard with CPU offload on two GPUs,
    axolotl skipping the k-bit preparation under FSDP; its adapters by hand."""
    _, spec, setup = read_row("3103")
    assert (spec.hidden_size, spec.num_layers, spec.vocab_size) == (8192, 80, 128256)
    assert setup.strategy == "fsdp" and setup.offload_params and setup.num_gpus == 2 and not setup.kbit_upcast
    assert (setup.micro_batch_size, setup.seq_len) == (1, 512) and setup.weights_dtype == "nf4"
    linears = ((8192, 8192), (8192, 1024), (8192, 1024), (8192, 8192), (8192, 28672), (8192, 28672), (28672, 8192))
    assert ledger(spec, setup).trainable_params == 80 * 8 * sum(i + o for i, o in linears) == 103_546_880
    _, _, int8 = read_row("3104")
    assert int8.weights_dtype == "int8" and (int8.micro_batch_size, int8.seq_len) == (2, 4096)
    _, _, full = read_row("3105")
    assert full.lora is None and full.optimizer == "paged_adamw_8bit" and full.seq_len == 8192


def test_gpt_oss_rows_read_as_the_yamls_ran() -> None:
    """gpt-oss-20b dequantized to bf16, 4,096 packed tokens, checkpointing with activation offloading, the CCE plugin;
    the FSDP2 rows ran accelerate 1.10, before FSDP2 kept unsharded gradients between micro-steps (the bench passes
    the release); the LoRA row's adapters on the attention Linears only, by hand."""
    for row_id, (value, gpus, strategy, offload) in GPT_OSS.items():
        row, spec, setup = read_row(row_id)
        assert row["peak_mem_value"] == value and "device_mem_reserved(gib)" in row["mem_metric"] and row["trust"] == "B"
        assert (setup.num_gpus, setup.strategy, setup.offload_params) == (int(gpus), strategy, offload), row_id
        assert setup.weights_dtype == "bf16" and setup.cut_cross_entropy and setup.activation_offloading, row_id
        assert (setup.micro_batch_size, setup.seq_len) == (1, 4096), row_id
        if strategy == "fsdp":
            assert setup.fsdp_version == 2 and load_bench("accuracy")._accelerate_version(row) == "1.10.0"
    _, spec, lora = read_row("3106")
    # r 8 on q (2880 -> 64 heads x 64), k and v (2880 -> 8 x 64), o (4096 -> 2880), in each of the 24 blocks
    assert lora.lora is not None and ledger(spec, lora).trainable_params == 24 * 8 * (
        (2880 + 4096) + 2 * (2880 + 512) + (4096 + 2880)) == 3_981_312
    # 'linear layers & 2 experts': the same, and layers 22-23's 32-expert stacks at r 8 (peft 0.17: no rank doubling)
    _, spec, experts = read_row("3112")
    assert experts.lora is not None and experts.lora.target_parameters[0] == "22._checkpoint_wrapped_module.mlp.experts.gate_up_proj"
    assert ledger(spec, experts).trainable_params == 3_981_312 + 2 * 32 * 8 * ((2880 + 5760) + (2880 + 2880))


def test_qwen3_next_rows_read_as_the_yaml_ran() -> None:
    """nf4 with the experts quantized on load, LoRA r 16 / alpha 8 on the attention and gated-DeltaNet projections
    (by hand from Qwen3-Next's config: 12 attention layers, q 2048 -> 2 x 16 x 256 with the output gate, k / v -> 2 x
    256, o 4096 -> 2048; 36 DeltaNet layers, in_proj_qkvz 2048 -> 2 x 2048 + 2 x 4096, in_proj_ba -> 2 x 32, out_proj
    4096 -> 2048), and for 'target experts' every layer's two 512-expert stacks at rank 16 (no rank doubling: peft 0.18)."""
    attention = 12 * 16 * ((2048 + 8192) + 2 * (2048 + 512) + (4096 + 2048))
    deltanet = 36 * 16 * ((2048 + 12288) + (2048 + 64) + (4096 + 2048))
    experts = 48 * 512 * 16 * ((2048 + 2 * 512) + (512 + 2048))
    for row_id, (value, stacks) in QWEN3_NEXT.items():
        row, spec, setup = read_row(row_id)
        assert "examples/qwen3-next/README.md @e672d37f3" in row["source"] and row["peak_mem_value"] == value
        assert setup.weights_dtype == "nf4" and setup.quantized_experts and setup.cut_cross_entropy and not setup.kbit_upcast
        assert setup.lora is not None and (setup.lora.r, setup.lora.alpha) == (16, 8) and spec.num_experts == 512
        assert (setup.micro_batch_size, setup.seq_len, setup.gradient_accumulation_steps) == (2, 2048, 2)
        assert ledger(spec, setup).trainable_params == attention + deltanet + (experts if stacks else 0), row_id
