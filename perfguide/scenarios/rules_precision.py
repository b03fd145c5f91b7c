"""Precision, decided once for training and inference: which dtype the matmuls run in and what the weights are
stored in (the transformers performance guides perf_train_gpu_one "Mixed precision", perf_infer_gpu_one and
perf_train_cpu; ``torch.cuda.is_bf16_supported`` counts emulation).

bf16 needs native matrix cores (the card's ``bf16`` capability flag; transformers' own check accepts emulation,
so perfguide gates it itself). fp16 below that, unless the checkpoint was trained in bf16: fp16's range overflows on those, so fp32.
Full fine-tuning keeps fp32 master weights under autocast (true AMP); pure half weights are a later rung of
the memory ladder, chosen by the scenario, never here.

A forced precision gets one verdict whatever the task (``forced_gpu_warnings``): honoured, with a warning where it
is risky (bf16 emulated on a card without bf16 tensor cores; fp16 on a bf16-trained family with no fp16 record),
and refused in one line only where it cannot run as asked (fp16 on a family known to overflow; fp16 training on
a CPU, which accelerate turns into fp32).
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import sources
from .._data import fact_value
from ..data.techniques import fp16_verdict
from ..decisions import Alternative, Decision
from ..errors import ConflictingConstraintsError
from ..hardware.types import CPU, GPU
from ..model.types import ModelSpec
from ..speed.rates import cpu_path, cpu_peak_gflops, gpu_peak_tflops

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
    if not a and fast == "bf16" and not gpu.supports_bf16:   # emulated: at the rate the speed model charges it
        a = gpu_peak_tflops(gpu, "bf16")[0]
    return round(a / b, 2) if a and b else None


def forced_gpu_warnings(spec: ModelSpec, gpu: GPU, forced: str | None) -> list[str]:
    """The one verdict on a forced GPU precision, for training and inference: its warnings, or a one-line refusal."""
    warns: list[str] = []
    if forced == "bf16" and not gpu.supports_bf16:
        warns.append(f"precision='bf16' on {gpu.name} ({gpu.generation}), which has no bf16 tensor cores: torch emulates it "
                     f"(torch.cuda.is_bf16_supported() counts emulation, {sources.BF16_EMULATION}), so expect fp32-or-slower "
                     "speed; fp16 or fp32 are the native choices")
    if forced == "fp16" and spec.native_dtype == "bf16":
        verdict, source = fp16_verdict(spec.model_type)
        if verdict == "overflows":
            raise ConflictingConstraintsError(
                f"precision='fp16' cannot train or run {spec.name}: it was trained in bf16 and its family overflows to NaN in fp16 "
                f"({source}); use precision='bf16' (on a GPU with bf16 tensor cores) or 'fp32'")
        warns.append(f"{spec.name} was trained in bf16; precision='fp16' is honoured: "
                     + (f"fp16 AMP fine-tunes {spec.model_type} well ({source})" if verdict == "fine" else
                        "perfguide knows no fp16 record for its family")
                     + "; watch the loss (or the generations) for inf/NaN, and use fp32 if they appear")
    return warns


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


_CC_UNIT = "compute capability (bf16 / TF32 tensor cores from 8.0)"


def _cc(gpu: GPU) -> float | None:
    """The compute capability as a number (7.5), the fact a 'no bf16 / no TF32' decision rests on; None off NVIDIA."""
    major, minor = gpu.compute_capability
    return float(f"{major}.{minor}") if (major, minor) != (0, 0) else None


def _deciding(gpu: GPU, autocast: str | None, forced: str | None) -> dict[str, float | str | None]:
    """The mixed-precision decision's number: the speed-up over fp32 peak when it autocasts; else, when perfguide chose
    fp32 (no bf16 tensor cores), the compute capability that decided it."""
    if autocast:
        return {"number": _ratio(gpu, autocast), "unit": "x fp32 peak"}
    half = "bf16" if gpu.supports_bf16 else "fp16"
    if forced and _ratio(gpu, half) is not None:   # fp32 asked for: the speed-up it gives up
        return {"number": _ratio(gpu, half), "unit": f"x fp32 peak with {half} (given up)"}
    cc = _cc(gpu)
    return {"number": cc, "unit": _CC_UNIT if cc is not None else None}


def gpu_precision(spec: ModelSpec, gpu: GPU, forced: str | None) -> Precision:
    """Precision for training on one GPU; forced values are honoured or refused with one line."""
    if forced:
        autocast = None if forced == "fp32" else forced
        reason, warns = f"precision={forced!r} was requested", forced_gpu_warnings(spec, gpu, forced)
    else:
        autocast, reason, warns = _auto_gpu_dtype(spec, gpu)
    alternatives = _mp_alternatives(spec, gpu, autocast)
    mixed = Decision(setting="mixed_precision", value=autocast or "no", reason=reason,
                     **_deciding(gpu, autocast, forced), source=_AMP_SOURCE, alternatives=alternatives)
    tf32 = gpu.supports_tf32
    tf32_reason = ("TF32 runs the matmuls autocast leaves in fp32 on tensor cores (same range, 10-bit mantissa)" if tf32 else
                   f"TF32 needs a CUDA GPU of Ampere or newer; transformers raises ValueError on {gpu.name} ({gpu.generation})")
    # off: the compute capability that rules it out on NVIDIA; elsewhere the fp32 rate the matmuls stay at
    off: dict[str, float | str | None] = ({"number": _cc(gpu), "unit": _CC_UNIT} if _cc(gpu) is not None else
                                          {"number": gpu.fp32_tflops, "unit": "fp32 TFLOP/s (dense peak) the matmuls stay at"})
    tf32_dec = Decision(setting="tf32", value=tf32, reason=tf32_reason, **({"number": _ratio(gpu, "tf32"), "unit": "x fp32 peak"} if tf32 else off),
                        source=f"{sources.TRAIN_GPU_ONE}#tf32; {sources.TRAINING_ARGUMENTS}.tf32")
    # precision='fp32' is honoured for a LoRA base too: no 16-bit storage (it would compute in bf16 while saying fp32)
    half = (None if forced == "fp32" else "bf16" if (gpu.supports_bf16 and forced != "fp16") or autocast == "bf16"
            else "fp16" if autocast == "fp16" else None)
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


#: the unit of a CPU dtype decision's number (``cpu_bf16_speedup``)
_CPU_UNIT = "x fp32 matmul rate with 16-bit (perfguide's CPU rates)"
_CPU_RATES_SOURCE = "perfguide/data/efficiency.json cpu_peak_fraction and bf16_emulation_fraction"


def cpu_bf16_speedup(cpu: CPU) -> float:
    """How much faster 16-bit matmuls run than fp32 on this CPU, as the speed model prices them: each path's peak
    (AMX tiles, AVX512-BF16 dot products, or bf16 emulated through fp32 at a fraction of it) x the share of that peak
    eager PyTorch reaches. The number a CPU dtype decision rests on: above 1 bf16 pays, below 1 it is emulated."""
    frac = fact_value("efficiency", "cpu_peak_fraction")
    sixteen = cpu_peak_gflops(cpu, True, None)[0] * frac[cpu_path(cpu, True)]
    fp32 = cpu_peak_gflops(cpu, False, None)[0] * frac["fp32"]
    return round(sixteen / fp32, 2)


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
    mixed = Decision(setting="mixed_precision", value=autocast or "no", reason=reason, number=cpu_bf16_speedup(cpu), unit=_CPU_UNIT,
                     source=f"{sources.TRAIN_CPU}#mixed-precision; {_CPU_RATES_SOURCE}", alternatives=alts)
    return Precision(autocast=autocast, half="bf16" if autocast else None, pure_half_allowed=autocast == "bf16",
                     tf32=False, decisions=(mixed,), warnings=tuple(warns))


# --- inference: the dtype the weights are loaded and run in -----------------------------------------------

SRC_DTYPE = f"{sources.LLM_TUTORIAL_OPTIMIZATION}; {sources.INFER_GPU_ONE}"


def inference_gpu_dtype(spec: ModelSpec, gpu: GPU, forced: str | None) -> tuple[str, Decision, list[str]]:
    """bf16 where the card has bf16 matrix cores; fp16 otherwise (warned for bf16-trained models); a forced precision
    gets the training verdict (forced_gpu_warnings)."""
    if forced:
        peak = gpu_peak_tflops(gpu, forced)[0]   # what the speed model runs it at: emulated bf16 at a fraction of fp32
        return forced, Decision(setting="dtype", value=forced, reason="precision given as a constraint", source=SRC_DTYPE,
                                number=peak, unit=f"TFLOP/s {forced} matmuls run at (dense peak)"), \
            forced_gpu_warnings(spec, gpu, forced)
    if gpu.supports_bf16:
        return "bf16", Decision(
            setting="dtype", value="bf16", number=gpu.bf16_tflops, unit="bf16 TFLOP/s (dense peak)", source=SRC_DTYPE,
            reason=f"native bf16 tensor cores on {gpu.name} ({gpu.generation}): half the bytes of fp32 and no fp16 overflow risk",
            alternatives=(Alternative(value="fp16", why_not="same speed, but overflows on bf16-trained checkpoints"),
                          Alternative(value="fp32", why_not="2x the weight bytes and ~2x slower decode"))), []
    alts = (Alternative(value="bf16", why_not=f"no native bf16 on {gpu.name} ({gpu.generation}); emulated and slow"),
            Alternative(value="fp32", why_not="2x the memory and slower; the safe choice only if fp16 overflows"))
    warns = ([f"{spec.name} was trained in bf16; in fp16 its activations can overflow (inf/NaN output). "
              "If generations look broken, load it with dtype=torch.float32"] if spec.native_dtype == "bf16" else [])
    return "fp16", Decision(setting="dtype", value="fp16", number=gpu.fp16_tflops, unit="fp16 TFLOP/s (dense peak)",
                            reason=f"{gpu.name} ({gpu.generation}) has native fp16 tensor cores, not bf16",
                            source=SRC_DTYPE, alternatives=alts), warns


def inference_cpu_dtype(cpu: CPU, forced: str | None) -> tuple[str, Decision, list[str]]:
    """bf16 only where the CPU computes it natively (AVX512-BF16 or AMX); elsewhere fp32 is faster. A forced fp16 is
    loaded as asked (torch runs fp16 matmuls on CPU, slowly), never silently turned into fp32."""
    deciding = {"number": cpu_bf16_speedup(cpu), "unit": _CPU_UNIT, "source": f"{sources.INFER_CPU}; {_CPU_RATES_SOURCE}"}
    if forced:
        warns = (["precision='fp16' on the CPU: torch runs fp16 matmuls there through slow conversions; bf16 (on CPUs with "
                  "AVX512-BF16/AMX) or fp32 are faster"] if forced == "fp16" else
                 [f"{cpu.model_name} has no AVX512-BF16/AMX: bf16 is emulated and likely slower than fp32"]
                 if forced == "bf16" and not cpu.native_bf16 else [])
        return forced, Decision(setting="dtype", value=forced, reason="precision given as a constraint", **deciding), warns
    if cpu.native_bf16:
        return "bf16", Decision(setting="dtype", value="bf16", reason="the CPU has AVX512-BF16/AMX: bf16 halves the bytes decode reads "
                                "from RAM and runs natively", **deciding, alternatives=(
                                    Alternative(value="fp32", why_not="2x the RAM traffic per token"),)), []
    return "fp32", Decision(setting="dtype", value="fp32", reason="no AVX512-BF16/AMX on this CPU: bf16 matmuls would be emulated, "
                            "slower than fp32", **deciding, alternatives=(
                                Alternative(value="bf16", why_not="emulated without avx512_bf16/amx_bf16 flags"),)), []
