"""DoRA's extra FLOPs (speed/dora.py), against torch's FlopCounterMode on a real PEFT DoRA model on CPU: one forward +
backward, DoRA minus plain LoRA on the same base and targets, per block (three blocks minus two, so the first block,
whose attention input needs no gradient, drops out), with dropout 0 and 0.1, with and without checkpointing.

Hand count per block (exact without checkpointing; see the test for the one small term checkpointed): the delta weight through the modules on an identity, ``2 r in (in + out)`` per adapted Linear
and forward; with dropout the base matmul again, ``2 T in out`` forward and as many for its input's gradient.
"""

from __future__ import annotations

import pytest

from perfguide import Setup
from perfguide.model.resolve import spec_from_any
from perfguide.setup import LoraSpec
from perfguide.speed.dora import dora_cost, fp32_rerun

CONFIG = dict(model_type="llama", hidden_size=96, intermediate_size=160, num_hidden_layers=3, num_attention_heads=6,
              num_key_value_heads=2, head_dim=16, vocab_size=320, max_position_embeddings=512)
TARGETS = ("q_proj", "v_proj", "down_proj")
SHAPES = ((96, 96), (96, 32), (160, 96))   # (in, out) of q, v, down_proj
B, S, R = 2, 40, 8


def _flops(use_dora: bool, dropout: float, checkpointing: bool, layers: int) -> int:
    import torch
    from peft import LoraConfig, get_peft_model
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = {k: v for k, v in CONFIG.items() if k != "model_type"} | {"num_hidden_layers": layers}
    base = LlamaForCausalLM(LlamaConfig(**cfg)).to(torch.bfloat16)
    if checkpointing:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = get_peft_model(base, LoraConfig(r=R, target_modules=list(TARGETS), use_dora=use_dora, lora_dropout=dropout))
    model.train()
    ids = torch.randint(0, CONFIG["vocab_size"], (B, S))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids, labels=ids).loss.backward()
    return int(counter.get_total_flops())


@pytest.mark.parametrize("dropout", [0.0, 0.1])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_dora_flops_per_block(dropout: float, checkpointing: bool) -> None:
    def block(dora: bool) -> int:
        return _flops(dora, dropout, checkpointing, 3) - _flops(dora, dropout, checkpointing, 2)

    traced = block(True) - block(False)
    forwards = 2 if checkpointing else 1
    identity = sum(2 * R * i * (i + o) for i, o in SHAPES)
    rerun = sum(2 * B * S * i * o for i, o in SHAPES) if dropout else 0
    hand = forwards * (identity + rerun) + rerun
    # checkpointed, the trace holds one r-wide matmul more (2 T r out, out = 96: a q_proj or down_proj adapter's
    # lora_B) that the plain-LoRA recompute does not count; not attributed, not priced
    assert hand <= traced <= hand + (2 * B * S * R * 96 if checkpointing else 0)

    spec = spec_from_any(dict(CONFIG))
    setup = Setup(seq_len=S, micro_batch_size=B, weights_dtype="bf16",
                  lora=LoraSpec(r=R, target_modules=TARGETS, use_dora=True, dropout=dropout))
    priced = dora_cost(spec, setup, B * S, forwards - 1)
    assert priced.flops == hand * CONFIG["num_hidden_layers"]
    assert priced.model_flops == (identity + 2 * rerun) * CONFIG["num_hidden_layers"]
    assert fp32_rerun(setup) == bool(dropout)   # pure bf16, fp32 adapters: x and the weight copy are fp32


def test_no_dora_costs_nothing() -> None:
    spec = spec_from_any(dict(CONFIG))
    setup = Setup(seq_len=S, micro_batch_size=B, weights_dtype="bf16", lora=LoraSpec(r=R, target_modules=TARGETS, dropout=0.1))
    assert dora_cost(spec, setup, B * S, 0).flops == 0.0


def test_norm_bytes_against_the_dispatch_count() -> None:
    """The weight norm's bytes per forward (priced by hand from peft's code: 7 adapter-width passes over each weight,
    its cast, the identity written and read) against every aten op's input and output bytes, DoRA minus LoRA, per
    block (scripts/count_dora_bytes.py), dropout 0, without the part that grows with the tokens: within 10%
    (the count also holds the magnitude-sized vectors and the r-wide factors' reads)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "count_dora_bytes.py"
    module_spec = importlib.util.spec_from_file_location("count_dora_bytes", path)
    assert module_spec is not None and module_spec.loader is not None
    script = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(script)
    slope, rest = script.per_token(0.0, False)
    matmul = script.block_delta(0.0, 2, 40)[1]   # the identity and delta matmuls: independent of the tokens here
    counted = rest + matmul

    spec = spec_from_any(dict(CONFIG))
    setup = Setup(seq_len=S, micro_batch_size=B, weights_dtype="bf16", lora=LoraSpec(r=R, target_modules=TARGETS, use_dora=True))
    priced = dora_cost(spec, setup, 0, 0).bytes / CONFIG["num_hidden_layers"]
    weights = sum(i * o for i, o in SHAPES)
    identity = sum(i * i for i, _ in SHAPES)
    assert priced == weights * (7 * 4 + 2 + 4) + 2 * identity * 4   # the hand count, fp32 adapters on a bf16 base
    assert abs(priced - counted) <= 0.1 * counted
    assert slope == pytest.approx(84, abs=0.5)   # efficiency.json dora_token_bytes "plain" is this count


def test_the_plan_names_doras_cost_and_dropouts() -> None:
    """A user asking for DoRA with dropout gets a fine-tuning decision that prices DoRA against plain LoRA and dropout
    against none (the plan's Setup priced again: more memory and a longer step each time)."""
    import re

    import perfguide

    rec = perfguide.recommend("meta-llama/Llama-3.2-3B", scenario="train_gpu_one", hardware="l40s", seq_len=1024,
                              lora=LoraSpec(r=16, target_modules=("q_proj", "v_proj"), use_dora=True, dropout=0.05))
    decision = rec.decision("finetune")
    assert decision is not None
    assert "DoRA recomputes each adapted weight's norm" in decision.reason and "lora_dropout=0.05" in decision.reason
    for other in ("plain LoRA", "lora_dropout=0"):
        saved = re.search(re.escape(other) + r": ([\d.]+) (GiB|MiB) less per device, ([\d.e-]+) s less per step", decision.reason)
        assert saved is not None and float(saved.group(1)) > 0 and float(saved.group(3)) > 0, decision.reason
    assert "peft/pull/2122" in decision.reason

    plain = perfguide.recommend("meta-llama/Llama-3.2-3B", scenario="train_gpu_one", hardware="l40s", seq_len=1024,
                                lora=LoraSpec(r=16, target_modules=("q_proj", "v_proj"), dropout=0.05)).decision("finetune")
    assert plain is not None and "DoRA" not in plain.reason
