"""Bundled data files are validated into pydantic models at load: a missing row or a mistyped value is one
DataFileError line naming the file and the field, never a KeyError or a silent default later."""

from __future__ import annotations

import copy
from collections.abc import Iterator

import pytest

from perfguide import _data
from perfguide.errors import DataFileError, PerfGuideError
from perfguide.memory.activations_data import ActivationsData
from perfguide.memory.inference import InferenceData


@pytest.fixture
def damaged(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, object]]:
    """Serve a mutable copy of a data file through ``_data.load``; ``validated``'s cache is cleared around it."""
    files: dict[str, object] = {}
    real = _data.load
    monkeypatch.setattr(_data, "load", lambda name: files[name] if name in files else real(name))
    _data.validated.cache_clear()
    _data.facts.cache_clear()
    yield files
    _data.validated.cache_clear()
    _data.facts.cache_clear()


@pytest.mark.parametrize(("name", "schema"), [("inference", InferenceData), ("activations", ActivationsData)])
def test_shipped_files_validate(name: str, schema: type) -> None:
    assert isinstance(_data.validated(name, schema), schema)


def test_missing_row_is_one_line_naming_it(damaged: dict[str, object]) -> None:
    raw = copy.deepcopy(_data.load("inference"))
    del raw["nf4_blocksize"]
    damaged["inference"] = raw
    with pytest.raises(DataFileError, match=r"inference\.json .*nf4_blocksize: Field required"):
        _data.validated("inference", InferenceData)


def test_mistyped_value_and_unknown_key_are_refused(damaged: dict[str, object]) -> None:
    raw = copy.deepcopy(_data.load("activations"))
    raw["families"]["llama"]["regimes"]["amp"]["per_token"]["h"] = "twenty"
    damaged["activations"] = raw
    with pytest.raises(DataFileError, match=r"families\.llama\.regimes\.amp\.per_token\.h"):
        _data.validated("activations", ActivationsData)
    raw = copy.deepcopy(_data.load("inference"))
    raw["decode_bandwidth_efficency"] = {"value": 0.8, "source": "a typo of an existing key"}
    damaged["inference"] = raw
    with pytest.raises(DataFileError, match="decode_bandwidth_efficency"):
        _data.validated("inference", InferenceData)


def test_a_fact_needs_its_source(damaged: dict[str, object]) -> None:
    raw = copy.deepcopy(_data.load("inference"))
    raw["pcie_offload_bandwidth_gbps"] = {"value": 12.0, "source": ""}
    damaged["inference"] = raw
    with pytest.raises(PerfGuideError, match="pcie_offload_bandwidth_gbps.source"):
        _data.validated("inference", InferenceData)


def test_optimizer_rows_are_transformers_names_and_cover_setup() -> None:
    from transformers.training_args import OptimizerNames

    from perfguide.optimizer_facts import rows
    from perfguide.setup import OPTIMIZERS

    accepted = {o.value for o in OptimizerNames}
    assert set(rows()) <= accepted  # every priced name is one TrainingArguments(optim=...) accepts
    assert OPTIMIZERS == tuple(rows())


def test_optimizer_state_facts_agree_with_each_other() -> None:
    """The streamed bytes the speed model uses and the states x bits the memory model uses are two rows of facts;
    for a large matrix they must agree (Adafactor's factored state is the exception: it is not per element)."""
    from perfguide.memory.optimizers import state_bytes_per_param
    from perfguide.optimizer_facts import rows

    for name, facts in rows().items():
        assert facts.paged == name.startswith("paged_")
        if facts.family in ("adafactor", "adalomo"):
            assert state_bytes_per_param(name) < 0.01
            continue
        assert state_bytes_per_param(name) == pytest.approx(facts.streamed_state_bytes, rel=0.07), name
        if facts.rank is not None:   # GaLore / APOLLO: states of the rank-r projection, not per element
            assert facts.streamed_state_bytes < facts.states * facts.bits / 8, name
            continue
        assert facts.streamed_state_bytes == pytest.approx(facts.states * facts.bits / 8, rel=0.07), name


def test_unknown_optimizer_is_one_line() -> None:
    from perfguide.optimizer_facts import row

    with pytest.raises(PerfGuideError, match="unknown optimizer 'adamw_torh'.*adamw_torch"):
        row("adamw_torh")


@pytest.mark.parametrize("name", ["efficiency", "calibration"])
def test_fact_tables_validate_and_keep_ints(name: str) -> None:
    rows = _data.facts(name)
    assert rows and all(len(r.source) >= 10 for r in rows.values())
    assert "_doc" not in rows
    if name == "efficiency":
        assert isinstance(rows["gemm_tile"].value, int)   # 64, not 64.0: the step model's integer arithmetic is unchanged


def test_fact_tables_refuse_damage(damaged: dict[str, object]) -> None:
    shipped = copy.deepcopy(_data.load("efficiency"))   # before any damage: _data.load serves the damaged copies after
    raw = copy.deepcopy(shipped)
    raw["comm_overlap"]["sorce"] = raw["comm_overlap"].pop("source")
    damaged["efficiency"] = raw
    with pytest.raises(DataFileError, match=r"efficiency\.json .*comm_overlap"):
        _data.facts("efficiency")
    raw = copy.deepcopy(_data.load("calibration"))
    del raw["reserved_over_allocated"]
    damaged["calibration"] = raw
    with pytest.raises(DataFileError, match=r"calibration\.json has no row 'reserved_over_allocated'"):
        _data.fact_value("calibration", "reserved_over_allocated")
    raw = copy.deepcopy(shipped)
    del raw["host_memory_gbps_per_core"]["cap"]
    damaged["efficiency"] = raw
    with pytest.raises(DataFileError, match="'host_memory_gbps_per_core' lacks its 'cap'"):
        _data.fact_extra("efficiency", "host_memory_gbps_per_core", "cap")
