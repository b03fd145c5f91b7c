"""The GPU step's memory-bound terms against bytes counted by hand, and the fitted constants against their rows.

Hand counts: eager attention moves ``bytes_per_element`` for every element of the b x heads x s x s scores in
every layer; a 4-bit base is read (0.5 B/param) and written as 16 bit (2 B/param) once per matmul pass; each
LoRA-adapted Linear copies its input (4 B per element) ``lora_passes`` times. No wall-clock time is asserted.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from helpers import load_bench
from test_speed import A100, T4, gpt2, llama7b

from perfguide._data import load
from perfguide.hardware.types import GPU
from perfguide.setup import LoraSpec, Setup
from perfguide.speed import rates, terms
from perfguide.speed.rates import matmul_params

ROOT = Path(__file__).resolve().parents[1]
GiB = 1024**3
V100 = GPU(name="Tesla V100-SXM2-32GB", memory_total=32 * GiB, memory_free=32 * GiB, compute_capability=(7, 0), fp16_tflops=125,
           fp32_tflops=15.7, memory_bandwidth_gbps=900)
RTX4090 = GPU(name="NVIDIA GeForce RTX 4090", memory_total=24 * GiB, memory_free=24 * GiB, compute_capability=(8, 9), bf16_tflops=165.2,
              fp16_tflops=165.2, fp32_tflops=82.6, memory_bandwidth_gbps=1008)


def _const(name: str):
    return load("efficiency")[name]["value"]


def test_gpu_classes() -> None:
    assert [rates.gpu_class(g) for g in (A100, V100, T4, RTX4090)] == ["datacenter", "volta", "graphics", "graphics"]
    from perfguide.hardware.types import Hardware

    mi300x = Hardware.from_name("mi300x").smallest_gpu
    assert mi300x is not None and rates.gpu_class(mi300x) == "cdna"


def test_fp32_runs_on_cuda_cores_and_amp_on_tensor_cores() -> None:
    assert rates.matmul_path(Setup(weights_dtype="fp32")) == "cuda"
    assert rates.matmul_path(Setup(weights_dtype="fp32", autocast="fp16")) == "tensor"
    assert rates.matmul_path(Setup(weights_dtype="fp32", tf32=True)) == "tensor"


def test_eager_score_bytes_by_hand() -> None:
    """Every element of the b x heads x s x s scores in every layer moves the traced eager-minus-SDPA bytes, plus
    the probability dropout's (GPT-2 trains with attention dropout 0.1); checkpointing re-runs a third."""
    row = load("traffic")["families"]["gpt2"]["regimes"]["amp"]
    setup = Setup(micro_batch_size=2, seq_len=1024, attn_implementation="eager", weights_dtype="fp32", autocast="fp16")
    elements = 2 * 12 * 1024 * 1024 * 12                          # b x heads x s x s x layers
    per_element = (row["eager_per_head_s2"] + row["eager_dropout_per_head_s2"]) * _const("elementwise_traffic_factor")
    assert terms.eager_score_bytes(gpt2(), setup) == pytest.approx(elements * per_element)
    ckpt = setup.model_copy(update={"gradient_checkpointing": True})
    assert terms.eager_score_bytes(gpt2(), ckpt) == pytest.approx(elements * per_element * 4 / 3)
    assert terms.eager_score_bytes(gpt2(), setup.model_copy(update={"attn_implementation": "sdpa"})) == 0
    # a sliding window is a mask on the full scores: the same bytes as no window
    windowed = gpt2().model_copy(update={"sliding_window": 128})
    assert terms.eager_score_bytes(windowed, setup) == pytest.approx(elements * per_element)


