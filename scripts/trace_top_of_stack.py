"""Trace what a decoder keeps after its last block at the loss peak (memory/top_of_stack.py): the final norm's saved
input and, where the head trains, the head's.

Run: ``HF_HUB_OFFLINE=1 .venv/bin/python scripts/trace_top_of_stack.py``. perfguide's fake-tensor tracer (the one
scripts/fit_activations.py fits with) on tiny checkpointed two-block models (Llama, Gemma 2, GPT-NeoX; h 64 / 128,
vocab 4096, b 2 x s 64), each dtype regime, full fine-tuning and LoRA (attention only: a frozen head). A forward
pre-hook on the final norm notes what is alive there (the blocks' inputs and the last block's output) and opens a
phase of its own. Printed, per b x s x h, at the head phase (the head's forward and the loss's forward, inside the
model's forward) and at the start of the loss's backward: what is alive beyond the blocks' inputs, i.e. the change
since the norm's entry plus the last block's output. Under autocast the backward figure is low by the 16-bit casts of
trainable weights that autocast's cache frees when the forward's autocast region ends (LoRA: ~0.9 B at h 64).
"""

from __future__ import annotations

import os
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from perfguide.memory.tracing import step, tracker
from perfguide.setup import LoraSpec, Setup

REGIMES: dict[str, dict[str, Any]] = {"half": {"weights_dtype": "bf16"}, "amp": {"autocast": "bf16"}, "fp32": {}}
B, SEQ, VOCAB = 2, 64, 4096


def llama(h: int) -> dict[str, Any]:
    return dict(model_type="llama", hidden_size=h, intermediate_size=2 * h, num_attention_heads=4, num_key_value_heads=2,
                head_dim=h // 4, num_hidden_layers=2, vocab_size=VOCAB, tie_word_embeddings=False, max_position_embeddings=1024)


def gemma2(h: int) -> dict[str, Any]:
    return dict(model_type="gemma2", hidden_size=h, intermediate_size=2 * h, num_attention_heads=4, num_key_value_heads=2,
                head_dim=h // 4, num_hidden_layers=2, vocab_size=VOCAB, max_position_embeddings=1024, query_pre_attn_scalar=16,
                attn_logit_softcapping=None, final_logit_softcapping=None, tie_word_embeddings=True,
                hidden_activation="gelu_pytorch_tanh")


def gpt_neox(h: int) -> dict[str, Any]:
    return dict(model_type="gpt_neox", hidden_size=h, intermediate_size=4 * h, num_attention_heads=4, num_hidden_layers=2,
                vocab_size=VOCAB, max_position_embeddings=1024, hidden_dropout=0.0, attention_dropout=0.0,
                tie_word_embeddings=False)


def top_bytes(config: dict[str, Any], setup: Setup, phase: str) -> float:
    """Bytes per b x s x h born from the final norm on (or the last block's output the norm keeps) alive at the
    head/loss peak."""
    seen: dict[str, Any] = {}
    make, build = step.make_tracker, step.build_on_meta

    def capture(round_to: int) -> Any:
        seen["t"] = make(round_to)
        return seen["t"]

    def hooked(cfg: dict[str, Any], s: Setup) -> Any:
        model = build(cfg, s)
        base = model.get_base_model() if hasattr(model, "get_base_model") else model

        def enter(module: Any, args: Any) -> None:
            t = seen["t"]
            seen["before"] = t.current["activations"]
            seen["output"] = args[0].numel() * args[0].element_size()   # the last block's output
            t.set_phase("top")

        inner = getattr(base, "model", None) or base.gpt_neox
        (getattr(inner, "norm", None) or inner.final_layer_norm).register_forward_pre_hook(enter)
        return model

    tracker._BORN_AS["top"] = "temporaries"
    step.make_tracker, step.build_on_meta = capture, hooked
    try:
        trace = step.run_step(config, setup)
    finally:
        step.make_tracker, step.build_on_meta = make, build
    parts = trace.phases[phase].parts
    since_entry = parts.get("temporaries", 0) + parts.get("activations", 0) - seen["before"]
    return (since_entry + seen["output"]) / (B * SEQ * config["hidden_size"])


def main() -> int:
    for name, build in (("llama", llama), ("gemma2", gemma2), ("gpt_neox", gpt_neox)):
        lora = LoraSpec(r=8, alpha=16, target_modules=("query_key_value",) if name == "gpt_neox" else ("q_proj", "v_proj"))
        for regime, kw in REGIMES.items():
            for label, extra in (("full", {}), ("lora", {"lora": lora})):
                setup = Setup(micro_batch_size=B, seq_len=SEQ, optimizer="sgd", attn_implementation="eager",
                              gradient_checkpointing=True, **kw, **extra)
                for phase in ("head", "backward_head"):
                    vals = [top_bytes(build(h), setup, phase) for h in (64, 128)]
                    print(f"{name} {regime} {label} {phase}: " + " / ".join(f"{v:.3f}" for v in vals) + " B per b*s*h (h 64 / 128)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
