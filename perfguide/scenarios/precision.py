"""Which dtype the matmuls run in, and what the weights are stored in (the transformers performance guides
perf_train_gpu_one "Mixed precision" and perf_train_cpu; ``torch.cuda.is_bf16_supported`` counts emulation).

bf16 needs native matrix cores (the card's ``bf16`` capability flag; transformers' own check accepts emulation,
so perfguide gates it itself). fp16 below that, unless the checkpoint was trained in bf16: fp16's range overflows on those, so fp32.
Full fine-tuning keeps fp32 master weights under autocast (true AMP); pure half weights are a later rung of
the memory ladder, chosen by the scenario, never here.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import sources
from ..data.techniques import fp16_verdict
from ..decisions import Alternative, Decision
from ..errors import ConflictingConstraintsError
from ..hardware.types import CPU, GPU
from ..model.types import ModelSpec

_AMP_SOURCE = f"{sources.TRAIN_GPU_ONE}#mixed-precision (bf16/fp16/tf32)"


@dataclass(frozen=True)
class Precision:
    """The precision plan of one device: autocast dtype, the half dtype weights may be stored in, TF32."""

    autocast: str | None           # "bf16" | "fp16" | None
    half: str | None               # dtype a frozen (LoRA) base or pure-half weights can be stored in
    pure_half_allowed: bool        # pure bf16 weights + optimizer: only with bf16 (fp16 needs fp32 master for GradScaler)
    tf32: bool
    decisions: tuple[Decision, ...]
    warnings: tuple[str, ...] = ()


def _ratio(gpu: GPU, fast: str, slow: str = "fp32") -> float | None:
    a, b = gpu.half_tflops(fast), gpu.half_tflops(slow)
    return round(a / b, 2) if a and b else None


def _check_forced_gpu(spec: ModelSpec, gpu: GPU, forced: str | None) -> None:
    if forced == "bf16" and not gpu.supports_bf16:
        raise ConflictingConstraintsError(
            f"precision='bf16' needs bf16 tensor cores but {gpu.name} ({gpu.generation}) has none; "
            "use precision='fp16' or 'fp32', or plan for an Ampere-or-newer GPU")
    if forced == "fp16" and spec.native_dtype == "bf16" and fp16_verdict(spec.model_type)[0] != "fine":
        verdict, source = fp16_verdict(spec.model_type)
        why = f"its family overflows to NaN in fp16 ({source})" if verdict == "overflows" else "perfguide knows no fp16 fine-tuning record for its family"
        raise ConflictingConstraintsError(
            f"precision='fp16' conflicts with {spec.name}, which was trained in bf16 and {why}; "
            "use precision='bf16' (on a GPU with bf16 tensor cores) or 'fp32'")


def _auto_gpu_dtype(spec: ModelSpec, gpu: GPU) -> tuple[str | None, str, list[str]]:
    """(autocast, reason, warnings) when the user left precision open."""
    if gpu.supports_bf16:
        return "bf16", f"{gpu.name} ({gpu.generation}) has bf16 tensor cores: fp32's range, no loss scaling, half the activation bytes", []
    if not gpu.has_tensor_cores:
        return None, f"{gpu.name} ({gpu.generation}) has no tensor cores: half precision buys little, fp32 keeps it simple", []
    if spec.native_dtype == "bf16":
        verdict, source = fp16_verdict(spec.model_type)
        if verdict == "fine":
            warn = (f"{spec.name} was trained in bf16 and {gpu.name} has no bf16 tensor cores: training with fp16 AMP (loss scaling), "
                    f"which fine-tunes {spec.model_type} models well ({source}); watch the loss for inf/NaN and lower the learning rate if it appears")
            return "fp16", (f"{gpu.name} ({gpu.generation}) lacks bf16; {spec.model_type} checkpoints fine-tune in fp16 AMP with loss scaling "
                            "(fp32 would run at a fraction of the tensor-core peak)"), [warn]
        why = "its family overflows to NaN in fp16" if verdict == "overflows" else "no fp16 fine-tuning record is known for its family"
        warn = (f"{spec.name} was trained in bf16 and {gpu.name} has no bf16 tensor cores: training in fp32 (slow), because {why} "
                f"({source}). An Ampere-or-newer GPU (A10, A100, L4, RTX 30xx+) runs it in bf16")
        return None, f"{gpu.name} ({gpu.generation}) lacks bf16, and {why} (bf16-trained), so fp32", [warn]
    return "fp16", f"{gpu.name} ({gpu.generation}) lacks bf16 but has fp16 tensor cores; AMP with loss scaling keeps fp32 master weights", []


def gpu_precision(spec: ModelSpec, gpu: GPU, forced: str | None) -> Precision:
    """Precision for training on one GPU; forced values are honoured or refused with one line."""
    _check_forced_gpu(spec, gpu, forced)
    if forced:
        autocast = None if forced == "fp32" else forced
        reason, warns = f"precision={forced!r} was requested", list[str]()
        if forced == "fp16" and spec.native_dtype == "bf16":
            warns = [f"{spec.name} was trained in bf16: fp16 AMP usually fine-tunes {spec.model_type} well ({fp16_verdict(spec.model_type)[1]}); "
                     "watch the loss for inf/NaN"]
    else:
        autocast, reason, warns = _auto_gpu_dtype(spec, gpu)
    alternatives = _mp_alternatives(spec, gpu, autocast)
    mixed = Decision(setting="mixed_precision", value=autocast or "no", reason=reason,
                     number=_ratio(gpu, autocast) if autocast else None, unit="x fp32 peak" if autocast else None,
                     source=_AMP_SOURCE, alternatives=alternatives)
    tf32 = gpu.supports_tf32
    tf32_reason = ("TF32 runs the matmuls autocast leaves in fp32 on tensor cores (same range, 10-bit mantissa)" if tf32 else
                   f"TF32 needs a CUDA GPU of Ampere or newer; transformers raises ValueError on {gpu.name} ({gpu.generation})")
    tf32_dec = Decision(setting="tf32", value=tf32, reason=tf32_reason, number=_ratio(gpu, "tf32") if tf32 else None,
                        unit="x fp32 peak" if tf32 else None, source=f"{sources.TRAIN_GPU_ONE}#tf32; {sources.TRAINING_ARGUMENTS}.tf32")
    # precision='fp32' is honoured for a LoRA base too: no 16-bit storage (it would compute in bf16 while saying fp32)
    half = None if forced == "fp32" else "bf16" if gpu.supports_bf16 and forced != "fp16" else ("fp16" if autocast == "fp16" else None)
    return Precision(autocast=autocast, half=half, pure_half_allowed=autocast == "bf16", tf32=tf32,
                     decisions=(mixed, tf32_dec), warnings=tuple(warns))


def _mp_alternatives(spec: ModelSpec, gpu: GPU, chosen: str | None) -> tuple[Alternative, ...]:
    out = []
    if chosen != "bf16":
        why = ("needs bf16 tensor cores; emulated bf16 is slower than fp32" if not gpu.supports_bf16
               else "bf16 is as fast as fp16 here without fp16's overflow risk; chosen only if requested")
        out.append(Alternative(value="bf16", why_not=why))
    if chosen != "fp16":
        why = ("overflows to NaN on this bf16-trained family" if spec.native_dtype == "bf16" and fp16_verdict(spec.model_type)[0] != "fine"
               else "same speed as bf16 on this GPU but needs loss scaling and overflows more easily")
        out.append(Alternative(value="fp16", why_not=why, number=_ratio(gpu, "fp16"), unit="x fp32 peak"))
    if chosen is not None:
        out.append(Alternative(value="no", why_not="fp32 matmuls run at a fraction of the tensor-core peak and keep fp32 activations",
                               number=_ratio(gpu, chosen), unit="x slower peak"))
    return tuple(out)


def cpu_precision(cpu: CPU, forced: str | None) -> Precision:
    """CPU: bf16 autocast only pays with AVX512-BF16/AMX; fp16 autocast is a silent no-op on CPU, so refused."""
    if forced == "fp16":
        raise ConflictingConstraintsError(
            "precision='fp16' does nothing on CPU (accelerate disables fp16 autocast there and trains in fp32); "
            "use precision='bf16' or 'fp32'")
    warns: list[str] = []
    if forced == "bf16":
        autocast, reason = "bf16", "precision='bf16' was requested"
        if not cpu.native_bf16:
            warns.append(f"{cpu.model_name} has no AVX512-BF16/AMX: bf16 autocast is emulated and likely slower than fp32")
    elif forced == "fp32":
        autocast, reason = None, "precision='fp32' was requested"
    elif cpu.native_bf16:
        autocast, reason = "bf16", f"{cpu.model_name} has native bf16 ({'AMX' if cpu.amx else 'AVX512-BF16'}): bf16 autocast is faster and halves activation bytes"
    else:
        autocast, reason = None, f"{cpu.model_name} has no AVX512-BF16/AMX: bf16 would be emulated (slower than fp32)"
    alts: tuple[Alternative, ...] = (Alternative(value="fp16", why_not="a silent no-op on CPU in transformers 5.x / accelerate 1.x (stays fp32)"),)
    if autocast is None:
        alts += (Alternative(value="bf16", why_not="emulated without AVX512-BF16/AMX"),)
    mixed = Decision(setting="mixed_precision", value=autocast or "no", reason=reason,
                     source=f"{sources.TRAIN_CPU}#mixed-precision", alternatives=alts)
    return Precision(autocast=autocast, half="bf16" if autocast else None, pure_half_allowed=autocast == "bf16",
                     tf32=False, decisions=(mixed,), warnings=tuple(warns))
