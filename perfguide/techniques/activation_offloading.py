"""Activation offloading (TRL ``activation_offloading=True``; torchtune ``enable_activation_offloading``): the
tensors backward needs (with checkpointing: each layer's input) go to pinned host RAM as forward leaves a layer
and come back for its backward, on a side stream that overlaps the copy with compute.

Memory: the GPU keeps only the layers in flight; host RAM takes the rest (memory/techniques.py). Speed: twice
the offloaded bytes over PCIe per micro-step, hidden behind compute up to the overlap fraction
(speed/techniques.py). For the plain Trainer the prepare step wraps the model's forward in torch's own
``torch.autograd.graph.save_on_cpu`` (pinned), which is the same mechanism without the side stream.
"""

from __future__ import annotations

from typing import Any

from .base import EmitContext, Requires, Technique

SOURCES = (
    "https://huggingface.co/docs/trl/reducing_memory_usage#activation-offloading",
    "https://pytorch.org/torchtune/main/tutorials/memory_optimizations.html#activation-offloading",
    "https://docs.pytorch.org/docs/stable/autograd.html#torch.autograd.graph.save_on_cpu",
)


class ActivationOffloading(Technique):
    name = "activation_offloading"
    fields = ("activation_offloading",)
    summary = "checkpointed activations kept in pinned host RAM between forward and backward"
    sources = SOURCES
    requires = Requires(devices=("cuda",), tasks=("train",))
    order = 32

    def active(self, setup: Any) -> bool:
        return bool(setup.activation_offloading)

    def trl_args(self, ctx: EmitContext) -> dict[str, Any]:
        return {"activation_offloading": True} if self.active(ctx.setup) else {}

    def prepare(self, ctx: EmitContext, model: Any) -> Any:
        if self.active(ctx.setup):
            offload_saved_tensors(model, pin_memory=ctx.setup.device == "cuda")
        return model


_HOOKED = "_perfguide_activation_offloading"


def offload_saved_tensors(model: Any, pin_memory: bool) -> None:
    """Every tensor autograd saves during the model's forward goes to (pinned) host RAM; idempotent."""
    if getattr(model, _HOOKED, False):
        return
    import torch

    stack: list[Any] = []

    def enter(_module: Any, _args: Any) -> None:
        ctx = torch.autograd.graph.save_on_cpu(pin_memory=pin_memory)
        ctx.__enter__()
        stack.append(ctx)

    def leave(_module: Any, _args: Any, _out: Any) -> None:
        if stack:
            stack.pop().__exit__(None, None, None)

    model.register_forward_pre_hook(enter)
    model.register_forward_hook(leave)
    setattr(model, _HOOKED, True)


TECHNIQUES = (ActivationOffloading(),)