def test_elementwise_bytes_are_the_traced_traffic_of_every_block_and_the_head() -> None:
    """By hand from data/traffic.json's gpt2 'half' row: per token and block sum(coef x width), x tokens x layers,
    plus the loss path's bytes per token and vocabulary entry; checkpointing adds the forward's share once."""
    row = load("traffic")["families"]["gpt2"]["regimes"]["half"]
    setup = Setup(micro_batch_size=4, seq_len=512, weights_dtype="bf16")
    widths = {"h": 768, "i": 3072, "q": 768, "kv": 768, "1": 1}
    per_token = sum(v * widths[k] for k, v in row["per_token"].items())
    forward = sum(v * widths[k] for k, v in row["forward_per_token"].items())
    tokens, factor = 4 * 512, _const("elementwise_traffic_factor")
    head = tokens * 50257 * row["logits_per_token_vocab"]
    assert terms.elementwise_bytes(gpt2(), setup) == pytest.approx(factor * (12 * tokens * per_token + head))
    ckpt = setup.model_copy(update={"gradient_checkpointing": True})
    assert terms.elementwise_bytes(gpt2(), ckpt) == pytest.approx(factor * (12 * tokens * (per_token + forward) + head))
    compiled = setup.model_copy(update={"torch_compile": True})
    assert terms.elementwise_bytes(gpt2(), compiled) == pytest.approx(
        factor * (12 * tokens * per_token + head) * _const("compile_elementwise_factor"))
    # eager's s x s chain is priced by eager_score_bytes, not twice
    eager = setup.model_copy(update={"attn_implementation": "eager"})
    assert terms.elementwise_bytes(gpt2(), eager) == pytest.approx(terms.elementwise_bytes(gpt2(), setup))


def test_traffic_follows_the_model_code_and_the_compute_copy() -> None:
    """Llama's block (fp32 RMSNorm, rotary) moves several times an MPT block's bytes per hidden unit; a model type
    the memory model aliases to llama is priced as llama; FSDP mixed precision computes on a 16-bit copy."""
    from perfguide.speed import traffic

    families = load("traffic")["families"]
    llama, mpt = families["llama"]["regimes"]["half"]["per_token"], families["mpt"]["regimes"]["half"]["per_token"]
    # an MPT block of width h has a 4h MLP; a Llama-2-7B-shaped block (i = 2.69h, q = kv = h)
    llama_per_h = llama["h"] + 2.6875 * llama["i"] + llama["q"] + llama["kv"]
    assert llama_per_h > 2.5 * mpt["h"]
    assert traffic.family_of(llama7b().model_copy(update={"model_type": "mistral", "family": "generic"})) == "llama"
    amp = Setup(weights_dtype="fp32", autocast="bf16")
    assert traffic.traffic_regime(amp) == "amp"
    assert traffic.traffic_regime(amp.model_copy(update={"strategy": "fsdp", "num_gpus": 8})) == "half"
    assert traffic.traffic_regime(amp.model_copy(update={"strategy": "zero3", "num_gpus": 8})) == "half"


def test_measured_matmul_rate_sets_the_asymptote_where_published() -> None:
    from perfguide.hardware.types import Hardware

    bf16 = Setup(weights_dtype="bf16")
    h100 = Hardware.from_name("h100-80gb").smallest_gpu
    assert h100 is not None and h100.matmul_tflops == 792.1
    assert rates.asymptote(h100, bf16) == pytest.approx(792.1 / 989.5)
    # no measurement: the class constant; fp32 on CUDA cores never uses the bf16 measurement
    assert rates.asymptote(V100, Setup(weights_dtype="fp32", autocast="fp16")) == _const("peak_fraction_by_class")["tensor"]["volta"]
    assert rates.asymptote(h100, Setup(weights_dtype="fp32")) == _const("peak_fraction_by_class")["cuda"]["datacenter"]


def test_an_older_attention_kernel_takes_longer_by_its_published_ratio() -> None:
    setup = Setup(micro_batch_size=2, seq_len=4096, weights_dtype="bf16")
    fa2 = terms.fused_attention_seconds(llama7b(), setup, A100, 312, 1e15)
    triton = terms.fused_attention_seconds(llama7b(), setup, A100, 312, 1e15, "triton_flash")
    assert triton == pytest.approx(fa2 / _const("attention_kernel_speed")["triton_flash"])


