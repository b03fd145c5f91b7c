"""Roofline primitives: what a device computes and moves per second, and the counts those rates divide.

Peak and achievable matmul rates (by dtype, GPU class and GEMM width), the fused-attention kernels' class,
host, PCIe and CPU rates, and the FLOP and byte counts of a step's matmuls and optimizer. This module sits
below the techniques (a technique's speed hook prices its own seconds with these), so it reads the model, the
hardware, the Setup and the data files only; the fold over the techniques' hooks is speed/training.py.
Constants: perfguide/data/efficiency.json, each with its source.
"""

from __future__ import annotations

import math
from functools import cache
from typing import Any

from .._data import fact_extra, fact_value
from ..errors import DataFileError
from ..hardware.types import CPU, GPU, Hardware
from ..memory.ledger import ledger
from ..model.types import ModelSpec
from ..optimizer_facts import row as optimizer_row
from ..setup import Setup


def constant(name: str) -> Any:
    """A number or a small table from data/efficiency.json (validated rows, see perfguide._data)."""
    return fact_value("efficiency", name)


def matmul_params(spec: ModelSpec) -> int:
    """Parameters that take part in matmuls per token: active params minus embedding lookups, plus a tied head."""
    return max(1, spec.active_params - spec.embedding_params + _tied_head(spec))


def _tied_head(spec: ModelSpec) -> int:
    return spec.vocab_size * spec.hidden_size if spec.tie_word_embeddings and spec.lm_head_params == 0 else 0


def recomputed_matmul_params(spec: ModelSpec) -> int:
    """The matmul parameters a checkpointed forward runs again: the blocks' only. Checkpointing wraps the decoder
    layers (transformers' gradient_checkpointing_enable, torchtune's set_activation_checkpointing on
    TransformerSelfAttentionLayer), so the output head - 12% of Llama 3.2 3B's matmul FLOPs - runs once."""
    return max(1, matmul_params(spec) - spec.lm_head_params - _tied_head(spec))


def trainable_params(spec: ModelSpec, setup: Setup) -> int:
    """Parameters the optimizer updates (all, or the LoRA adapters), counted by the memory ledger."""
    return ledger(spec, setup).trainable_params


def attention_flops_fwd(spec: ModelSpec, micro_batch: int, seq_len: int) -> float:
    """QK^T and AV of one micro-batch, forward: 4 * layers * d_attn * s * s_attended * b."""
    attended = min(seq_len, spec.sliding_window) if spec.sliding_window else seq_len
    d_attn = spec.num_attention_heads * spec.head_dim
    return 4.0 * spec.total_layers * d_attn * seq_len * attended * micro_batch


def _saturation(x: float, half: float) -> float:
    return x / (x + half)


def efficiency(asymptote: float, tokens: int, hidden: int, half: float) -> float:
    """Fraction of peak the matmuls reach: asymptote x width saturation x tile fill of the GEMM M dimension."""
    tile = int(constant("gemm_tile"))
    fill = tokens / (math.ceil(tokens / tile) * tile)
    return asymptote * _saturation(hidden, half) * fill


def gpu_peak_tflops(gpu: GPU, compute_dtype: str) -> tuple[float, str | None]:
    """Dense peak for the dtype matmuls really run in, with emulation and missing specs handled."""
    fp32 = gpu.fp32_tflops
    emulated = constant("bf16_emulation_fraction")
    if compute_dtype == "bf16" and not gpu.supports_bf16:
        return ((fp32 or constant("unknown_gpu_peak_tflops")) * emulated,
                f"{gpu.name} ({gpu.generation}) has no bf16 tensor cores: bf16 is emulated and slow")
    if compute_dtype == "tf32" and not gpu.supports_tf32:
        compute_dtype = "fp32"
    chain = {"bf16": ("bf16", "fp16"), "fp16": ("fp16",), "tf32": ("tf32",), "fp32": ("fp32",)}[compute_dtype]
    for name in (*chain, "fp32"):
        peak = gpu.half_tflops(name)
        if peak:
            return peak, None
    return constant("unknown_gpu_peak_tflops"), f"no TFLOP/s known for {gpu.name}: step time is a rough guess"


def cpu_path(cpu: CPU, bf16: bool) -> str:
    """The kernel family CPU matmuls use: 'bf16_amx', 'bf16_avx512' or 'fp32'."""
    return ("bf16_amx" if cpu.amx else "bf16_avx512") if bf16 and cpu.native_bf16 else "fp32"


