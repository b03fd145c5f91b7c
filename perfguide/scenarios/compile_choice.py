"""torch.compile for a training plan: the per-step gain against the one-off compile, decided on the run's length.

Inductor fuses the elementwise kernels between GEMMs (norms, RoPE, SiLU x up, residual adds), so a step launches
fewer kernels and streams the activations fewer times (perfguide.techniques.torch_compile prices both), but the
first step pays Dynamo + Inductor compile time (``compile_seconds``). With ``max_steps`` known the plan compares
whole runs: ``steps x eager step`` against ``compile + steps x compiled step``; without it, compile stays off (the
transformers default) and the decision says after how many steps it would pay. Emitted as
``TrainingArguments(torch_compile=True)``.
"""

from __future__ import annotations

from ..decisions import Alternative, Decision
from ..techniques.torch_compile import SOURCES, compile_seconds
from .search import Priced, fits, price
from .types import Request

PAPER = ("Ansel et al. 2024, PyTorch 2: Faster Machine Learning Through Dynamic Python Bytecode Transformation and "
         "Graph Compilation (ASPLOS '24): TorchInductor 1.41x geomean training speed-up on an A100 over 180+ models")


def _runs(steps: int, eager: float, compiled: float, once: float) -> str:
    return f"{steps} steps take {steps * eager:,.0f} s eager vs {once + steps * compiled:,.0f} s compiled ({once:.0f} s compile included)"


def _fp8_once_compiled(request: Request, compiled: Priced, reason: str) -> tuple[Priced, str]:
    """The search priced fp8 with eager casts; compiled, its casts fuse, so fp8 and bf16 are compared again here
    (only where perfguide picks the precision: the GPU has fp8, no precision or fp8 constraint, a full fine-tune)."""
    s, cons, gpu = compiled.setup, request.constraints, request.hardware.smallest_gpu
    if cons.fp8 is not None or cons.precision is not None or gpu is None or not gpu.supports_fp8 or s.autocast not in ("bf16", "fp8"):
        return compiled, reason
    try:
        flipped = s.replace(autocast="bf16" if s.autocast == "fp8" else "fp8")
    except ValueError:   # fp8 cannot run this layout or fine-tuning mode (DeepSpeed, LoRA)
        return compiled, reason
    other = price(request.model, flipped, request.hardware, request.calibration)
    if other.step_time < compiled.step_time and fits(other.memory, request.hardware, cons.headroom):
        return other, (f"{reason}; compiled, {other.setup.autocast} matmuls are faster ({other.step_time:.3g} vs "
                       f"{compiled.step_time:.3g} s/step with {s.autocast}: torch.compile fuses fp8's scaling casts)")
    return compiled, reason


def compile_choice(request: Request, chosen: Priced) -> tuple[Priced, list[Decision]]:
    """The plan with torch.compile on or off, and the Decision stating the gain, the compile time and the run length."""
    s, cons = chosen.setup, request.constraints
    if s.task != "train" or s.device != "cuda":
        return chosen, []
    spec, hw = request.model, request.hardware
    on = price(spec, s.replace(torch_compile=True), hw, request.calibration)
    off = price(spec, s.replace(torch_compile=False), hw, request.calibration)
    once = compile_seconds(spec, on.setup)
    saved = off.step_time - on.step_time
    breakeven = once / saved if saved > 0 else None
    gain = off.step_time / on.step_time if on.step_time else 1.0
    per_step = f"{off.step_time:.3g} s/step eager vs {on.step_time:.3g} s compiled ({gain:.2f}x)"
    pays = f"pays after {breakeven:,.0f} steps" if breakeven is not None else "never pays here (no per-step gain)"
    steps = cons.max_steps
    if cons.torch_compile is not None:
        use = cons.torch_compile
        reason = f"torch_compile={use} was requested; {per_step}, one-off compile ~{once:.0f} s: {pays}"
    elif steps is None:
        use = False
        reason = (f"{per_step}; the one-off compile (~{once:.0f} s) {pays}, and the run length is unknown: off (transformers' "
                  "default); pass max_steps=N to let the plan weigh it, or torch_compile=True")
    else:
        use = breakeven is not None and steps > breakeven
        reason = f"{'compile pays' if use else 'a short run: compile loses'}: {_runs(steps, off.step_time, on.step_time, once)}; {pays}"
    pick = on if use else off
    if use:
        pick, reason = _fp8_once_compiled(request, pick, reason)
    if pick.setup == s or not fits(pick.memory, hw, cons.headroom):
        pick = chosen   # the searched object itself: the ladder's decisions find their option by identity
    other = off if use else on
    alt = Alternative(value=not use, number=other.step_time, unit="s/step",
                      why_not=f"{other.step_time:.3g} s/step" + (f"; {_runs(steps, off.step_time, on.step_time, once)}" if steps else ""))
    sources = "; ".join((*SOURCES, PAPER))
    return pick, [Decision(setting="torch_compile", value=use, reason=reason, number=once, unit="s one-off compile",
                           source=sources, alternatives=(alt,))]