def test_nf4_dequant_reads_half_a_byte_and_writes_two_per_pass() -> None:
    spec = llama7b()
    n = matmul_params(spec)
    qlora = Setup(weights_dtype="nf4", lora=LoraSpec(r=8), seq_len=1024)
    factor = _const("dequant_traffic_factor")
    assert terms.dequant_bytes(spec, qlora, n) == pytest.approx(2 * n * 2.5 * factor)      # forward + input-grad pass
    ckpt = qlora.model_copy(update={"gradient_checkpointing": True})
    assert terms.dequant_bytes(spec, ckpt, n) == pytest.approx(3 * n * 2.5 * factor)       # + the recompute
    assert terms.dequant_bytes(spec, Setup(weights_dtype="bf16"), n) == 0


def test_lora_adapter_copies_by_hand() -> None:
    setup = Setup(weights_dtype="bf16", lora=LoraSpec(r=16), micro_batch_size=2, seq_len=256)
    inputs = 6 * 4096 + 11008                                      # q,k,v,o,gate,up read 4096 wide; down reads 11008
    expected = _const("lora_passes") * 2 * 256 * inputs * 32 * 4
    assert terms.lora_bytes(setup, inputs, 32) == pytest.approx(expected)
    assert terms.lora_bytes(Setup(weights_dtype="bf16"), inputs, 32) == 0


H100 = GPU(name="NVIDIA H100 80GB HBM3", memory_total=80 * GiB, memory_free=80 * GiB, compute_capability=(9, 0), bf16_tflops=989,
           fp16_tflops=989, fp32_tflops=67, memory_bandwidth_gbps=3350)


def test_flash_kernel_generation_by_compute_capability() -> None:
    assert [rates.attention_arch(g) for g in (A100, RTX4090, H100, V100, T4)] == ["ampere", "ampere", "hopper", "volta_turing", "volta_turing"]
    from perfguide.hardware.types import Hardware

    mi300x = Hardware.from_name("mi300x").smallest_gpu
    assert mi300x is not None and rates.attention_arch(mi300x) == "cdna"


def test_causal_kernels_compute_half_the_score_tiles() -> None:
    setup = Setup(seq_len=4096, weights_dtype="bf16")
    assert rates.causal_fraction(llama7b(), setup) == 0.5                                   # decoder, full causal
    eager = setup.model_copy(update={"attn_implementation": "eager"})
    assert rates.causal_fraction(llama7b(), eager) == 1.0                                   # masks after
    window = llama7b().model_copy(update={"sliding_window": 1024})
    # query i attends min(i, 1024) keys: sum over 4096 queries ~ 1024 * 4096 - 1024^2 / 2 of the 1024 * 4096 counted
    flash = setup.model_copy(update={"attn_implementation": "flash_attention_2"})
    assert rates.causal_fraction(window, flash) == pytest.approx(1 - 1024 / (2 * 4096))
    # eager, and SDPA handed the window as a bool mask, compute all 4096 x 4096 tiles: 4x the 1024 x 4096 counted
    assert rates.causal_fraction(window, setup) == rates.causal_fraction(window, eager) == 4.0
    from perfguide.model.types import ModelSpec

    bert = ModelSpec.from_any({"model_type": "bert", "architectures": ["BertForMaskedLM"], "hidden_size": 768, "num_hidden_layers": 12,
                               "num_attention_heads": 12, "intermediate_size": 3072, "vocab_size": 30522, "max_position_embeddings": 512})
    assert rates.causal_fraction(bert, setup) == 1.0                                         # encoders attend both ways


