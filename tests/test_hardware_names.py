"""Hardware names as people type them: accelerate's and the clouds' ``8xA100 80GB``, any case, a vendor word,
and a family name (``a100``) read as one card with the others named in a Decision."""

from __future__ import annotations

import pytest
from helpers import one_line

import perfguide
from perfguide import Hardware, PerfGuideError
from perfguide.cli import main
from perfguide.hardware.named import name_decision

GiB = 1024**3


def gpus(hw: Hardware) -> tuple[int, set[str], int]:
    return hw.gpu_count, {g.name for g in hw.gpus}, hw.nodes


@pytest.mark.parametrize(("typed", "canonical"), [
    ("8xa100-80gb", "a100-80gb:8"),
    ("8x a100-80gb", "a100-80gb:8"),
    ("8 x A100 80GB", "a100-80gb:8"),
    ("8xNVIDIA A100 80GB", "a100-80gb:8"),
    ("8*h100", "h100:8"),
    ("4x4090", "rtx4090:4"),
    ("H100", "h100-80gb"),
    ("NVIDIA H100 SXM", "h100-80gb"),
    ("L40S", "l40s"),
])
def test_spellings_people_type_name_the_same_machine(typed, canonical):
    assert gpus(Hardware.from_name(typed)) == gpus(Hardware.from_name(canonical))


def test_leading_count_spelling_gives_the_canonical_name():
    assert Hardware.from_name("8xa100-80gb").name == "a100-80gb:8"
    assert Hardware.from_name("8x a100").name == "a100-40gb:8"


@pytest.mark.parametrize(("typed", "named"), [
    ("8xa100:2", ("twice", "a100:8")),
    ("2xdgx-h100", ("ambiguous", "dgx-h100:8x2")),
    ("32xh100", ("16",)),
])
def test_counts_that_cannot_be_read_one_way_are_refused_in_one_line(typed, named):
    with pytest.raises(PerfGuideError) as exc:
        Hardware.from_name(typed)
    one_line(exc, *named)


def test_a_family_name_is_read_as_the_smaller_card_and_the_decision_names_the_others():
    d = name_decision("a100")
    assert d is not None and d.value == "a100-40gb"
    assert d.number == 40 * GiB   # the 40 GB A100 (40,960 MiB on nvidia-smi)
    assert {a.value for a in d.alternatives} == {"a100-80gb", "a100-80gb-pcie"}
    assert {a.number for a in d.alternatives} == {80 * GiB}
    assert "a100-80gb" in d.reason
    assert name_decision("8x a100").value == "a100-40gb"   # the count does not hide it
    assert name_decision("v100").value == "v100-16gb" and "v100-32gb" in {a.value for a in name_decision("v100").alternatives}


@pytest.mark.parametrize("name", ["a100-80gb", "A100 80GB", "rtx4090", "8xh100-80gb", "l4", "dgx-h100", "cpu"])
def test_a_name_meaning_one_card_carries_no_decision(name):
    assert name_decision(name) is None


def test_the_plan_shows_the_hardware_decision_first():
    rec = perfguide.recommend("gpt2", hardware="a100")
    assert rec.decisions[0].setting == "hardware" and rec.decisions[0].value == "a100-40gb"
    assert "hardware = a100-40gb" in rec.report() and "rejected a100-80gb" in rec.report()
    assert perfguide.recommend("gpt2", hardware="a100-80gb").decision("hardware") is None


def test_cli_takes_the_cloud_spelling(capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code = main(["recommend", "gpt2", "--scenario", "train_gpu_many", "--hardware", "8xA100-80GB", "--brief"])
    out, _ = capsys.readouterr()
    assert code == 0
    assert out.splitlines()[0] == "perfguide train_gpu_many: openai-community/gpt2 on a100-80gb:8"
    code = main(["recommend", "gpt2", "--hardware", "8xa100:2"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.startswith("error: ") and err.count("\n") == 1
