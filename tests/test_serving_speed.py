"""The serving speed rule against hand-derived bytes: a decode step is never faster than the HBM needs to read what
the step must read (the dense weights of the rank, and only the routed experts some token picked)."""

from __future__ import annotations

import pytest

from perfguide import Hardware
from perfguide._serving_data import serving_facts
from perfguide.model.types import ModelSpec
from perfguide.setup import ServingSetup
from perfguide.speed.serving import decode_step_s, moe_latency_s

H100_BW = 3.35e12          # NVIDIA H100 SXM datasheet: 3.35 TB/s HBM3


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _reads_s(model: str, serving: ServingSetup, hardware: str, batch: int) -> float:
    """The step without its fixed costs (host work 0, the MoE kernels' per-layer latency and the TP all-reduces taken
    off): the weight and KV reads."""
    spec, hw = ModelSpec.from_any(model), Hardware.from_name(hardware)
    step, _, _, comm = decode_step_s(spec, serving, hw, batch, 1, 0.0)
    return step - moe_latency_s(spec, serving, hw.smallest_gpu) - comm


# Mixtral-8x7B config.json: 32 layers, hidden 4096, 8 experts of gate/up/down 4096x14336, top-2; q/o 4096x4096, k/v 4096x1024;
# vocab 32000 (untied embed + lm_head); router 4096x8 per layer
MIX_ATTN = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024)
MIX_EXPERT = 3 * 4096 * 14336
MIX_OTHER = 2 * 32000 * 4096 + 32 * 4096 * 8


@pytest.mark.parametrize(("batch", "share"), [(1, 2 / 8), (8, 1 - (6 / 8) ** 8)])
def test_mixtral_decode_is_never_faster_than_its_routed_bytes(batch: int, share: float) -> None:
    # batch 1 reads 2 of 8 experts a layer; 8 tokens leave an expert cold with probability (6/8)^8
    s = ServingSetup(engine="vllm", weight_format="bf16", tensor_parallel_size=2, max_model_len=4096)
    per_rank = (MIX_ATTN + MIX_OTHER + share * 32 * 8 * MIX_EXPERT) * 2 / 2
    floor = per_rank / H100_BW
    reads = _reads_s("mistralai/Mixtral-8x7B-v0.1", s, "h100-80gb:2", batch)
    assert reads >= floor
    # and not far above it: the decode efficiency (0.91) on every byte, the fused-MoE grouped GEMMs' read efficiency
    # (0.57) on the routed experts' bytes, and one token of KV cache are the only other terms
    facts = serving_facts()
    routed = share * 32 * 8 * MIX_EXPERT * 2 / 2
    ceiling = (per_rank + routed * (1 / facts.moe_expert_read_efficiency.value - 1)) / H100_BW
    assert reads <= ceiling / facts.decode_bandwidth_efficiency.value * 1.02


def test_gpt_oss_routed_mxfp4_bytes_floor() -> None:
    # gpt-oss-120b config.json: 36 layers, hidden 2880, 128 experts (gate_up 2880x5760, down 2880x2880) top-4 in MXFP4
    # (4.25 bits a weight: OCP MX spec, one 8-bit scale per 32); attention q 2880x4096, k/v 2880x512, o 4096x2880 and
    # embed + lm_head 2 x 201088 x 2880 in bf16
    experts = 4 * 36 * 3 * 2880 * 2880 * 4.25 / 8
    dense = (36 * (2 * 2880 * 4096 + 2 * 2880 * 512) + 2 * 201088 * 2880) * 2
    s = ServingSetup(engine="vllm", weight_format="mxfp4", checkpoint_format="mxfp4", max_model_len=4096)
    assert _reads_s("openai/gpt-oss-120b", s, "h100-80gb", 1) >= (experts + dense) / H100_BW


def test_the_moe_kernels_fixed_cost_is_paid_where_the_experts_are_dequantized_in_software() -> None:
    # DeepSeek-V3 config.json: 61 layers, first_k_dense_replace 3 -> 58 MoE layers; two pipeline stages hold 29 each.
    # MXFP4 runs natively from cc 9.0 (vLLM's Triton / FlashInfer MoE); an A100 (cc 8.0) dequantizes it through Marlin
    # and an MI300X has no FP4 datapath, so those pay the per-layer latency; bf16 experts never do
    spec = ModelSpec.from_any("deepseek-ai/DeepSeek-V3")
    latency = serving_facts().moe_layer_decode_latency_s.value
    a100, h100, mi300x = (Hardware.from_name(n).smallest_gpu for n in ("a100-80gb", "h100-80gb", "mi300x"))
    mx = ServingSetup(engine="vllm", weight_format="mxfp4", checkpoint_format="mxfp4")
    assert moe_latency_s(spec, mx, a100) == pytest.approx(58 * latency)
    assert moe_latency_s(spec, mx.model_copy(update={"pipeline_parallel_size": 2}), a100) == pytest.approx(29 * latency)
    assert moe_latency_s(spec, mx, mi300x) == pytest.approx(58 * latency)
    assert moe_latency_s(spec, mx, h100) == 0.0
    assert moe_latency_s(spec, ServingSetup(engine="vllm"), a100) == 0.0
    assert moe_latency_s(ModelSpec.from_any("meta-llama/Llama-3.1-8B"), mx, a100) == 0.0