def test_fused_attention_seconds_by_hand() -> None:
    """Executed FLOPs (half the counted ones for a causal decoder) at the kernel's fraction of the 16-bit peak; the
    stack term is not applied (the same flash kernel under every stack)."""
    setup = Setup(seq_len=8192, weights_dtype="bf16", attn_implementation="sdpa")
    fwd = 4.0 * 32 * 4096 * 8192 * 8192                                          # 4*L*d*s*s
    counted = 3 * fwd                                                             # MFU convention: backward 2x forward
    executed = (1 + 2.5) * fwd * 0.5          # flash backward: 5 matmuls to the forward's 2; causal: half the tiles
    fractions = _const("attention_peak_fraction")
    assert terms.fused_attention_seconds(llama7b(), setup, A100, 312, counted) == pytest.approx(executed / (312e12 * fractions["ampere"]))
    assert terms.fused_attention_seconds(llama7b(), setup, H100, 989, counted) == pytest.approx(executed / (989e12 * fractions["hopper"]))
    ckpt = setup.model_copy(update={"gradient_checkpointing": True})            # + one recomputed forward
    assert terms.fused_attention_seconds(llama7b(), ckpt, A100, 312, 4 * fwd) == pytest.approx((1 + 2.5 + 1) * fwd * 0.5 / (312e12 * fractions["ampere"]))
    assert terms.fused_attention_seconds(llama7b(), setup.model_copy(update={"attn_implementation": "eager"}), A100, 312, counted) == 0
    fp32 = Setup(seq_len=8192, weights_dtype="fp32")                              # no flash kernel on CUDA cores: a GEMM
    assert not rates.fused_attention(fp32) and terms.fused_attention_seconds(llama7b(), fp32, A100, 19.5, counted) == 0


def test_fused_attention_enters_the_step_at_its_own_rate() -> None:
    """Doubling the attention kernel's fraction of peak removes exactly half of its seconds from the step."""
    from test_speed import machine

    from perfguide.speed.training import _compute_split, training_speed

    spec, setup = llama7b(), Setup(seq_len=8192, weights_dtype="bf16", attn_implementation="sdpa", gradient_checkpointing=True)
    attn = _compute_split(spec, setup)[1]
    base = training_speed(spec, setup, machine()).step_time_s
    fractions = load("efficiency")["attention_peak_fraction"]["value"]
    saved = fractions["ampere"]
    try:
        fractions["ampere"] = 2 * saved
        faster = training_speed(spec, setup, machine()).step_time_s
    finally:
        fractions["ampere"] = saved
    assert base - faster == pytest.approx(attn * 0.5 * (1 + 2.5 + 1) / 4 / (312e12 * saved) / 2, rel=1e-6)


def test_framework_term_is_one_for_hf_trainer_and_unknown_stacks() -> None:
    assert rates.framework_efficiency("hf_trainer") == 1.0
    assert rates.framework_efficiency("something-else") == 1.0


_bench = load_bench


def test_fitted_constants_reproduce_the_rows_they_came_from() -> None:
    """The stored constants (bench/throughput_fit.py --write) price the rows they were fitted on: every fitted
    constant names its rows' sources, and on the two largest sources the in-sample median error is small. A
    constant edited by hand without refitting, or a model change that breaks the fit, fails here."""
    rows = _bench("throughput_rows")
    bench = _bench("throughput")
    fit = _bench("throughput_fit")
    cases, _ = rows.load()
    groups = {c.group for c in cases}
    data = load("efficiency")
    for p in fit.PARAMS:
        if p.key[0] == "protocol":
            continue
        note = data[p.key[0]]["fitted"][".".join(p.key[1:]) or "value"]
        named = [g for g in groups if g in note]
        assert named or note.startswith("prior"), p.key
    errors: dict[str, list[float]] = {}
    for c in cases:
        errors.setdefault(c.group, []).append(abs(bench.err(bench.predict(c), c.published)))
    assert statistics.median(errors["llm-foundry"]) < 15
    assert statistics.median(errors["deepspeed-autotuning"]) < 15
    # the stack term fitted on the flash-attention repo's 5 rows prices them; torchtune's and Answer.AI's
    # single-GPU / consumer rows are priced by the shared constants alone (plain PyTorch: no stack term fitted)
    for group in ("flash-attn-training", "torchtune-readme", "answerai-fsdp-qlora"):
        assert statistics.median(errors[group]) < 15, group


