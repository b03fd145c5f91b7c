"""data/gpus.json and data/architectures.json are read through one validated loader each (hardware/specs.py
``gpus_file``, model/catalog.py ``catalog_file``): every part of the file is a pydantic row checked at load, and no
module indexes the raw JSON, so a damaged row fails once, in one line naming it, never as a KeyError mid-plan."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from helpers import damaged_data

import perfguide
from perfguide.errors import DataFileError

PACKAGE = Path(perfguide.__file__).parent


def _raw_reads(path: Path, root: Path = PACKAGE) -> list[str]:
    """``load("gpus")`` / ``load("architectures")`` calls (the raw, unvalidated JSON) in one module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and node.args[0].value in ("gpus", "architectures"):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name == "load":
                found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_no_module_reads_the_raw_json() -> None:
    assert [hit for p in PACKAGE.rglob("*.py") for hit in _raw_reads(p)] == []


def test_the_checker_sees_a_raw_read(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text('from ._data import load\nrows = load("gpus")["gpus"]\nok = validated("gpus", GpusFile)\n')
    assert _raw_reads(planted, tmp_path) == ["planted.py:2"]


@pytest.mark.parametrize(("edit", "where"), [
    (lambda raw: raw["size_rule"].update(match_within=2), "size_rule.match_within"),
    (lambda raw: raw["size_rule"].update(template="nobody/none"), "nobody/none"),
    (lambda raw: raw["families"].update(llama=["not", "a", "key"]), "families.llama"),
    (lambda raw: raw["no_sdpa_model_types"].update(value="gpt2"), "no_sdpa_model_types.value"),
])
def test_a_damaged_architectures_json_fails_at_load_in_one_line(monkeypatch: pytest.MonkeyPatch, edit: object, where: str) -> None:
    from perfguide.model import catalog, fields

    with damaged_data(monkeypatch, "architectures", edit):  # type: ignore[arg-type]
        for read in (lambda: fields.family("llama"), catalog.catalog_names):
            with pytest.raises(DataFileError, match=where) as exc:
                read()
            assert "\n" not in str(exc.value)


def test_the_validated_rows_are_what_the_readers_use() -> None:
    """The size rule and the families come from the loaded objects (a bare size resolves by the rule's numbers)."""
    from perfguide.model.catalog import catalog_file
    from perfguide.model.sizes import spec_for_size

    rule = catalog_file().size_rule
    spec = spec_for_size("7b")
    assert spec.model_type in rule.model_types and abs(spec.total_params / 7e9 - 1) <= rule.match_within


def test_the_tp_split_expert_list_is_what_the_installed_transformers_plans() -> None:
    """data/architectures.json records which model types' base_model_tp_plan splits the fused routed experts, so
    planning imports no transformers; the list is checked against every config class of the pinned release."""
    from perfguide.model.catalog import catalog_file

    transformers = pytest.importorskip("transformers")
    splits = set()
    for model_type in transformers.CONFIG_MAPPING.keys():
        try:
            plan = getattr(transformers.CONFIG_MAPPING[model_type], "base_model_tp_plan", None) or {}
        except Exception:  # noqa: BLE001 - a config class that needs an optional extra: not planned for TP either
            continue
        if any(key.endswith("experts.gate_up_proj") for key in plan):
            splits.add(model_type)
    listed = set(catalog_file().tp_split_expert_model_types.value)
    assert listed == splits, (sorted(splits - listed), sorted(listed - splits))
    assert {"qwen3_moe", "mixtral"} <= listed and "gpt_oss" not in listed
