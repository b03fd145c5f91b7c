"""Offload splits keep the headroom the user asked for (GPU and host RAM), and a Recommendation's max_memory map
survives a JSON round trip with integer GPU keys, as accelerate's device_map='auto' expects them."""

from __future__ import annotations

import pytest

import perfguide
from perfguide import Recommendation


@pytest.mark.parametrize("headroom", [0.1, 0.3])
def test_offload_split_leaves_the_requested_headroom(headroom: float) -> None:
    r = perfguide.recommend("meta-llama/Llama-3.1-70B", scenario="infer_gpu_one", hardware="l4", host_ram="256GiB", headroom=headroom)
    assert r.fits and r.setup.offload_params
    gpu = r.hardware.gpus[0]
    assert r.memory.device_total <= gpu.memory_total * (1 - headroom)
    assert r.memory.cpu_ram <= r.hardware.cpu.ram_available * (1 - headroom)
    budget = r.decision("max_memory").value
    assert int(budget["cpu"].removesuffix("MiB")) * 2**20 <= r.hardware.cpu.ram_available * (1 - headroom)


def test_more_headroom_keeps_fewer_weights_on_the_gpu() -> None:
    tight = perfguide.recommend("meta-llama/Llama-3.1-70B", scenario="infer_gpu_one", hardware="l4", host_ram="256GiB", headroom=0.1)
    roomy = perfguide.recommend("meta-llama/Llama-3.1-70B", scenario="infer_gpu_one", hardware="l4", host_ram="256GiB", headroom=0.3)
    assert roomy.memory.weights < tight.memory.weights and roomy.memory.cpu_ram > tight.memory.cpu_ram
    assert roomy.throughput.time_per_output_token_ms > tight.throughput.time_per_output_token_ms   # more streamed per token


def test_max_memory_keys_survive_json() -> None:
    pytest.importorskip("transformers")
    r = perfguide.recommend("meta-llama/Llama-3.1-70B", scenario="infer_gpu_many", hardware="l4:2", host_ram="256GiB",
                           strategy="device_map")  # 102 GB of the 141 offloaded: more than the assumed host holds
    assert r.setup.strategy == "device_map"
    back = Recommendation.model_validate_json(r.to_json())
    keys = set(back.model_kwargs()["max_memory"])
    assert keys == {0, 1, "cpu"} == set(r.model_kwargs()["max_memory"])
