"""Serving-engine plans (vLLM / SGLang) from recommend(): formats, layouts, the engine budget, the commands.

The engines cannot be installed next to this test environment (vLLM 0.33 pins torch 2.14 + CUDA and
transformers < 5.21; SGLang 0.5.23 pins torch 2.14.1, transformers 5.19 and CUDA kernels), so every emitted
name is checked against the names the pinned versions' own parser sources register (tests/data/engine_flags.json,
extracted by scripts/engine_flags.py from the wheels).
"""

from __future__ import annotations

import json
import math
import shlex
from pathlib import Path

import pytest
from helpers import one_line

import perfguide
from perfguide import PerfGuideError, Recommendation
from perfguide._serving_data import serving_facts
from perfguide.memory.overhead import cuda_context_bytes
from perfguide.speed.serving import weight_bytes_read

FLAGS = json.loads((Path(__file__).parent / "data" / "engine_flags.json").read_text())
GiB = 1024**3


def rec(model: str, scenario: str, hardware: str, **kw: object) -> Recommendation:
    return perfguide.recommend(model, scenario=scenario, hardware=hardware, **kw)


def check_vllm_names(r: Recommendation) -> None:
    kw = r.engine_args()
    vllm = FLAGS["vllm"]
    assert set(kw) <= set(vllm["engine_args"]), set(kw) - set(vllm["engine_args"])
    assert kw["quantization"] is None or kw["quantization"] in vllm["quantization"]
    assert kw["kv_cache_dtype"] in vllm["kv_cache_dtype"]
    words = shlex.split(r.serve_command())
    assert words[:3] == ["vllm", "serve", r.model.name]
    flags = [w for w in words if w.startswith("--")]
    assert flags and set(flags) <= set(vllm["flags"]), set(flags) - set(vllm["flags"])


def check_sglang_names(r: Recommendation) -> None:
    words = shlex.split(r.serve_command())
    assert words[:3] == ["python", "-m", "sglang.launch_server"]
    sg = FLAGS["sglang"]
    flags = [w for w in words if w.startswith("--")]
    assert set(flags) <= set(sg["flags"]), set(flags) - set(sg["flags"])
    value = dict(zip(words[3::2], words[4::2]))
    if "--quantization" in value:
        assert value["--quantization"] in sg["quantization"]
    assert value["--kv-cache-dtype"] in sg["kv_cache_dtype"]


def test_70b_on_one_h100_is_quantized_and_fits() -> None:
    r = rec("meta-llama/Llama-3.1-70B", "infer_gpu_one", "h100-80gb", engine="vllm")
    assert r.fits and r.setup.serving is not None
    assert r.setup.serving.weight_format in ("fp8", "awq", "gptq")          # 16-bit (141 GB) cannot fit 80 GB
    bf16 = [c for c in r.candidates if c.setup.serving and c.setup.serving.weight_format == "bf16"]
    assert bf16 and all(c.verdict == "does-not-fit" for c in bf16)
    assert r.max_concurrency is not None and r.max_concurrency >= 1
    assert r.throughput.tokens_per_s > 20                                      # tens of tokens/s, not bnb's ~2.6
    d = r.decision("quantization")
    assert d is not None and "quality cost" in d.reason and d.alternatives
    check_vllm_names(r)


def test_70b_on_8_h100_layout_is_the_fastest_priced_one() -> None:
    r = rec("meta-llama/Llama-3.1-70B", "infer_gpu_many", "h100-80gb:8", engine="vllm")
    s = r.setup.serving
    assert s is not None and s.tensor_parallel_size * s.data_parallel_size == 8
    fitting = [c for c in r.candidates if c.verdict in ("fits", "chosen") and c.setup.serving.weight_format == s.weight_format]
    layouts = {(c.setup.serving.tensor_parallel_size, c.setup.serving.data_parallel_size) for c in fitting}
    assert len(layouts) >= 3                                                   # TP2x4, TP4x2, TP8x1 (and TP1x8 if it fits)
    assert r.throughput.tokens_per_s == pytest.approx(max(c.throughput.tokens_per_s for c in fitting))
    assert r.decision("tensor_parallel_size").alternatives
    check_vllm_names(r)
    lat = rec("meta-llama/Llama-3.1-70B", "infer_gpu_many", "h100-80gb:8", engine="vllm", prefer="latency", quantization="fp8")
    assert lat.setup.serving.tensor_parallel_size == 8                          # latency: every GPU on one token
    assert lat.throughput.time_per_output_token_ms < r.throughput.time_per_output_token_ms


