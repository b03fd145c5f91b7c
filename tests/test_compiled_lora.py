"""PEFT LoRA on a frozen bf16 Llama block, eager and under torch.compile, against hand-counted saved tensors
(scripts/trace_compiled_block.py ``--lora``, data/techniques.json ``compiled_blocks`` ``transformers:llama:lora:*``;
techniques/torch_compile.py ``memory``; memory/lora_activations.py).

What a frozen block keeps per token (transformers' LlamaDecoderLayer, SDPA): each RMSNorm its fp32 upcast and one
fp32 rstd per row (the norm's weight takes no gradient, so no normalised copy), q, k, v, the attention output and
its fp32 log-sum-exp per head, and the MLP's gate, SiLU(gate) and up (16-bit). Compiled, the min-cut partition keeps
each norm's 16-bit input instead of the upcast and recomputes SiLU. Each adapted Linear's lora_A keeps its input
in the adapters' dtype (fp32 adapters: a cast per Linear eager, one per tensor compiled; bf16: the tensor itself,
q / k / v and gate / up sharing it and o_proj's being the attention's saved output), lora_B the r-wide lora_A
output; dropout a dropped copy and a mask per adapter (CUDA's native_dropout and the compiled graph a 1-byte mask,
CPU's eager dropout one in the input's dtype)."""

from __future__ import annotations

import pytest
from helpers import load_script

from perfguide import Hardware, LoraSpec, ModelSpec, Setup
from perfguide.data.techniques import compiled_blocks
from perfguide.memory import estimate_memory
from perfguide.memory.ledger import ledger
from perfguide.memory.lora_activations import lora_layer_bytes

LLAMA_3B = {"h": 3072, "heads": 24, "kv": 8, "d": 128, "i": 8192}   # Llama-3.2-3B's config.json
SMALL = {"h": 256, "heads": 4, "kv": 2, "d": 64, "i": 512}
R, LAYERS, TOKENS = 16, 28, 2 * 4096
ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _in_widths(dims: dict[str, int], targets: str) -> dict[str, int]:
    h, q = dims["h"], dims["heads"] * dims["d"]
    widths = {"q_proj": h, "k_proj": h, "v_proj": h, "o_proj": q, "gate_proj": h, "up_proj": h, "down_proj": dims["i"]}
    return widths if targets == "all" else {k: widths[k] for k in ("q_proj", "v_proj")}


def _frozen_block(dims: dict[str, int], compiled: bool) -> int:
    """Per token: two norms (fp32 upcast 4 B, or the bf16 input 2 B compiled, plus a 4 B rstd), SDPA's q / out (2 B
    x heads x d), k / v (2 B x kv x d), log-sum-exp (4 B per head), gate, up and (eager) SiLU(gate) at 2 B."""
    h, heads, kv, d, i = dims["h"], dims["heads"], dims["kv"], dims["d"], dims["i"]
    norms = 2 * ((2 if compiled else 4) * h + 4)
    return norms + 2 * 2 * heads * d + 2 * 2 * kv * d + 4 * heads + (2 if compiled else 3) * 2 * i


def _adapters(dims: dict[str, int], targets: str, dtype: str, dropout: float, *, compiled: bool, mask: int) -> int:
    """Per token, the adapters' saved tensors; ``mask``: bytes per element of eager dropout's mask."""
    widths = _in_widths(dims, targets)
    a = 4 if dtype == "fp32" else 2
    ranks = a * R * len(widths)
    if dropout:   # a dropped copy and a mask per adapter, eager and compiled
        return sum(widths.values()) * (a + (1 if compiled else mask)) + ranks
    if dtype == "bf16":   # the tensor itself: q's (shared by k, v), gate's (shared by up), down's; o's is SDPA's output
        distinct = [w for k, w in widths.items() if k in ("q_proj", "gate_proj", "down_proj")]
        return a * sum(distinct) + ranks
    if compiled:   # one fp32 cast per tensor: q / k / v's, o's, gate / up's, down's
        distinct = [w for k, w in widths.items() if k not in ("k_proj", "v_proj", "up_proj")]
        return a * sum(distinct) + ranks
    return a * sum(widths.values()) + ranks   # one fp32 cast per adapted Linear


