"""Trace what lit-gpt's blocks keep for backward with bitsandbytes nf4 Linears under bf16-mixed vs bf16-true.

Why: lit-gpt's ``finetune/lora.py --quantize bnb.nf4`` without ``--precision`` (PR #275's tables, rows 2702-2703 and
2708-2709) builds the model in fp32 under Fabric's bf16-mixed (autocast only), so the embedding, norms, biases and
LoRA matrices stay fp32 and bitsandbytes' Linear4bit returns ``out.to(input dtype)``: the residual stream and every
Linear output stay fp32. This prints, per token per block, the bytes the forward saves for backward in each regime
(``saved_tensors_hooks`` storages, deduplicated, plus the input MatMul4Bit kept on its node before bitsandbytes
0.43.2, as 0.41.1 ran) and their difference per FFN unit and per hidden unit (steps of one dim at a time).

lit-gpt is not a perfguide dependency and nothing of it is vendored: export it yourself, e.g.
``git -C <litgpt clone> archive 064fd523 lit_gpt quantize | tar -x -C /tmp/litgpt_064fd523``, then
``LITGPT_SRC=/tmp/litgpt_064fd523 .venv/bin/python scripts/trace_litgpt_mixed_stream.py``. Two packages lit-gpt
imports at module level and never uses here (lightning_utilities' RequirementCache, lightning's CSVLogger) are
stood in for; the export's ``lit_gpt/__init__.py`` (a version check and the tokenizer) is not run.

Printed at 064fd523 with bitsandbytes 0.50.2 and torch 2.13 on CPU (b 2 x s 128, 4 heads, dropout 0.05, LoRA r 8 on
query and value): Llama-2 block 16 / 8 B per FFN unit (mixed / true), 36.34 / 30.33 B per hidden unit; StableLM-alpha
(GPT-NeoX) block 8 / 4 and 32.38 / 28.34. memory/activations.fp32_mlp_bytes prices the FFN-unit part (+8, +4).
"""

from __future__ import annotations

import os
import sys
import types
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _stand_ins() -> None:
    """Module-level imports of lit-gpt that the traced code never calls."""
    class RequirementCache:
        def __init__(self, requirement: str, *args: Any, **kwargs: Any) -> None:
            self.requirement = requirement

        def __bool__(self) -> bool:   # flash-attn absent (SDPA runs), every other requirement met
            return "flash" not in self.requirement

    imports = types.ModuleType("lightning_utilities.core.imports")
    imports.RequirementCache = RequirementCache  # type: ignore[attr-defined]
    loggers = types.ModuleType("lightning.fabric.loggers")
    loggers.CSVLogger = object  # type: ignore[attr-defined]
    for name in ("lightning_utilities", "lightning_utilities.core", "lightning", "lightning.fabric"):
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules["lightning_utilities.core.imports"] = imports
    sys.modules["lightning.fabric.loggers"] = loggers
    package = types.ModuleType("lit_gpt")   # skip lit_gpt/__init__.py: import model before config, as it does
    package.__path__ = [os.path.join(os.environ["LITGPT_SRC"], "lit_gpt")]  # type: ignore[attr-defined]
    sys.modules["lit_gpt"] = package
    sys.path.insert(0, os.environ["LITGPT_SRC"])
    import lit_gpt.model  # noqa: F401


def saved_bytes(name: str, n_layer: int, mixed: bool, n_embd: int, inter: int, b: int = 2, s: int = 128) -> int:
    """Bytes one forward saves for backward (storages, deduplicated) for a lit-gpt GPT of ``n_layer`` blocks."""
    from bitsandbytes.autograd._functions import MatMul4Bit
    from lit_gpt.lora import GPT, Config, mark_only_lora_as_trainable
    from lit_gpt.utils import quantization

    torch.manual_seed(0)
    cfg = Config.from_name(name, n_layer=n_layer, n_embd=n_embd, n_head=4, intermediate_size=inter,
                           padded_vocab_size=1024, vocab_size=1024, block_size=512,
                           r=8, alpha=16, dropout=0.05, to_query=True, to_value=True)
    torch.set_default_dtype(torch.float32 if mixed else torch.bfloat16)   # Fabric: bf16-true builds in bf16
    try:
        with quantization("bnb.nf4"):
            model = GPT(cfg)
    finally:
        torch.set_default_dtype(torch.float32)
    model = model.to(torch.device("cpu"))   # Params4bit quantizes on the move
    mark_only_lora_as_trainable(model)
    model.train()
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
        return t

    original = MatMul4Bit.forward

    def forward(ctx: Any, a: torch.Tensor, w: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(ctx, a, w, *args, **kwargs)
        if any(ctx.needs_input_grad[:2]):   # bitsandbytes < 0.43.2: ctx.tensors = (A, B)
            ctx.kept_input = a
            pack(a)
        return out

    MatMul4Bit.forward = staticmethod(forward)  # type: ignore[method-assign,assignment]
    try:
        x = torch.randint(0, 1024, (b, s))
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
                torch.autocast("cpu", dtype=torch.bfloat16, enabled=mixed):
            model(x, max_seq_length=s)
    finally:
        MatMul4Bit.forward = staticmethod(original)  # type: ignore[method-assign]
    return sum(seen.values())


def per_block(name: str, mixed: bool, n_embd: int, inter: int, tokens: int = 256) -> float:
    return (saved_bytes(name, 2, mixed, n_embd, inter) - saved_bytes(name, 1, mixed, n_embd, inter)) / tokens


def main() -> None:
    _stand_ins()
    for name in ("Llama-2-7b-hf", "stablelm-base-alpha-3b"):
        coef = {}
        for mixed in (True, False):
            base = per_block(name, mixed, 256, 1024)
            coef[mixed] = ((per_block(name, mixed, 256, 2048) - base) / 1024, (per_block(name, mixed, 512, 1024) - base) / 256)
        (i_m, h_m), (i_t, h_t) = coef[True], coef[False]
        print(f"{name}: per FFN unit {i_m:.2f} / {i_t:.2f} B (mixed / true, +{i_m - i_t:.2f}); "
              f"per hidden unit {h_m:.2f} / {h_t:.2f} B (+{h_m - h_t:.2f})")


if __name__ == "__main__":
    main()
