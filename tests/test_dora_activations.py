"""DoRA's saved activations (memory/lora_activations.lora_layer_bytes), against the tensors autograd saves in a real PEFT
DoRA model on CPU: the saved-tensor set reachable from the loss, DoRA minus plain LoRA on the same base and targets.

Each DoRA-adapted Linear saves its base output and its adapter output for the magnitude's gradient (peft
``DoraLinearLayer.forward``), per token and output unit: 2 + 4 B on a bf16 base with fp32 adapters, 2 + 2 under
autocast, 4 + 4 in fp32. The trace also holds a few magnitude-sized vectors per Linear (the norm, the scale, the
scale minus one: about 10 B per output unit, independent of the tokens), which are not priced.
"""

from __future__ import annotations

from typing import Any

import pytest
from helpers import live_storages

from perfguide import Setup
from perfguide.memory.ledger import ledger
from perfguide.memory.lora_activations import dora_norm_bytes, lora_layer_bytes
from perfguide.model.resolve import spec_from_any
from perfguide.setup import LoraSpec

CONFIG = dict(model_type="llama", hidden_size=96, intermediate_size=160, num_hidden_layers=3, num_attention_heads=6,
              num_key_value_heads=2, head_dim=16, vocab_size=320, max_position_embeddings=512)
TARGETS = ("q_proj", "v_proj", "down_proj")
OUTPUTS = 96 + 2 * 16 + 96          # q, v and down_proj output widths of one block
B, S = 2, 40



def saved_bytes(root: Any, params: set[int]) -> int:
    """Distinct storages autograd saved for backward below ``root`` (parameters excluded): what the step keeps."""
    import torch

    seen: dict[int, int] = {}
    stack, done = [root.grad_fn], set()
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
    return sum(seen.values())

def _saved_bytes(use_dora: bool, dtype: Any, autocast: bool, dropout: float = 0.0, layers: int = 3, upcast: bool = True) -> int:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = {k: v for k, v in CONFIG.items() if k != "model_type"} | {"num_hidden_layers": layers}
    model = get_peft_model(LlamaForCausalLM(LlamaConfig(**cfg)).to(dtype),
                           LoraConfig(r=8, target_modules=list(TARGETS), use_dora=use_dora, lora_dropout=dropout),
                           autocast_adapter_dtype=upcast)
    model.train()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    ids = torch.randint(0, CONFIG["vocab_size"], (B, S))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = model(input_ids=ids, labels=ids).loss
    return saved_bytes(loss, params)


@pytest.mark.parametrize("weights, autocast, per_unit", [("bf16", None, 2 + 4), ("fp32", "bf16", 2 + 2), ("fp32", None, 4 + 4)])
def test_dora_saves_both_branch_outputs(weights: str, autocast: str | None, per_unit: int) -> None:
    import torch

    dtype = torch.bfloat16 if weights == "bf16" else torch.float32
    traced = _saved_bytes(True, dtype, autocast is not None) - _saved_bytes(False, dtype, autocast is not None)
    layers = CONFIG["num_hidden_layers"]
    assert OUTPUTS * per_unit * B * S * layers <= traced <= OUTPUTS * (per_unit * B * S + 12) * layers   # hand count

    spec = spec_from_any(dict(CONFIG))

    def priced(dora: bool) -> int:
        setup = Setup(seq_len=S, micro_batch_size=B, weights_dtype=weights, autocast=autocast,  # type: ignore[arg-type]
                      lora=LoraSpec(r=8, target_modules=TARGETS, use_dora=dora, dropout=0.0))
        led = ledger(spec, setup)
        return lora_layer_bytes(setup, led.lora_inputs_per_layer, led.lora_rank_per_layer, led.dora_outputs_per_layer)

    assert (priced(True) - priced(False)) * layers == OUTPUTS * per_unit * B * S * layers


WEIGHTS = 96 * 96 + 96 * 32 + 160 * 96   # in x out of q, v and down_proj: one block's DoRA base weights