def _key(key: str) -> tuple[str, str, float]:
    targets, dtype, dropout = key.split(":")
    return targets, dtype, float(dropout)


def test_traced_lora_blocks_are_the_hand_count() -> None:
    """Every traced LoRA block, eager (CPU: the dropout mask in the input's dtype) and compiled, to the byte."""
    blocks = {k.split(":lora:")[1]: b for k, b in compiled_blocks().blocks.items() if k.startswith("transformers:llama:lora:")}
    assert len(blocks) == 7
    for key, block in blocks.items():
        targets, dtype, p = _key(key)
        cpu_mask = 4 if dtype == "fp32" else 2
        assert (block.hidden_size, block.intermediate_size) == (LLAMA_3B["h"], LLAMA_3B["i"])
        assert block.eager_bytes_per_token == _frozen_block(LLAMA_3B, False) + _adapters(
            LLAMA_3B, targets, dtype, p, compiled=False, mask=cpu_mask), key
        assert block.compiled_bytes_per_token == _frozen_block(LLAMA_3B, True) + _adapters(
            LLAMA_3B, targets, dtype, p, compiled=True, mask=cpu_mask), key
    # the frozen block alone keeps 2 B per hidden unit per norm and 2 B per FFN unit less compiled
    assert _frozen_block(LLAMA_3B, False) - _frozen_block(LLAMA_3B, True) == 4 * 3072 + 2 * 8192 == 28672


@pytest.fixture(scope="module")
def llama() -> ModelSpec:
    return ModelSpec.from_any("meta-llama/Llama-3.2-3B")


def _lora(targets: str, dtype: str, dropout: float, **kw: object) -> LoraSpec:
    return LoraSpec(r=R, alpha=2 * R, dropout=dropout, target_modules=ALL if targets == "all" else ("q_proj", "v_proj"),
                    autocast_adapter_dtype=dtype == "fp32", **kw)


def _setup(lora: LoraSpec | None, **kw: object) -> Setup:
    base = dict(task="train", device="cuda", micro_batch_size=2, seq_len=4096, weights_dtype="bf16",
                optimizer="adamw_torch_fused", lora=lora)
    return Setup(**{**base, **kw})


SETUPS = [(t, d, p) for t in ("all", "qv") for d in ("fp32", "bf16") for p in (0.0, 0.05)]


@pytest.mark.parametrize("targets, dtype, p", SETUPS)
def test_eager_adapter_bytes_are_the_hand_count(llama: ModelSpec, targets: str, dtype: str, p: float) -> None:
    """perfguide's eager adapter term on a CUDA run (native_dropout's 1-byte mask): the hand count, 16-bit adapters'
    shared inputs counted once."""
    setup = _setup(_lora(targets, dtype, p))
    led = ledger(llama, setup)
    got = lora_layer_bytes(setup, led.lora_inputs_per_layer, led.lora_rank_per_layer,
                           shared_inputs_per_layer=led.shared_inputs_per_layer,
                           attention_output_inputs_per_layer=led.attention_output_inputs_per_layer)
    assert got == TOKENS * _adapters(LLAMA_3B, targets, dtype, p, compiled=False, mask=1)


@pytest.mark.parametrize("dtype, p, want", [("bf16", 0.0, 2 * R * 7), ("fp32", 0.0, 4 * 26624 + 4 * R * 7),
                                             ("bf16", 0.05, 3 * 26624 + 2 * R * 7)])
