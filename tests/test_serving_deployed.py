"""Serving as it is deployed (issue 22): MoE experts in every per-format and per-rank count, the checkpoint's
own quantization_config, the checkpoint served as given, commands that start, engine knobs as constraints,
estimate() reporting the KV-cache tokens the engine logs."""

from __future__ import annotations

import math
import shlex

import pytest
from helpers import one_line

import perfguide
from perfguide import PerfGuideError, engines
from perfguide._serving_data import serving_facts
from perfguide.memory.serving import format_weight_parts, rank_weight_bytes
from perfguide.model.quantized import checkpoint_format
from perfguide.model.types import ModelSpec
from perfguide.setup import ServingSetup
from perfguide.speed.serving import weight_bytes_read

GiB = 1024**3

# a toy MoE: 2 layers, hidden 64, 8 experts of intermediate 32 (fused gate_up + down, as transformers 5 stores
# them: parameters, not Linears), attention 64x64 q/o and 64x16 k/v, vocab 100, untied head
H, I, E, L, V = 64, 32, 8, 2, 100
ATTN = 2 * H * H + 2 * H * 16
EXPERT = 3 * H * I                       # gate, up, down of one expert
ROUTER = H * E
NORMS = L * 2 * H + H
TOTAL = L * (ATTN + ROUTER + E * EXPERT) + 2 * V * H + NORMS
TOY_MOE = ModelSpec(name="toy-moe", model_type="qwen3_moe", hidden_size=H, num_layers=L, num_attention_heads=4, num_key_value_heads=1,
                    head_dim=16, intermediate_size=I, vocab_size=V, total_params=TOTAL, embedding_params=V * H, lm_head_params=V * H,
                    num_experts=E, num_experts_per_tok=2, expert_params=L * E * EXPERT,
                    block_linears={"q_proj": (H, H), "k_proj": (H, 16), "v_proj": (H, 16), "o_proj": (H, H), "mlp.gate": (H, E)})


