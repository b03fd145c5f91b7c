"""Typical hosts per GPU class (perfguide/data/hosts.json): a bare GPU name is planned on the host its cards ship in,
the plan names that host, its source and the flag that replaces it, and warns when a decision rests on its RAM.

Expected figures are the sources' own (AWS's and GCP's instance tables, Answer.AI's README), not perfguide output.
"""

from __future__ import annotations

import warnings

import pytest
from pydantic import ValidationError

from perfguide import Hardware, recommend
from perfguide._data import load
from perfguide.hardware.hosts import HostEntry, _rows, typical_host
from perfguide.hardware.named import assumed_host

GiB = 1024**3


def _rec(*args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return recommend(*args, **kwargs)


def test_every_row_is_sourced_and_validated_at_load() -> None:
    rows = load("hosts")["hosts"]
    assert len(rows) >= 30 and all("https://" in r["source"] for r in rows)
    with pytest.raises(ValidationError, match="URL"):
        HostEntry.model_validate({**rows[0], "source": "someone said so, trust me"})
    with pytest.raises(ValidationError, match="not a size"):
        HostEntry.model_validate({**rows[0], "ram": "lots"})
    with pytest.raises(ValidationError, match="physical_cores"):
        HostEntry.model_validate({**rows[0], "physical_cores": rows[0]["vcpus"] + 1})


@pytest.mark.parametrize(("name", "cores", "ram"), [
    ("rtx4090:2", 16, 64 * GiB),          # a desktop: 16-core CPU; 64 GiB holds Answer.AI's ~55 GB 70B-QLoRA host need
    ("a10g", 2, 16 * GiB),                # AWS g5.xlarge: 4 vCPUs, 16 GiB
    ("t4:4", 24, 192 * GiB),              # AWS g4dn.12xlarge: 48 vCPUs, 192 GiB
    ("a100-40gb:3", 24, 340 * 10**9),     # GCP a2-highgpu-4g: 48 vCPUs, 340 GB (the fewest GPUs >= 3)
    ("a100-80gb:8", 48, 1152 * GiB),      # AWS p4de.24xlarge 1,152 GiB < GCP a2-ultragpu-8g 1,360 GB: the smaller one
    ("h100-80gb:8x2", 104, 1872 * 10**9),  # GCP a3-highgpu-8g 1,872 GB < AWS p5.48xlarge 2,048 GiB, per node
])
def test_a_bare_gpu_name_gets_the_host_its_cards_ship_in(name: str, cores: int, ram: int) -> None:
    hw = Hardware.from_name(name)
    assert (hw.cpu.physical_cores, hw.cpu.ram_total) == (cores, ram)
    assert assumed_host(hw) is not None and assumed_host(hw).sourced


def test_a_gpu_or_count_no_row_covers_keeps_the_generic_server_and_says_so() -> None:
    guess = typical_host("rtx4090", 4)
    assert not guess.sourced and "no sourced typical host" in guess.describe()
    assert assumed_host(Hardware.from_name("dgx-a100")) is None   # a node type ships with its own host
    assert assumed_host(Hardware.from_name("cpu")) is None


def test_the_plan_names_the_assumed_host_its_source_and_the_flag() -> None:
    rec = _rec("gpt2", "train_gpu_one", hardware="rtx4090")
    host = rec.decision("host")
    assert host.number == 64 * GiB and "consumer desktop" in host.reason and "--host-ram" in host.reason
    assert "github.com/AnswerDotAI/fsdp_qlora" in host.source
    told = _rec("gpt2", "train_gpu_one", hardware="rtx4090", host_ram="128GiB").decision("host")
    assert told.number == 128 * GiB and "replaced by host_ram=" in told.reason


def test_a_decision_that_flips_on_the_assumed_ram_is_warned_about() -> None:
    """70B QLoRA on two 24 GB cards offloads its 4-bit base to the host (Answer.AI: ~55 GB of CPU RAM): it fits the
    typical 64 GiB desktop, with a warning that names the figure, and not a 32 GiB one."""
    rec = _rec("meta-llama/Llama-3.1-70B", "train_gpu_many", hardware="rtx4090:2", finetune="qlora")
    assert rec.fits and rec.setup.offload_params
    said = [w for w in rec.warnings if "host RAM is assumed" in w]
    assert said and "consumer desktop" in said[0] and "64 GiB" in said[0] and "host_ram=" in said[0]
    small = _rec("meta-llama/Llama-3.1-70B", "train_gpu_many", hardware="rtx4090:2", finetune="qlora", host_ram="32GiB")
    assert not small.fits and not any("host RAM is assumed" in w for w in small.warnings)


def test_a_setup_passed_over_for_the_assumed_ram_is_named() -> None:
    """A 13B full fine-tune on one A10G fits only with ZeRO-Offload (16 B/param of fp32 states on the host, ~200 GiB),
    far more than the g5.xlarge's 16 GiB: the warning names the setup the assumed RAM ruled out."""
    rec = _rec("meta-llama/Llama-2-13b-hf", "train_gpu_one", hardware="a10g", finetune="full")
    said = [w for w in rec.warnings if "host RAM is assumed" in w]
    assert not rec.fits and said and "g5.xlarge (16 GiB" in said[0]
    assert 13e9 * 12 / GiB < float(said[0].split("need ")[1].split(" GiB")[0].replace(",", ""))


def test_one_gpu_of_an_eight_gpu_cloud_host_is_planned_on_its_share() -> None:
    """Clouds rent 1-GPU slices of their 8-GPU hosts in proportion (GCP's own a2-highgpu types, rows of hosts.json):
    one H200 is planned on 1/8 of the only H200 host in the data, not on its whole 2 TiB; a desktop is not sliced."""
    rows = {r.name: r for r in _rows()}
    one, eight = rows["GCP a2-highgpu-1g"], rows["GCP a2-highgpu-8g"]
    assert (one.ram_bytes * 8, one.vcpus * 8) == (eight.ram_bytes, eight.vcpus)   # the proportion the rule assumes
    row = min((r for r in _rows() if "h200" in r.gpus), key=lambda r: (r.gpu_count, r.ram_bytes))   # the data row itself
    assert row.gpu_count == 8
    hw = Hardware.from_name("h200")
    assert hw.cpu.ram_total == row.ram_bytes // 8 and hw.cpu.physical_cores == row.cores // 8
    assert "1/8 share" in assumed_host(hw).describe()
    desk = Hardware.from_name("rtx4090")   # one card in the two-card desktop row: the same desktop
    assert (desk.cpu.physical_cores, desk.cpu.ram_total) == (16, 64 * GiB)
