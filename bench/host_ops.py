"""How many eager ops the host dispatches per decoder layer and micro-step: the count behind the launch floor.

Run: ``.venv/bin/python bench/host_ops.py`` (writes bench/results/host_ops.md; CPU only, a few seconds). A small
micro-batch is launch-bound when the GPU finishes each kernel before the CPU has dispatched the next one, so the
step cannot be shorter than ops x host cost per op. perfguide/data/efficiency.json keeps the op counts measured
here (``cuda_ops_per_layer``, ``recompute_ops_factor``, ``autocast_ops_factor``,
``lora_ops_per_adapted_linear``); the host cost per op
(``kernel_launch_s``) is a prior fitted on published rows by bench/throughput_fit.py.

Method: a ``TorchDispatchMode`` counts every aten op of one forward + backward of a tiny transformers
``LlamaForCausalLM`` (SDPA attention, loss on the labels), for 1 and 3 decoder layers; the difference / 2 is one
layer's share. The count does not depend on the tensor sizes (the same modules run), so a tiny model on the CPU
counts what a 7B model dispatches on a GPU. Variants: PEFT LoRA on all Linears, gradient checkpointing, autocast;
and a tiny Qwen3-MoE (bf16, peft's fp32 adapters) with all-linear LoRA minus attention-only LoRA: the ops of peft's
ParamWrapper on the fused experts and router (the merged weight rebuilt each forward, speed/moe_lora.py).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

OUT = ROOT / "bench" / "results" / "host_ops.md"
LINEARS_PER_LAYER = 7   # q, k, v, o, gate, up, down: what target_modules="all-linear" adapts in a Llama block


def count_ops(layers: int, lora: bool, checkpointing: bool, autocast: bool = False) -> int:
    """Aten ops dispatched by one training micro-step (forward, loss, backward) of a tiny Llama; ``autocast``: under
    torch.autocast (bf16, the CPU twin of CUDA AMP: the same cast insertion), which adds the casts."""
    import torch

    if autocast:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return count_ops(layers, lora, checkpointing)
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4,
                         num_key_value_heads=4, vocab_size=128, attn_implementation="sdpa")
    model: Any = LlamaForCausalLM(config)
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.05, target_modules="all-linear"))
    if checkpointing:
        model.config.use_cache = False
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if lora:
            model.enable_input_require_grads()
    model.train()
    return _count_step(model, torch.randint(0, 128, (1, 16)))


def _count_step(model: Any, ids: Any) -> int:
    """Aten ops of one forward + loss + backward on ``ids``, after a first step that runs the lazy inits."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            self.n += 1
            return func(*args, **(kwargs or {}))

    model(input_ids=ids, labels=ids).loss.backward()          # first call: lazy inits out of the count
    counter = Count()
    with counter:
        model(input_ids=ids, labels=ids).loss.backward()
    return counter.n


def per_layer(lora: bool, checkpointing: bool, autocast: bool = False) -> float:
    return (count_ops(3, lora, checkpointing, autocast) - count_ops(1, lora, checkpointing, autocast)) / 2


def moe_ops(layers: int, targets: Any) -> int:
    """Aten ops of one micro-step of a tiny bf16 Qwen3-MoE (5 experts, top-2) with peft LoRA r=4 on ``targets``."""
    import torch

    sys.path.insert(0, str(ROOT / "tests"))
    from helpers import moe_config, moe_peft_model

    model = moe_peft_model({**moe_config("qwen3_moe", 80, 56, 5, 2), "num_hidden_layers": layers}, targets, torch.bfloat16, 4)
    return _count_step(model, torch.randint(0, 384, (1, 24)))


def param_wrapper_ops() -> float:
    """Ops peft's ParamWrapper adds per MoE layer (gate_up, down and router adapted): all-linear minus attention-only."""
    attention = ["q_proj", "k_proj", "v_proj", "o_proj"]
    return ((moe_ops(3, "all-linear") - moe_ops(1, "all-linear")) - (moe_ops(3, attention) - moe_ops(1, attention))) / 2


