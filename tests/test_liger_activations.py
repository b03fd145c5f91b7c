"""Liger's fused RMSNorm / SwiGLU activation savings (issue 11 item 1), against what HF's eager modules and Liger's
kernels save for backward: HF's RMSNorm keeps an fp32 upcast of its input and the normalised tensor, Liger's keeps its
input and one fp32 rstd per row (liger_kernel/ops/rms_norm.py); HF's SwiGLU keeps act(gate), Liger recomputes it
(ops/swiglu.py). The HF side is checked on a real tiny Llama's saved tensors on CPU; Liger itself needs CUDA."""

from __future__ import annotations

import pytest

from perfguide import Hardware, ModelSpec, Setup
from perfguide.memory import estimate_memory
from perfguide.techniques.liger_kernel import fused_activation_savings

torch = pytest.importorskip("torch")

try:
    from helpers import tiny_config
except ImportError:  # pragma: no cover
    from tests.helpers import tiny_config


def _setup(**kw):
    base = dict(task="train", device="cuda", micro_batch_size=2, seq_len=1024, weights_dtype="bf16", autocast="bf16",
                optimizer="adamw_torch_fused")
    return Setup(**{**base, **kw})


@pytest.fixture(scope="module")
def llama():
    return ModelSpec.from_any("meta-llama/Llama-3.1-8B")


def test_savings_hand_formula(llama):
    tokens = 2 * 1024
    # two norms x 4 B per hidden element, plus one bf16 intermediate tensor per token per block
    want = tokens * 32 * (2 * 4 * 4096 + 2 * 14336)
    assert fused_activation_savings(llama, _setup()) == want
    fp32 = _setup(weights_dtype="fp32", autocast=None)
    assert fused_activation_savings(llama, fp32) == tokens * 32 * (2 * 4 * 4096 + 4 * 14336)
    assert fused_activation_savings(llama, _setup(gradient_checkpointing=True)) == 0


def test_memory_estimate_applies_them(llama):
    hw = Hardware.from_name("h100-80gb")
    off = estimate_memory(llama, _setup(liger_kernel=False), hw)
    on = estimate_memory(llama, _setup(liger_kernel=True), hw)
    assert off.activations - on.activations == fused_activation_savings(llama, _setup())


def test_unsupported_family_saves_nothing():
    gpt2 = ModelSpec.from_any("gpt2")
    assert fused_activation_savings(gpt2, _setup()) == 0


@pytest.mark.parametrize("name", ["gpt2", "google-bert/bert-base-uncased"])
def test_unpatched_families_are_priced_as_without_liger(name):
    """apply_liger_kernel has no entry for gpt2 or bert (MODEL_TYPE_TO_APPLY_LIGER_FN): it logs and patches nothing,
    so the run keeps HF's loss and modules; neither memory nor step time may change (issue 24: GPT-2 / BERT were
    priced 10-19% faster with Liger)."""
    from perfguide.speed import estimate_speed as estimate_throughput

    spec, hw = ModelSpec.from_any(name), Hardware.from_name("a100-80gb")
    off, on = _setup(liger_kernel=False, seq_len=512), _setup(liger_kernel=True, seq_len=512)
    assert estimate_memory(spec, on, hw).peak_allocated == estimate_memory(spec, off, hw).peak_allocated
    assert estimate_throughput(spec, on, hw).step_time_s == estimate_throughput(spec, off, hw).step_time_s


def test_patched_family_still_changes_the_step(llama):
    from perfguide.speed import estimate_speed as estimate_throughput

    hw = Hardware.from_name("h100-80gb")
    assert estimate_throughput(llama, _setup(liger_kernel=True), hw).step_time_s != estimate_throughput(llama, _setup(), hw).step_time_s


def _norm_and_mlp_saved_bytes(dtype) -> tuple[int, int]:
    """Bytes HF's eager LlamaRMSNorm and LlamaMLP save for backward in one block of a real tiny Llama."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config(), attn_implementation="sdpa").to(dtype)
    block = model.model.layers[0]
    x = torch.randn(2, 16, model.config.hidden_size, dtype=dtype, requires_grad=True)

    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}   # weights and their transposed views

    def saved(module, inp) -> int:
        seen, total = set(), 0

        def pack(t):
            nonlocal total
            key = t.untyped_storage().data_ptr()
            if key not in seen and key not in weights:
                seen.add(key)
                total += t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            module(inp).float().sum().backward()
        return total

    norm = saved(block.input_layernorm, x)
    h = block.input_layernorm(x).detach().requires_grad_()
    mlp = saved(block.mlp, h)
    return norm, mlp


def test_hf_eager_modules_keep_what_liger_removes():
    """bf16 tiny Llama: HF's RMSNorm keeps the fp32 upcast (4 B) + the bf16 normalised tensor (2 B) per element, so
    Liger's input-only copy (2 B) saves 4 B; HF's MLP keeps gate, act(gate), up and their product (4 x 2 B per
    intermediate element, plus the bf16 input for gate/up), one of which (act(gate)) Liger recomputes."""
    norm, mlp = _norm_and_mlp_saved_bytes(torch.bfloat16)
    b, s, h, i = 2, 16, 32, 64
    rows = b * s
    assert norm == rows * (h * (4 + 2) + 4)      # the fp32 copy, the normalised bf16 tensor, one fp32 rsqrt per row
    liger_norm = rows * (h * 2 + 4)              # Liger: its bf16 input and one fp32 rstd per row
    assert norm - liger_norm == rows * h * 4     # the 4 B per element fused_activation_savings counts per norm
    assert mlp == rows * (h * 2 + 4 * i * 2)     # x, gate, act(gate), up, act(gate)*up
    liger_mlp = rows * (h * 2 + 3 * i * 2)       # Liger's SiLUMul keeps gate and up, the product stays down_proj's input
    assert mlp - liger_mlp == rows * i * 2       # the one bf16 intermediate tensor fused_activation_savings counts