def test_8b_on_a100_kv_cache_tokens_by_hand() -> None:
    """vLLM's rule: ceil(total x util) - weights - non-torch - activation peak - graphs, in 16-token blocks."""
    r = rec("meta-llama/Llama-3.1-8B", "infer_gpu_one", "a100-80gb", engine="vllm", quantization="fp8",
            prompt_len=2048, max_new_tokens=2048, batch_size=64)
    s = r.setup.serving
    assert s.max_model_len == 4096 and s.max_num_seqs == 64
    # vllm serve's own prefill chunk on an A100 (arg_utils get_batch_defaults: 2048 below 70 GiB or on any A100)
    assert s.max_num_batched_tokens == 2048
    vllm = serving_facts().engines["vllm"]
    total = round(79.14 * 2**30)   # CUDA's total, as vLLM reads it (torch prints 79.14 GiB on an A100 80GB)
    util = 0.9                                                                  # 1 - the default 10% headroom
    assert s.gpu_memory_utilization == util
    linear = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336)      # q,o + k,v + gate,up,down per layer
    weights = linear * 1 + (8_030_261_248 - linear) * 2                        # fp8 Linears, 16-bit embeddings/norms/head
    weights += 131072 * 128 * 2                     # the rotary cos/sin buffer, 131072 positions x 128 dims, bf16
    activation = max(2048 * 3 * 14336 * 2 + 2 * 2048 * 4096 * 2,               # forward: MLP + residuals
                     64 * 128256 * 38 + 2048 * 4096 * 2)                       # or the sorting sampler, whichever is larger
    graphs = (3 + len(range(8, 129, 8))) * vllm.cuda_graph_bytes_per_size    # captured sizes up to 2 x 64
    kv = math.ceil(total * util) - weights - vllm.non_torch_bytes - activation - graphs
    blocks = kv // (16 * 32 * 2 * 8 * 128 * 2)
    assert r.kv_cache_tokens == blocks * 16
    assert r.max_concurrency == pytest.approx(blocks / (4096 / 16))
    check_vllm_names(r)


def test_mixtral_batch_1_reads_only_routed_experts() -> None:
    r = rec("mistralai/Mixtral-8x7B-v0.1", "infer_gpu_many", "h100-80gb:2", engine="vllm", prefer="latency", batch_size=1,
            quantization="fp8")
    spec, s = r.model, r.setup.serving
    expert = sum(i * o for k, (i, o) in spec.block_linears.items() if k.startswith("experts.")) * spec.num_layers
    everything = spec.total_params                                              # fp8 Linears: ~1 byte each
    read = weight_bytes_read(spec, s, 1) * s.tensor_parallel_size
    routed = everything - expert * spec.num_experts * (1 - 2 / 8)              # 2 of 8 experts per token
    assert read == pytest.approx(routed, rel=0.15)
    assert read < 0.45 * weight_bytes_read(spec, s, 256) * s.tensor_parallel_size
    facts = serving_facts()
    bw = 3350e9 * facts.decode_bandwidth_efficiency.value * facts.formats["fp8"].decode_efficiency
    # never faster than H100's 3.35 TB/s reading the routed bytes once; at most those reads plus the engine's fixed
    # per-step host cost and the fused-MoE kernels' per-layer latency (32 MoE layers) and 1 ms of slack
    fixed = facts.engines["vllm"].step_overhead_s + 32 * facts.moe_layer_decode_latency_s.value
    assert r.throughput.time_per_output_token_ms >= read / s.tensor_parallel_size / 3350e9 * 1000
    assert r.throughput.time_per_output_token_ms < (1.6 * read / s.tensor_parallel_size / bw + fixed) * 1000 + 1


def test_sglang_commands_use_its_own_names_and_budget() -> None:
    r = rec("meta-llama/Llama-3.1-70B", "infer_gpu_many", "h100-80gb:8", engine="sglang")
    check_sglang_names(r)
    words = shlex.split(r.serve_command())
    value = dict(zip(words[3::2], words[4::2]))
    assert int(value["--tp-size"]) * int(value["--dp-size"]) == 8
    frac = float(value["--mem-fraction-static"])
    s = r.setup.serving
    pool = int((round(79.11 * 2**30) - cuda_context_bytes(r.hardware)) * frac) - r.engine_memory.weights
    assert r.kv_cache_tokens == pool // r.engine_memory.kv_bytes_per_token
    one = rec("meta-llama/Llama-3.1-8B", "infer_gpu_one", "a100-80gb", engine="sglang", quantization="nf4")
    check_sglang_names(one)
    assert "--quantization bitsandbytes" in one.serve_command() and s.max_model_len == 1280