def test_frozen_linears_keeping_inputs_leave_uncast_adapters_none(llama: ModelSpec, dtype: str, p: float, want: int) -> None:
    """FSDP1 + LoRA: every frozen Linear keeps its input (analytic.frozen_params_get_grads), the very tensor bf16
    adapters without dropout keep: only the r-wide lora_A outputs are the adapters' own; an fp32 cast or a dropped
    copy (and its 1-byte mask) is a tensor of its own. All 7 Linears: inputs 3 x 3,072 + 3,072 + 2 x 3,072 + 8,192."""
    assert 3 * 3072 + 3072 + 2 * 3072 + 8192 == 26624
    setup = _setup(_lora("all", dtype, p))
    led = ledger(llama, setup)
    got = lora_layer_bytes(setup, led.lora_inputs_per_layer, led.lora_rank_per_layer, base_keeps_inputs=True,
                           shared_inputs_per_layer=led.shared_inputs_per_layer,
                           attention_output_inputs_per_layer=led.attention_output_inputs_per_layer)
    assert got == TOKENS * want


@pytest.mark.parametrize("targets, dtype, p", SETUPS)
def test_compile_prices_the_traced_lora_saving(llama: ModelSpec, targets: str, dtype: str, p: float) -> None:
    """Eager minus compiled activations over the 28 blocks: the frozen block's 4 h + 2 i and, fp32 adapters without
    dropout, the casts the graph shares (k and v read q's input, up gate's: 4 B each)."""
    lora = _lora(targets, dtype, p)
    eager = estimate_memory(llama, _setup(lora), Hardware.from_name("a100-80gb")).activations
    compiled = estimate_memory(llama, _setup(lora, torch_compile=True), Hardware.from_name("a100-80gb")).activations
    per_token = (_frozen_block(LLAMA_3B, False) + _adapters(LLAMA_3B, targets, dtype, p, compiled=False, mask=1)
                 - _frozen_block(LLAMA_3B, True) - _adapters(LLAMA_3B, targets, dtype, p, compiled=True, mask=1))
    assert eager - compiled == per_token * TOKENS * LAYERS
    assert per_token == {("all", "fp32", 0.0): 28672 + 4 * 3 * 3072, ("qv", "fp32", 0.0): 28672 + 4 * 3072}.get(
        (targets, dtype, p), 28672)


@pytest.mark.parametrize("kw", [dict(lora=LoraSpec(r=R, use_dora=True)), dict(lora=LoraSpec(r=R), gradient_checkpointing=True),
                                dict(lora=LoraSpec(r=R), weights_dtype="nf4"), dict(lora=LoraSpec(r=R), model_code="litgpt")])
def test_untraced_lora_setups_stay_eager(llama: ModelSpec, kw: dict[str, object]) -> None:
    """DoRA, LoRA with checkpointing (the recomputed block's peak), QLoRA, litgpt's code: priced as eager."""
    hw = Hardware.from_name("a100-80gb")
    assert estimate_memory(llama, _setup(**kw), hw).activations == estimate_memory(llama, _setup(torch_compile=True, **kw), hw).activations


@pytest.mark.parametrize("key", ["all:bf16:0", "qv:bf16:0", "all:fp32:0"])
def test_small_block_eager_lora_is_the_hand_count(key: str) -> None:
    """PEFT on a small real block, eager (saved_tensors_hooks storages): bf16 adapters keep one storage per shared
    input and none for o_proj (SDPA's output), fp32 adapters a cast per Linear."""
    pytest.importorskip("peft")
    trace = load_script("trace_compiled_block")
    targets, dtype, p = _key(key)
    got = trace.per_token("transformers", False, SMALL, trace.LORA_SETUPS[key])
    assert got == _frozen_block(SMALL, False) + _adapters(SMALL, targets, dtype, p, compiled=False, mask=4)


def test_small_block_compiled_lora_is_the_hand_count() -> None:
    """The compiled small block (Inductor on CPU, in the test): one fp32 cast per input tensor, norms' bf16 inputs,
    SiLU recomputed."""
    pytest.importorskip("peft")
    trace = load_script("trace_compiled_block")
    got = trace.per_token("transformers", True, SMALL, trace.LORA_SETUPS["all:fp32:0"])
    assert got == _frozen_block(SMALL, True) + _adapters(SMALL, "all", "fp32", 0.0, compiled=True, mask=4)