def cpu_peak_gflops(cpu: CPU, bf16: bool, threads: int | None) -> tuple[float, str | None]:
    """All-core peak for fp32 or bf16 autocast; fallbacks from the ISA flags when the probe had no number."""
    per_core = constant("cpu_gflops_per_core")
    note = None
    path = cpu_path(cpu, bf16)
    if path != "fp32":
        peak = cpu.bf16_gflops or cpu.physical_cores * per_core[path]
    else:
        avx512 = any(f.startswith("avx512f") for f in cpu.flags)
        peak = cpu.fp32_gflops or cpu.physical_cores * per_core["fp32_avx512" if avx512 else "fp32"]
        if bf16:
            peak *= constant("bf16_emulation_fraction")
            note = "this CPU has no AVX512-BF16/AMX: bf16 autocast is emulated and slower than fp32"
    used = min(threads or cpu.physical_cores, cpu.physical_cores)
    return peak * used / cpu.physical_cores, note


def host_bandwidth_gbps(cpu: CPU) -> float:
    return min(constant("host_memory_gbps_per_core") * cpu.physical_cores, fact_extra("efficiency", "host_memory_gbps_per_core", "cap"))


def pcie_gbps(gpu: GPU) -> float:
    default = fact_extra("efficiency", "pcie_gbps_by_cc_major", "default")
    return float(constant("pcie_gbps_by_cc_major").get(str(gpu.compute_capability[0]), default))


def ring_time(nbytes: float, setup: Setup, hardware: Hardware, gpu: GPU, factor: float) -> float:
    """Seconds of one ring collective over ``nbytes`` per rank: factor=2 for all-reduce, 1 for all-gather /
    reduce-scatter; the intra-node ring, then the inter-node one."""
    bus = constant("comm_bus_fraction")
    per_node = setup.num_gpus
    intra_bw = hardware.intra_node_bandwidth_gbps or pcie_gbps(gpu)
    t = factor * (per_node - 1) / per_node * nbytes / (intra_bw * 1e9 * bus) if per_node > 1 else 0.0
    if setup.nodes > 1:
        inter_bw = hardware.inter_node_bandwidth_gbps or constant("unknown_inter_node_gbps")
        t += factor * (setup.nodes - 1) / setup.nodes * nbytes / (inter_bw * 1e9 * bus)
    return t


def half_bytes(setup: Setup) -> float:
    """Bytes per parameter of what moves between GPUs (the compute copy under AMP, else the stored weights)."""
    return 2 if setup.autocast else min(4, setup.weight_bytes)


def optimizer_bytes(spec: ModelSpec, setup: Setup) -> float:
    """Bytes the optimizer step streams per device: read weights, grads, states; write weights, states; grad-norm read."""
    if setup.optimizer is None:
        return 0.0
    weights = grads = trainable_bytes(spec, setup)
    facts = optimizer_row(setup.optimizer)                 # data/optimizers.json
    # 32-bit states follow each parameter's dtype (torch keeps exp_avg in p's dtype): a bf16 tensor's are half an
    # fp32 one's; low-bit states are per element whatever the width
    states = facts.streamed_state_bytes * (ledger(spec, setup).trainable_params if facts.low_bit else weights / 4)
    shards = setup.shard_degree if setup.shards_optimizer else 1
    return (facts.passes * (2 * weights + grads + 2 * states) + grads) / shards


def trainable_bytes(spec: ModelSpec, setup: Setup) -> int:
    """One copy of the trainable tensors (their weights, or their gradients) at the widths the memory ledger gives
    them: fp32 LoRA adapters (16-bit where peft < 0.12 or TRL 0.7.5-0.8.6's recast keeps them), a PEFT
    modules_to_save copy at its original's 16 bits beside them, or the stored dtype of a full fine-tune."""
    return ledger(spec, setup).trainable_bytes


def class_constant(table: str, cls: str, gpu: GPU, path: str | None = None) -> float:
    """efficiency.json's number for a GPU class (``path``: 'tensor' or 'cuda' first where the table has both); a
    class a gpus.json row names but the table lacks is one line naming both, not a KeyError mid-plan."""
    rows = constant(table)
    rows = rows[path] if path is not None else rows
    if cls not in rows:
        raise DataFileError(f"perfguide/data/efficiency.json {table} has no class {cls!r} (the class of {gpu.name}); "
                            f"it has {', '.join(sorted(rows))}")
    return float(rows[cls])


