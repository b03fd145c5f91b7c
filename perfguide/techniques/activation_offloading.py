"""Activation offloading (TRL ``activation_offloading=True``; torchtune ``enable_activation_offloading``): the
tensors backward needs (with checkpointing: each layer's input) go to pinned host RAM as forward leaves a layer
and come back for its backward, on a side stream that overlaps the copy with compute.

Memory: the GPU keeps only the layers in flight (the one computing and the one copying); host RAM takes the
rest (``memory``). Speed: twice the offloaded bytes over PCIe per micro-step, hidden behind compute up to the
overlap fraction (``speed``); the copy back is issued when backward reaches each layer (``StepSeconds.fetch``), so
it hides only behind kernels the host queued ahead of it (none after a bitsandbytes step drains the GPU in backward). For the plain Trainer the prepare step wraps the model's forward in torch's own
saved-tensor hooks (``torch.autograd.graph.saved_tensors_hooks``, pinned host copies), the mechanism of torch's
``save_on_cpu`` without its copies of the weights and without the side stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..data.techniques import constant
from .base import EmitContext, Requires, Technique
from .effects import MemoryContext, MemoryTerms, SpeedContext, StepSeconds
from .gradient_checkpointing import held_activations

#: layers whose checkpointed inputs stay on the GPU while offloading: the one computing and the one copying
LAYERS_IN_FLIGHT = 2

SOURCES = (
    "https://huggingface.co/docs/trl/reducing_memory_usage#activation-offloading",
    "https://pytorch.org/torchtune/main/tutorials/memory_optimizations.html#activation-offloading",
    "https://docs.pytorch.org/docs/stable/autograd.html#torch.autograd.graph.saved_tensors_hooks",
)


class ActivationOffloading(Technique):
    name = "activation_offloading"
    fields = ("activation_offloading",)
    summary = "checkpointed activations kept in pinned host RAM between forward and backward"
    sources = SOURCES
    requires = Requires(devices=("cuda",), tasks=("train",), binding=True)
    order = 32
    label_order = 63
    switch = "activation_offloading"
    #: tried inside every rung, as checkpointing is (the combination without checkpointing is not priced, see why_not):
    #: it keeps the training the same, so it must not wait for a rung that gives something up
    axis = True

    def axis_values(self, ctx: Any) -> list[dict[str, Any]]:
        want = ctx.wants.get(self.switch)
        if ctx.base.device != "cuda" or ctx.base.task != "train" or want is False:
            return [{"activation_offloading": False}]
        return [{"activation_offloading": True}] if want is True else [{"activation_offloading": False}, {"activation_offloading": True}]

    def active(self, setup: Any) -> bool:
        return bool(setup.activation_offloading)

    def label_word(self, setup: Any) -> str | None:
        return "act-offload" if self.active(setup) else None

    def off(self) -> dict[str, Any]:
        return {"activation_offloading": False}

    def why_not(self, setup: Any, hardware: Any = None, model: Any = None) -> str | None:
        """Without checkpointing the memory hook would move every saved tensor while the speed hook copies only the
        held activations: the two paths would price different bytes, so the combination is not priced at all."""
        base = super().why_not(setup, hardware, model)
        if base or not self.active(setup) or setup.gradient_checkpointing:
            return base
        return ("activation offloading is priced with gradient checkpointing (TRL and torchtune offload the checkpointed "
                "layer inputs); set gradient_checkpointing=True with it")

    def memory(self, ctx: MemoryContext, terms: MemoryTerms) -> MemoryTerms:
        if not self.active(ctx.setup):
            return terms
        on_gpu, to_host = split_boundaries(terms.activations, ctx.spec.total_layers)
        # cpu_ram is the node's (every rank on it offloads its own), as the states' offload counts it
        return terms.changed("checkpointed activations offloaded to pinned host RAM", activations=on_gpu,
                             cpu_ram=terms.cpu_ram + to_host * ctx.setup.num_gpus)

    def speed(self, ctx: SpeedContext) -> StepSeconds:
        if not self.active(ctx.setup):
            return StepSeconds()
        from . import shaped

        held = held_activations(ctx.spec, shaped(ctx.setup))
        to_host = split_boundaries(held, ctx.spec.total_layers)[1]
        # the copy back (one of the passes) is issued by the unpack hook when backward reaches the layer
        return StepSeconds(transfer=constant("activation_offload_pcie_passes") * to_host / ctx.pcie, fetch=to_host / ctx.pcie)

    def trl_args(self, ctx: EmitContext) -> dict[str, Any]:
        return {"activation_offloading": self.active(ctx.setup)}   # written out both ways: the config says what runs

    def prepare(self, ctx: EmitContext, model: Any) -> Any:
        if self.active(ctx.setup):
            offload_saved_tensors(model, pin_memory=ctx.setup.device == "cuda")
        return model


def split_boundaries(boundaries: int, layers: int) -> tuple[int, int]:
    """(bytes kept on the GPU, bytes moved to host RAM) of the checkpointed layer inputs under activation offloading."""
    per_layer = boundaries // max(1, layers)
    on_gpu = per_layer * min(layers, LAYERS_IN_FLIGHT)
    return on_gpu, boundaries - on_gpu


_HOOKED = "_perfguide_activation_offloading"
#: saved tensors smaller than this stay on the device: the copy would cost more than it frees (torchtune's
#: OffloadActivations keeps tensors under its min_offload_size on the GPU for the same reason)
MIN_OFFLOAD_BYTES = 1024


@dataclass
class OffloadStats:
    """What the hooks did during the model's forwards: bytes copied to host RAM, bytes left in place."""

    moved_bytes: int = 0
    kept_bytes: int = 0


def offload_saved_tensors(model: Any, pin_memory: bool) -> OffloadStats:
    """Every activation autograd saves during the model's forward goes to (pinned) host RAM; idempotent.

    Parameters are left in place (autograd saves a Linear's weight for its input gradient; copying it would send
    the weights over PCIe every micro-step and pin a second copy in host RAM), as are tensors under
    MIN_OFFLOAD_BYTES. torch's own ``save_on_cpu`` copies every saved tensor, weights included, hence these hooks.
    """
    stats = getattr(model, _HOOKED, None)
    if isinstance(stats, OffloadStats):
        return stats
    import torch

    stats = OffloadStats()

    def pack(t: Any) -> Any:
        nbytes = t.numel() * t.element_size()
        if isinstance(t, torch.nn.Parameter) or nbytes < MIN_OFFLOAD_BYTES:
            stats.kept_bytes += nbytes
            return t
        stats.moved_bytes += nbytes
        host = torch.empty(t.size(), dtype=t.dtype, layout=t.layout, pin_memory=pin_memory)
        host.copy_(t, non_blocking=pin_memory)
        return (t.device, host)

    def unpack(packed: Any) -> Any:
        if isinstance(packed, tuple):
            device, host = packed
            return host.to(device, non_blocking=pin_memory)
        return packed

    stack: list[Any] = []

    def enter(_module: Any, _args: Any) -> None:
        hooks = torch.autograd.graph.saved_tensors_hooks(pack, unpack)
        hooks.__enter__()
        stack.append(hooks)

    def leave(_module: Any, _args: Any, _out: Any) -> None:
        if stack:
            stack.pop().__exit__(None, None, None)

    model.register_forward_pre_hook(enter)
    model.register_forward_hook(leave)
    setattr(model, _HOOKED, stats)
    return stats


TECHNIQUES = (ActivationOffloading(),)
