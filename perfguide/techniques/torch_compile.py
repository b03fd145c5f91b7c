"""torch.compile: fuse the model's graph; with a static KV cache, decode replays CUDA graphs.

For serving it pays when latency is preferred and decode is launch-overhead or bandwidth bound; every new
shape recompiles, so it is not chosen for throughput serving with varied batches.
"""

from __future__ import annotations

from typing import Any

from .base import EmitContext, Technique

SOURCES = (
    "https://huggingface.co/docs/transformers/llm_optims#static-kv-cache-and-torchcompile",
    "https://docs.pytorch.org/docs/stable/generated/torch.compile.html",
)


class TorchCompile(Technique):
    name = "torch_compile"
    fields = ("torch_compile", "cache_implementation")
    summary = "compile the model; with a static KV cache, decode runs as CUDA graphs"
    sources = SOURCES
    order = 70

    def active(self, setup: Any) -> bool:
        return setup.torch_compile

    def training_args(self, ctx: EmitContext) -> dict[str, Any]:
        return {"torch_compile": True} if ctx.setup.torch_compile else {}


TECHNIQUES = (TorchCompile(),)