def test_routed_experts_are_read_at_the_fused_moe_rate_by_hand() -> None:
    # gpt-oss-120b at batch 1 on one H100 (MXFP4 native): the 4 routed experts of 128 (gate_up 2880x5760, down 2880x2880,
    # priced at 0.5 byte a weight + a 2.5-byte scale/zero allowance per group of 32) at 0.91 x 0.85 x 0.57 of 3.35 TB/s,
    # attention, embed and lm_head (bf16) at 0.91 x 0.85
    facts = serving_facts()
    experts = 4 * 36 * 3 * 2880 * 2880 * (0.5 + 2.5 / 32)
    dense = (36 * (2 * 2880 * 4096 + 2 * 2880 * 512) + 2 * 201088 * 2880) * 2
    rate = H100_BW * facts.decode_bandwidth_efficiency.value * facts.formats["mxfp4"].decode_efficiency
    s = ServingSetup(engine="vllm", weight_format="mxfp4", checkpoint_format="mxfp4", max_model_len=4096)
    by_hand = dense / rate + experts / (rate * facts.moe_expert_read_efficiency.value)
    assert _reads_s("openai/gpt-oss-120b", s, "h100-80gb", 1) == pytest.approx(by_hand, rel=0.02)


def test_pipeline_stages_do_not_speed_one_sequence_and_fill_with_micro_batches() -> None:
    from perfguide import engines

    spec, hw, vllm = ModelSpec.from_any("meta-llama/Llama-3.1-8B"), Hardware.from_name("h100-80gb:2"), engines.server("vllm")
    one = ServingSetup(engine="vllm", max_model_len=4096)
    two = one.model_copy(update={"pipeline_parallel_size": 2})
    t1, t2 = (vllm.speed(spec, s, hw, 1024, 256, 1).time_per_output_token_ms for s in (one, two))
    # a token still passes all 32 layers in turn: the 16.06 GB of Llama-3.1-8B's bf16 weights at 3.35 TB/s, whatever PP does
    assert t2 >= 8_030_261_248 * 2 / H100_BW * 1000
    assert t2 == pytest.approx(t1, rel=0.05)
    # two sequences make two micro-batches, one in each stage: twice the tokens per step, no bubble
    b1, b2 = (vllm.speed(spec, two, hw, 1024, 256, b).output_tokens_per_s for b in (1, 2))
    assert b2 == pytest.approx(2 * b1, rel=0.05)


def test_a_model_no_node_holds_is_served_with_pipeline_stages_across_nodes() -> None:
    import json
    from pathlib import Path

    import perfguide

    flags = json.loads((Path(__file__).parent / "data" / "engine_flags.json").read_text())
    model = "meta-llama/Llama-3.1-405B"
    assert not perfguide.recommend(model, scenario="infer_gpu_many", hardware="h100-80gb:8", engine="vllm", quantization="none").fits
    r = perfguide.recommend(model, scenario="infer_gpu_many", hardware="h100-80gb:8x2", engine="vllm", quantization="none")
    s = r.setup.serving
    assert r.fits and s is not None and (s.tensor_parallel_size, s.pipeline_parallel_size) == (8, 2)
    # 405.85 B bf16 parameters over 8 x 2 GPUs (norms replicated, a rounding error): ~47 GiB a GPU
    assert r.memory.weights == pytest.approx(405_853_388_800 * 2 / 16, rel=0.01)
    assert (r.setup.num_gpus, r.setup.nodes) == (8, 2)
    assert perfguide.estimate(model, r.setup, hardware="h100-80gb:8x2").kv_cache_tokens == r.engine_memory.kv_cache_tokens  # type: ignore[union-attr]
    hint = next(w for w in r.warnings if "spans 2 nodes" in w)
    assert all(f in hint and f in flags["vllm"]["flags"] for f in ("--nnodes", "--node-rank", "--master-addr"))
    sg = perfguide.recommend(model, scenario="infer_gpu_many", hardware="h100-80gb:8x2", engine="sglang", quantization="none")
    assert sg.fits and "--pp-size 2" in sg.serve_command() and set(flags_of(sg.serve_command())) <= set(flags["sglang"]["flags"])
    hint = next(w for w in sg.warnings if "spans 2 nodes" in w)
    assert all(f in hint and f in flags["sglang"]["flags"] for f in ("--nnodes", "--node-rank", "--dist-init-addr"))


def flags_of(command: str) -> list[str]:
    return [w for w in command.split() if w.startswith("--")]
