"""CPU offload: optimizer states (and parameters) live in pinned host RAM; the CPU runs the optimizer step.

The last layout level of the multi-GPU ladder: every step moves the states over PCIe, and host RAM becomes
the limit (checked per node). DeepSpeed offloads the optimizer at ZeRO stages 1-3 and parameters at stage 3
(zero/offload_config.py); FSDP2 offloads parameters, gradients and optimizer together (CPUOffloadPolicy).

Memory (``place``): the offloaded states leave the device for pinned host RAM (per node). Speed (``speed``): the
offloaded parameters cross PCIe twice per micro-step, the fp32 gradients go down and the updated parameters come up
once per step, and the CPU streams the optimizer step at host memory bandwidth (``kernel_factors``: the GPU does not).
The sharding itself (what each rank holds) is memory/sharding.py's.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..memory.sharding import ONE_GPU_BUCKET
from ..optimizer_facts import row
from ..speed.rates import half_bytes, host_bandwidth_gbps, optimizer_bytes, trainable_params
from .base import EmitContext, LadderContext, Rung, Technique
from .effects import KernelFactors, SpeedContext, StepSeconds

if TYPE_CHECKING:
    from ..memory.sharding import PerDevice

SOURCES = (
    "Ren et al. 2021, ZeRO-Offload (arXiv:2101.06840)",
    "https://www.deepspeed.ai/docs/config-json/#parameter-offloading",
    "https://huggingface.co/docs/accelerate/usage_guides/fsdp",
    "https://www.deepspeed.ai/tutorials/zero-offload/ (13B on a single V100)",
)
#: one GPU: ZeRO-Offload (stage 2: optimizer states, fp32 master and the update on the CPU) before ZeRO-3 with the
#: weights offloaded too (every layer's weights cross PCIe twice per micro-step)
ONE_GPU_LAYOUTS: tuple[tuple[str, bool, bool], ...] = (("zero2", True, False), ("zero3", True, True))
_OFFLOAD = {"device": "cpu", "pin_memory": True}
#: (strategy, offload_optimizer, offload_params) layouts of the ladder's "CPU offload" level, FSDP2 first.
LAYOUTS: tuple[tuple[str, bool, bool], ...] = (("fsdp", True, True), ("zero2", True, False), ("zero3", True, False), ("zero3", True, True))


class CpuOffload(Technique):
    name = "cpu_offload"
    fields = ("offload_optimizer", "offload_params")
    summary = "optimizer states (and parameters) in pinned host RAM, stepped by the CPU"
    sources = SOURCES
    order = 60
    ladder_order = 45

    def active(self, setup: Any) -> bool:
        return setup.offload_optimizer or setup.offload_params

    def conflict(self, setup: Any) -> str | None:
        # DeepSpeed: param offload is stage 3 only, optimizer offload stages 1-3 (zero/offload_config.py);
        # FSDP offloads params, grads and optimizer together whatever the sharding; device_map offloads weights.
        if setup.offload_params and not setup.facts.offloads_params:
            return f"offload_params needs strategy 'zero3', 'fsdp', 'fsdp_shard_grad_op' or 'device_map' (inference), not {setup.strategy!r}"
        if setup.offload_optimizer and not setup.facts.offloads_optimizer:
            return f"offload_optimizer needs a sharded strategy (zero1/zero2/zero3/fsdp/fsdp_shard_grad_op), not {setup.strategy!r}"
        return None

    def label_word(self, setup: Any) -> str | None:
        return "offload" if self.active(setup) else None

    def off(self) -> dict[str, Any]:
        return {"strategy": "single", "offload_optimizer": False, "offload_params": False}

    def rungs(self, ctx: LadderContext) -> list[Rung]:
        """One GPU (train_gpu_one): the last full fine-tuning rung keeps exact AMP semantics (fp32 masters on the
        CPU) and gives up speed: the CPU steps the optimizer and the states cross PCIe every step."""
        b = ctx.base
        forced = ctx.wants.get("strategy")
        if (ctx.finetune != "full" or b.device != "cuda" or b.world_size != 1 or b.strategy != "single"
                or ctx.wants.get("allow_offload") is False):
            return []
        layouts = [lay for lay in ONE_GPU_LAYOUTS if forced in (None, lay[0])]
        autocast = "bf16" if ctx.autocast == "fp8" else ctx.autocast
        templates = tuple(b.replace(weights_dtype="fp32", autocast=autocast, optimizer=ctx.optimizer or "adamw_torch", strategy=st,
                                    offload_optimizer=oo, offload_params=op)   # activation offloading: an axis of every rung
                          for st, oo, op in layouts)
        return [Rung("CPU offload (one GPU)", "optimizer states, fp32 masters and the update on the CPU (ZeRO-Offload): exact AMP, slower", templates)]

    def place(self, setup: Any, dev: PerDevice) -> PerDevice:
        if not self.active(setup):
            return dev
        weights, grads, opt, cpu = dev.weights, dev.grads, dev.optimizer, 0
        notes = list(dev.notes)
        offload_all = setup.is_fsdp   # FSDP offload is all-or-nothing: params, grads and optimizer together
        if (setup.offload_optimizer and setup.shards_optimizer) or offload_all:
            cpu, opt = cpu + opt, 0
            if setup.is_deepspeed or offload_all:
                cpu, grads = cpu + grads, 0   # reduced gradient partitions are copied to pinned host buffers for the CPU step
            notes.append("optimizer states offloaded to CPU RAM")
        if (setup.offload_params and setup.gathers_params) or offload_all:
            cpu, weights = cpu + weights, 0
            notes.append("parameters offloaded to CPU RAM")
        return replace(dev, weights=weights, grads=grads, optimizer=opt, cpu_ram=dev.cpu_ram + cpu * setup.num_gpus,
                       notes=tuple(notes))

    def kernel_factors(self, setup: Any) -> KernelFactors:
        return KernelFactors(device_optimizer=0.0) if setup.task == "train" and setup.offload_optimizer else KernelFactors()

    def speed(self, ctx: SpeedContext) -> StepSeconds:
        """Seconds per micro-step moving parameters over PCIe, per step moving grads/params and running the CPU optimizer."""
        s = ctx.setup
        if not self.active(s):
            return StepSeconds()
        shards = s.world_size if s.strategy != "single" else 1
        per_micro = 2 * ctx.spec.total_params * half_bytes(s) / shards / ctx.pcie if s.offload_params else 0.0
        per_step = 0.0
        if s.offload_optimizer:
            trainable = trainable_params(ctx.spec, s) / shards
            per_step = trainable * (4 + half_bytes(s)) / ctx.pcie              # fp32 grads down, updated params up
            per_step += optimizer_bytes(ctx.spec, s) / (host_bandwidth_gbps(ctx.hardware.cpu) * 1e9)
        return StepSeconds(transfer=per_micro, per_step=per_step)

    def fsdp_config(self, ctx: EmitContext) -> dict[str, Any]:
        # FSDP offload is all-or-nothing: params, grads and optimizer together
        return {"cpu_offload": self.active(ctx.setup)} if ctx.setup.is_fsdp else {}

    def deepspeed_zero(self, ctx: EmitContext) -> dict[str, Any]:
        s = ctx.setup
        out: dict[str, Any] = {}
        if s.offload_optimizer:
            out["offload_optimizer"] = dict(_OFFLOAD)
        if s.offload_params and s.zero_stage == 3:
            out["offload_param"] = dict(_OFFLOAD)
        if s.world_size == 1 and s.zero_stage == 2:
            out.update(allgather_bucket_size=ONE_GPU_BUCKET, reduce_bucket_size=ONE_GPU_BUCKET)
        return out

    def deepspeed_top(self, ctx: EmitContext) -> dict[str, Any]:
        s = ctx.setup
        if not s.offload_optimizer:
            return {}
        if s.optimizer is None or row(s.optimizer).offloadable:
            # an offloaded optimizer must step on the CPU: DeepSpeed's CPU AdamW does, torch's fused CUDA one cannot
            return {"optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}}}
        # keep the plan's optimizer; DeepSpeed otherwise insists on its own CPU optimizer with offload
        return {"zero_force_ds_cpu_optimizer": False}


TECHNIQUES = (CpuOffload(),)
