"""Inference rules: each decision, its number, and the cases where nothing fits."""

from __future__ import annotations

from perfguide.hardware.types import CPU, GPU, Hardware
from perfguide.scenarios import planner
from perfguide.scenarios.types import Constraints, Request
from tests.test_inference_memory import LLAMA2_7B, LLAMA2_70B, LLAMA31_8B, a100


def t4() -> Hardware:
    gpu = GPU(name="Tesla T4", memory_total=15 * 2**30, memory_free=15 * 2**30, compute_capability=(7, 5), fp16_tflops=65,
              fp32_tflops=8.1, memory_bandwidth_gbps=320)
    return Hardware(gpus=(gpu,), cpu=CPU(physical_cores=4, logical_cores=8, ram_total=2**35, ram_available=2**35))


def cpu(flags: tuple[str, ...] = (), ram_gib: int = 64) -> Hardware:
    return Hardware(cpu=CPU(physical_cores=16, logical_cores=32, ram_total=ram_gib * 2**30, ram_available=ram_gib * 2**30, flags=flags))


def dec(plan, setting: str):
    return next((d for d in plan.decisions if d.setting == setting), None)


def run(scenario: str, spec, hw: Hardware, **cons):
    c = Constraints(prompt_len=512, max_new_tokens=256, **cons)
    return planner(scenario)(Request(scenario=scenario, model=spec, hardware=hw, seq_len=512, global_batch_size=1, constraints=c))


def test_a100_bf16_no_quantization_sdpa() -> None:
    p = run("infer_gpu_one", LLAMA2_7B, a100(), batch_size=1)
    assert p.fits and p.setup.weights_dtype == "bf16" and p.setup.attn_implementation == "sdpa"
    assert dec(p, "quantization_config").value is None
    assert dec(p, "dtype").number == 312  # A100 datasheet: 312 dense bf16 TFLOP/s, the peak bf16 buys
    # max batch: (usable - weights - context) / KV per sequence, the KV number is the hand formula
    kv = dec(p, "max_batch_size")
    assert kv.number == 2 * 32 * 32 * 128 * (512 + 256 - 1) * 2
    assert 20 < kv.value < 40 * 2**30 // kv.number


def test_t4_fp16_with_bf16_warning_and_quantization_when_needed() -> None:
    p = run("infer_gpu_one", LLAMA31_8B, t4(), batch_size=1)
    assert dec(p, "dtype").value == "fp16"
    assert any("trained in bf16" in w for w in p.warnings)
    # 8.03B x 2 B = 16.06 GB (14.96 GiB) of fp16 weights alone exceed the T4's 14.56 GiB CUDA total: quantize, and
    # say what it costs; of the formats that fit, the faster by the plan's own speed model (nf4 dequantizes faster
    # than LLM.int8 matmuls). (Llama-2-7B's 12.55 GiB of fp16 weights plus a lazy-loading CUDA context of ~0.13 GiB
    # fit on it: the plan keeps fp16 there.)
    q = dec(p, "quantization_config")
    assert p.setup.weights_dtype == "nf4" and q.number > 1
    assert q.alternatives[0].value == "fp16"
    slower = [a for a in q.alternatives if a.value == "int8"]
    assert slower and slower[0].number < p.throughput.tokens_per_s


def test_forced_nf4_and_no_flash_attn_without_package() -> None:
    p = run("infer_gpu_one", LLAMA31_8B, a100(), quantization="nf4")
    assert p.setup.weights_dtype == "nf4"
    attn = dec(p, "attn_implementation")
    assert attn.value == "sdpa" and any(a.value == "flash_attention_2" for a in attn.alternatives)


def test_latency_picks_static_cache_and_compile() -> None:
    p = run("infer_gpu_one", LLAMA2_7B, a100(), prefer="latency")
    assert p.setup.cache_implementation == "static" and p.setup.torch_compile
    assert dec(p, "cache_implementation").number > 1
    assert run("infer_gpu_one", LLAMA2_7B, a100()).setup.cache_implementation == "dynamic"


def test_70b_on_one_gpu_offloads_or_reports_no_fit() -> None:
    # 70B in nf4 is ~35 GiB of weights alone (hand check in test_inference_memory): a 24 GiB card cannot hold it
    p = run("infer_gpu_one", LLAMA2_70B, a100(1, 24))
    assert p.fits and p.setup.offload_params and dec(p, "max_memory") is not None
    assert p.throughput.bound == "offload" and any("offload" in w for w in p.warnings)
    q = run("infer_gpu_one", LLAMA2_70B, a100(1, 24), allow_offload=False)
    assert not q.fits and q.suggestions and q.memory.needed > q.memory.capacity


def test_gpu_many_tp_vs_device_map_vs_replicas() -> None:
    big = run("infer_gpu_many", LLAMA2_70B, a100(8, 80), prefer="latency")
    assert big.setup.strategy == "tp" and big.setup.num_gpus == 8
    assert dec(big, "launcher").value == "torchrun --nproc-per-node 8"
    alts = {a.value: a for a in dec(big, "strategy").alternatives}
    assert "device_map" in alts and "ms/token" in alts["device_map"].why_not
    small = run("infer_gpu_many", LLAMA2_7B, a100(4, 80), batch_size=8)
    assert small.setup.strategy == "single" and small.setup.num_gpus == 4   # throughput: one replica per GPU
    forced = run("infer_gpu_many", LLAMA2_70B, a100(4, 80), strategy="device_map")
    assert forced.setup.strategy == "device_map" and dec(forced, "max_memory").value["cpu"]


def test_tp_size_must_divide_heads() -> None:
    odd = LLAMA31_8B.model_copy(update={"num_attention_heads": 30, "num_key_value_heads": 6})
    p = run("infer_gpu_many", odd, a100(4, 80), strategy="tp")
    assert p.setup.num_gpus == 3   # 30 and 6 heads divide by 3, not by 4


