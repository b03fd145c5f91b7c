"""Bytes a Llama block keeps for backward, eager against torch.compile (Inductor), per token, on real CPU tensors.

Run: ``nice .venv/bin/python scripts/trace_compiled_block.py [--write]`` (a few minutes on two cores: Inductor
compiles each block's forward and backward once per shape).

Two block codes at Llama-3.2-3B's own widths (hidden 3,072, 24 query / 8 key-value heads of 128, FFN 8,192), bf16
weights and activations, every parameter trainable:

* ``torchtune``: torchtune 0.4.0's ``TransformerSelfAttentionLayer`` as its Llama 3.2 builder assembles it, copied
  op for op (modules/rms_norm.py: fp32 upcast, ``x_normed.type_as(x) * scale``; models/llama3_1/
  _position_embeddings.py: fp32 rotation, the rope cache gathered at ``input_pos``; modules/attention.py: k and v
  expanded to every query head and reshaped (a copy) before attention; modules/feed_forward.py: ``w2(silu(w1 x) *
  w3 x)``). torchtune's ``training.compile_model`` compiles each such layer on its own (``m.compile()`` per
  layer, torch >= 2.5), which is what runs here;
* ``transformers``: transformers' ``LlamaDecoderLayer`` (the installed release), the code perfguide's activation
  table (data/activations.json) was traced on, fed the model's rotary (cos, sin) as its model does.

``--lora``: PEFT's LoRA (the installed peft, r 16) on transformers' block, its base frozen bf16, adapters fp32 (PEFT's
default ``autocast_adapter_dtype`` on a bf16 base) or bf16, on all seven Linears or q / v, lora_dropout 0 or 0.05
(``LORA_SETUPS``; docs/validation.md section 39). Off CUDA eager dropout keeps its mask in the input's dtype
(ATen ``_dropout_impl``), CUDA's ``native_dropout`` and the compiled graph a 1-byte one.

Eager: the storages autograd's saved-tensor hooks see (``saved_tensors_hooks``). Compiled: the tensors
AOTAutograd's compiled function saved for its backward (``grad_fn.saved_tensors`` of the layer output's
``CompiledFunctionBackward``: the min-cut partitioner's choice). Both leave out the parameters and the rotary
inputs shared by every block, count each storage once, and keep the block's own input (which the next block's
output would otherwise free). Two token counts, differenced: the per-token bytes (attention's per-row
statistics included; nothing in a block grows with tokens squared under a flash kernel).

Attention is SDPA (causal), not torchtune's packed flex_attention: both save q, k, v, the output and the per-row
log-sum-exp, which is what the partitioner sees around an attention kernel it cannot recompute; a stand-in
for the document mask. CPU Inductor: the saved set is chosen by the partitioner on the joint graph before any
lowering (torch/_functorch/partitioners.py, device-independent); what could differ on CUDA is the decomposition
of an op, none of which here (mm, SDPA, pointwise, mean) decomposes differently on CPU.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "perfguide" / "data" / "techniques.json"   # its ``compiled_blocks`` entry
#: Llama-3.2-3B (meta-llama/Llama-3.2-3B config.json)
DIMS = {"h": 3072, "heads": 24, "kv": 8, "d": 128, "i": 8192}
SHAPES = ((1, 128), (1, 256))   # (batch, sequence); the difference is the per-token bytes


def _torchtune_layer(dims: dict[str, int], max_seq: int) -> Any:
    """torchtune 0.4.0's Llama 3.2 self-attention layer, op for op (see the module docstring)."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    h, heads, kv, d, i = dims["h"], dims["heads"], dims["kv"], dims["d"], dims["i"]

    class RMSNorm(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = nn.Parameter(torch.ones(h))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x_fp32 = x.float()
            x_normed = (x_fp32 * torch.rsqrt(x_fp32.pow(2).mean(-1, keepdim=True) + 1e-5)).type_as(x)
            return x_normed * self.scale

    theta = 1.0 / (500000.0 ** (torch.arange(0, d, 2)[: d // 2].float() / d))
    idx = torch.outer(torch.arange(max_seq).float(), theta)
    cache = torch.stack([torch.cos(idx), torch.sin(idx)], dim=-1)   # [max_seq, d/2, 2] fp32, a buffer

    def rope(x: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        rope_cache = cache[input_pos]
        xshaped = x.float().reshape(*x.shape[:-1], -1, 2)
        rope_cache = rope_cache.view(-1, xshaped.size(1), 1, xshaped.size(3), 2)
        x_out = torch.stack([xshaped[..., 0] * rope_cache[..., 0] - xshaped[..., 1] * rope_cache[..., 1],
                             xshaped[..., 1] * rope_cache[..., 0] + xshaped[..., 0] * rope_cache[..., 1]], -1)
        return x_out.flatten(3).type_as(x)

    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.sa_norm, self.mlp_norm = RMSNorm(), RMSNorm()
            self.q_proj = nn.Linear(h, heads * d, bias=False)
            self.k_proj = nn.Linear(h, kv * d, bias=False)
            self.v_proj = nn.Linear(h, kv * d, bias=False)
            self.output_proj = nn.Linear(heads * d, h, bias=False)
            self.w1, self.w3 = nn.Linear(h, i, bias=False), nn.Linear(h, i, bias=False)
            self.w2 = nn.Linear(i, h, bias=False)

        def attn(self, x: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
            b, s, _ = x.shape
            q = rope(self.q_proj(x).view(b, s, heads, d), input_pos).transpose(1, 2)
            k = rope(self.k_proj(x).view(b, s, -1, d), input_pos)
            k = k.view(b, s, kv, 1, d).expand(b, s, kv, heads // kv, d).reshape(b, s, -1, d).transpose(1, 2)
            v = self.v_proj(x).view(b, s, kv, 1, d).expand(b, s, kv, heads // kv, d).reshape(b, s, -1, d).transpose(1, 2)
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.output_proj(out.transpose(1, 2).contiguous().view(b, s, -1))

        def forward(self, x: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
            hid = self.attn(self.sa_norm(x), input_pos) + x
            y = self.mlp_norm(hid)
            return hid + self.w2(F.silu(self.w1(y)) * self.w3(y))

    return Layer()


def _transformers_layer(dims: dict[str, int]) -> Any:
    """transformers' LlamaDecoderLayer at the same widths (sdpa attention)."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    cfg = LlamaConfig(hidden_size=dims["h"], num_attention_heads=dims["heads"], num_key_value_heads=dims["kv"],
                      head_dim=dims["d"], intermediate_size=dims["i"], num_hidden_layers=1, vocab_size=256,
                      rope_theta=500000.0, max_position_embeddings=4096)
    cfg._attn_implementation = "sdpa"
    layer = LlamaDecoderLayer(cfg, layer_idx=0)
    layer.rotary = LlamaRotaryEmbedding(cfg)   # model-level in transformers: its (cos, sin) are shared inputs
    return layer


def _call(code: str, layer: Any, x: Any, pos: Any, fn: Any) -> Any:
    """One forward of ``fn`` (the layer or its compiled self); returns (output, the shared inputs)."""
    if code == "torchtune":
        return fn(x, pos), ()
    cos, sin = layer.rotary(x, pos)
    out = fn(x, position_embeddings=(cos, sin), attention_mask=None, position_ids=pos)
    return (out[0] if isinstance(out, tuple) else out), (cos, sin)


def _storage_bytes(tensors: Any, skip: set[int]) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        st = t.untyped_storage()
        if st.data_ptr() not in skip:
            seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


#: PEFT LoRA setups traced on transformers' block: (targets, adapters' dtype, lora_dropout); r 16, frozen bf16 base
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LORA_SETUPS = {
    "all:fp32:0": (ALL_LINEAR, "fp32", 0.0), "all:fp32:0.05": (ALL_LINEAR, "fp32", 0.05),
    "all:bf16:0": (ALL_LINEAR, "bf16", 0.0), "all:bf16:0.05": (ALL_LINEAR, "bf16", 0.05),
    "qv:fp32:0": (("q_proj", "v_proj"), "fp32", 0.0), "qv:fp32:0.05": (("q_proj", "v_proj"), "fp32", 0.05),
    "qv:bf16:0": (("q_proj", "v_proj"), "bf16", 0.0),
}
LORA_R = 16


def _add_lora(layer: Any, lora: tuple[tuple[str, ...], str, float]) -> Any:
    """PEFT's LoRA on the block (the installed peft's ``inject_adapter_in_model``), its base frozen; the adapters in
    fp32 as ``get_peft_model``'s default ``autocast_adapter_dtype`` leaves them on a bf16 base, or kept bf16."""
    import torch
    from peft import LoraConfig, inject_adapter_in_model

    targets, dtype, dropout = lora
    layer = inject_adapter_in_model(LoraConfig(r=LORA_R, lora_alpha=2 * LORA_R, lora_dropout=dropout,
                                               target_modules=list(targets)), layer)
    for name, p in layer.named_parameters():
        p.requires_grad_("lora_" in name)
        if "lora_" in name:
            p.data = p.data.to(torch.float32 if dtype == "fp32" else torch.bfloat16)
    return layer.train()


def saved_bytes(code: str, compiled: bool, batch: int, seq: int, dims: dict[str, int] = DIMS,
                lora: tuple[tuple[str, ...], str, float] | None = None) -> int:
    """Bytes one block saves for backward at (batch, seq), bf16, every parameter trainable (or ``lora``: PEFT's
    adapters on the frozen block)."""
    import torch

    torch.manual_seed(0)
    layer = (_torchtune_layer(dims, 4096) if code == "torchtune" else _transformers_layer(dims)).to(torch.bfloat16)
    if lora is not None:
        layer = _add_lora(layer, lora)
    params = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    x = (torch.randn(batch, seq, dims["h"], dtype=torch.bfloat16, requires_grad=True) * 1.0)
    pos = torch.arange(seq).unsqueeze(0).expand(batch, seq)
    if compiled:
        torch._dynamo.reset()
        fn = torch.compile(layer, dynamic=False)
        out, shared = _call(code, layer, x, pos, fn)
        node = out.grad_fn
        while node is not None and "CompiledFunction" not in type(node).__name__:   # views of the graph's output
            node = node.next_functions[0][0]
        assert node is not None, "no compiled function in the output's history (a graph break?)"
        tensors = list(node.saved_tensors)
    else:
        tensors = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: tensors.append(t) or t, lambda t: t):
            out, shared = _call(code, layer, x, pos, layer)
    skip = params | {t.untyped_storage().data_ptr() for t in shared}
    total = _storage_bytes(tensors, skip)
    out.float().sum().backward()   # the backward runs on what was saved (a check that nothing was left out)
    return total


def per_token(code: str, compiled: bool, dims: dict[str, int] = DIMS,
              lora: tuple[tuple[str, ...], str, float] | None = None) -> float:
    (b0, s0), (b1, s1) = SHAPES
    return ((saved_bytes(code, compiled, b1, s1, dims, lora) - saved_bytes(code, compiled, b0, s0, dims, lora))
            / (b1 * s1 - b0 * s0))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--write", action="store_true", help="write the compiled_blocks entry of perfguide/data/techniques.json")
    ap.add_argument("--lora", action="store_true", help="trace the PEFT LoRA setups (LORA_SETUPS) only; --write merges them")
    args = ap.parse_args()
    if args.lora:
        return _main_lora(args.write)
    import torch
    import transformers

    blocks: dict[str, Any] = {}
    for code in ("transformers", "torchtune"):
        eager, comp = per_token(code, False), per_token(code, True)
        blocks[f"{code}:llama"] = {"eager_bytes_per_token": round(eager), "compiled_bytes_per_token": round(comp),
                                   "hidden_size": DIMS["h"], "intermediate_size": DIMS["i"]}
        print(code, blocks[f"{code}:llama"], f"compiled / eager {comp / eager:.4f}", flush=True)
    if args.write:
        doc = json.loads(DATA.read_text())
        doc["compiled_blocks"] = {
            "source": (f"scripts/trace_compiled_block.py: Llama-3.2-3B's block (h 3072, 24 / 8 heads of 128, FFN 8192), "
                       f"bf16, every parameter trainable, SDPA causal, real CPU tensors, (batch, seq) {SHAPES} "
                       f"differenced; torch {torch.__version__} CPU Inductor (torch.compile of the block), transformers "
                       f"{transformers.__version__}'s LlamaDecoderLayer and torchtune 0.4.0's TransformerSelfAttentionLayer "
                       "copied op for op; eager: saved_tensors_hooks storages, compiled: CompiledFunctionBackward's "
                       "saved tensors (the min-cut partitioner's choice); parameters and the shared rotary left out"),
            "blocks": blocks}
        DATA.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    return 0 if all(math.isfinite(b["compiled_bytes_per_token"]) for b in blocks.values()) else 1


def _main_lora(write: bool) -> int:
    """PEFT LoRA (r 16) on transformers' frozen bf16 block, each of LORA_SETUPS eager and compiled; ``write`` merges
    them into ``compiled_blocks`` as ``transformers:llama:lora:<targets>:<adapters' dtype>:<dropout>``."""
    import peft

    blocks: dict[str, Any] = {}
    for key, lora in LORA_SETUPS.items():
        eager, comp = per_token("transformers", False, lora=lora), per_token("transformers", True, lora=lora)
        blocks[f"transformers:llama:lora:{key}"] = {"eager_bytes_per_token": round(eager), "compiled_bytes_per_token": round(comp),
                                                    "hidden_size": DIMS["h"], "intermediate_size": DIMS["i"]}
        print(key, blocks[f"transformers:llama:lora:{key}"], f"eager - compiled {eager - comp:.0f}", flush=True)
    if write:
        doc = json.loads(DATA.read_text())
        entry = doc["compiled_blocks"]
        entry["blocks"] = {k: v for k, v in entry["blocks"].items() if ":lora:" not in k} | blocks
        if "LoRA:" not in entry["source"]:
            entry["source"] += (f". LoRA: ``--lora``, peft {peft.__version__}'s inject_adapter_in_model on the same "
                                "transformers block, base frozen bf16, r 16 (alpha 32), keyed lora:<targets: all = q/k/v/o/"
                                "gate/up/down, qv = q/v>:<adapters: fp32 as get_peft_model's autocast_adapter_dtype leaves "
                                "them, or bf16>:<lora_dropout>; CPU eager dropout keeps an input-dtype mask where CUDA's "
                                "native_dropout keeps a 1-byte one (the compiled graph keeps the 1-byte mask on either)")
        DATA.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
