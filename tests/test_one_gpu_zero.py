"""A ZeRO stage asked for on one GPU (train_gpu_one, strategy='zero3') prices every layout that stage runs there: every
state on the GPU, the optimizer offloaded, the optimizer and the parameters offloaded; the fastest that fits wins, the
strategy is never swapped for another, and a plan where none fits says what each layout breaks, in one line.

Before, only the layout that offloads everything was tried: Llama-3.2-3B with fp32 masters on a 4090 (64 GiB host)
came back 'does not fit' on host RAM, while keeping the 16-bit parameters on the GPU fits."""

from __future__ import annotations

import warnings

import pytest

import perfguide
from perfguide.errors import ConflictingConstraintsError


def _rec(model: str, hardware: str, **kw: object) -> perfguide.Recommendation:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return perfguide.recommend(model, "train_gpu_one", hardware=hardware, strategy="zero3", **kw)


def _strategy(rec: perfguide.Recommendation) -> perfguide.Decision:
    return next(d for d in rec.decisions if d.setting == "strategy")


def test_keeping_the_parameters_on_the_gpu_fits_where_offloading_everything_does_not() -> None:
    rec = _rec("meta-llama/Llama-3.2-3B", "rtx4090", master_weights="fp32")
    s = rec.setup
    assert rec.fits and s.strategy == "zero3" and s.offload_optimizer and not s.offload_params
    everything = [c for c in rec.candidates if c.setup.strategy == "zero3" and c.setup.offload_params
                  and c.setup.optimizer == s.optimizer and c.setup.gradient_checkpointing == s.gradient_checkpointing]
    assert everything
    usable_ram = rec.hardware.cpu.ram_available * (1 - rec.request.constraints.headroom)
    for c in everything:   # it breaks the host RAM (64 GiB, 10% kept free), not the GPU
        assert c.memory.cpu_ram > usable_ram >= rec.memory.cpu_ram
    # the difference is the 16-bit parameters ZeRO-3 moves to pinned host memory with offload_param: 2 B each
    params = rec.model.total_params
    assert min(c.memory.cpu_ram for c in everything) - rec.memory.cpu_ram == pytest.approx(2 * params, rel=0.05)
    alts = {str(a.value): a.why_not for a in _strategy(rec).alternatives}
    assert alts["zero3"].startswith("does not fit") and alts["zero3 + offload optimizer+params"].startswith("does not fit")


def test_without_offload_only_the_on_gpu_layout_is_priced() -> None:
    rec = _rec("Qwen/Qwen2.5-0.5B", "h100", allow_offload=False)
    assert rec.fits and rec.setup.strategy == "zero3" and not (rec.setup.offload_optimizer or rec.setup.offload_params)
    assert all(not (c.setup.offload_optimizer or c.setup.offload_params) for c in rec.candidates if c.verdict != "incompatible")


def test_none_fits_keeps_zero3_and_says_what_each_layout_breaks_in_one_line() -> None:
    rec = _rec("meta-llama/Llama-3.1-8B", "t4")
    assert not rec.fits and rec.setup.strategy == "zero3"
    reason = _strategy(rec).reason
    assert "\n" not in reason and reason.startswith("strategy='zero3' was requested and none of its layouts fits one GPU")
    for layout in ("zero3: needs", "zero3 + offload optimizer: ", "zero3 + offload optimizer+params: offload needs"):
        assert layout in reason, reason


def test_a_one_gpu_deepspeed_plan_launches_one_rank_without_dataparallel_talk() -> None:
    launcher = next(d for d in _rec("Qwen/Qwen2.5-0.5B", "h100").decisions if d.setting == "launcher")
    assert launcher.number == 1 and "DataParallel" not in launcher.reason


def test_zero1_is_still_refused_on_one_gpu() -> None:
    with pytest.raises(ConflictingConstraintsError, match="zero1"):
        perfguide.recommend("Qwen/Qwen2.5-0.5B", "train_gpu_one", hardware="h100", strategy="zero1")


@pytest.mark.parametrize("kw", [{"optimizer_in_backward": True}, {"optimizer": "lomo"}])
def test_a_step_inside_backward_is_refused_under_zero_in_one_line(kw: dict[str, object]) -> None:
    """The step-in-backward rung is laid out on the plain replica only: ZeRO steps after its reduce-scatter, so a forced
    switch is refused rather than turned off, and LOMO (which needs it) is not built into an invalid Setup."""
    with pytest.raises(ConflictingConstraintsError, match="inside backward") as e:
        perfguide.recommend("Qwen/Qwen2.5-0.5B", "train_gpu_one", hardware="h100", strategy="zero3", **kw)
    assert "\n" not in str(e.value)
    # the way out it names is one this scenario takes and that can run the step: the plain replica, not zero2/fsdp
    assert "accepted here: single)" in str(e.value)
