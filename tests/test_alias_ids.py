"""A chat / instruct checkpoint the catalog files under its base model must still be the one the plan's code loads.

The offline catalog keys -Instruct / -it / -chat variants to their base entry (same config shape), which once made
the report, the recommend() call and the from_pretrained line name the BASE checkpoint: a user fine-tuning
Llama-3.1-8B-Instruct was handed a script that trains Llama-3.1-8B. The shape may be shared; the repo id may not.
"""
from __future__ import annotations

import json

import pytest

import perfguide
from perfguide.model.catalog import lookup

#: (the id a user types, the catalog entry whose shape it takes): variants named on their model cards as fine-tunes of
#: the base checkpoint, so the shape is the base's and only the weights differ
VARIANTS = [("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B"),
            ("google/gemma-3-27b-it", "google/gemma-3-27b-pt"),
            ("mistralai/Mistral-Small-24B-Instruct-2501", "mistralai/Mistral-Small-24B-Base-2501"),
            ("Qwen/Qwen3-30B-A3B-Base", "Qwen/Qwen3-30B-A3B")]


def test_base_as_a_size_still_tells_models_apart() -> None:
    """'-Base' is dropped only beside a parameter count; in BERT / T5 names it is the size."""
    assert lookup("t5-base") == "google-t5/t5-base" != lookup("t5-3b")
    assert lookup("bert-base-uncased") not in (None, lookup("bert-large-uncased"))
    assert lookup("FacebookAI/roberta-base") == "FacebookAI/roberta-base"


@pytest.mark.parametrize(("given", "entry"), VARIANTS)
def test_a_variant_id_keeps_its_name_and_takes_the_entrys_shape(given: str, entry: str) -> None:
    assert lookup(given) == entry   # the premise: the catalog files the variant under the base entry
    spec, base = perfguide.ModelSpec.from_any(given), perfguide.ModelSpec.from_any(entry)
    assert spec.name == given and base.name == entry
    assert spec.total_params == base.total_params and spec.num_layers == base.num_layers
    assert spec.config is not None and spec.config["_name_or_path"] == given


@pytest.mark.parametrize(("given", "entry"), VARIANTS)
def test_the_plans_code_loads_the_checkpoint_the_user_named(given: str, entry: str) -> None:
    scenario = "train_gpu_one" if "Llama" in given else "infer_gpu_one"
    rec = perfguide.recommend(given, scenario, hardware="h100-80gb", seq_len=1024)
    code = rec.report()
    assert f"from_pretrained({json.dumps(given)}" in code and f"perfguide.recommend({json.dumps(given)}" in code
    assert json.dumps(entry) not in code
    assert rec.model.name == given and rec.to_dict()["request"]["model"]["name"] == given


def test_a_short_name_or_a_case_variant_takes_the_entrys_id() -> None:
    """Names that are not a repo id (a short name) or that differ only in case resolve to the entry's own spelling,
    which is the one the Hub serves."""
    assert perfguide.ModelSpec.from_any("llama-3.1-8b-instruct").name == "meta-llama/Llama-3.1-8B"
    assert perfguide.ModelSpec.from_any("META-LLAMA/llama-3.1-8b").name == "meta-llama/Llama-3.1-8B"