def test_estimate_speed_api_prices_the_setup_like_the_cost_model() -> None:
    """Named hardware carries no calibration, so the API returns the cost model's own Throughput; flops by hand."""
    import perfguide
    from perfguide.hardware.types import Hardware
    from perfguide.model.types import ModelSpec
    from perfguide.speed.training import training_speed as model

    setup = {"micro_batch_size": 4, "seq_len": 512, "weights_dtype": "bf16"}
    got = perfguide.estimate_speed("gpt2", setup, hardware="a100-80gb")
    want = model(ModelSpec.from_any("gpt2"), Setup(**setup), Hardware.from_name("a100-80gb"))
    assert got == want
    n = matmul_params(ModelSpec.from_any("gpt2"))
    attention = 3 * 4 * 12 * 768 * 512 * 512 * 4                  # fwd 4*L*d*s*s*b, backward twice that
    assert got.flops_per_step == pytest.approx(6 * n * 4 * 512 + attention)
    with pytest.raises(perfguide.PerfGuideError, match="num_gpus"):
        perfguide.estimate_speed("gpt2", {**setup, "num_gpus": 2, "strategy": "ddp"}, hardware="a100-80gb")


def test_liger_saves_the_traced_eager_chains_less_its_kernels_bytes() -> None:
    """By hand: per token and block, two RMSNorms, rotary on q and k, and the SwiGLU product, each HF's traced bytes
    per element minus Liger's kernel bytes (data/techniques.json), over every layer; nothing under torch.compile
    (Inductor fuses the same chains); the loss path saves HF's traced logits bytes net of Liger's chunk logits."""
    from perfguide.speed import traffic
    from perfguide.techniques.fused import chain_seconds_saved as block_seconds_saved
    from perfguide.techniques.liger_kernel import loss_seconds

    spec, setup = llama7b(), Setup(micro_batch_size=2, seq_len=1024, weights_dtype="bf16", liger_kernel=True)
    parts = load("traffic")["families"]["llama"]["regimes"]["half"]["components"]
    tech = load("techniques")
    norm, rope, glu = (tech[f"fused_{k}_bytes_per_element"]["value"] for k in ("rmsnorm", "rope", "swiglu"))
    per_token = (2 * 4096 * (parts["rmsnorm_per_h"] - norm) + 2 * 4096 * (parts["rope_per_qk"] - rope)
                 + 11008 * (parts["swiglu_per_i"] - glu))
    bw = 1.6e12
    factor = _const("elementwise_traffic_factor")
    assert block_seconds_saved(spec, setup, bw) == pytest.approx(per_token * 2048 * 32 * factor / bw)
    # compiled, the step model already charges the chains at compile_elementwise_factor of their eager bytes, and
    # Liger (opaque to Inductor) saves the rest down to one fused pass
    k = _const("compile_elementwise_factor")
    compiled = (2 * 4096 * (k * parts["rmsnorm_per_h"] - norm) + 2 * 4096 * (k * parts["rope_per_qk"] - rope)
                + 11008 * (k * parts["swiglu_per_i"] - glu))
    assert block_seconds_saved(spec, setup, bw, eager_scale=k) == pytest.approx(compiled * 2048 * 32 * factor / bw)
    # FSDP mixed precision computes on a 16-bit copy: the half-precision eager bytes against 16-bit fused kernels
    fsdp = setup.model_copy(update={"weights_dtype": "fp32", "autocast": "bf16", "strategy": "fsdp", "num_gpus": 8})
    assert block_seconds_saved(spec, fsdp, bw) == pytest.approx(per_token * 2048 * 32 * factor / bw)
    hf = 2048 * 32000 * load("traffic")["families"]["llama"]["regimes"]["half"]["logits_per_token_vocab"]
    liger = 2048 * 32000 * tech["liger_flce_bytes_per_logit"]["value"]
    same_rate = loss_seconds(spec, setup, 2048, 1e14, 1e14, bw)        # no GEMM penalty when the chunk runs as fast
    assert same_rate == pytest.approx(-(hf - liger) * factor / bw)
    assert traffic.head_bytes(spec, setup) == pytest.approx(hf)


