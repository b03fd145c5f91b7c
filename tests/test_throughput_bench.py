"""bench/throughput.py: the published rows are mapped to the setups their sources state, and the statistics are right.

The row mapping is checked against the publishers' own numbers (llm-foundry's exact NumParams column), the
statistics against hand-computed values. No test compares a predicted speed with anything here.
"""

from __future__ import annotations

import csv
from pathlib import Path
from types import ModuleType

import pytest
from helpers import load_bench

ROOT = Path(__file__).resolve().parents[1]


_bench = load_bench


@pytest.fixture(scope="module")
def rows() -> ModuleType:
    return _bench("throughput_rows")


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return _bench("throughput")


def test_mpt_shapes_reproduce_llm_foundry_num_params(rows: ModuleType) -> None:
    """Each MPT shape (d_model, layers) plus learned positions gives the row's published NumParams within 0.1%."""
    with rows.CSV.open(newline="", encoding="utf-8") as f:
        foundry = [r for r in csv.DictReader(f) if r["source"] == "mosaicml/llm-foundry"]
    assert len(foundry) > 200
    for r in foundry:
        spec = _bench("throughput_specs").mpt_spec(r["model"], int(r["seq_len"]))
        with_positions = spec.total_params + int(r["seq_len"]) * spec.hidden_size
        assert with_positions == pytest.approx(int(r["num_params"]), rel=1e-3), r["row_id"]


def test_rows_keep_the_published_setup(rows: ModuleType) -> None:
    cases, skipped = rows.load()
    by_id = {c.row_id: c for c in cases}
    ds = by_id["226"]   # gpt2, HF Trainer --fp16, mbs 8, 16 V100, samples/s 284.142 over all GPUs
    assert (ds.setup.autocast, ds.setup.micro_batch_size, ds.setup.world_size, ds.setup.strategy) == ("fp16", 8, 16, "ddp")
    assert ds.published == pytest.approx(284.142 * 1024 / 16)
    why = {row["row_id"]: reason for row, reason in skipped}
    assert "max length" in why["315"] and "Unsloth" in why["321"]      # cutoff_len on an unstated dataset; Unsloth kernels
    assert "power cap" in why["286"]                                    # B200 (power limited)
    mi300x = by_id["282"]   # torchtitan Llama3-8B bf16 on 8 MI300X, FSDP2, compiled
    assert mi300x.hardware.smallest_gpu.vendor == "amd" and mi300x.setup.world_size == 8 and mi300x.setup.torch_compile
    consumer = by_id["309"]  # torchao Llama2-1B pretraining, BF16 eager, on an RTX 4070 Ti SUPER
    assert consumer.hardware.name == "rtx4070tisuper" and consumer.setup.weights_dtype == "bf16" and not consumer.setup.torch_compile
    big = by_id["30"]       # llm-foundry H100 table, 64 GPUs, network unstated: the DGX H100's 8 x 400 Gb/s per node
    assert big.hardware.inter_node_bandwidth_gbps == 400
    assert all(why for _, why in skipped)
    assert all(c.published > 0 for c in cases)


def test_spearman_by_hand(bench: ModuleType) -> None:
    # d = rank differences (-1, 1, -1, 1, 0): rho = 1 - 6 * 4 / (5 * (25 - 1)) = 0.8
    assert bench.spearman([1, 2, 3, 4, 5], [2, 1, 4, 3, 5]) == pytest.approx(0.8)
    assert bench.spearman([1, 2, 3], [30, 20, 10]) == pytest.approx(-1.0)


def test_p90_interpolates(bench: ModuleType) -> None:
    assert bench.p90(list(range(11))) == pytest.approx(9.0)
    assert bench.p90([0.0, 10.0]) == pytest.approx(9.0)


def test_qwen_shapes_reproduce_the_published_sizes(rows: ModuleType) -> None:
    """Qwen (v1) 1.8B / 7B / 14B: the Llama-shaped stand-ins count the models' published parameter totals."""
    sizes = {"qwen-1.8b-chat": 1.84e9, "qwen-7b-chat": 7.72e9, "qwen-14b-chat": 14.17e9}
    from perfguide.model.types import ModelSpec

    for key, total in sizes.items():
        assert ModelSpec.from_any(_bench("throughput_specs").QWEN_V1[key]).total_params == pytest.approx(total, rel=0.005), key


def test_qwen_rows_are_exact_lengths_and_tokens_from_step_time(rows: ModuleType) -> None:
    cases, skipped = rows.load()
    by_id = {c.row_id: c for c in cases}
    lora = by_id["339"]     # Qwen-7B-Chat LoRA, column 256: '20.1G / 1.2s/it', batch 1 x grad accum 8
    assert lora.published == pytest.approx(256 * 8 / 1.2, rel=1e-3)
    assert (lora.setup.seq_len, lora.setup.micro_batch_size, lora.setup.gradient_accumulation_steps) == (256, 1, 8)
    assert lora.setup.lora is not None and lora.setup.lora.r == 64 and lora.setup.gradient_checkpointing
    assert lora.setup.weights_dtype == "bf16" and lora.framework == "hf_trainer"
    why = {row["row_id"]: reason for row, reason in skipped}
    assert "GPTQ" in why["351"]      # Q-LoRA rows run a GPTQ int4 base