def test_cpu_dtype_by_isa_threads_and_ram() -> None:
    plain = run("infer_cpu", LLAMA2_7B, cpu())
    assert plain.setup.weights_dtype == "fp32" and plain.setup.device == "cpu"
    assert dec(plain, "cpu_threads").value == 16
    # serving and training on a CPU follow one threads rule: same value, same words, same rejected alternative
    train = planner("train_cpu")(Request(scenario="train_cpu", model=LLAMA2_7B, hardware=cpu(), seq_len=512, global_batch_size=1))
    served, trained = dec(plain, "cpu_threads"), dec(train, "cpu_threads")
    assert served.reason == trained.reason == ("one intra-op thread per physical core (16 physical, 32 logical); "
                                               "set OMP_NUM_THREADS or torch.set_num_threads")
    assert [a.value for a in served.alternatives] == [a.value for a in trained.alternatives] == [32]
    # the reason names the dtype really chosen (fp32 here), not "16-bit"
    assert dec(plain, "quantization_config").reason.startswith("fp32 weights and the KV cache fit")
    amx = run("infer_cpu", LLAMA2_7B, cpu(("amx_bf16", "amx_tile")))
    assert amx.setup.weights_dtype == "bf16"
    small = run("infer_cpu", LLAMA2_7B, cpu(ram_gib=12))
    assert small.setup.weights_dtype in ("int8", "nf4") and small.fits
    none = run("infer_cpu", LLAMA2_70B, cpu(ram_gib=8))
    assert not none.fits and none.suggestions


def test_batch_of_one_says_why_latency_or_room() -> None:
    """batch_size=1 has two reasons that must not be confused: prefer='latency', or no room for a second
    sequence's KV cache (13B in nf4 on a 15 GiB T4 with 3996-token sequences: 3.3 GB of fp16 KV cache each,
    2 x 40 layers x 5120 x 2 bytes x 3996 tokens)."""
    from perfguide import recommend

    full = recommend("13b", "infer_gpu_one", hardware="t4", quantization="nf4", prompt_len=3900, max_new_tokens=96)
    d = full.decision("batch_size")
    assert d.value == 1 and d.number == 1, d
    assert "latency" not in d.reason and "fit" in d.reason, d.reason
    fast = recommend("gpt2", "infer_gpu_one", hardware="a100-80gb", prefer="latency").decision("batch_size")
    assert fast.value == 1 and fast.number > 1 and "latency" in fast.reason


def test_offloaded_weights_keep_the_ram_headroom_like_training() -> None:
    """device_map offload needs the offloaded bytes within RAM less the headroom (as training offload does):
    5% spare RAM fails the default 10% headroom, and fits once the headroom is 0."""
    from perfguide import Hardware, recommend

    t4 = Hardware.from_name("t4")
    need = recommend("70b", "infer_gpu_one", hardware=t4).memory.cpu_ram
    assert need > 0
    ram = int(need * 1.05)
    tight = t4.model_copy(update={"cpu": t4.cpu.model_copy(update={"ram_available": ram, "ram_total": ram})})
    short = recommend("70b", "infer_gpu_one", hardware=tight)
    assert not short.fits and "to CPU RAM" in short.suggestions[0] and "10% headroom" in short.suggestions[0]
    assert recommend("70b", "infer_gpu_one", hardware=tight, headroom=0.0).fits


def test_transformers_multi_gpu_plan_on_two_nodes_says_it_uses_one_node() -> None:
    # h100-80gb:8x2 is 16 GPUs (8 per node x 2 nodes); the transformers plan is one node's processes, so a user must
    # be told to run it once per node, and the vLLM hint (which spans both nodes) must not compare 16 GPUs to 8 unsaid
    import perfguide

    rec = perfguide.recommend("meta-llama/Llama-3.1-8B", scenario="infer_gpu_many", hardware="h100-80gb:8x2")
    assert rec.setup.serving is None and rec.setup.num_gpus * rec.setup.nodes == 8
    assert any("2 nodes" in w and "each node" in w for w in rec.warnings)
    hint = rec.decision("engine").alternatives[0].why_not
    assert "on 16 GPUs" in hint and "here on 8 GPUs" in hint


def test_encoder_inference_reasons_do_not_talk_about_decoding() -> None:
    # BERT is an encoder: one forward pass, no KV cache and no decode steps, so the batch and quantization reasons
    # must not justify themselves by a memory-bound decode or a KV cache
    import perfguide

    for scenario, hw in (("infer_gpu_one", "l4"), ("infer_cpu", "cpu")):
        rec = perfguide.recommend("bert-base-uncased", scenario=scenario, hardware=hw)
        assert rec.setup.new_tokens == 0
        for setting in ("batch_size", "quantization_config"):
            reason = rec.decision(setting).reason
            assert "decod" not in reason and "KV cache" not in reason, (scenario, setting, reason)


def test_layout_comparison_names_the_batch_its_tokens_per_s_is_at() -> None:
    # the layouts are compared before the batch is tuned: 'single x8 ... 316 tok/s' next to a headline of thousands
    # of tokens/s at batch 64 reads as a contradiction unless the row says the batch it was priced at
    import perfguide

    rec = perfguide.recommend("meta-llama/Llama-3.1-8B", scenario="infer_gpu_many", hardware="a100-80gb:8")
    d = rec.decision("strategy")
    assert rec.setup.micro_batch_size > 1 and d.number is not None and d.number < rec.throughput.tokens_per_s
    assert "at batch 1" in d.reason and all("at batch 1" in a.why_not for a in d.alternatives)
