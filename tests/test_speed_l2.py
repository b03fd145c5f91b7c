"""The matmul's read of bitsandbytes' dequantized weight served by the GPU's L2 (speed/terms.py ``l2_bytes``).

Checks against bytes derived by hand from Llama-2-7B's Linear shapes and the whitepapers' L2 sizes, never against
the code's own output; no wall-clock time is asserted.
"""

from __future__ import annotations

from typing import Any

import pytest
from test_speed import llama7b

from perfguide import Hardware, LoraSpec, Setup
from perfguide._data import load
from perfguide.hardware.specs import GpuRow, gpus_file
from perfguide.hardware.types import GPU
from perfguide.speed import terms, traffic
from perfguide.speed.training import training_speed, usable_bandwidth

MiB = 2**20
Q_PROJ = 4096 * 4096 * 2          # Llama-2-7B's q/k/v/o_proj dequantized to 16 bit: 32 MiB
MLP = 4096 * 11008 * 2            # gate/up/down_proj: 86 MiB


def _gpu(name: str) -> GPU:
    gpu = Hardware.from_name(name).smallest_gpu
    assert gpu is not None
    return gpu


def _qlora(**kw: Any) -> Setup:
    return Setup(**{"weights_dtype": "nf4", "lora": LoraSpec(r=8), "micro_batch_size": 1, "seq_len": 256, **kw})


def test_room_is_the_resident_share_of_the_whitepaper_l2() -> None:
    """RTX 4090: 72 MB (73,728 KB) x 0.65 = 49,073,356.8 bytes; A100: 40 MB x 0.65 = 27,262,976; H100 SXM 50 MB x
    0.65 = 34,078,720; a card without a measured L2 rate (T4) has none: every byte stays at the DRAM rate."""
    assert load("efficiency")["l2_resident_fraction"]["value"] == 0.65
    assert traffic.l2_room(_gpu("rtx4090")) == pytest.approx(49_073_356.8)
    assert traffic.l2_room(_gpu("a100-80gb")) == pytest.approx(27_262_976)
    assert traffic.l2_room(_gpu("h100-80gb")) == pytest.approx(34_078_720)
    assert traffic.l2_room(_gpu("t4")) == 0.0
    assert traffic.l2_rate(_gpu("l40s")) == 5200e9


def test_dequantized_q_proj_fits_a_72mb_l2_not_a_40mb_one() -> None:
    """Llama-2-7B: q/k/v/o_proj dequantized are 33,554,432 bytes each, under the 4090's 49.1 MB room and the H100's
    34.1 MB, over the A100's 27.3 MB; gate/up/down (90,177,536) fit none. Forward and input-gradient pass each
    dequantize: 2 x 32 layers x 4 x 33,554,432 = 8,589,934,592 bytes read from L2 a micro-step, whatever the tokens;
    checkpointing's recompute adds a third pass; a 16-bit base dequantizes nothing."""
    spec = llama7b()
    assert Q_PROJ < traffic.l2_room(_gpu("h100-80gb")) < MLP
    assert terms.l2_bytes(spec, _qlora(), _gpu("rtx4090")) == 2 * 32 * 4 * Q_PROJ == 8_589_934_592
    assert terms.l2_bytes(spec, _qlora(micro_batch_size=16), _gpu("rtx4090")) == 8_589_934_592
    assert terms.l2_bytes(spec, _qlora(), _gpu("h100-80gb")) == 8_589_934_592
    assert terms.l2_bytes(spec, _qlora(), _gpu("a100-80gb")) == 0.0
    assert terms.l2_bytes(spec, _qlora(gradient_checkpointing=True), _gpu("rtx4090")) == 3 * 32 * 4 * Q_PROJ
    assert terms.l2_bytes(spec, _qlora(weights_dtype="bf16"), _gpu("rtx4090")) == 0.0
    assert terms.l2_bytes(spec, _qlora(), _gpu("t4")) == 0.0


def test_the_step_prices_the_cached_bytes_at_the_l2_rate() -> None:
    """The same QLoRA step on an RTX 4090 with and without its L2 rate: the compute part differs by exactly the L2
    bytes x (1 / usable DRAM bandwidth - 1 / L2 rate) (HF Trainer's stack factor is 1): 8.59 GB x (1 / 806.4 GB/s -
    1 / 4,690 GB/s) = 8.82 ms."""
    spec, setup = llama7b(), _qlora(micro_batch_size=4, attn_implementation="eager")
    hw = Hardware.from_name("rtx4090")
    gpu = hw.smallest_gpu
    assert gpu is not None and usable_bandwidth(gpu) == pytest.approx(806.4e9)
    bare = hw.model_copy(update={"gpus": tuple(g.model_copy(update={"l2_bandwidth_gbps": None}) for g in hw.gpus)})
    with_l2, without = training_speed(spec, setup, hw), training_speed(spec, setup, bare)
    saved = 8_589_934_592 * (1 / 806.4e9 - 1 / 4690e9)
    assert saved == pytest.approx(8.82e-3, abs=1e-5)
    assert without.compute_time_s - with_l2.compute_time_s == pytest.approx(saved, rel=1e-9)


def _row(**update: Any) -> dict[str, Any]:
    return {**gpus_file().gpus["rtx4090"].model_dump(), **update}


def test_gpus_json_l2_fields_are_checked_at_load() -> None:
    """A size without its source, a rate without a size, or an L2 rate not above the DRAM's is refused; every rate
    names its measurement."""
    assert GpuRow.model_validate(_row()).l2_cache_mib == 72
    for bad in ({"l2_source": None}, {"l2_cache_mib": None, "l2_source": None}, {"l2_bandwidth_gbps": 900}):
        with pytest.raises(ValueError, match="l2_"):
            GpuRow.model_validate(_row(**bad))
    every = gpus_file().gpus
    assert {k for k, r in every.items() if r.l2_bandwidth_gbps} >= {"rtx4090", "l40s", "a100-80gb", "h100-80gb"}
    assert all(r.l2_source and "gpu-benches" in r.l2_source for r in every.values() if r.l2_bandwidth_gbps)
    size = every["rtx4090"].l2_cache_mib
    assert size is not None and MiB * size == 75_497_472
