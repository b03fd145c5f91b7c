"""Count the bytes one eager Llama block's memory-bound kernels move under torchtune's modules and under transformers'.

Run: ``PYTHONPATH=<torchtune source> .venv/bin/python bench/throughput_traffic.py``, where ``<torchtune source>`` holds
the ``torchtune`` package of pytorch/torchtune@1814feb17a9038e1a8053ce93111bd26774a8db6 (the commit of the README's
2024-11 'Optimization flags' table: ``git archive 1814feb1 torchtune | tar -x``) and its import-time dependencies
(omegaconf, sentencepiece, tiktoken). It prints the numbers efficiency.json's ``framework_eager_block_traffic`` row
holds. Both blocks run forward and backward on fake tensors (no memory, no compute) under perfguide's tracker, the
count scripts/fit_traffic.py uses for data/traffic.json: every non-GEMM, non-view op's input + output bytes, SDPA
dispatched as CUDA's flash kernel (compute-bound, not counted). Per token = the slope between 256 and 512 tokens,
so per-call constants cancel. Why it matters: the speed model prices an eager block's pointwise kernels from these
bytes, and torchtune's block spells RMSNorm and RoPE in fp32 (x.float(), pow, mean, rsqrt, type_as; RoPE as
x.float().reshape(..., 2), per-half products, stack, flatten, type_as) where transformers' RoPE stays in bf16.
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: Llama 3.2 3B's widths: hidden, MLP, heads, KV heads, head dim
H, MLP, HEADS, KV_HEADS, HEAD_DIM = 3072, 8192, 24, 8, 128
TOKENS = (256, 512)


def _stub_nf4() -> None:
    """torchtune imports torchao.dtypes.nf4tensor for its QLoRA path; torchao >= 0.1x moved it. A stub module lets
    the full-precision modules import (nothing here touches NF4)."""
    import torchao.dtypes  # noqa: F401  (the parent package must exist before its child is faked)

    if "torchao.dtypes.nf4tensor" in sys.modules:
        return
    stub = types.ModuleType("torchao.dtypes.nf4tensor")
    stub.NF4Tensor = type("NF4Tensor", (), {})  # type: ignore[attr-defined]
    stub.linear_nf4 = stub.to_nf4 = None  # type: ignore[attr-defined]
    stub.implements = lambda *a, **k: (lambda f: f)  # type: ignore[attr-defined]
    sys.modules["torchao.dtypes.nf4tensor"] = stub


def torchtune_block() -> Callable[[Any], Any]:
    import torch

    _stub_nf4()
    from torchtune.models.llama3_2._component_builders import llama3_2

    model = llama3_2(vocab_size=256, num_layers=1, num_heads=HEADS, num_kv_heads=KV_HEADS, embed_dim=H,
                     max_seq_len=8192, intermediate_dim=MLP)
    layer = model.layers[0].to(torch.bfloat16)
    return lambda x: layer(x)


def transformers_block() -> Callable[[Any], Any]:
    import torch
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    cfg = LlamaConfig(hidden_size=H, intermediate_size=MLP, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                      head_dim=HEAD_DIM, num_hidden_layers=1, vocab_size=256)
    cfg._attn_implementation = "sdpa"
    layer = LlamaDecoderLayer(cfg, 0).to(torch.bfloat16)
    rope = LlamaRotaryEmbedding(cfg)

    def run(x: Any) -> Any:
        pos = torch.arange(x.shape[1]).unsqueeze(0)
        return layer(x, attention_mask=None, position_ids=pos, position_embeddings=rope(x, pos))   # cos/sin: once per model
    return run


def traced(build: Callable[[], Callable[[Any], Any]], tokens: int) -> dict[str, int]:
    """Bytes the block's memory-bound ops move, by phase, for one sequence of ``tokens`` bf16 hidden states."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from perfguide.memory.tracing.cuda_emulation import make_cuda_emulation, make_scalar_fallback
    from perfguide.memory.tracing.tracker import make_tracker

    block = build()
    emulation = make_cuda_emulation(None, emulate_sdpa=True)
    with contextlib.ExitStack() as stack:
        stack.enter_context(FakeTensorMode(allow_non_fake_inputs=True))
        stack.enter_context(make_scalar_fallback())
        x = torch.empty(1, tokens, H, dtype=torch.bfloat16, requires_grad=True)
        tracker = stack.enter_context(make_tracker(1))
        stack.enter_context(emulation)
        tracker.set_phase("forward")
        out = block(x)
        out = out[0] if isinstance(out, tuple) else out
        tracker.set_phase("head")   # the sum that seeds the backward is not the block's
        loss = out.sum()
        tracker.set_phase("backward")
        emulation.backward(loss)
    return dict(tracker.traffic)


def per_token(build: Callable[[], Callable[[Any], Any]]) -> dict[str, float]:
    lo, hi = (traced(build, t) for t in TOKENS)
    span = TOKENS[1] - TOKENS[0]
    phases = {ph: (hi.get(ph, 0) - lo.get(ph, 0)) / span for ph in ("forward", "backward")}
    return {"bytes_per_token_block": phases["forward"] + phases["backward"], "forward": phases["forward"]}


def main() -> int:
    hf = per_token(transformers_block)
    tt = per_token(torchtune_block)
    print("transformers", hf)
    print("torchtune", tt)
    print(f"torchtune / transformers: {tt['bytes_per_token_block'] / hf['bytes_per_token_block']:.3f} "
          f"(forward {tt['forward'] / hf['forward']:.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