def test_named_constraints_are_used_or_refused_in_one_line() -> None:
    awq = "hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4"
    r = rec("meta-llama/Llama-3.1-8B", "infer_gpu_many", "h100-80gb:4", engine="vllm", strategy="single", quantization="awq",
            quantized_model=awq)
    assert r.setup.serving.tensor_parallel_size == 1 and r.setup.serving.data_parallel_size == 4
    assert r.setup.serving.weight_format == "awq" and any(awq in w for w in r.warnings)
    assert r.serve_command().startswith(f"vllm serve {awq} ") and "--quantization" not in r.serve_command()   # read from its config
    with pytest.raises(PerfGuideError) as e:                                    # no AWQ checkpoint given: no AWQ plan
        rec("meta-llama/Llama-3.1-8B", "infer_gpu_one", "h100-80gb", engine="vllm", quantization="awq")
    one_line(e, "quantized_model=")
    for kw, word in ((dict(engine="vllm", quantization="nf4"), "sglang"), (dict(engine="vllm", quantization="int8"), "int8"),
                     (dict(quantization="awq"), "engine='vllm'"), (dict(engine="vllm", strategy="device_map"), "device_map")):
        with pytest.raises(PerfGuideError) as e:
            rec("meta-llama/Llama-3.1-8B", "infer_gpu_many", "h100-80gb:4", **kw)
        one_line(e, word)
    with pytest.raises(PerfGuideError) as e:
        rec("meta-llama/Llama-3.1-8B", "infer_cpu", "cpu", engine="vllm")
    one_line(e, "infer_gpu_one")
    big = rec("meta-llama/Llama-3.1-70B", "infer_gpu_one", "a100-40gb", engine="vllm", quantization="fp8")
    assert not big.fits and big.suggestions                                     # named, does not fit: not replaced


def test_engine_plan_survives_json_round_trip() -> None:
    r = rec("meta-llama/Llama-3.1-70B", "infer_gpu_many", "h100-80gb:8", engine="vllm")
    back = Recommendation.model_validate_json(r.to_json())
    assert back.engine_args() == r.engine_args() and back.kv_cache_tokens == r.kv_cache_tokens
    with pytest.raises(PerfGuideError) as e:
        rec("meta-llama/Llama-3.1-8B", "infer_gpu_one", "a100-80gb").engine_args()
    one_line(e, "engine='vllm'")


def test_transformers_plan_names_the_vllm_alternative_with_its_speed() -> None:
    """The default stays transformers (and unchanged); its report says what vLLM would serve at what speed."""
    r = rec("meta-llama/Llama-3.1-8B", "infer_gpu_one", "a100-80gb")
    assert r.setup.serving is None and r.setup.weights_dtype == "bf16"
    d = r.decision("engine")
    assert d is not None and d.value == "transformers"
    vllm = rec("meta-llama/Llama-3.1-8B", "infer_gpu_one", "a100-80gb", engine="vllm")
    assert d.alternatives[0].number == pytest.approx(vllm.throughput.tokens_per_s)
    assert d.alternatives[0].number > r.throughput.tokens_per_s                 # continuous batching over a paged cache


def test_report_launches_with_the_engine_command() -> None:
    r = rec("meta-llama/Llama-3.1-70B", "infer_gpu_many", "h100-80gb:8", engine="vllm")
    text = r.report()
    assert r.serve_command() in text and "torchrun" not in text
    assert f"{r.kv_cache_tokens:,} tokens" in text                              # the memory decision's account


def test_cli_prints_the_serve_command(capsys) -> None:
    from perfguide.cli import main

    code = main(["recommend", "meta-llama/Llama-3.1-8B", "--scenario", "infer_gpu_many", "--hardware", "h100-80gb:4",
                 "--engine", "sglang", "--quantization", "fp8", "--serve-command"])
    out = capsys.readouterr().out.strip()
    assert code == 0 and out.startswith("python -m sglang.launch_server --model-path meta-llama/Llama-3.1-8B")
    assert "--quantization fp8" in out
    code = main(["recommend", "meta-llama/Llama-3.1-8B", "--scenario", "infer_gpu_one", "--hardware", "a100-80gb", "--serve-command"])
    assert code == 2 and "engine='vllm'" in capsys.readouterr().err
