"""Bytes DoRA's elementwise ops move beyond LoRA's, per block and micro-step, counted on real CPU tensors.

Run: ``.venv/bin/python scripts/count_dora_bytes.py`` (CPU, about a minute). A ``TorchDispatchMode`` sums the input
and output bytes of every aten op of one forward + backward of a tiny transformers ``LlamaForCausalLM`` (bf16, peft's
default fp32 adapters on q_proj, v_proj and down_proj), views left out and matmuls counted apart, with DoRA minus plain
LoRA, three blocks minus two (one block's share), at two token counts: the part that grows with the tokens, per token
and adapted output unit, is ``dora_token_bytes`` in perfguide/data/efficiency.json (speed/dora.py); the rest is the
weight norm's passes, which speed/dora.py counts by hand from peft's code and tests/test_dora_speed.py checks
against this count. The aten ops it adds per adapted Linear are ``dora_ops_per_adapted_linear`` (the launch floor,
speed/terms.lora_ops_per_layer).
"""

from __future__ import annotations

import os
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

CONFIG = dict(hidden_size=96, intermediate_size=160, num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=2,
              head_dim=16, vocab_size=320, max_position_embeddings=512)
TARGETS = ["q_proj", "v_proj", "down_proj"]
OUTPUTS = 96 + 32 + 96     # q, v, down_proj output widths
VIEWS = {"t", "transpose", "view", "_unsafe_view", "detach", "alias", "expand", "permute", "unsqueeze", "squeeze",
         "slice", "select", "as_strided", "reshape", "_reshape_alias", "split", "unbind"}
MATMULS = {"mm", "addmm", "bmm"}


def _nbytes(values: Any) -> int:
    import torch

    if isinstance(values, torch.Tensor):
        return values.numel() * values.element_size()
    if isinstance(values, (list, tuple)):
        return sum(_nbytes(v) for v in values)
    return 0


def count(use_dora: bool, dropout: float, layers: int, batch: int, seq: int, autocast: bool = False,
          checkpointing: bool = False) -> tuple[int, int, int]:
    """(elementwise bytes, matmul bytes, aten ops) of one micro-step."""
    import torch
    from peft import LoraConfig, get_peft_model
    from torch.utils._python_dispatch import TorchDispatchMode
    from transformers import LlamaConfig, LlamaForCausalLM

    class Count(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.elementwise = self.matmul = self.ops = 0

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            name = func.overloadpacket.__name__
            self.ops += 1
            if name not in VIEWS:
                moved = _nbytes(list(args)) + _nbytes(list((kwargs or {}).values())) + _nbytes(out)
                if name in MATMULS:
                    self.matmul += moved
                else:
                    self.elementwise += moved
            return out

    torch.manual_seed(0)
    base = LlamaForCausalLM(LlamaConfig(**(CONFIG | {"num_hidden_layers": layers}))).to(torch.bfloat16)
    if checkpointing:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = get_peft_model(base, LoraConfig(r=8, target_modules=TARGETS, use_dora=use_dora, lora_dropout=dropout))
    model.train()
    ids = torch.randint(0, CONFIG["vocab_size"], (batch, seq))
    counter = Count()
    with counter, torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        model(input_ids=ids, labels=ids).loss.backward()
    return counter.elementwise, counter.matmul, counter.ops


def block_delta(dropout: float, batch: int, seq: int, autocast: bool = False, checkpointing: bool = False) -> tuple[int, ...]:
    """(elementwise bytes, matmul bytes, aten ops) one DoRA block adds to the same LoRA block."""
    def block(dora: bool) -> tuple[int, ...]:
        three = count(dora, dropout, 3, batch, seq, autocast, checkpointing)
        two = count(dora, dropout, 2, batch, seq, autocast, checkpointing)
        return tuple(a - b for a, b in zip(three, two))
    return tuple(a - b for a, b in zip(block(True), block(False)))


def per_token(dropout: float, autocast: bool, checkpointing: bool = False) -> tuple[float, float]:
    """(elementwise bytes per token and adapted output unit, the token-independent rest) of one block."""
    small, large = (block_delta(dropout, 2, seq, autocast, checkpointing)[0] for seq in (40, 80))
    slope = (large - small) / (2 * 40 * OUTPUTS)
    return slope, small - slope * 2 * 40 * OUTPUTS


def main() -> None:
    print("| dropout | autocast | checkpointing | bytes per token x output unit | token-independent bytes | ops per adapted Linear |")
    print("|---|---|---|---|---|---|")
    for dropout in (0.0, 0.1):
        for autocast in (False, True):
            for checkpointing in (False, True):
                slope, rest = per_token(dropout, autocast, checkpointing)
                ops = block_delta(dropout, 2, 40, autocast, checkpointing)[2] / len(TARGETS)
                print(f"| {dropout} | {autocast} | {checkpointing} | {slope:.2f} | {rest:,.0f} | {ops:.1f} |")


if __name__ == "__main__":
    main()