def _per_block(use_dora: bool, dtype: Any, autocast: bool, dropout: float, upcast: bool = True) -> int:
    """Saved bytes of one block: three blocks minus two, so the first block (whose attention input needs no gradient,
    so its re-run matmuls keep no weight) and the head drop out."""
    def traced(layers: int) -> int:
        return _saved_bytes(use_dora, dtype, autocast, dropout=dropout, layers=layers, upcast=upcast)
    return traced(3) - traced(2)


@pytest.mark.parametrize("weights, autocast, upcast, per_unit, copy", [
    ("bf16", None, True, 4 + 4, 4),     # x and the weight go fp32 (peft casts x to the adapters' dtype, W.to(x.dtype))
    ("bf16", "bf16", True, 2 + 2, 2),   # autocast casts the fp32 weight copy back to bf16 and keeps that
    ("fp32", "bf16", True, 2 + 2, 2),
    ("fp32", None, True, 4 + 4, 0),     # W.to(fp32) is W itself
    ("bf16", "bf16", False, 2 + 2, 0),  # 16-bit adapters (peft < 0.12): W.to(bf16) is W, autocast's cast too
])
def test_dora_dropout_reruns_base_and_keeps_its_weight(weights: str, autocast: str | None, upcast: bool, per_unit: int,
                                                       copy: int) -> None:
    """With lora_dropout > 0 each DoRA Linear runs F.linear(dropout(x), W.to(x.dtype)) again: its output (x's dtype)
    and the weight it ran with are kept, the weight a new tensor where its dtype changed (hand count per block)."""
    import torch

    dtype = torch.bfloat16 if weights == "bf16" else torch.float32
    traced = (_per_block(True, dtype, autocast is not None, 0.1, upcast)
              - _per_block(False, dtype, autocast is not None, 0.1, upcast))
    hand = OUTPUTS * per_unit * B * S + WEIGHTS * copy
    assert hand <= traced <= hand + OUTPUTS * 12   # the magnitude-sized vectors (norm, scale) are not priced

    spec = spec_from_any(dict(CONFIG))

    def priced(dora: bool) -> int:
        setup = Setup(seq_len=S, micro_batch_size=B, weights_dtype=weights, autocast=autocast,  # type: ignore[arg-type]
                      lora=LoraSpec(r=8, target_modules=TARGETS, use_dora=dora, dropout=0.1, autocast_adapter_dtype=upcast))
        led = ledger(spec, setup)
        return lora_layer_bytes(setup, led.lora_inputs_per_layer, led.lora_rank_per_layer, led.dora_outputs_per_layer,
                                led.dora_weights_per_layer)

    assert priced(True) - priced(False) == hand


def test_dora_without_dropout_keeps_no_weight() -> None:
    """Dropout 0 (peft >= 0.14): the base output is reused, no weight is kept, per block (the same hand count as above)."""
    import torch

    traced = _per_block(True, torch.bfloat16, False, 0.0) - _per_block(False, torch.bfloat16, False, 0.0)
    assert OUTPUTS * (2 + 4) * B * S <= traced <= OUTPUTS * ((2 + 4) * B * S + 12)


