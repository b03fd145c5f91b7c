"""bitsandbytes' 4-bit dequantize kernel priced as the longer of its bytes and its decode (perfguide/speed/dequant.py).

Hand derivations: the kernel's lane-instructions per weight are the warp-instruction counts of its SASS (one tile
of 512 weights a warp: 572 ALU-pipe of 997 issued for NF4 up to 0.47, 417 of 676 for FP4; 199 of 418 and 247 of
512 from 0.48) times 32 lanes / 512 weights; an SM retires 64 ALU-pipe and issues 128 lane-instructions a clock;
the GPU's SM-clocks a second are its SM count times its boost clock (A100 108 x 1.41 GHz, RTX 4090 128 x 2.52 GHz,
the datasheets'). The model is checked against the one published measurement of that kernel's speed, the rewrite's
before/after (bitsandbytes PR #1747: 1.36-2.07x faster on A100 40GB / H100 at every size; sm86 / sm89 cards
1.3-1.6x at small sizes only). No wall-clock time of this machine is asserted.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from test_speed import llama7b, machine

from perfguide._data import load
from perfguide.hardware.types import GPU, Hardware
from perfguide.setup import LoraSpec, Setup
from perfguide.speed import dequant
from perfguide.speed.rates import matmul_params
from perfguide.speed.training import training_speed

N = 4096 * 11008                      # one Llama-2-7B MLP weight: 45,088,768 weights
#: the fitted multiplier on the dequantize's counted bytes (efficiency.json dequant_traffic_factor; 1.0 is the bytes as counted)
FACTOR = float(load("efficiency")["dequant_traffic_factor"]["value"])
QLORA = Setup(weights_dtype="nf4", lora=LoraSpec(r=8, alpha=16), micro_batch_size=1, seq_len=256)
FP4 = QLORA.model_copy(update={"bnb_4bit_quant_type": "fp4"})


def _gpu(name: str) -> GPU:
    gpu = Hardware.from_name(name).smallest_gpu
    assert gpu is not None
    return gpu


def _usable(gpu: GPU) -> float:
    return (gpu.memory_bandwidth_gbps or 0) * 1e9 * 0.8     # efficiency.json memory_bandwidth_fraction


@pytest.fixture
def release(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """Set the bitsandbytes release the pricing sees (the bench does the same per row)."""
    def use(version: str | None) -> None:
        monkeypatch.setattr(dequant, "installed_bitsandbytes", lambda: version)
    yield use


def test_eras_by_release() -> None:
    assert [dequant.kernel_era(v) for v in ("0.37.2", "0.39.0", "0.41.1", "0.43.0", "0.47.0")] == ["tree"] * 5
    assert [dequant.kernel_era(v) for v in ("0.48.0", "0.50.2", None)] == ["lut"] * 3


def test_sm_clocks_are_sms_times_boost_clock() -> None:
    """fp32_tflops / (2 x fp32 lanes an SM) against the SM count x boost clock of the datasheets."""
    assert dequant.sm_clocks_per_s(_gpu("a100-80gb")) == pytest.approx(108 * 1.410e9, rel=1e-3)
    assert dequant.sm_clocks_per_s(_gpu("rtx4090")) == pytest.approx(128 * 2.520e9, rel=1e-3)
    assert dequant.sm_clocks_per_s(_gpu("h100-80gb")) == pytest.approx(132 * 1.980e9, rel=3e-3)   # gpus.json rounds 66.9 TFLOPS to 67
    assert dequant.sm_clocks_per_s(_gpu("mi300x")) == 0       # no compute capability: bytes only


def test_clocks_per_weight_from_the_sass_counts() -> None:
    """NF4 tree: 572 ALU warp-instr / 512 weights x 32 lanes = 35.75 lane-slots at 64 a clock (0.559), above its
    997 x 32 / 512 = 62.3 issued at 128 a clock (0.487); FP4 tree 417 -> 0.407; lookup NF4: issue binds,
    418 x 32 / 512 / 128 = 0.204."""
    assert dequant.sm_clocks_per_element(QLORA, "0.41.1") == pytest.approx(572 / 16 / 64)
    assert dequant.sm_clocks_per_element(FP4, "0.41.1") == pytest.approx(417 / 16 / 64)
    assert dequant.sm_clocks_per_element(QLORA, "0.48.0") == pytest.approx(418 / 16 / 128)
    assert dequant.sm_clocks_per_element(Setup(weights_dtype="int8", lora=LoraSpec(r=8, alpha=16)), "0.41.1") == 0


def test_seconds_for_one_weight_by_hand(release) -> None:
    """One 4096 x 11008 NF4 weight dequantized twice (forward, input gradient) on an A100 80GB: the bytes take
    2 x N x 2.5 B / (2039 GB/s x 0.8) = 138 us (times the fitted dequant_traffic_factor); the 2023 tree's decode 2 x N x 0.5586 / (108 x 1.41 GHz) = 331 us."""
    a100 = _gpu("a100-80gb")
    release("0.41.1")
    got = dequant.dequant_seconds(llama7b(), QLORA, a100, _usable(a100), N)
    assert 2 * N * 2.5 / (2039e9 * 0.8) == pytest.approx(138.2e-6, rel=1e-3)
    assert got == pytest.approx(2 * N * (572 / 16 / 64) / (108 * 1.41e9), rel=2e-3)
    assert got == pytest.approx(330.6e-6, rel=2e-3)
    release("0.48.0")    # the lookup kernel's decode (120 us) hides behind the same bytes, at the fitted traffic factor
    assert 2 * N * 2.5 * FACTOR / (2039e9 * 0.8) > 2 * N * (418 / 16 / 128) / (108 * 1.41e9)
    assert dequant.dequant_seconds(llama7b(), QLORA, a100, _usable(a100), N) == pytest.approx(2 * N * 2.5 * FACTOR / (2039e9 * 0.8))


