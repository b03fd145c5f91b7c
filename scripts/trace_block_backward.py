"""Trace the live bytes inside one recomputed decoder block's backward (memory/block_backward.py).

Run: ``HF_HUB_OFFLINE=1 .venv/bin/python scripts/trace_block_backward.py``. Real CPU tensors: a random-init
Mistral-shaped Llama (GQA 4:1, FFN 3.5 x hidden, three blocks) saved and reloaded through transformers'
bitsandbytes integration (nf4, double quant, bf16 compute), prepared with peft's prepare_model_for_kbit_training
(fp32 embeddings, norms and head: the hidden stream is fp32), LoRA on all seven Linears, bf16 autocast, gradient
checkpointing with ``use_reentrant=True`` (transformers 4.35-4.4x's default) and False (the current one). The 16-bit
case is the same model in bf16 without the kbit preparation. perfguide's live-bytes tracker (tracing/tracker.py)
counts every storage an op returns until Python frees it. A forward pre-hook on the middle block notes the live
bytes when autograd starts to recompute it (the baseline), a forward hook when the recompute ends; the peak until
the next block's recompute starts is the block's backward. Printed per token (two lengths, differenced, so the
dequantized weights and other length-free transients drop out) and per FFN unit (two FFN widths, differenced):
what the recompute keeps (``saved``) and how far the backward rises above it (``in flight``).
"""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")


#: the traced cases: (quantized base prepared by peft's kbit preparation, bf16 autocast)
CASES: dict[str, tuple[bool, bool]] = {"fp32_stream": (True, True), "half_autocast": (False, True), "half": (False, False)}


def build(h: int, i: int, kbit: bool, reentrant: bool, tmp: str) -> Any:
    import torch
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig, LlamaConfig

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=h, intermediate_size=i, num_attention_heads=4, num_key_value_heads=1, head_dim=h // 4,
                         num_hidden_layers=3, vocab_size=256, max_position_embeddings=4096, tie_word_embeddings=False)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp)
    kwargs: dict[str, Any] = {"attn_implementation": "sdpa", "dtype": torch.bfloat16}
    if kbit:
        kwargs["quantization_config"] = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                                           bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained(tmp, **kwargs)
    ckpt = {"use_reentrant": reentrant}
    if kbit:
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=True, gradient_checkpointing_kwargs=ckpt)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=ckpt)
        model.enable_input_require_grads()
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=targets))
    model.train()
    return model


def block_backward(model: Any, seq: int, autocast: bool) -> tuple[int, int]:
    """(bytes the middle block's recompute keeps, peak of its backward) above the live bytes as its recompute starts."""
    import torch

    from perfguide.memory.tracing.tracker import make_tracker

    tracker = make_tracker(1)
    layers = model.get_base_model().model.layers
    marks: dict[str, int] = {}
    state = {"backward": False, "peak": 0, "open": False}

    def pre(module: Any, args: Any) -> None:
        if state["backward"]:
            if module is layers[1].input_layernorm:
                marks["start"], state["open"], state["peak"] = tracker.total, True, tracker.total
            elif module is layers[0].input_layernorm:
                state["open"] = False

    def post(module: Any, args: Any, out: Any) -> None:
        if state["backward"]:
            marks["saved"] = tracker.total

    # the checkpointed layer's own hooks do not fire on recompute (GradientCheckpointingLayer re-runs its forward);
    # its first submodule's (the input norm) and last one's (the MLP) do
    handles = [m.input_layernorm.register_forward_pre_hook(pre) for m in layers] + [layers[1].mlp.register_forward_hook(post)]
    cls = type(tracker)
    original = cls.__torch_dispatch__

    def dispatch(self: Any, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = original(self, func, types, args, kwargs)
        if state["open"]:
            state["peak"] = max(state["peak"], self.total)
        return out

    cls.__torch_dispatch__ = dispatch  # type: ignore[method-assign]
    ids = torch.randint(0, 256, (1, seq))
    try:
        with tracker, torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = model(input_ids=ids, labels=ids).loss
            state["backward"] = True
            loss.backward()
    finally:
        cls.__torch_dispatch__ = original  # type: ignore[method-assign]
        for handle in handles:
            handle.remove()
    # non-reentrant checkpointing stops recomputing once the tensors backward needs exist (torch's early stop), so the
    # MLP hook may not fire: then only the peak is known
    return marks.get("saved", marks["start"]) - marks["start"], state["peak"] - marks["start"]


def per_token(case: str, h: int, i: int, reentrant: bool, s1: int = 256, s2: int = 512) -> tuple[float, float]:
    """(saved, peak) bytes per token of the middle block's backward, differenced over two lengths."""
    kbit, autocast = CASES[case]
    with tempfile.TemporaryDirectory() as tmp:
        model = build(h, i, kbit, reentrant, tmp)
        (k1, p1), (k2, p2) = block_backward(model, s1, autocast), block_backward(model, s2, autocast)
    return (k2 - k1) / (s2 - s1), (p2 - p1) / (s2 - s1)


def coefficients(case: str, reentrant: bool, h: int = 64, i1: int = 224, i2: int = 448) -> dict[str, float]:
    """Bytes per token the backward holds beyond the recompute's saved tensors (reentrant's: non-reentrant recomputes
    the same ones), per FFN unit ("i", two widths differenced) and per hidden unit ("h", the rest at q = h, kv = h / 4)."""
    saved1, _ = per_token(case, h, i1, True)
    saved2, _ = per_token(case, h, i2, True)
    _, peak1 = per_token(case, h, i1, reentrant)
    _, peak2 = per_token(case, h, i2, reentrant)
    per_i = ((peak2 - saved2) - (peak1 - saved1)) / (i2 - i1)
    return {"i": round(per_i, 2), "h": round(((peak1 - saved1) - per_i * i1) / h, 2)}


def main() -> int:
    for case in CASES:
        for reentrant in (True, False):
            coef = coefficients(case, reentrant)
            saved, peak = per_token(case, 128, 448, True)[0], per_token(case, 128, 448, reentrant)[1]
            check = coef["i"] * 448 + coef["h"] * 128
            print(f"{case} reentrant={reentrant}: in flight per token {coef}; at h 128, i 448: measured "
                  f"{peak - saved:.0f} B, the coefficients give {check:.0f} B (saved {saved:.0f}, peak {peak:.0f})")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