def test_toy_moe_expert_bytes_per_rank_by_hand() -> None:
    experts, dense_params = L * E * EXPERT, L * (ATTN + ROUTER) + 2 * V * H
    bf16 = format_weight_parts(TOY_MOE, "bf16")
    assert (bf16.experts, bf16.dense, bf16.norms) == (experts * 2, dense_params * 2, NORMS * 2)
    fp8 = format_weight_parts(TOY_MOE, "fp8")              # experts and block Linears 1 byte; embeddings and head 2
    assert fp8.experts == experts and fp8.dense == L * (ATTN + ROUTER) + 2 * V * H * 2
    # TP2: every tensor halved, norms replicated; TP2 x DP2 with expert parallelism: experts over all 4 GPUs
    tp2 = ServingSetup(engine="vllm", weight_format="fp8", tensor_parallel_size=2)
    assert rank_weight_bytes(TOY_MOE, tp2) == fp8.dense // 2 + experts // 2 + NORMS * 2
    ep = tp2.model_copy(update={"data_parallel_size": 2, "enable_expert_parallel": True})
    assert rank_weight_bytes(TOY_MOE, ep) == fp8.dense // 2 + experts // 4 + NORMS * 2
    # batch 1 decode reads 2 of 8 experts: 1 - (1 - 2/8)^1 of the expert bytes
    assert weight_bytes_read(TOY_MOE, tp2, 1) == int(fp8.dense // 2 + experts * 0.25 / 2 + NORMS * 2)


@pytest.mark.parametrize(("config", "fmt"), [
    ({"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}, "nf4"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False}, "gptq"),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm", "zero_point": True}, "awq"),
    ({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}, "fp8_block"),
    ({"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]}, "mxfp4"),
    ({"quant_method": "compressed-tensors", "format": "float-quantized",
      "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}}}, "fp8"),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized",
      "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "group_size": 128}}}}, "w4a16"),
])
def test_quantization_config_read(config: dict, fmt: str) -> None:
    """Field names as the hub checkpoints write them (e.g. neuralmagic / RedHatAI compressed-tensors, TheBloke AWQ)."""
    assert checkpoint_format({"model_type": "llama", "quantization_config": config}) == fmt
    assert checkpoint_format({"model_type": "llama"}) is None
    with pytest.raises(PerfGuideError) as e:
        checkpoint_format({"quantization_config": {"quant_method": "hqq"}})
    one_line(e, "hqq")


def _vllm(model: str, hardware: str, scenario: str = "infer_gpu_many", **kw: object) -> perfguide.Recommendation:
    return perfguide.recommend(model, scenario=scenario, hardware=hardware, engine="vllm", **kw)


def test_the_three_moe_deployments_fit() -> None:
    """The issue's cases: public vLLM logs show these serving hundreds of thousands of KV tokens."""
    qwen = _vllm("Qwen/Qwen3-235B-A22B", "h100-80gb:4")
    assert qwen.fits and qwen.engine_memory.weights < 70 * GiB and qwen.kv_cache_tokens > 100_000
    small = _vllm("Qwen/Qwen3-30B-A3B", "l40s:4")
    assert small.fits and small.setup.serving.weight_format == "bf16"          # as given: 61 GB over four 48 GB cards
    oss = _vllm("openai/gpt-oss-120b", "h100-80gb", "infer_gpu_one")
    s = oss.setup.serving
    assert oss.fits and s.weight_format == "mxfp4" and s.checkpoint_format == "mxfp4"
    assert 60 * GiB < oss.engine_memory.weights < 70 * GiB                     # 114.7B experts x 4.25 bits + 2.1B 16-bit
    assert "--quantization" not in oss.serve_command()                         # the engine reads its config


def test_the_checkpoint_as_given_by_default_and_none_and_auto() -> None:
    r = _vllm("meta-llama/Llama-3.1-8B", "a100-80gb", "infer_gpu_one")
    assert r.setup.serving.weight_format == "bf16" and "--quantization" not in r.serve_command()
    assert "as given" in r.decision("quantization").reason
    none = _vllm("meta-llama/Llama-3.1-70B", "h100-80gb", "infer_gpu_one", quantization="none")
    assert not none.fits and {c.setup.serving.weight_format for c in none.candidates} == {"bf16"}
    fallback = _vllm("meta-llama/Llama-3.1-70B", "h100-80gb", "infer_gpu_one")
    assert fallback.setup.serving.weight_format == "fp8" and "does not fit" in fallback.decision("quantization").reason
    words = shlex.split(fallback.serve_command())
    assert words[words.index("--quantization") + 1] == "fp8"                   # fp8 applied at load to the bf16 repo
    auto = _vllm("meta-llama/Llama-3.1-8B", "a100-80gb", "infer_gpu_one", quantization="auto")
    assert {c.setup.serving.weight_format for c in auto.candidates} >= {"bf16", "fp8"}


def test_the_model_id_goes_into_the_command_as_given() -> None:
    for model in ("mistralai/Mistral-7B-Instruct-v0.3", "Qwen/Qwen2.5-7B-Instruct"):
        for engine in ("vllm", "sglang"):
            r = perfguide.recommend(model, scenario="infer_gpu_one", hardware="a100-80gb", engine=engine)
            assert model in shlex.split(r.serve_command())


def test_7b_on_a_t4_names_the_4bit_checkpoint_and_serves_it_when_given() -> None:
    r = _vllm("mistralai/Mistral-7B-Instruct-v0.3", "t4", "infer_gpu_one")
    assert not r.fits and "quantized_model=" in r.suggestions[0] and "awq" in r.suggestions[0]
    repo = "TheBloke/Mistral-7B-Instruct-v0.2-AWQ"
    given = _vllm("mistralai/Mistral-7B-Instruct-v0.3", "t4", "infer_gpu_one", quantized_model=repo, quantization="awq")
    assert given.fits and given.setup.serving.weight_format == "awq"
    assert shlex.split(given.serve_command())[:3] == ["vllm", "serve", repo] and "--quantization" not in given.serve_command()
    assert "--dtype float16" in given.serve_command()                          # a T4 has no bf16


def test_engine_knobs_are_honoured_or_refused_in_one_line() -> None:
    r = _vllm("meta-llama/Llama-3.1-8B", "h100-80gb:4", gpu_memory_utilization=0.8, max_model_len=8192, max_num_seqs=32,
              kv_cache_dtype="fp8", tensor_parallel_size=2)
    s = r.setup.serving
    assert (s.gpu_memory_utilization, s.max_model_len, s.max_num_seqs, s.kv_cache_dtype) == (0.8, 8192, 32, "fp8")
    assert (s.tensor_parallel_size, s.data_parallel_size) == (2, 2)
    value = dict(zip(shlex.split(r.serve_command())[3::2], shlex.split(r.serve_command())[4::2]))
    assert value["--gpu-memory-utilization"] == "0.8" and value["--max-model-len"] == "8192"
    for kw, word in ((dict(tensor_parallel_size=3), "tensor_parallel_size=3"), (dict(max_model_len=10**6), "max_position_embeddings"),
                     (dict(enable_expert_parallel=True), "dense")):
        with pytest.raises(PerfGuideError) as e:
            _vllm("meta-llama/Llama-3.1-8B", "h100-80gb:4", **kw)
        one_line(e, word)
    with pytest.raises(PerfGuideError) as e:
        perfguide.recommend("meta-llama/Llama-3.1-8B", scenario="infer_gpu_one", hardware="a100-80gb", gpu_memory_utilization=0.8)
    one_line(e, "engine='vllm' or 'sglang'")


def test_estimate_of_a_serving_setup_reports_what_vllm_logs() -> None:
    """The rule by hand, as in test_serving_memory: ceil(total x util) - weights - non-torch - activations - graphs."""
    setup = {"task": "infer", "serving": {"engine": "vllm", "max_model_len": 8192, "gpu_memory_utilization": 0.9}}
    est = perfguide.estimate("meta-llama/Llama-3.1-8B", setup, hardware="a100-80gb")
    mem = engines.server("vllm").memory(ModelSpec.from_any("meta-llama/Llama-3.1-8B"),
                                        ServingSetup(engine="vllm", max_model_len=8192, gpu_memory_utilization=0.9),
                                        perfguide.Hardware.from_name("a100-80gb"))
    assert est.kv_cache_tokens == mem.kv_cache_tokens and 400_000 < est.kv_cache_tokens < 460_000
    assert est.max_concurrency == pytest.approx(mem.num_blocks / math.ceil(8192 / 16))
    with pytest.raises(PerfGuideError) as e:
        perfguide.estimate("meta-llama/Llama-3.1-8B", {"task": "infer", "serving": {"engine": "vlm"}}, hardware="a100-80gb")
    one_line(e, "vllm")


def test_decode_is_never_faster_than_the_bytes_it_must_read() -> None:
    """Mixtral batch 1 on 2x H100: each rank reads its half of the dense weights and of the 2 routed experts."""
    r = _vllm("mistralai/Mixtral-8x7B-v0.1", "h100-80gb:2", prefer="latency", batch_size=1)
    s = r.setup.serving
    floor_ms = weight_bytes_read(r.model, s, 1) / (3352e9) * 1000                 # the HBM peak, no efficiency
    assert r.throughput.time_per_output_token_ms > floor_ms > 3.0
    assert serving_facts().decode_bandwidth_efficiency.value < 1


def test_vllm_hybrid_allocator_counts_sliding_layers_as_vllm_does() -> None:
    """gpt-oss-120b: 18 full + 18 sliding-window (128) layers fall in groups of 18; one pool block is a 16-token page
    of 18 layers; a request takes cdiv(max_model_len, 16) blocks for the full group and cdiv(min(127 + 8192,
    max_model_len), 16) + 1 for the sliding one (vllm/v1/core/kv_cache_utils.py, SlidingWindowSpec)."""
    r = _vllm("openai/gpt-oss-120b", "h100-80gb", "infer_gpu_one", max_model_len=32768)
    m = r.engine_memory
    page = 16 * 2 * 8 * 64 * 2                                                   # K and V, 8 KV heads x 64, bf16
    blocks = m.kv_cache_bytes // (page * 18)
    per_request = 32768 // 16 + -(-(127 + 8192) // 16) + 1
    assert m.num_blocks == blocks and r.kv_cache_tokens == int(blocks / per_request * 32768)
    assert r.max_concurrency == pytest.approx(blocks / per_request)