def test_optimizer_tensors_counted_by_hand() -> None:
    """A per-tensor optimizer loop dispatches ops per parameter tensor. GPT-2: 12 blocks x (4 Linears + 2
    LayerNorms) x (weight + bias) = 144, plus the 5 edge tensors; Llama-2-7B: 32 x (7 Linears + 2 RMSNorm weights) =
    288 + 5; LoRA on q_proj, v_proj: A and B of 2 Linears in 32 blocks = 128."""
    edge = _const("edge_param_tensors")
    assert terms.trainable_tensors(gpt2(), Setup()) == 12 * 6 * 2 + edge
    assert terms.trainable_tensors(llama7b(), Setup()) == 32 * 9 + edge
    lora = Setup(weights_dtype="bf16", lora=LoraSpec(r=8, target_modules=("q_proj", "v_proj")))
    assert terms.trainable_tensors(llama7b(), lora) == 2 * 2 * 32


def test_per_tensor_optimizer_loop_costs_its_host_ops() -> None:
    """transformers' AdamW (adamw_hf) under a pre-2.0 torch: its per-tensor step as PyTorch PR #45299 measured
    torch.optim.Adam's single-tensor loop, 42.69 ms over ResNet-101's 314 tensors = 136 us a tensor = 17 ops at the
    8 us kernel_launch_s prior, + clip_grad_norm_'s norm and mul_ + zero_grad's zero_ = 20; foreach kernels batch the
    tensors, so today's adamw_torch costs a small fraction of that."""
    spec = llama7b()
    setup = Setup(optimizer="adamw_torch")
    tensors = terms.trainable_tensors(spec, setup)
    measured = 42.69e-3 / 314 / 8e-6                  # PR #45299's per-tensor Adam step in 8 us ops: 16.99
    assert _const("optimizer_host_ops_per_tensor")["per_tensor_loop"] == round(measured) + 2 + 1
    assert terms.optimizer_host_ops(spec, setup, "per_tensor_loop") == tensors * 20
    assert terms.optimizer_impl(setup) == "foreach" and terms.optimizer_impl(Setup(optimizer="adamw_torch_fused")) == "fused"
    assert terms.optimizer_impl(Setup(optimizer="adafactor")) == "adafactor"
    assert terms.optimizer_host_ops(spec, setup) < terms.optimizer_host_ops(spec, setup, "per_tensor_loop") / 10
    assert terms.optimizer_host_ops(spec, Setup(optimizer=None)) == 0


def test_optimizer_step_is_the_longer_of_its_bytes_and_its_host_ops() -> None:
    """A small model of many tensors waits on the host's per-tensor dispatch; the step the model prices is then
    ops x kernel_launch_s, not bytes / bandwidth (GPT-2 124M on a V100: ~1,490 ops at 8 us = ~12 ms, about the
    same as streaming its 9 GB of AdamW traffic; the per-tensor loop is never faster than foreach)."""
    from test_speed import machine

    from perfguide.speed.training import training_speed

    spec = gpt2()
    hw = machine(V100)
    setup = Setup(optimizer="adamw_torch", weights_dtype="fp32", autocast="fp16", micro_batch_size=1, seq_len=128)
    foreach = training_speed(spec, setup, hw)
    loop = training_speed(spec, setup, hw, optimizer_impl="per_tensor_loop")
    host = terms.optimizer_host_ops(spec, setup, "per_tensor_loop") * _const("kernel_launch_s")
    assert loop.step_time_s >= foreach.step_time_s
    assert loop.step_time_s - foreach.step_time_s <= host + 1e-12


def test_fp16_grad_scaler_reads_and_writes_the_fp32_grads_once() -> None:
    spec = llama7b()
    n = 1_000
    assert terms.grad_scaler_bytes(spec, Setup(weights_dtype="fp32", autocast="fp16"), n) == 8 * n
    assert terms.grad_scaler_bytes(spec, Setup(weights_dtype="fp32", autocast="bf16"), n) == 0


