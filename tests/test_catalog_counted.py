"""Catalogued models resolve from data alone, and that data equals a fresh meta-device build.

Entries whose model type has no analytic counter carry ``counted`` (scripts/catalog_counts.py): the facts the
transformers module built on the meta device gives. Each is rebuilt here and must match exactly, and the ModelSpec
assembled from the record must equal the one perfguide builds through the module, field for field.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from perfguide.model.catalog import catalog_names, config_of, counted_of
from perfguide.model.counting import analytic_count, spec_from_config
from perfguide.model.facts import spec_from_facts

pytest.importorskip("torch")
pytest.importorskip("transformers")

RECORDED = [h for h in catalog_names() if counted_of(h) is not None]


def test_every_entry_without_a_counter_is_recorded_and_no_other() -> None:
    assert RECORDED == [h for h in catalog_names() if analytic_count(config_of(h)) is None]
    assert len(RECORDED) >= 30  # Qwen3, DeepSeek-V3, GPT-OSS, Gemma-3, Llama-4, OLMo-2, ...


@pytest.mark.parametrize("hub", RECORDED)
def test_recorded_facts_equal_a_fresh_meta_build(hub: str) -> None:
    sys.path.insert(0, "scripts")
    from catalog_counts import fresh_facts  # type: ignore[import-not-found]

    recorded = counted_of(hub)
    assert recorded is not None and recorded.model_dump(mode="json") == fresh_facts(hub)
    from_data = spec_from_facts(config_of(hub), recorded, hub, "catalog")
    via_module = spec_from_config(config_of(hub), hub, "catalog")  # builds the module on the meta device
    # the module's full config spells out ``layer_types`` where the published one leaves them to the class: compare
    # what each layer caches instead
    assert from_data.model_dump(exclude={"config", "layer_types"}) == via_module.model_dump(exclude={"config", "layer_types"})
    assert from_data.cache_layer_types() == via_module.cache_layer_types()


def test_catalogued_models_resolve_without_importing_torch_or_transformers() -> None:
    code = ("import sys, json; from perfguide import ModelSpec; from perfguide.model.catalog import catalog_names; "
            "totals = {h: ModelSpec.from_any(h).total_params for h in catalog_names()}; "
            "print(json.dumps([len(totals), 'torch' in sys.modules, 'transformers' in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"HF_HUB_OFFLINE": "1", "PATH": ""})
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [len(catalog_names()), False, False]


@pytest.mark.parametrize(("edit", "where"), [
    (lambda m: m["Qwen/Qwen3-8B"].update(extends="Qwen/Qwen9-1T"), "Qwen9-1T"),
    (lambda m: m["Qwen/Qwen3-8B"]["counted"].update(total_params=-1), "total_params"),
    (lambda m: m["Qwen/Qwen3-8B"].update(alias=["typo"]), "alias"),
])
def test_a_damaged_catalog_fails_at_load(monkeypatch: pytest.MonkeyPatch, edit: object, where: str) -> None:
    from perfguide import _data
    from perfguide.errors import DataFileError
    from perfguide.model.catalog import CatalogFile

    raw = json.loads(json.dumps(_data.load("architectures")))
    edit(raw["models"])  # type: ignore[operator]
    monkeypatch.setattr(_data, "load", lambda name: raw)
    _data.validated.cache_clear()
    try:
        with pytest.raises(DataFileError, match=where):
            _data.validated("architectures", CatalogFile)
    finally:
        _data.validated.cache_clear()
