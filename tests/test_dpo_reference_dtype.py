"""The reference copy a full-fine-tuning DPO plan prices is the one TRL builds: ``DPOConfig.model_init_kwargs`` names
the policy's dtype (techniques/dpo.reference_init_kwargs).

TRL 1.0-1.15's DPOTrainer loads the reference with ``create_model_from_path(path, **model_init_kwargs)``, whose
dtype defaults to float32, whatever dtype the policy object has; 1.16 defaults it to the policy's. Run here with the
real DPOTrainer of 1.14.2 (its wheel from PyPI, imported ahead of the installed TRL in a fresh interpreter) and of the
installed release, on a tiny bf16 Llama given as an object, with and without the plan's key.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

try:
    from helpers import pypi_release, tiny_model, tiny_spec
except ImportError:  # pragma: no cover - run from the repository root
    from tests.helpers import pypi_release, tiny_model, tiny_spec

import perfguide

GPU = "h100-80gb"
PLAN = dict(hardware=GPU, seq_len=16, global_batch_size=4, objective="dpo")

BUILD = """
import json, sys, warnings
sys.path.insert(0, sys.argv[4])
import torch, datasets, trl
from transformers import AutoModelForCausalLM
from helpers import tiny_tokenizer
folder, init_kwargs, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
pairs = datasets.Dataset.from_list([{"prompt": "t5 t6 ", "chosen": "t7 t8", "rejected": "t9"}] * 4)
extra = {"model_init_kwargs": init_kwargs} if init_kwargs else {}
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    args = trl.DPOConfig(output_dir=out, use_cpu=True, report_to="none", per_device_train_batch_size=2, max_length=16, **extra)
    trainer = trl.DPOTrainer(model=model, args=args, train_dataset=pairs, processing_class=tiny_tokenizer())
print(json.dumps({"trl": trl.__version__, "policy": sorted({str(p.dtype) for p in trainer.model.parameters()}),
                  "reference": sorted({str(p.dtype) for p in trainer.ref_model.parameters()})}))
"""


def _bf16_plan() -> perfguide.Recommendation:
    return perfguide.recommend(tiny_spec(), "train_gpu_one", precision="bf16", master_weights="bf16", **PLAN)


@pytest.fixture
def trl_1_15(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plans made where TRL 1.15.0 is installed (the release lookup only; tests below run the real 1.14.2)."""
    from perfguide.memory import fused_head

    monkeypatch.setattr(fused_head, "installed_trl", lambda: "1.15.0")


def test_a_full_dpo_plan_names_the_policy_dtype_for_the_reference(trl_1_15: None) -> None:
    rec = _bf16_plan()
    assert rec.setup.weights_dtype == "bf16"
    assert rec.dpo_config_dict()["model_init_kwargs"] == {"dtype": "bfloat16"}
    fp32 = perfguide.recommend(tiny_spec(), "train_gpu_one", precision="fp32", **PLAN)
    assert fp32.dpo_config_dict()["model_init_kwargs"] == {"dtype": "float32"}
    # no reference copy, nothing to name: LoRA disables the adapters, a precomputed reference is dropped
    lora = perfguide.recommend(tiny_spec(), "train_gpu_one", precision="bf16", finetune="lora", lora={"r": 4, "alpha": 8}, **PLAN)
    pre = perfguide.recommend(tiny_spec(), "train_gpu_one", precision="bf16", master_weights="bf16", precompute_ref_log_probs=True, **PLAN)
    assert "model_init_kwargs" not in lora.dpo_config_dict() and "model_init_kwargs" not in pre.dpo_config_dict()
    # perfguide check reads the emitted config back as the same weights
    assert perfguide.check(tiny_spec(), rec.dpo_config_dict(), hardware=GPU, device="cuda").setup.weights_dtype == "bf16"


def test_trl_1_16_and_later_get_no_key() -> None:
    """1.16+ load the reference at the policy's dtype already; the key would only make TRL warn on a model object."""
    from perfguide.techniques.dpo import reference_init_kwargs

    s = _bf16_plan().setup
    assert reference_init_kwargs(s, "1.16.0") == reference_init_kwargs(s, "2.0.0") == {}
    assert reference_init_kwargs(s, None) == reference_init_kwargs(s, "1.0.0") == {"model_init_kwargs": {"dtype": "bfloat16"}}


def _reference_dtypes(tmp: Path, release: Path | None, init_kwargs: dict[str, str] | None) -> dict[str, object]:
    """The policy's and the reference's parameter dtypes of a real DPOTrainer built on a bf16 model object."""
    folder = tmp / "tiny"
    if not folder.exists():
        tiny_model().save_pretrained(folder)   # DPOTrainer loads the reference from the policy's _name_or_path
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    if release is not None:
        env["PYTHONPATH"] = str(release)
    out = subprocess.run([sys.executable, "-c", BUILD, str(folder), json.dumps(init_kwargs or {}), str(tmp / "out"),
                          str(Path(__file__).parent)], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.slow
@pytest.mark.parametrize("version", ["1.14.2", None])
def test_trl_builds_the_reference_the_plan_priced(tmp_path: Path, version: str | None) -> None:
    release = pypi_release("trl", version, tmp_path) if version else None
    from perfguide.techniques.dpo import reference_init_kwargs

    emitted = reference_init_kwargs(_bf16_plan().setup, version)["model_init_kwargs"] if version else None
    if version is None:   # the installed release (1.16+) gets no key from the plan: the policy's dtype is its default
        assert "model_init_kwargs" not in _bf16_plan().dpo_config_dict()
    planned = _reference_dtypes(tmp_path, release, emitted)
    assert version is None or planned["trl"] == version
    assert planned["policy"] == planned["reference"] == ["torch.bfloat16"]
    bare = _reference_dtypes(tmp_path, release, None)
    # without the key: 1.14.2 loads an fp32 reference beside the bf16 policy; the installed release (1.16+) the policy's
    assert bare["reference"] == (["torch.float32"] if version else ["torch.bfloat16"])


def test_the_report_warns_where_the_installed_trl_would_load_an_fp32_reference() -> None:
    from perfguide.techniques.dpo import fp32_reference_warning

    s = _bf16_plan().setup
    assert "float32" in fp32_reference_warning(s, "1.15.0") and "bfloat16" in fp32_reference_warning(s, "1.0.0")
    assert fp32_reference_warning(s, "1.16.0") == ""                                  # 1.16 takes the policy's dtype
    assert fp32_reference_warning(s.replace(weights_dtype="fp32", autocast="bf16"), "1.14.2") == ""   # fp32 either way
    assert fp32_reference_warning(s.replace(precompute_ref_log_probs=True), "1.14.2") == ""        # no copy kept