def test_bnb_syncs_per_parameter_counted_by_hand() -> None:
    """bitsandbytes synchronizes after every parameter's update (Optimizer8bit.step), and a paged optimizer also
    prefetches each parameter's two states and syncs at the end of every step() call - once per parameter when
    torchtune-style optimizer_in_backward gives each parameter its own optimizer. Llama 3.2 3B: 28 blocks x (7
    Linears + 2 RMSNorms) + the edge tensors; per parameter 2 syncs and 3 + 2 host ops (paged, in backward), 1 sync
    and 3 ops (adamw_bnb_8bit at step end, plus nothing per step); torch's optimizers never sync."""
    from perfguide.model.types import ModelSpec

    spec = ModelSpec.from_any("meta-llama/Llama-3.2-3B")
    tensors = 28 * (7 + 2) + _const("edge_param_tensors")
    sync, launch = _const("cuda_sync_s"), _const("kernel_launch_s")
    per_tensor = _const("optimizer_host_ops_per_tensor")["per_tensor_kernel"]
    assert per_tensor == 3
    in_bwd = Setup(weights_dtype="bf16", optimizer="paged_adamw_8bit", optimizer_in_backward=True)
    assert terms.trainable_tensors(spec, in_bwd) == tensors
    assert terms.optimizer_sync_seconds(spec, in_bwd) == pytest.approx(tensors * (2 * sync + (3 + 2) * launch))
    at_end = Setup(weights_dtype="bf16", optimizer="paged_adamw_8bit")
    assert terms.optimizer_sync_seconds(spec, at_end) == pytest.approx((tensors + 1) * sync + tensors * (3 + 2) * launch)
    plain = Setup(weights_dtype="bf16", optimizer="adamw_bnb_8bit")
    assert terms.optimizer_sync_seconds(spec, plain) == pytest.approx(tensors * (sync + 3 * launch))
    assert terms.optimizer_sync_seconds(spec, Setup(weights_dtype="bf16", optimizer="adamw_torch")) == 0.0
    # ~15 ms a step for the paged, in-backward case: 257 tensors x (2 x 10 us + 5 x 8 us)
    assert 0.010 < terms.optimizer_sync_seconds(spec, in_bwd) < 0.020


def test_bnb_step_adds_its_drained_host_time_to_its_bytes() -> None:
    """With the queue drained per parameter, the bnb step is bytes / bandwidth + the sync term, not the longer of
    the two: the same setup stepped by torch's fused AdamW (no sync) differs by the bytes and the sync term only."""
    from test_speed import machine

    from perfguide.model.types import ModelSpec
    from perfguide.speed.rates import optimizer_bytes
    from perfguide.speed.training import training_speed

    spec = ModelSpec.from_any("meta-llama/Llama-3.2-3B")
    hw = machine(A100)
    base = Setup(weights_dtype="bf16", micro_batch_size=1, seq_len=1024, optimizer_in_backward=True)
    bnb, torch_fused = base.replace(optimizer="paged_adamw_8bit"), base.replace(optimizer="adamw_torch_fused")
    bw = A100.memory_bandwidth_gbps * 1e9 * _const("memory_bandwidth_fraction")
    expected = (optimizer_bytes(spec, bnb) - optimizer_bytes(spec, torch_fused)) / bw + terms.optimizer_sync_seconds(spec, bnb)
    dt = training_speed(spec, bnb, hw).step_time_s - training_speed(spec, torch_fused, hw).step_time_s
    assert dt == pytest.approx(expected, rel=1e-6)