def test_fit_reprices_only_the_rows_a_constant_informs(rows: ModuleType) -> None:
    """bench/throughput_fit.py caches every row a constant does not inform: moving any constant by 1.5x must leave
    exactly those rows' predictions unchanged, or the cached fit would be wrong."""
    fit = _bench("throughput_fit")
    bench = _bench("throughput")
    cases, _ = rows.load()
    sample = cases[::4]
    base = [bench.predict(c) for c in sample]
    table = fit.load("efficiency")
    for p in fit.PARAMS:
        value = fit._get(table, p.key)
        with fit.constants({p.key: (value or 1.0) * 1.5}):
            moved = [bench.predict(c) for c in sample]
        for c, before, after in zip(sample, base, moved, strict=True):
            if not p.informed_by(c):
                assert after == pytest.approx(before, rel=1e-12), (p.key, c.row_id)


def test_llm_foundry_attention_kernel_follows_its_launcher(rows: ModuleType) -> None:
    """The tables' kernel is the one submit_benchmarks.py / sweep.py set at the commits that added them: Triton
    FlashAttention for the A100 and H100 BF16 tables, FlashAttention-2 for the large-scale sweep's 1b/3b/7b/70b."""
    cases, _ = rows.load()
    foundry = [c for c in cases if c.group == "llm-foundry"]
    assert foundry and all(c.attention_kernel == "triton_flash" for c in foundry if "Large Scale" not in c.table)
    large = {c.label.split()[0]: c.attention_kernel for c in foundry if "Large Scale" in c.table}
    assert large == {"mpt-70b": None, "mpt-30b": "triton_flash", "mpt-13b": "triton_flash", "mpt-7b": None,
                     "mpt-3b": None, "mpt-1b": None}
    others = {c.group: c.attention_kernel for c in cases if c.group != "llm-foundry"}
    assert others.pop("flash-attn-training") == "flash_v1"     # its README's table predates FlashAttention-2
    assert set(others.values()) == {None}


def test_unstated_checkpointing_is_inferred_only_when_the_row_cannot_fit_without_it(rows: ModuleType) -> None:
    """HF's blog FSDP / ZeRO-3 rows (7B, 8 x 4096 tokens per A100) do not fit without checkpointing in perfguide's
    memory model and do with it; rows that state their checkpointing keep it as stated."""
    from perfguide.memory.analytic import training_memory

    cases, _ = rows.load()
    blog = [c for c in cases if c.group == "hf-blog-fsdp-deepspeed"]
    assert len(blog) == 2 and all(c.setup.gradient_checkpointing for c in blog)
    for c in blog:
        plain = c.setup.model_copy(update={"gradient_checkpointing": False})
        assert not training_memory(c.spec, plain, c.hardware).fits and training_memory(c.spec, c.setup, c.hardware).fits
    stated_off = [c for c in cases if c.group == "llm-foundry" and "mb6" in c.label and "mpt-7b s2048" in c.label]
    assert stated_off and not any(c.setup.gradient_checkpointing for c in stated_off)


def test_torchtune_rows_keep_the_readme_setups(rows: ModuleType) -> None:
    """torchtune README (2024-09): batch 2, packed to 2048, compiled; LoRA r=8 on q_proj/v_proj (8B_lora_single_device);
    2024-11 table: Llama 3.2 3B, batch 2, 4096 packed, techniques added in order. Rows whose stated setup exceeds the
    GPU's peak, or pages optimizer states, are listed with their reason, not priced."""
    cases, skipped = rows.load()
    by_id = {c.row_id: c for c in cases}
    lora = by_id["399"]
    assert (lora.setup.micro_batch_size, lora.setup.seq_len, lora.setup.torch_compile) == (2, 2048, True)
    assert lora.setup.lora is not None and lora.setup.lora.target_modules == ("q_proj", "v_proj") and lora.setup.lora.r == 8
    assert by_id["401"].setup.weights_dtype == "nf4" and by_id["401"].setup.lora.target_modules == "all-linear"
    offload = by_id["409"]   # '+ Activation Offloading', on top of checkpointing and the optimizer step in backward
    assert offload.setup.activation_offloading and offload.setup.gradient_checkpointing and offload.setup.optimizer_in_backward
    assert by_id["410"].setup.optimizer == "paged_adamw_8bit"
    assert by_id["404"].hardware.name == "a100-80gb" and not by_id["404"].setup.torch_compile
    why = {row["row_id"]: reason for row, reason in skipped}
    assert "dense peak" in why["400"] and "dense peak" in why["402"] and "paged" in why["403"]


