"""A technique's facts live in its module: its conflicts (from its ``Requires``), its label word and its
constants (a row of data/techniques.json, read by name). setup.py names no technique, and a technique written
outside the package is one module: registered, validated, priced and planned without touching another file."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import get_args

import pytest

from perfguide import techniques
from perfguide.setup import Autocast, Setup

PACKAGE = Path(techniques.__file__).resolve().parents[1]
#: the ledger's own vocabulary: what the weights, the autocast, the adapters and the optimizer are (setup.py reads
#: them to say what a Setup computes in); the techniques that own them add rungs and hooks on top
CORE = frozenset({"weights_dtype", "autocast", "tf32", "lora", "optimizer"})


def _names_in_setup_code() -> set[str]:
    """Attribute reads and string constants inside setup.py's functions (the field declarations aside)."""
    tree = ast.parse((PACKAGE / "setup.py").read_text(encoding="utf-8"))
    found: set[str] = set()
    for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
        for node in ast.walk(fn):
            if isinstance(node, ast.Attribute):
                found.add(node.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.update(re.findall(r"[a-z_0-9]+", node.value))
    return found


def test_setup_code_names_no_technique() -> None:
    owned = {f for t in techniques.registry() for f in t.fields} | {t.name for t in techniques.registry()}
    dtypes = set(get_args(Autocast))     # 'fp8' is also a dtype word: compute_dtype says fp8 autocast computes in bf16
    named = _names_in_setup_code() & (owned - CORE - dtypes)
    assert not named, f"setup.py names techniques or their switches: {sorted(named)}; move the rule into the technique"


@pytest.mark.parametrize(("setup", "fragment"), [
    ({"liger_kernel": True, "device": "cpu"}, "liger_kernel needs a cuda device, not 'cpu'; or turn it off (liger_kernel=False)"),
    ({"activation_offloading": True, "device": "cpu"}, "activation_offloading needs a cuda device"),
    ({"padding_free": True, "task": "infer"}, "padding_free applies to train, not 'infer'"),
    ({"autocast": "fp8", "lora": {"r": 8}}, "fp8 is for full fine-tuning, not lora; or turn it off (autocast='bf16')"),
    ({"autocast": "fp8", "strategy": "zero2", "num_gpus": 2}, "fp8 runs under strategy single, ddp, fsdp, fsdp_shard_grad_op, not 'zero2'"),
    ({"optimizer_in_backward": True, "lora": {"r": 8}}, "optimizer_in_backward is for full fine-tuning, not lora"),
    ({"optimizer_in_backward": True, "gradient_accumulation_steps": 4}, "gradient_accumulation_steps must be 1"),
    ({"avg_seq_len": 600, "seq_len": 512}, "avg_seq_len=600 exceeds seq_len=512"),
    ({"offload_optimizer": True, "strategy": "ddp", "num_gpus": 2}, "offload_optimizer needs a sharded strategy"),
])
def test_conflicts_come_from_the_technique(setup: dict[str, object], fragment: str) -> None:
    with pytest.raises(ValueError, match=re.escape(fragment)):
        Setup(**setup)  # type: ignore[arg-type]


def test_the_binding_requirements_are_the_ones_the_planner_offers() -> None:
    """One declaration serves both: what a binding technique refuses is what its ``Requires`` lists."""
    fp8 = techniques.get("fp8").requires
    assert fp8.binding and fp8.finetune == ("full",) and "zero2" not in (fp8.strategies or ())
    assert techniques.get("liger_kernel").requires.devices == ("cuda",)
    assert not techniques.get("gradient_checkpointing").requires.binding     # offered for training, never refused


def test_label_lists_each_technique_word_in_order() -> None:
    s = Setup(micro_batch_size=2, gradient_accumulation_steps=4, weights_dtype="fp32", autocast="bf16", gradient_checkpointing=True,
              strategy="fsdp", num_gpus=8, offload_optimizer=True, offload_params=True, liger_kernel=True, torch_compile=True)
    assert s.label == "mb=2 ga=4 fp32 amp-bf16 adamw_torch_fused ckpt fsdp offload liger compile"
    assert Setup(task="infer", weights_dtype="bf16", torch_compile=True).label == "mb=1 ga=1 bf16"   # training words only


def test_every_technique_constant_is_written_once_and_read() -> None:
    rows = {k for k in json.loads((PACKAGE / "data" / "techniques.json").read_text()) if not k.startswith("_")} - {"fp16_by_family", "compiled_blocks"}   # two tables with accessors of their own
    text = "\n".join(p.read_text(encoding="utf-8") for p in (PACKAGE / "techniques").glob("*.py"))
    quoted = set(re.findall(r'"([a-z0-9_]+)"', text))
    assert rows <= quoted, f"rows no technique reads: {sorted(rows - quoted)}"
    from perfguide.data.techniques import constant

    for name in sorted(set(re.findall(r'constant\("([a-z0-9_]+)"\)', text))):
        assert constant(name) > 0
    assert not re.search(r"^\s+\w+: _?Constant", (PACKAGE / "data" / "techniques.py").read_text(), re.M)  # no second list


def test_a_missing_constant_is_one_line() -> None:
    from perfguide.data.techniques import constant
    from perfguide.errors import DataFileError

    with pytest.raises(DataFileError, match="techniques.json has no row 'no_such_constant'"):
        constant("no_such_constant")


TOY = '''
"""A toy technique: a fused kernel that saves one millisecond per training micro-step on a GPU."""
from typing import Any

from perfguide.techniques.base import EmitContext, LadderContext, Requires, Technique
from perfguide.techniques.effects import SpeedContext, StepSeconds

SAVED_S = 1e-3


class ToyFusedNorm(Technique):
    name = "toy_fused_norm"
    fields = ("toy_fused_norm",)
    setup_fields = {"toy_fused_norm": (bool, False, "a toy fused norm kernel")}
    summary = "a toy fused norm kernel"
    sources = ("https://example.org/toy-fused-norm",)
    requires = Requires(devices=("cuda",), tasks=("train",), binding=True)
    order = 40
    axis = True

    def active(self, setup: Any) -> bool:
        return bool(getattr(setup, "toy_fused_norm", False))

    def axis_values(self, ctx: LadderContext) -> list[dict[str, Any]]:
        return [{"toy_fused_norm": False}, {"toy_fused_norm": True}]

    def off(self) -> dict[str, Any]:
        return {"toy_fused_norm": False}

    def label_word(self, setup: Any) -> str | None:
        return "toy-norm" if self.active(setup) else None

    def speed(self, ctx: SpeedContext) -> StepSeconds:
        return StepSeconds(compute=-SAVED_S) if self.active(ctx.setup) else StepSeconds()

    def training_args(self, ctx: EmitContext) -> dict[str, Any]:
        return {"toy_fused_norm": True} if self.active(ctx.setup) else {}


TECHNIQUES = (ToyFusedNorm(),)
'''

DRIVER = '''
import json, sys
import perfguide, perfguide.techniques as T
T.__path__.append(sys.argv[1])
T.registry.cache_clear()
from perfguide import Setup
out = {"names": T.names()}
base = dict(weights_dtype="bf16", micro_batch_size=4, seq_len=1024, gradient_checkpointing=True)
on = perfguide.estimate_speed("meta-llama/Llama-3.1-8B", dict(base, toy_fused_norm=True), hardware="a100-80gb")
off = perfguide.estimate_speed("meta-llama/Llama-3.1-8B", dict(base, toy_fused_norm=False), hardware="a100-80gb")
out["saved"] = off.step_time_s - on.step_time_s
rec = perfguide.recommend("meta-llama/Llama-3.1-8B", "train_gpu_one", hardware="a100-80gb", seq_len=1024, finetune="lora")
out["chosen"] = rec.setup.toy_fused_norm
out["label"] = rec.setup.label
out["args"] = rec.training_args_dict().get("toy_fused_norm")
try:
    Setup(device="cpu", toy_fused_norm=True)
except ValueError as e:
    out["refused"] = str(e)
print(json.dumps(out))
'''


def test_a_toy_technique_is_one_module(tmp_path: Path) -> None:
    """Registered from a module outside the package (one file), it gets its Setup switch, its conflict, its
    label word, its priced speed effect and a place in the plan the search chooses."""
    (tmp_path / "toy_fused_norm.py").write_text(TOY)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", DRIVER, str(tmp_path)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert "toy_fused_norm" in out["names"]
    assert out["saved"] == pytest.approx(1e-3, rel=1e-6)   # one micro-step per optimizer step (GA=1), not launch-bound
    assert out["chosen"] is True and "toy-norm" in out["label"].split()
    assert out["args"] is True
    assert "toy_fused_norm needs a cuda device, not 'cpu'; or turn it off (toy_fused_norm=False)" in out["refused"]


VENDOR_DRIVER = '''
import copy, json, sys
import perfguide
from perfguide import _data
from perfguide.hardware import specs
fraction = float(sys.argv[1])
real = _data.load
gpus = copy.deepcopy(real("gpus"))
gpus["gpus"]["acme-x1"] = {
    "vendor": "acme", "efficiency_class": "acme", "attention_class": "acme", "compute_capability": [0, 0],
    "capabilities": {"bf16": True, "fp16": True, "tf32": False, "fp8": False, "flash_attention": False,
                     "bitsandbytes": False, "llm_int8": False},
    "memory_mib": 98304, "bf16_tflops": 400, "fp16_tflops": 400, "fp32_tflops": 50, "memory_bandwidth_gbps": 3000,
    "link": "pcie", "pcie_gbps": 64, "source": "a toy accelerator's datasheet", "memory_source": "its datasheet",
    "cuda_total_gib": 95.5, "cuda_total_source": "[I] a toy: its runtime's total, as its datasheet would print it"}
eff = copy.deepcopy(real("efficiency"))
for path in ("tensor", "cuda"):
    eff["peak_fraction_by_class"]["value"][path]["acme"] = fraction
eff["attention_peak_fraction"]["value"]["acme"] = fraction
served = {"gpus": gpus, "efficiency": eff}
_data.load = lambda name: served.get(name) or real(name)
specs.load = _data.load
for f in (_data.facts, _data.validated, *(v for v in vars(specs).values() if hasattr(v, "cache_clear"))):
    f.cache_clear()
rec = perfguide.recommend("meta-llama/Llama-3.1-8B", "train_gpu_one", hardware="acme-x1", seq_len=1024)
print(json.dumps({"fits": rec.fits, "step": rec.throughput.step_time_s, "generation": rec.hardware.gpus[0].generation,
                  "autocast": rec.setup.autocast, "tf32": rec.setup.tf32}))
'''


def _acme(fraction: float) -> dict[str, object]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", VENDOR_DRIVER, str(fraction)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    out: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def test_a_toy_vendor_is_data_rows_only() -> None:
    """A card of a vendor perfguide has never heard of, added as a gpus.json row plus its efficiency classes'
    rows in efficiency.json (no code), gets a plan in its own flags' precision, priced at its own class's share of
    peak: halving that share slows the compute-bound step (an 8B LoRA-less full fine-tune's matmuls)."""
    fast, slow = _acme(0.6), _acme(0.3)
    assert fast["fits"] and fast["generation"] == "ACME"
    assert (fast["autocast"], fast["tf32"]) == ("bf16", False)       # its row's flags: bf16, no tf32
    assert 1.3 < float(slow["step"]) / float(fast["step"]) <= 2.0     # compute-bound share of the step doubles
