"""Exact memory mode: traced bytes against hand-counted tensors, depth extrapolation against full traces.

Expected values are counted from the architecture (HF LlamaDecoderLayer source: which tensors autograd keeps)
and the allocator's 512-byte rounding, never read back from the tracer.
"""

from __future__ import annotations

import math

import pytest

from perfguide import ModelSpec, Setup

pytestmark = pytest.mark.slow

H, I, HEADS, V, B, S = 64, 128, 4, 256, 2, 16
LLAMA = dict(model_type="llama", hidden_size=H, intermediate_size=I, num_hidden_layers=2, num_attention_heads=HEADS,
             num_key_value_heads=HEADS, vocab_size=V, tie_word_embeddings=False, max_position_embeddings=2048)


def r512(nbytes: int) -> int:
    """The CUDA caching allocator's smallest block is 512 bytes; every request rounds up to it."""
    return math.ceil(nbytes / 512) * 512


#: LlamaRotaryEmbedding keeps inv_freq and original_inv_freq (head_dim/2 fp32 each) as device buffers
ROPE_BUFFERS = 2 * r512(4 * (H // HEADS) // 2)


def llama_param_shapes(layers: int, h: int = H, i: int = I, v: int = V) -> list[int]:
    """Element counts of every parameter of an untied LlamaForCausalLM (q/k/v/o, gate/up/down, 2 norms)."""
    block = [h * h] * 4 + [h * i] * 3 + [h, h]
    return [v * h] + block * layers + [h] + [v * h]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PERFGUIDE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _run(config, **setup):
    from perfguide.memory.tracing.step import run_step

    return run_step(config, Setup(micro_batch_size=B, seq_len=S, **setup))


def _depth(config, n):
    return {**config, "num_hidden_layers": n}


def test_model_states_equal_hand_counted_bytes():
    step = _run(LLAMA, optimizer="adamw_torch")
    params = sum(r512(4 * n) for n in llama_param_shapes(2))
    opt = step.phases["optimizer"].parts
    assert step.params == sum(llama_param_shapes(2))
    assert opt["weights"] == params + ROPE_BUFFERS
    assert opt["gradients"] == params
    assert opt["optimizer_states"] == 2 * params          # exp_avg + exp_avg_sq; step counters stay on the host
    # foreach AdamW builds sqrt(exp_avg_sq) for every tensor: one more parameter-sized set; the rest are scalars
    assert opt["optimizer_temporaries"] >= params
    assert step.phases["optimizer"].total - 4 * params - ROPE_BUFFERS <= 64 * 512 * len(llama_param_shapes(2))


def test_activations_per_block_equal_hand_count():
    """fp32 Llama block on GPU-style SDPA (mem-efficient kernel for fp32), counted tensor by tensor.

    Kept for backward: 2 RMSNorms x (normalised x, weighted output) + the residual after attention + the block
    output = 6 (b,s,h); q and k after RoPE, v, and the attention output (its transposed view is already
    contiguous, so o_proj's input is the same storage) = 2 q-sized + 2 kv-sized; gate, silu(gate), up and the
    product = 4 (b,s,i); small: 2 rsqrt (b,s,1), logsumexp (b,heads,s rounded up to 32), 2 RNG scalars.
    """
    one, two = _run(_depth(LLAMA, 1), optimizer="adamw_torch"), _run(LLAMA, optimizer="adamw_torch")
    per_block = two.phases["head"].parts["activations"] - one.phases["head"].parts["activations"]
    f = 4
    big = r512(B * S * H * f) * 6 + r512(B * S * H * f) * 2 + r512(B * S * H * f) * 2 + r512(B * S * I * f) * 4
    small = 2 * r512(B * S * f) + r512(B * HEADS * 32 * f) + 2 * r512(8)
    assert per_block == big + small
    assert one.sdpa_kernels["efficient"] == 1 and one.sdpa_kernels["flash"] == 0


def test_checkpointed_bf16_llama_runs_flash_without_a_mask():
    """Real training builds no causal mask for SDPA (is_causal; transformers finds the rows unpacked from their
    position_ids), checkpointed or not; the fake trace cannot read position_ids, so it must not take the rows for
    packed sequences and build a b x s x s mask that sends SDPA to the memory-efficient kernel. 2 blocks, forward and
    recompute: 4 flash calls."""
    step = _run(LLAMA, optimizer="adamw_torch", weights_dtype="bf16", gradient_checkpointing=True)
    assert step.sdpa_kernels["flash"] == 4 and step.sdpa_kernels["efficient"] == 0


def test_loss_path_holds_logits_sized_buffers():
    """log_softmax output (fp32 b*s*V) is kept for backward; at the start of backward its gradient and the
    logits' gradient join it (the logits themselves die with the model output, as in Trainer.compute_loss)."""
    step = _run(LLAMA, optimizer="adamw_torch")
    logits = B * S * V * 4
    assert 2 * logits <= step.phases["head"].parts["logits"] < 2 * logits + 8 * 512
    assert 3 * logits <= step.phases["backward_head"].parts["logits"] < 3 * logits + 24 * 512


def test_bf16_autocast_runs_flash_and_keeps_16bit_weight_copies():
    step = _run(LLAMA, optimizer="adamw_torch", autocast="bf16")
    assert step.sdpa_kernels["flash"] == 2 and step.sdpa_kernels["efficient"] == 0
    # autocast caches a bf16 copy of every Linear weight until the forward ends (2 bytes/element)
    linear = sum(n for n in llama_param_shapes(2)[1:-1] if n >= H * H) + V * H
    fp32 = _run(LLAMA, optimizer="adamw_torch").phases["head"].parts["activations"]
    amp = step.phases["head"].parts["activations"]
    assert amp - fp32 > 0.5 * 2 * linear - 2 * (6 * B * S * H * 2)


def test_extrapolation_equals_full_trace():
    from perfguide.memory.trace import traced_step
    from perfguide.memory.tracing.step import run_step

    deep = {**LLAMA, "num_hidden_layers": 6, "num_key_value_heads": 2}
    for setup in (Setup(micro_batch_size=B, seq_len=S, optimizer="adamw_torch"),
                  Setup(micro_batch_size=B, seq_len=S, autocast="bf16", gradient_checkpointing=True),
                  Setup(micro_batch_size=B, seq_len=S, weights_dtype="bf16", attn_implementation="eager", gradient_accumulation_steps=2)):
        notes: list[str] = []
        est, full = traced_step(deep, setup, notes), run_step(deep, setup)
        assert any("extrapolated" in n for n in notes)
        for name, phase in full.phases.items():
            assert est.phases[name].total == pytest.approx(phase.total, rel=0.005), (setup.label, name)
        assert est.params == full.params


def test_checkpointing_reduces_activations():
    plain = _run(LLAMA, optimizer="adamw_torch")
    ckpt = _run(LLAMA, optimizer="adamw_torch", gradient_checkpointing=True)
    # only each block's input (b,s,h fp32) survives the forward
    assert ckpt.phases["head"].parts["activations"] < plain.phases["head"].parts["activations"] / 3
    one = _run(_depth(LLAMA, 1), optimizer="adamw_torch", gradient_checkpointing=True)
    assert ckpt.phases["head"].parts["activations"] - one.phases["head"].parts["activations"] == r512(B * S * H * 4)


def test_eager_attention_exceeds_sdpa_at_long_sequence():
    seq = 512
    from perfguide.memory.tracing.step import run_step

    common = dict(micro_batch_size=1, seq_len=seq, optimizer="sgd")
    eager = run_step(LLAMA, Setup(attn_implementation="eager", **common))
    fused = run_step(LLAMA, Setup(attn_implementation="sdpa", **common))
    scores = HEADS * seq * seq * 4  # one fp32 softmax output per block, kept for backward
    gap = eager.phases["head"].parts["activations"] - fused.phases["head"].parts["activations"]
    assert gap >= 0.99 * 2 * scores  # two blocks; the fused kernel's own output and logsumexp are the 1%


def test_lora_cuts_gradients_and_optimizer_to_adapters():
    from perfguide.setup import LoraSpec

    r = 4
    step = _run(LLAMA, optimizer="adamw_torch", lora=LoraSpec(r=r, alpha=8, target_modules=("q_proj", "v_proj")))
    adapters = [r * H, H * r] * 2 * 2   # A (r x h) and B (h x r) on q and v, in 2 blocks
    assert step.trainable_params == sum(adapters)
    expected = sum(r512(4 * n) for n in adapters)
    opt = step.phases["optimizer"].parts
    assert opt["gradients"] == expected
    assert opt["optimizer_states"] == 2 * expected
    assert opt["weights"] == sum(r512(4 * n) for n in llama_param_shapes(2)) + expected + ROPE_BUFFERS


def test_estimate_api_uses_trace_and_cache(tmp_path):
    import perfguide

    spec = ModelSpec.from_any(dict(LLAMA))
    setup = dict(micro_batch_size=B, seq_len=S, optimizer="adamw_torch_fused", autocast="bf16")
    first = perfguide.estimate(spec, setup, method="trace")
    assert first.method == "trace"
    assert first.peak_allocated >= first.weights + first.optimizer_states
    assert first.peak_reserved >= first.peak_allocated and first.device_total > first.peak_reserved
    assert list((tmp_path / "trace").glob("*.json"))
    again = perfguide.estimate(spec, setup, method="trace")
    assert again == first


def test_bnb_optimizer_falls_back_to_analytic_state():
    import perfguide

    spec = ModelSpec.from_any(dict(LLAMA, hidden_size=128, intermediate_size=256))
    est = perfguide.estimate(spec, dict(micro_batch_size=B, seq_len=S, optimizer="adamw_bnb_8bit"), method="trace")
    assert any("analytic" in n for n in est.notes)
    adam32 = perfguide.estimate(spec, dict(micro_batch_size=B, seq_len=S, optimizer="adamw_torch"), method="trace")
    assert 0 < est.optimizer_states < adam32.optimizer_states / 2


FAMILY_CONFIGS = {
    "llama": dict(model_type="llama", hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=8,
                  num_key_value_heads=2, vocab_size=4096, max_position_embeddings=1024),
    "gpt2": dict(model_type="gpt2", n_embd=256, n_layer=4, n_head=8, vocab_size=4096, n_positions=1024),
    "bert": dict(model_type="bert", hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8,
                 vocab_size=4096, max_position_embeddings=1024, architectures=["BertForMaskedLM"]),
}
AGREEMENT_SETUPS = {
    "fp32-adamw": dict(micro_batch_size=4, seq_len=256, optimizer="adamw_torch"),
    "amp-bf16": dict(micro_batch_size=4, seq_len=256, autocast="bf16"),
    "bf16-eager": dict(micro_batch_size=2, seq_len=512, attn_implementation="eager", weights_dtype="bf16"),
    "bf16-ckpt": dict(micro_batch_size=4, seq_len=256, weights_dtype="bf16", gradient_checkpointing=True),
}
AGREEMENT_TOL = 0.05  # analytic peak within 5% of the traced peak (measured: 0-3% on these shapes)


@pytest.mark.parametrize("family", sorted(FAMILY_CONFIGS))
@pytest.mark.parametrize("case", sorted(AGREEMENT_SETUPS))
def test_analytic_agrees_with_trace(family, case):
    """The analytic model, fed by scripts/fit_activations.py's coefficients, reproduces the traced peak."""
    from perfguide.memory import estimate_memory
    from perfguide.memory.trace import trace_memory

    spec = ModelSpec.from_any(dict(FAMILY_CONFIGS[family]))
    assert spec.family == family
    setup = Setup(**AGREEMENT_SETUPS[case])
    analytic, traced = estimate_memory(spec, setup), trace_memory(spec, setup)
    assert analytic.peak_allocated == pytest.approx(traced.peak_allocated, rel=AGREEMENT_TOL)


def test_dropout_keeps_one_byte_masks_as_cuda_native_dropout():
    """On CUDA ``at::dropout`` runs ``native_dropout`` and keeps a bool mask (1 byte per element) for backward;
    GPT-2 drops out the attention and MLP outputs of each block: two (b, s, h) masks per block."""
    gpt2 = dict(model_type="gpt2", n_embd=H, n_inner=I, n_head=HEADS, vocab_size=V, n_positions=1024, embd_pdrop=0.0, attn_pdrop=0.0)

    def block(p):
        cfg = {**gpt2, "resid_pdrop": p}
        runs = [_run({**cfg, "n_layer": n}, optimizer="sgd").phases["head"].parts["activations"] for n in (1, 2)]
        return runs[1] - runs[0]

    assert block(0.1) - block(0.0) == 2 * r512(B * S * H)
