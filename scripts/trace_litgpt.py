"""Trace litgpt's own GPT through its LoRA fine-tuning step on real CPU tensors (perfguide/model/code.py).

litgpt is not a perfguide dependency: run this in a separate virtual environment that reuses the project's torch
(so torch stays the CPU build the project pins), e.g.::

    .venv/bin/python -m venv /tmp/venv_litgpt
    echo "$PWD/$(ls -d .venv/lib/python3*/site-packages)" > $(ls -d /tmp/venv_litgpt/lib/python3*/site-packages)/project.pth
    /tmp/venv_litgpt/bin/pip install --no-deps litgpt==0.4.12 lightning==2.4.0 lightning-utilities torchmetrics
    PYTHONPATH=. /tmp/venv_litgpt/bin/python scripts/trace_litgpt.py

What it runs is litgpt/finetune/lora.py's ``fit`` loop at ``precision="bf16-true"``: the model built with bf16 as
the default dtype (``fabric.init_module``) and cast whole to bf16 (Lightning's ``HalfPrecision.convert_module``),
``mark_only_lora_as_trainable``, ``model(input_ids, lm_head_chunk_size=128)``, ``chunked_cross_entropy``, backward,
AdamW (foreach, CUDA's default) step; two steps, perfguide's live-bytes tracker (memory/tracing/tracker.py, 512 B
rounding) charging the parameters and buffers first. Printed per model (one and two blocks, so the difference is
one block): the bytes of parameters and buffers against the Hub count (tied models: the head copy), the trainable
parameters' dtype, the bytes alive when the forward returns per token (one block's share and the rest), and the
peak of each phase.
"""

from __future__ import annotations

import json
from typing import Any

#: small shapes of the bench's litgpt families: (litgpt config name, overrides, LoRA switches, LoRA rank); vocabulary 1024
CASES: dict[str, tuple[str, dict[str, Any], tuple[str, ...], int]] = {
    "phi-2": ("phi-2", {"n_embd": 320, "n_head": 4, "intermediate_size": 1280},
              ("query", "key", "value", "projection", "mlp", "head"), 8),
    "llama-3": ("Llama-3-8B", {"n_embd": 256, "n_head": 4, "n_query_groups": 2, "head_size": 64, "intermediate_size": 1024},
                ("query", "value"), 32),
    "gemma": ("Gemma-2b", {"n_embd": 256, "n_head": 4, "n_query_groups": 1, "head_size": 64, "intermediate_size": 1024},
              ("query", "key", "value", "projection", "mlp", "head"), 8),
}
VOCAB, B, S = 1024, 2, 256


def build(name: str, lora: bool = True, **config: Any) -> Any:
    """litgpt's LoRA GPT as finetune/lora.py builds it under bf16-true: bf16 default dtype at construction
    (``fabric.init_module``), cast whole (``HalfPrecision.convert_module``), ``max_seq_length`` set afterwards as
    ``fit`` does (which rebuilds the rope cache in fp32), and everything but the adapters frozen when ``lora``."""
    import torch
    from litgpt.lora import GPT, Config, mark_only_lora_as_trainable

    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    model = GPT(Config.from_name(name, **config))
    torch.set_default_dtype(torch.float32)
    model = model.to(torch.bfloat16)
    model.max_seq_length = S
    if lora:
        mark_only_lora_as_trainable(model)
    return model


def charged(model: Any) -> Any:
    """perfguide's live-bytes tracker (no rounding) with the model's parameters and buffers charged first."""
    from perfguide.memory.tracing.tracker import make_tracker

    tracker = make_tracker(1)
    with tracker:
        for tensor in (*model.parameters(), *model.buffers()):
            tracker.charge(tensor, "weights")
    return tracker


def step_bytes(name: str, overrides: dict[str, Any], targets: tuple[str, ...], rank: int, n_layer: int) -> dict[str, Any]:
    """Two LoRA fine-tuning steps of litgpt's GPT as finetune/lora.py runs them, measured by perfguide's tracker."""
    import torch
    from litgpt.utils import chunked_cross_entropy

    switches = {f"lora_{t}": True for t in targets}
    model = build(name, n_layer=n_layer, padded_vocab_size=VOCAB, vocab_size=VOCAB, lora_r=rank, lora_alpha=16,
                  lora_dropout=0.05, **overrides, **switches)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-4, foreach=True)
    tracker = charged(model)
    forward_end = 0
    with tracker:
        states = tracker.total
        for _ in range(2):
            idx = torch.randint(0, VOCAB, (B, S))
            tracker.set_phase("forward")
            start = tracker.total
            logits = model(idx, lm_head_chunk_size=128)
            forward_end = tracker.total - start
            logits[-1] = logits[-1][..., :-1, :]
            tracker.set_phase("head")
            loss = chunked_cross_entropy(logits, torch.randint(0, VOCAB, (B, S))[..., 1:])
            tracker.set_phase("backward")
            loss.backward()
            del logits, loss
            tracker.set_phase("optimizer")
            optimizer.step()
            optimizer.zero_grad()
    return {"states": states, "forward_end": forward_end, "params": sum(p.numel() for p in model.parameters()),
            "buffers": sum(b.numel() * b.element_size() for b in model.buffers()),
            "head_params": model.lm_head.linear.weight.numel(), "embedding_params": model.transformer.wte.weight.numel(),
            "trainable_dtypes": sorted({str(p.dtype) for p in trainable}),
            "peaks": {phase: peak[0] for phase, peak in tracker.peaks.items()}}


def loss_path_bytes(vocab: int = 32768) -> dict[str, float]:
    """Bytes per b*s*V above the model's states at each phase's peak, for a one-block GPT whose logits dwarf its
    block (h 64): litgpt's chunked head and cross-entropy (bench/accuracy_loss.py LITGPT_LOSS_BYTES_PER_LOGIT)."""
    import torch
    from litgpt.utils import chunked_cross_entropy

    model = build("Llama-3-8B", n_layer=1, padded_vocab_size=vocab, vocab_size=vocab, n_embd=64, n_head=2,
                  n_query_groups=1, head_size=32, intermediate_size=128, lora_r=8, lora_alpha=16, lora_query=True,
                  lora_value=True)
    tracker = charged(model)
    states = tracker.total
    with tracker:
        logits = model(torch.randint(0, vocab, (B, S)), lm_head_chunk_size=128)
        logits[-1] = logits[-1][..., :-1, :]
        tracker.set_phase("head")
        loss = chunked_cross_entropy(logits, torch.randint(0, vocab, (B, S))[..., 1:])
        tracker.set_phase("backward")
        loss.backward()
    return {phase: round((peak[0] - states) / (B * S * vocab), 3) for phase, peak in tracker.peaks.items()}


def main() -> None:
    print(json.dumps({"loss_path_bytes_per_logit": loss_path_bytes()}))
    for key, (name, overrides, targets, rank) in CASES.items():
        one, two = (step_bytes(name, overrides, targets, rank, n) for n in (1, 2))
        per_block = (two["forward_end"] - one["forward_end"]) / (B * S)
        print(json.dumps({"case": key, "one_block": one, "two_blocks": two,
                          "block_bytes_per_token": per_block,
                          "rest_bytes_per_token": one["forward_end"] / (B * S) - per_block}))


if __name__ == "__main__":
    main()
