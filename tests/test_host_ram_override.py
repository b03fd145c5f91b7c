"""A named target's host as the report states it: what is assumed and what the user set (--host-ram)."""

from __future__ import annotations

import perfguide
from perfguide.render.hardware import describe_hardware


def test_host_ram_given_is_not_reported_as_assumed() -> None:
    # a100-80gb alone is planned on GCP's a2-ultragpu-1g: 12 vCPUs, 170 GB = 158.3 GiB
    # (https://cloud.google.com/compute/docs/accelerator-optimized-machines); host_ram=512GiB replaces that RAM, so
    # neither the Request line nor the host decision may present 158 GiB / "assumed" RAM as what the plan used
    rec = perfguide.recommend("gpt2", hardware="a100-80gb", host_ram="512GiB")
    assert rec.hardware.cpu.ram_total == 512 * 2**30
    line = describe_hardware(rec.hardware)
    assert "512.0 GiB RAM" in line and "--host-ram sets the RAM" not in line and "RAM from --host-ram" in line
    reason = rec.decision("host").reason
    assert "planned with 6 cores, 158 GiB RAM" not in reason and "512 GiB" in reason


def test_generic_host_is_reported_as_assumed() -> None:
    # no typical-host row covers a single A10 (hosts.json has A10G rows, not A10): the generic server stands in,
    # and the Request line must say that its cores and RAM are an assumption, as it does for the sourced rows
    rec = perfguide.recommend("gpt2", hardware="a10")
    line = describe_hardware(rec.hardware)
    assert "assumed" in line and "--host-ram sets the RAM" in line
