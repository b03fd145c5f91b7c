"""device_map='auto' as accelerate lays it out: the most loaded GPU's decoder blocks against accelerate's own
get_balanced_memory + infer_auto_device_map on a meta-device model (what transformers' from_pretrained runs), and the
bytes a CPU-offloaded map leaves in RAM against the whole model less what the GPUs hold."""

from __future__ import annotations

from collections import Counter

import pytest

from perfguide.hardware.types import CPU, GPU, Hardware
from perfguide.memory.inference import estimate_inference, weight_bytes
from perfguide.model.resolve import spec_from_any
from perfguide.setup import Setup


def _gpus(n: int, gib: float) -> Hardware:
    gpus = tuple(GPU(name="A100", index=k, memory_total=int(gib * 2**30), memory_free=int(gib * 2**30), compute_capability=(8, 0),
                     bf16_tflops=312, fp16_tflops=312, fp32_tflops=19.5, tf32_tflops=156, memory_bandwidth_gbps=1555)
                 for k in range(n))
    return Hardware(gpus=gpus, cpu=CPU(physical_cores=32, logical_cores=64, ram_total=2**40, ram_available=2**40),
                    interconnect="nvlink" if n > 1 else "none")


def _config(layers: int) -> object:
    transformers = pytest.importorskip("transformers")
    return transformers.LlamaConfig(hidden_size=512, intermediate_size=1408, num_hidden_layers=layers, num_attention_heads=8,
                                    num_key_value_heads=2, vocab_size=32000, tie_word_embeddings=False)


def _accelerate_most_loaded(config: object, gpus: int) -> tuple[int, int]:
    """(weight bytes, decoder blocks) on the GPU accelerate loads most, with room to spare on every GPU (no offload)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    accelerate = pytest.importorskip("accelerate")
    from accelerate.utils import compute_module_sizes, get_balanced_memory

    with accelerate.init_empty_weights():
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    room = {k: 2**40 for k in range(gpus)}
    no_split = model._no_split_modules
    budgets = get_balanced_memory(model, max_memory=room, no_split_module_classes=no_split, dtype=torch.bfloat16)
    device_map = accelerate.infer_auto_device_map(model, max_memory=budgets, no_split_module_classes=no_split,
                                                  dtype=torch.bfloat16)
    sizes = compute_module_sizes(model, dtype=torch.bfloat16)
    loads = Counter[int]()
    for name, dev in device_map.items():
        loads[dev] += sizes[name]
    most = max(loads, key=lambda d: loads[d])
    return loads[most], sum(1 for name, dev in device_map.items() if ".layers." in name and dev == most)


@pytest.mark.parametrize(("layers", "gpus"), [(94, 8), (30, 4), (32, 4), (80, 3), (22, 2)])
def test_most_loaded_gpu_holds_what_accelerate_puts_there(layers: int, gpus: int) -> None:
    config = _config(layers)
    spec = spec_from_any(config)
    setup = Setup(task="infer", weights_dtype="bf16", strategy="device_map", num_gpus=gpus, seq_len=128, new_tokens=16)
    one = estimate_inference(spec, setup.replace(strategy="single", num_gpus=1))
    mem = estimate_inference(spec, setup, _gpus(gpus, 80))
    weights, blocks = _accelerate_most_loaded(config, gpus)
    assert f"most loaded GPU holds {blocks} layers" in " ".join(mem.notes)
    assert abs(mem.weights - weights) <= 4 * 512   # the norms perfguide spreads over the blocks, not the final one
    assert mem.kv_cache == one.kv_cache // layers * blocks


def test_offloaded_bytes_are_the_model_less_every_gpu_budget() -> None:
    """Llama-2-70B-shaped model, bf16, two 24 GB cards: each GPU is filled to its budget, CPU RAM takes the rest
    (the most loaded GPU's excess alone under-counted it by half)."""
    config = _config(80).__class__(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
                                   num_key_value_heads=8, vocab_size=32000, tie_word_embeddings=False)
    spec = spec_from_any(config)
    whole = 2 * (80 * (2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28672 + 2 * 8192) + 2 * 32000 * 8192 + 8192)
    setup = Setup(task="infer", weights_dtype="bf16", strategy="device_map", num_gpus=2, seq_len=128, new_tokens=16,
                  offload_params=True)
    assert weight_bytes(spec, "bf16") == whole
    mem = estimate_inference(spec, setup, _gpus(2, 24))
    assert mem.cpu_ram == whole - 2 * mem.weights
    assert mem.cpu_ram > whole * 0.6
    # accelerate, given each GPU the weight budget the plan sizes, sends the same bytes to CPU within three blocks: it
    # keeps the largest module's room free on the first GPU and packs whole blocks (up to one short on each GPU)
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    accelerate = pytest.importorskip("accelerate")
    from accelerate.utils import compute_module_sizes, get_balanced_memory

    with accelerate.init_empty_weights():
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    room = {0: mem.weights, 1: mem.weights, "cpu": 2**41}
    no_split = model._no_split_modules
    budgets = get_balanced_memory(model, max_memory=room, no_split_module_classes=no_split, dtype=torch.bfloat16)
    device_map = accelerate.infer_auto_device_map(model, max_memory=budgets, no_split_module_classes=no_split,
                                                  dtype=torch.bfloat16)
    sizes = compute_module_sizes(model, dtype=torch.bfloat16)
    on_cpu = sum(sizes[name] for name, dev in device_map.items() if dev == "cpu")
    block = 2 * (2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28672 + 2 * 8192)
    assert abs(on_cpu - mem.cpu_ram) <= 3 * block


def test_litgpt_sequential_keeps_its_own_split_on_the_root() -> None:
    """litgpt generate/sequentially.py gives each device n_layer / devices blocks and keeps the embedding, final norm and
    head on the root, whose max_memory_allocated litgpt reports: Llama-2-70B's shapes on 4 GPUs, 20 blocks + both."""
    config = _config(80).__class__(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
                                   num_key_value_heads=8, vocab_size=32000, tie_word_embeddings=False)
    spec = spec_from_any(config)
    block = 2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28672 + 2 * 8192
    root = 2 * (20 * block + 2 * 32000 * 8192 + 8192)
    setup = Setup(task="infer", weights_dtype="bf16", strategy="device_map", num_gpus=4, seq_len=16, new_tokens=50,
                  model_code="litgpt")
    mem = estimate_inference(spec, setup, _gpus(4, 40))
    assert abs(mem.weights - root) <= 2 * 8192
    assert "most loaded GPU holds 20 layers" in " ".join(mem.notes)