def test_pre_torch2_trainer_rows_step_the_optimizer_tensor_by_tensor(rows: ModuleType) -> None:
    cases, _ = rows.load()
    by_id = {c.row_id: c for c in cases}
    assert by_id["369"].optimizer_impl == "per_tensor_loop"     # transformers guide, adamw_hf
    assert by_id["226"].optimizer_impl == "per_tensor_loop"     # HF Trainer --fp16 without DeepSpeed (2022)
    assert by_id["227"].optimizer_impl is None                  # DeepSpeed's FusedAdam
    assert by_id["374"].optimizer_impl is None                  # adafactor: its own row in the table
    assert by_id["376"].optimizer_impl == "per_tensor_kernel"   # bnb Adam8bit in 2022: before 0.39's per-parameter sync
    assert by_id["410"].optimizer_impl is None                  # torchtune 2024-11: today's bnb, which syncs


def test_flash_attention_rows_reproduce_the_readme_table(rows: ModuleType) -> None:
    """flash-attention training README (8 x A100 80GB): GPT3 shapes with a padded GPT-2 vocabulary (125M ~ 125.2M
    with learned positions and the tied head), the config's micro-batch at 80 GB times 8 GPUs times the accumulation
    gives the table's tokens per batch (0.5M for 125M-760M, 1M for 1.3B/2.7B), and the table's total tokens/s / 8."""
    cases, _ = rows.load()
    flash = {c.label.split()[0]: c for c in cases if c.group == "flash-attn-training"}
    assert set(flash) == {"GPT3-125M", "GPT3-355M", "GPT3-760M", "GPT3-1.3B", "GPT3-2.7B"}
    for name, tokens in (("GPT3-125M", 2**19), ("GPT3-760M", 2**19), ("GPT3-1.3B", 2**20), ("GPT3-2.7B", 2**20)):
        s = flash[name].setup
        assert s.micro_batch_size * s.seq_len * s.gradient_accumulation_steps * s.world_size == tokens
    assert flash["GPT3-125M"].spec.total_params == pytest.approx(125e6, rel=0.01)
    assert flash["GPT3-2.7B"].spec.total_params == pytest.approx(2.7e9, rel=0.03)
    assert flash["GPT3-125M"].published == pytest.approx(1_310_000 / 8)
    assert flash["GPT3-760M"].setup.strategy == "zero1" and flash["GPT3-760M"].optimizer_impl == "per_tensor_loop"
    assert flash["GPT3-125M"].setup.optimizer == "adamw_torch_fused" and not flash["GPT3-125M"].setup.gradient_checkpointing


def test_fms_fsdp_rows_keep_the_readme_setups(rows: ModuleType) -> None:
    """fms-fsdp README: Llama 2 at 4096 tokens, 2 per GPU, compiled; 7B HSDP (shard in a node, replicate across the
    stated 400 / 800 Gb/s node network) on 16 x 8 A100 and 12 x 8 H100; 13B FSDP with every block checkpointed."""
    cases, _ = rows.load()
    by_id = {c.row_id: c for c in cases if c.group == "fms-fsdp"}
    a100, h100, big = by_id["418"], by_id["419"], by_id["420"]
    assert a100.setup.hybrid_shard and a100.setup.nodes == 16 and a100.setup.world_size == 128
    assert a100.hardware.inter_node_bandwidth_gbps == 400 / 8 and h100.hardware.inter_node_bandwidth_gbps == 800 / 8
    assert h100.setup.world_size == 96 and h100.published == 9600
    assert (a100.setup.micro_batch_size, a100.setup.seq_len, a100.setup.torch_compile) == (2, 4096, True)
    assert not a100.setup.gradient_checkpointing and big.setup.gradient_checkpointing and not big.setup.hybrid_shard


def test_tinyllama_row_keeps_the_readme_setup(rows: ModuleType) -> None:
    """TinyLlama README: 22 layers x 2048, 32 heads in 4 query groups, SwiGLU 5632, Llama-2's 32k vocabulary (1.1B);
    16k tokens per GPU (8 x 2048), no checkpointing, FSDP, the flash-attn repo's fused kernels; 24k tokens/s per GPU,
    which is the README's own '22B tokens in 32 hours with 8 A100' (22e9 / (24000 * 8) / 3600 = 31.8 h)."""
    cases, _ = rows.load()
    (tiny,) = [c for c in cases if c.group == "tinyllama"]
    spec, s = tiny.spec, tiny.setup
    assert (spec.num_layers, spec.hidden_size, spec.num_attention_heads, spec.num_key_value_heads) == (22, 2048, 32, 4)
    assert (spec.intermediate_size, spec.vocab_size) == (5632, 32000)
    assert spec.total_params == pytest.approx(1.1e9, rel=0.02)
    assert s.micro_batch_size * s.seq_len == 16 * 1024 and s.strategy == "fsdp" and not s.gradient_checkpointing
    assert s.micro_batch_size * s.seq_len * s.gradient_accumulation_steps * s.world_size == 512 * 2048
    assert tiny.framework == "flashattn_training" and s.attn_implementation == "flash_attention_2"
    assert 22e9 / (tiny.published * s.world_size) / 3600 == pytest.approx(32, rel=0.02)