def gpu_class(gpu: GPU) -> str:
    """'datacenter' for the big training dies of Ampere and later (A100, H100/H200, B200: compute capability
    8.0+ with minor 0), 'volta' for the V100 (7.0: first-generation, fp16-only tensor cores), 'graphics' for the
    GeForce / workstation / inference dies (T4, A10, RTX 3090/4090, A6000, L4, L40S: x.5-x.9), 'cdna' for AMD
    Instinct (MI300X/MI325X).

    They reach different fractions of their spec-sheet peak: graphics dies boost well above the clock their
    datasheet TFLOP/s assume; Volta's tensor cores are fed by an older memory system and cuBLAS generation.
    """
    if gpu.efficiency_class is not None:
        return gpu.efficiency_class   # a gpus.json column: AMD Instinct is 'cdna' (ROCm's GEMMs reach a smaller share)
    if gpu.compute_capability[1] != 0:
        return "graphics"
    return "datacenter" if gpu.supports_bf16 else "volta"


def matmul_path(setup: Setup) -> str:
    """'tensor' when matmuls run on tensor cores (fp16/bf16/tf32), 'cuda' for plain fp32 FMA units."""
    return "cuda" if setup.compute_dtype == "fp32" else "tensor"


def asymptote(gpu: GPU, setup: Setup) -> float:
    """Fraction of the dtype's peak that large matmuls reach inside a training step: the GPU's measured maximum
    achievable matmul rate (``GPU.matmul_tflops``, bf16/fp16 on tensor cores) where one is published, else its
    class's constant (by GPU class and matmul path)."""
    path = matmul_path(setup) if gpu.has_tensor_cores else "cuda"
    peak = gpu.half_tflops(setup.compute_dtype)
    if path == "tensor" and setup.compute_dtype in ("bf16", "fp16") and gpu.matmul_tflops and peak:
        return gpu.matmul_tflops / peak        # above 1 where a card boosts past its datasheet clock (RTX 4090)
    return class_constant("peak_fraction_by_class", gpu_class(gpu), gpu, path)


def half_saturation(setup: Setup, gpu: GPU | None = None) -> float:
    """Hidden size at which a GEMM reaches half its asymptote: tensor cores need far wider GEMMs to fill.

    On tensor cores the width scales with the GPU's machine balance (achievable matmul FLOP/s per byte/s of HBM,
    ``machine_balance``) over the reference GPU's: a GEMM of width h over many tokens does ~h/2 FLOPs per byte it
    moves, so it stays compute-bound only where h/2 exceeds the balance (roofline, Williams et al. 2009). An H100
    SXM (792.1 TFLOP/s MAMF over 3.35 TB/s: 236 FLOP/B) needs 1.8x the width an A100 80GB (267.9 / 2.039: 131) does."""
    half = float(constant("hidden_half_saturation_by_path")[matmul_path(setup)])
    if gpu is None or matmul_path(setup) != "tensor":
        return half
    ratio = machine_balance(gpu, setup)
    return half * ratio if ratio else half


@cache
def _reference_gpu(name: str) -> GPU:
    gpu = Hardware.from_name(name).smallest_gpu
    assert gpu is not None, f"{name} names a GPU row of gpus.json"
    return gpu


def machine_balance(gpu: GPU, setup: Setup) -> float | None:
    """The GPU's achievable 16-bit matmul FLOP/s per HBM byte/s, relative to hidden_half_saturation_reference_gpu's
    (the fitted width is that GPU's); None where the bandwidth or the peak is unknown."""
    ref = _reference_gpu(str(constant("hidden_half_saturation_reference_gpu")[0]))

    def balance(g: GPU) -> float | None:
        peak = g.half_tflops(setup.compute_dtype)
        if not (peak and g.memory_bandwidth_gbps and g.has_tensor_cores):
            return None
        return asymptote(g, setup) * peak / g.memory_bandwidth_gbps

    mine, base = balance(gpu), balance(ref)
    return mine / base if mine and base else None