def test_bnb_in_backward_exposes_the_offload_copy_back_counted_by_hand() -> None:
    """torchtune's optimizer_in_bwd steps each parameter from its gradient hook, and autograd runs those hooks before
    it reaches the next layer's node (AccumulateGrad first), so bnb's per-parameter synchronize leaves the queue empty
    when that node's unpack issues activation offloading's copy back: the copy runs on an idle GPU. Hand count for
    Llama 3.2 3B (28 layers, hidden 3072) at 2 x 4096 tokens: each offloaded layer input is 2 x 4096 x 3072 x 2 B,
    28 - 2 layers in flight go to host RAM, back over the A100's 25 GB/s: 26 x 50,331,648 B / 25e9 B/s = 52.3 ms.
    torch's AdamW stepped the same way, or bnb stepped after backward, hides the copy behind the queued backward."""
    from test_speed import machine

    from perfguide.model.types import ModelSpec
    from perfguide.speed.training import training_speed

    spec = ModelSpec.from_any("meta-llama/Llama-3.2-3B")
    assert (spec.total_layers, spec.hidden_size) == (28, 3072)
    hw = machine(A100)
    base = Setup(weights_dtype="bf16", micro_batch_size=2, seq_len=4096, gradient_checkpointing=True, optimizer="paged_adamw_8bit")
    pcie = _const("pcie_gbps_by_cc_major")["8"] * 1e9
    hand = (28 - 2) * (2 * 4096 * 3072 * 2) / pcie
    assert hand == pytest.approx(0.0523, abs=1e-4)

    def offload_cost(setup: Setup) -> float:
        on = training_speed(spec, setup.replace(activation_offloading=True), hw)
        return on.step_time_s - training_speed(spec, setup, hw).step_time_s

    in_bwd = base.replace(optimizer_in_backward=True)
    assert terms.drains_in_backward(in_bwd)
    assert offload_cost(in_bwd) == pytest.approx(hand, rel=1e-6)
    for hidden in (in_bwd.replace(optimizer="adamw_torch"), base):   # no sync in backward / syncs only after it
        assert not terms.drains_in_backward(hidden)
        assert offload_cost(hidden) == pytest.approx(0.0, abs=1e-9)


def test_torchtune_rescales_gradients_instead_of_clipping_counted_by_hand() -> None:
    """torchtune's recipes (since pytorch/torchtune#1917; at the 2024-11 README's commit 1814feb1) rescale every
    gradient after backward (training.scale_grads: p.grad *= 1 / num_tokens, a read and a write of each) and leave
    clip_grad_norm unset, where the optimizer's bytes count the Trainer's one norm read; with optimizer_in_bwd the
    recipe does neither. Llama 3.2 3B full fine-tuning in bf16 (3,212,749,824 parameters, 2 B gradients): +1 pass
    of 6.43 GB after backward, -1 pass in backward, so the two differ by 2 x 2 B x N over the bandwidth; the
    Trainer's loop (hf_trainer) adds nothing."""
    from test_speed import machine

    from perfguide.model.types import ModelSpec
    from perfguide.speed.training import training_speed

    spec = ModelSpec.from_any("meta-llama/Llama-3.2-3B")
    n = 3_212_749_824
    assert rates.trainable_params(spec, Setup(weights_dtype="bf16", optimizer="adamw_torch")) == n
    after = Setup(weights_dtype="bf16", micro_batch_size=2, seq_len=4096, gradient_checkpointing=True, optimizer="adamw_torch")
    in_bwd = after.replace(optimizer_in_backward=True)
    assert terms.recipe_grad_bytes(spec, after, "torchtune") == 2 * n
    assert terms.recipe_grad_bytes(spec, in_bwd, "torchtune") == -2 * n
    assert terms.recipe_grad_bytes(spec, after, "hf_trainer") == terms.recipe_grad_bytes(spec, in_bwd, "hf_trainer") == 0
    hw = machine(A100)
    bw = A100.memory_bandwidth_gbps * 1e9 * _const("memory_bandwidth_fraction")

    def step(setup: Setup, framework: str) -> float:
        return training_speed(spec, setup, hw, framework=framework).step_time_s

    assert step(after, "torchtune") - step(in_bwd, "torchtune") == pytest.approx(2 * 2 * n / bw, rel=1e-6)
    assert step(after, "hf_trainer") == pytest.approx(step(in_bwd, "hf_trainer"), rel=1e-9)
