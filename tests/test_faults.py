"""Issue 26: contradictions between a plan's Decisions and its outputs, and faults (a missing library, Ctrl-C).

The missing library is simulated the way Python itself reports one: ``sys.modules[name] = None`` makes
``import name`` raise ModuleNotFoundError, exactly as on a machine without the package.
"""

from __future__ import annotations

import sys

import pytest

import perfguide
from perfguide.errors import MissingDependencyError


@pytest.mark.parametrize("quantization", ["nf4", "int8"])
def test_infer_cpu_loads_in_the_dtype_its_decision_names(quantization):
    """A CPU without AVX512-BF16: the dtype Decision says fp32, so the weights outside the quantized Linears load
    in fp32 and bitsandbytes computes in fp32 (it loaded bf16 with a bf16 compute dtype)."""
    import torch

    rec = perfguide.recommend("gpt2", "infer_cpu", hardware="cpu", quantization=quantization)
    decided = rec.decision("dtype").value
    assert decided == "fp32" and not rec.hardware.cpu.native_bf16
    kwargs = rec.model_kwargs()
    assert kwargs["dtype"] == torch.float32
    qc = kwargs["quantization_config"]
    assert qc.bnb_4bit_compute_dtype == torch.float32


@pytest.mark.parametrize(("method", "package"), [("model_kwargs", "torch"), ("lora_config", "peft")])
def test_without_the_library_an_output_is_one_line_naming_what_to_install(monkeypatch, method, package):
    rec = perfguide.recommend("gpt2", hardware="a100-80gb", finetune="lora")
    for name in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, package, None)
    with pytest.raises(MissingDependencyError) as exc:
        getattr(rec, method)()
    message = str(exc.value)
    assert "\n" not in message and package in message and "pip install" in message
