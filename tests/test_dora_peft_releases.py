"""DoRA as older peft releases run it, traced on real CPU tensors with those releases' own code (each wheel fetched
from PyPI with ``pip download``, unpacked, and imported ahead of the installed peft in a fresh interpreter), against
perfguide priced with that release (``lora_activations.installed_peft``):

- 0.9.0 to 0.13.x run the base matmul again in every DoRA forward, dropout or not (``DORA_REUSES_BASE``: 0.14);
- before 0.12 the delta is ``lora_B.weight @ lora_A.weight`` (no identity, ``DORA_IDENTITY``), and the adapters stay
  in the base's dtype (no autocast_adapter_dtype): on a bf16 base the re-run keeps no weight copy;
- 0.12 and 0.13 upcast the adapters to fp32, so the re-run keeps an fp32 copy of each weight.

Per block (three blocks minus two), bf16 base, no autocast, dropout 0, no checkpointing: DoRA minus LoRA FLOPs
(FlopCounterMode) and bytes of the tensors autograd keeps (the saved-tensor set reachable from the loss).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import pypi_release

from perfguide import Setup
from perfguide.memory import lora_activations
from perfguide.memory.ledger import ledger
from perfguide.model.resolve import spec_from_any
from perfguide.setup import LoraSpec
from perfguide.speed.dora import dora_cost

CONFIG = dict(model_type="llama", hidden_size=96, intermediate_size=160, num_hidden_layers=3, num_attention_heads=6,
              num_key_value_heads=2, head_dim=16, vocab_size=320, max_position_embeddings=512)
TARGETS = ("q_proj", "v_proj", "down_proj")
SHAPES = ((96, 96), (96, 32), (160, 96))
OUTPUTS = sum(o for _, o in SHAPES)
WEIGHTS = sum(i * o for i, o in SHAPES)
B, S, R = 2, 40, 8

TRACE = r"""
import json, sys, torch
from peft import LoraConfig, get_peft_model, __version__
from torch.utils.flop_counter import FlopCounterMode
from transformers import LlamaConfig, LlamaForCausalLM
cfg, targets, b, s, r = json.loads(sys.argv[1])

def run(dora, layers):
    torch.manual_seed(0)
    model = get_peft_model(LlamaForCausalLM(LlamaConfig(**(cfg | {"num_hidden_layers": layers}))).to(torch.bfloat16),
                           LoraConfig(r=r, target_modules=targets, use_dora=dora, lora_dropout=0.0))
    model.train()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    ids = torch.randint(0, cfg["vocab_size"], (b, s))
    with FlopCounterMode(display=False) as counter:
        loss = model(input_ids=ids, labels=ids).loss
        seen, stack, done = {}, [loss.grad_fn], set()
        while stack:
            node = stack.pop()
            if node is None or node in done:
                continue
            done.add(node)
            for name in (a for a in dir(node) if a.startswith("_saved_")):
                try:
                    value = getattr(node, name)
                except RuntimeError:
                    continue
                for t in value if isinstance(value, (tuple, list)) else (value,):
                    if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in params:
                        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            stack += [f for f, _ in node.next_functions]
        loss.backward()
    return counter.get_total_flops(), sum(seen.values())

block = {d: [x - y for x, y in zip(run(d, 3), run(d, 2))] for d in (True, False)}
print(json.dumps({"peft": __version__, "flops": block[True][0] - block[False][0], "saved": block[True][1] - block[False][1]}))
"""


def _release(version: str, tmp: Path) -> Path:
    return pypi_release("peft", version, tmp)


def _traced(version: str, tmp: Path) -> dict[str, Any]:
    cfg = {k: v for k, v in CONFIG.items() if k != "model_type"}
    env = {**os.environ, "PYTHONPATH": str(_release(version, tmp)), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", TRACE, json.dumps([cfg, list(TARGETS), B, S, R])], capture_output=True,
                         text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["peft"] == version
    return result


@pytest.mark.parametrize("version, upcast, per_unit, copy, identity", [
    ("0.11.1", False, 2 + 2, 0, False),   # bf16 adapters: x and the weight stay bf16; delta = lora_B.weight @ lora_A.weight
    ("0.13.2", True, 4 + 4, 4, True),     # fp32 adapters: the re-run keeps W.to(fp32) and its fp32 output
])
def test_dropout_free_dora_reran_the_base_before_014(version: str, upcast: bool, per_unit: int, copy: int, identity: bool,
                                                      tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    traced = _traced(version, tmp_path)
    tokens = B * S
    rerun = 2 * tokens * WEIGHTS
    delta = sum(2 * R * i * (i + o) for i, o in SHAPES) if identity else 2 * R * WEIGHTS
    assert traced["flops"] == delta + 2 * rerun                        # hand count: delta, re-run forward, its input grad
    hand = OUTPUTS * per_unit * tokens + WEIGHTS * copy
    assert hand <= traced["saved"] <= hand + OUTPUTS * 12              # + the magnitude-sized vectors, not priced

    monkeypatch.setattr(lora_activations, "installed_peft", lambda: version)
    spec = spec_from_any(dict(CONFIG))

    def setup(dora: bool) -> Setup:
        return Setup(seq_len=S, micro_batch_size=B, weights_dtype="bf16",
                     lora=LoraSpec(r=R, target_modules=TARGETS, use_dora=dora, dropout=0.0, autocast_adapter_dtype=upcast))

    def priced(dora: bool) -> int:
        led = ledger(spec, setup(dora))
        return lora_activations.lora_layer_bytes(setup(dora), led.lora_inputs_per_layer, led.lora_rank_per_layer,
                                                 led.dora_outputs_per_layer, led.dora_weights_per_layer)

    assert priced(True) - priced(False) == hand
    assert dora_cost(spec, setup(True), tokens, 0).flops == (delta + 2 * rerun) * CONFIG["num_hidden_layers"]