def _norm_transient(use_dora: bool, dtype: Any, autocast: bool, fan_in: int, fan_out: int) -> int:
    """Peak minus end-of-forward live bytes of one adapted Linear's forward: storages the dispatched ops create, each
    counted until its storage is freed (weakref.finalize)."""
    import torch
    from peft import LoraConfig, get_peft_model

    class One(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(fan_in, fan_out, bias=False)

        def forward(self, x: Any) -> Any:
            return self.lin(x)

    torch.manual_seed(0)
    model = get_peft_model(One().to(dtype), LoraConfig(r=8, target_modules=["lin"], use_dora=use_dora))
    model.train()
    x = torch.randn(4, 8, fan_in, dtype=dtype, requires_grad=True)
    live = live_storages()
    with live, torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        model(x)
    return live.peak - live.live


@pytest.mark.parametrize("weights, autocast, hand", [
    ("bf16", None, lambda i, o: i * i * 4 + i * o * (3 * 4 + 4)),    # fp32 identity kept; delta, cast weight, scaled, sum
    ("fp32", None, lambda i, o: i * i * 4 + i * o * 3 * 4),          # W.to(fp32) is W
    ("bf16", "bf16", lambda i, o: i * i * 2 + i * o * (3 * 4 + 4)),  # the identity's bf16 cast kept instead
    ("fp32", "bf16", lambda i, o: i * i * 2 + i * o * 3 * 4),
])
def test_dora_weight_norm_transient(weights: str, autocast: str | None, hand: Any) -> None:
    """The weight norm's transient (DoRA minus LoRA, peak minus what the forward leaves) against the hand count and the
    priced dora_norm_bytes; within 5% (the magnitude-sized vectors)."""
    import torch

    fan_in, fan_out = 512, 256
    dtype = torch.bfloat16 if weights == "bf16" else torch.float32
    traced = (_norm_transient(True, dtype, autocast is not None, fan_in, fan_out)
              - _norm_transient(False, dtype, autocast is not None, fan_in, fan_out))
    setup = Setup(seq_len=S, micro_batch_size=B, weights_dtype=weights, autocast=autocast,  # type: ignore[arg-type]
                  lora=LoraSpec(r=8, target_modules=("lin",), use_dora=True))
    priced = dora_norm_bytes(setup, (fan_in, fan_out))
    assert priced == hand(fan_in, fan_out)
    assert abs(traced - priced) <= 0.05 * priced, (traced, priced)


def _qdora_saved(use_dora: bool, dropout: float, fan_in: int, fan_out: int) -> int:
    """Bytes autograd keeps (reachable from the output) for one bitsandbytes nf4 Linear with a PEFT adapter, on CPU."""
    import bitsandbytes as bnb
    import torch
    from peft import LoraConfig, get_peft_model

    class One(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = bnb.nn.Linear4bit(fan_in, fan_out, bias=False, compute_dtype=torch.bfloat16, quant_type="nf4")

        def forward(self, x: Any) -> Any:
            return self.lin(x)

    torch.manual_seed(0)
    module = One()
    module.lin.weight = bnb.nn.Params4bit(torch.randn(fan_out, fan_in, dtype=torch.bfloat16) * 0.02, requires_grad=False,
                                          quant_type="nf4")
    module = module.to("cpu")   # quantizes: packed uint8 with its quant_state
    assert module.lin.weight.dtype == torch.uint8
    model = get_peft_model(module, LoraConfig(r=8, target_modules=["lin"], use_dora=use_dora, lora_dropout=dropout))
    model.train()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    out = model(torch.randn(B, S, fan_in, dtype=torch.bfloat16, requires_grad=True))
    return saved_bytes(out, params)


@pytest.mark.parametrize("dropout, per_unit, copy", [(0.0, 2 + 4, 0), (0.1, 4 + 4, 4)])
def test_qdora_keeps_the_dequantized_weight_with_dropout(dropout: float, per_unit: int, copy: int) -> None:
    """QDoRA (nf4 base, fp32 adapters): with dropout the re-run matmul keeps the dequantized weight cast to fp32
    (dequantize_module_weight(base).to(x.dtype)), 4 B per weight element, and its fp32 output; without, as on a bf16 base."""
    fan_in, fan_out = 512, 256
    traced = _qdora_saved(True, dropout, fan_in, fan_out) - _qdora_saved(False, dropout, fan_in, fan_out)
    hand = fan_out * per_unit * B * S + fan_in * fan_out * copy
    assert hand <= traced <= hand + fan_out * 12

    spec = spec_from_any(dict(CONFIG))

    def priced(dora: bool) -> int:
        setup = Setup(seq_len=S, micro_batch_size=B, weights_dtype="nf4",
                      lora=LoraSpec(r=8, target_modules=("q_proj",), use_dora=dora, dropout=dropout))
        led = ledger(spec, setup)
        return lora_layer_bytes(setup, led.lora_inputs_per_layer, led.lora_rank_per_layer, led.dora_outputs_per_layer,
                                led.dora_weights_per_layer)

    q_proj = 96   # CONFIG's q_proj: 96 x 96, one per block
    assert priced(True) - priced(False) == q_proj * per_unit * B * S + q_proj * q_proj * copy