def attention_efficiency(setup: Setup) -> float:
    """Rate of attention matmuls that run as plain GEMMs (eager attention, and the fp32 kernels on CUDA cores)
    relative to the model's GEMMs; eager's real cost, the s x s traffic, is ``eager_score_bytes``. Fused kernels
    on tensor cores are priced by ``fused_attention_seconds`` instead, at their own rate."""
    return float(constant("attention_efficiency")["eager"])


def fused_attention(setup: Setup) -> bool:
    """SDPA / flash_attention_2 on tensor cores: one kernel with its own achievable rate, not a GEMM."""
    return setup.attn_implementation != "eager" and matmul_path(setup) == "tensor"


def attention_arch(gpu: GPU) -> str:
    """The flash-kernel generation a GPU runs: FlashAttention-2 is written for Ampere's mma.sync (sm80, also
    Ada sm89), and does not use Hopper's wgmma/TMA - FlashAttention-3 does -, so on an H100 the same kernel
    reaches a much smaller fraction of peak; Volta/Turing get the memory-efficient (cutlass) SDPA kernel."""
    if gpu.attention_class is not None:
        return gpu.attention_class    # a gpus.json column (AMD Instinct: 'cdna')
    major = gpu.compute_capability[0]
    return {7: "volta_turing", 8: "ampere", 9: "hopper"}.get(major, "blackwell" if major >= 10 else "volta_turing")


def causal_fraction(spec: ModelSpec, setup: Setup) -> float:
    """Score tiles a kernel really computes, as a share of the b x s x s_attended counted ones. A causal decoder's
    fused kernels skip the tiles above the diagonal (FlashAttention-2 ``causal=True``, SDPA ``is_causal``): about
    half, or ``1 - w / 2s`` when flash-attn is handed a sliding window w < s. Encoders attend both ways (all of it).
    Eager attention builds the full s x s matrix and masks it afterwards, and so does SDPA when transformers hands it
    a window as a boolean mask (it cannot say ``is_causal`` then): s / w of the counted tiles. The MFU convention
    (no causal halving, the window's span) is unchanged."""
    attended = min(setup.seq_len, spec.sliding_window) if spec.sliding_window else setup.seq_len
    masked_after = setup.attn_implementation == "eager" or (setup.attn_implementation == "sdpa" and attended < setup.seq_len)
    if masked_after:
        return setup.seq_len / attended
    if not spec.generates or spec.is_encoder_decoder:
        return 1.0
    if setup.packed_doc_len is not None:
        return document_block_fraction(setup.seq_len, setup.packed_doc_len, int(constant("flex_block_size")))
    return 1.0 - attended / (2.0 * setup.seq_len)


def document_block_fraction(seq_len: int, doc_len: int, block: int) -> float:
    """Share of the s x s score tiles a block-sparse kernel computes for a causal pack of documents masked from each
    other (torchtune's packed_block_causal_mask: causal and same-document, run by FlexAttention, which skips every
    ``block`` x ``block`` tile its BlockMask marks empty and computes partial tiles whole). The pack is laid out as
    documents of ``doc_len`` tokens back to back (the last one cut at ``seq_len``, as torchtune's pack padding is
    its own document); a tile (q-block i, kv-block j <= i) is computed when one document reaches into both blocks.
    Causal attention over the whole pack (one document) gives (n + 1) / 2n of the n^2 tiles. Row i of tiles runs from
    the first block of the earliest document reaching into q-block i up to the diagonal, so the count is one pass
    over the documents' block spans (linear in blocks + documents, where a set of tiles grows with n^2)."""
    n = -(-seq_len // block)
    reach = list(range(n))   # per q-block: the lowest kv-block a document in it starts in
    for start in range(0, seq_len, doc_len):
        first, last = start // block, (min(start + doc_len, seq_len) - 1) // block
        for i in range(first, last + 1):
            reach[i] = min(reach[i], first)
    return sum(i - r + 1 for i, r in enumerate(reach)) / (n * n)


def framework_efficiency(framework: str) -> float:
    """How much faster than HF Trainer a training stack runs the same step (fused kernels, no Trainer overhead).

    perfguide's own plans run under HF Trainer / accelerate, so it is 1.0 there; the bench passes the stack each
    published row was measured with, so this term, not the GPU constants, absorbs the difference.
    """
    table = constant("framework_efficiency")
    return float(table.get(framework, table["hf_trainer"]))