@pytest.mark.parametrize("name", ["a100-40gb"])
def test_rewrite_speedup_on_a100_is_in_the_prs_measured_range(release, name: str) -> None:
    """bitsandbytes PR #1747 measured the rewrite 1.36-2.07x faster on its A100 40GB at every problem size."""
    gpu = _gpu(name)
    for n in (N, 8192 * 8192, 8192 * 28672):
        release("0.47.0")
        before = dequant.dequant_seconds(llama7b(), QLORA, gpu, _usable(gpu), n)
        release("0.48.0")
        after = dequant.dequant_seconds(llama7b(), QLORA, gpu, _usable(gpu), n)
        assert 1.36 <= before / after <= 2.07, (name, n, before / after)


@pytest.mark.parametrize("name", ["rtx4090", "l4", "a10"])
def test_rewrite_gains_nothing_at_large_sizes_on_sm86_sm89(release, name: str) -> None:
    """sm86 / sm89 cards gained 1.3-1.6x only at small (L2-resident) sizes: at the sizes of a 7B weight, which
    stream from DRAM, the tree's decode already hid behind its bytes."""
    gpu = _gpu(name)
    release("0.47.0")
    before = dequant.dequant_seconds(llama7b(), QLORA, gpu, _usable(gpu), N)
    release("0.48.0")
    after = dequant.dequant_seconds(llama7b(), QLORA, gpu, _usable(gpu), N)
    assert before == pytest.approx(after) == pytest.approx(2 * N * 2.5 * FACTOR / _usable(gpu))


def test_training_step_adds_the_decode_where_it_binds(release) -> None:
    """A QLoRA step of Llama-7B: on the A100 the tree kernel adds its decode's excess over the bytes, per pass and
    weight; on the RTX 4090 the step is the same under either release."""
    spec, setup = llama7b(), QLORA.model_copy(update={"micro_batch_size": 4, "seq_len": 512})   # GPU-bound, not launch-bound
    weights = matmul_params(spec)   # what terms.dequant_bytes dequantizes each pass
    release("0.48.0")
    lut = training_speed(spec, setup, machine())
    release("0.41.1")
    tree = training_speed(spec, setup, machine())
    assert lut.bound == tree.bound == "compute"
    extra = 2 * weights * (572 / 16 / 64) / (108 * 1.41e9) - 2 * weights * 2.5 * FACTOR / (2039e9 * 0.8)
    assert extra > 0.05 * lut.step_time_s   # 28 ms of a 0.47 s step: not a rounding
    assert tree.step_time_s - lut.step_time_s == pytest.approx(extra, rel=5e-3)
    rtx = Hardware.from_name("rtx4090")
    release("0.48.0")
    lut_4090 = training_speed(spec, setup, rtx).step_time_s
    release("0.41.1")
    assert training_speed(spec, setup, rtx).step_time_s == pytest.approx(lut_4090)


def test_the_plan_emits_the_priced_code() -> None:
    """The Setup's 4-bit code is what the emitted BitsAndBytesConfig asks for (the kernel priced is the one run)."""
    pytest.importorskip("transformers")
    from perfguide.techniques.qlora import bnb_config

    assert bnb_config("nf4", "bf16", quant_type="fp4").bnb_4bit_quant_type == "fp4"
    assert bnb_config("nf4", "bf16").bnb_4bit_quant_type == "nf4"


def test_the_bench_reads_each_rows_kernel() -> None:
    """optimum-benchmark's bnb rows ran 0.41.x with fp4 (their configs set only load_in_4bit), Answer.AI's 0.43 with
    nf4, torchtune's quantize with torchao (no bitsandbytes kernel: the newest era's bytes)."""
    from helpers import load_bench, throughput_rows_in

    cases, _, _, _ = throughput_rows_in(load_bench("throughput_rows"), range(391, 667))
    kernels = {rid: (c.bnb_release, c.setup.bnb_4bit_quant_type) for rid, c in cases.items() if c.setup.weights_dtype == "nf4"}
    assert {kernels[r] for r in ("653", "654", "655", "658", "659", "661", "663", "666")} == {("0.41.1", "fp4")}
    assert {kernels[r] for r in ("391", "392", "395", "396", "397", "398")} == {("0.43.0", "nf4")}
    assert {kernels[r] for r in ("401", "412")} == {(None, "nf4")}