def deltanet_ops(layers: int, seq: int) -> int:
    """Aten ops of one micro-step of a tiny Qwen3.5 whose layers all run gated DeltaNet on transformers' reference code
    (no flash-linear-attention here), at ``seq`` tokens."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model("qwen3_5_text", hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                  num_key_value_heads=2, head_dim=16, num_hidden_layers=layers,
                                  layer_types=["linear_attention"] * layers, linear_num_key_heads=2,
                                  linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
                                  vocab_size=128, use_cache=False, pad_token_id=0, eos_token_id=1, bos_token_id=2)
    return _count_step(AutoModelForCausalLM.from_config(config).train(), torch.randint(0, 128, (1, seq)))


def deltanet_chunk_ops() -> float:
    """Ops the reference code's loop adds per DeltaNet layer for each more 64-token chunk: per layer at 512 tokens minus
    at 256, over the 4 chunks between (past the first chunks, which keep less)."""
    at = {s: (deltanet_ops(3, s) - deltanet_ops(1, s)) / 2 for s in (256, 512)}
    return (at[512] - at[256]) / 4


def measure() -> dict[str, float]:
    full, full_ckpt = per_layer(False, False), per_layer(False, True)
    lora, lora_ckpt = per_layer(True, False), per_layer(True, True)
    full_amp, lora_amp = per_layer(False, False, True), per_layer(True, False, True)
    return {"full": full, "full_ckpt": full_ckpt, "lora": lora, "lora_ckpt": lora_ckpt, "full_amp": full_amp, "lora_amp": lora_amp,
            "recompute_factor": (full_ckpt / full + lora_ckpt / lora) / 2,
            "autocast_factor": (full_amp / full + lora_amp / lora) / 2,
            "lora_per_linear": (lora - full) / LINEARS_PER_LAYER, "param_wrapper": param_wrapper_ops(),
            "deltanet_chunk": deltanet_chunk_ops()}


def report(m: dict[str, float]) -> str:
    import peft
    import torch
    import transformers

    from perfguide._data import load

    eff = load("efficiency")
    lines = [
        "# Eager ops per decoder layer (the launch floor's count)", "",
        "Regenerate: `.venv/bin/python bench/host_ops.py`. Counted with a TorchDispatchMode around one forward + "
        f"backward of a tiny transformers LlamaForCausalLM (transformers {transformers.__version__}, torch "
        f"{torch.__version__}, peft {peft.__version__}); per layer = (3 layers - 1 layer) / 2.", "",
        "| variant | aten ops per layer and micro-step |", "|---|---|",
        f"| full fine-tune | {m['full']:.0f} |", f"| + gradient checkpointing | {m['full_ckpt']:.0f} |",
        f"| LoRA on all {LINEARS_PER_LAYER} Linears | {m['lora']:.0f} |", f"| LoRA + gradient checkpointing | {m['lora_ckpt']:.0f} |",
        f"| full, under autocast (bf16) | {m['full_amp']:.0f} |", f"| LoRA, under autocast (bf16) | {m['lora_amp']:.0f} |", "",
        f"- recompute factor (with / without checkpointing, mean of full and LoRA): {m['recompute_factor']:.2f}",
        f"- autocast factor (the casts AMP inserts, mean of full and LoRA): {m['autocast_factor']:.2f}",
        f"- ops one LoRA Linear adds: {m['lora_per_linear']:.1f}",
        f"- ops peft's ParamWrapper adds per MoE layer (tiny bf16 Qwen3-MoE, all-linear minus attention-only LoRA: the "
        f"experts' gate_up / down and the router adapted as parameters): {m['param_wrapper']:.0f}",
        f"- ops a gated-DeltaNet layer on transformers' reference code adds per 64-token chunk (tiny Qwen3.5, every layer "
        f"DeltaNet, 512 minus 256 tokens over 4 chunks): {m['deltanet_chunk']:.0f}", "",
        "efficiency.json as shipped: "
        f"cuda_ops_per_layer {eff['cuda_ops_per_layer']['value']}, recompute_ops_factor {eff['recompute_ops_factor']['value']}, "
        f"autocast_ops_factor {eff['autocast_ops_factor']['value']}, "
        f"lora_ops_per_adapted_linear {eff['lora_ops_per_adapted_linear']['value']}, "
        f"param_wrapper_ops_per_moe_layer {eff['param_wrapper_ops_per_moe_layer']['value']}, "
        f"deltanet_reference_ops_per_chunk {eff['deltanet_reference_ops_per_chunk']['value']} (tests/test_host_ops.py checks they match this count).",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    from _report import publish

    return publish(report(measure()), OUT)


if __name__ == "__main__":
    raise SystemExit(main())
