"""Sweep finding: a plan that offloads FSDP to the CPU and syncs gradients each micro-step had a ``cpu_offload``
decision without its deciding number, because CPU offload's off (one GPU) left the FSDP-only sync switch on, a Setup
the validation refuses. Turning a technique off now turns off the techniques that cannot run without it."""

from __future__ import annotations

import perfguide


def test_every_technique_decision_of_an_offloaded_synced_plan_has_its_number() -> None:
    rec = perfguide.recommend("meta-llama/Llama-3.1-8B", "train_gpu_many", hardware="rtx4090:2")
    s = rec.setup
    assert s.offload_params and s.sync_grads_each_micro_step   # the combination the finding needs
    offload = rec.decision("cpu_offload")
    assert offload.number is not None and offload.number > 0 and offload.alternatives
    assert all(d.number is not None for d in rec.decisions)
