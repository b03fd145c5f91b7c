"""Peak device memory vs micro-batch and vs sequence length, against the device limit.

The curves show how far the chosen setup is from the cliff and what each alternative (checkpointing,
another optimizer) would buy. Every point is re-priced with the memory model; nothing is interpolated.
Uses matplotlib's object API with the Agg canvas, so a user's own pyplot backend is never switched.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._base import GiB
from ..errors import PerfGuideError
from ..setup import Setup
from .report import memory_labels, planned_limit
from .units import fmt_bytes

if TYPE_CHECKING:
    from ..recommendation import Recommendation

#: Optimizers drawn as alternatives to the chosen one (full-precision, 8-bit, factored states).
ALTERNATIVE_OPTIMIZERS = ("adamw_torch_fused", "adamw_bnb_8bit", "adafactor")
#: Inference alternatives to 16-bit weights: bitsandbytes quantization.
ALTERNATIVE_WEIGHTS = ("int8", "nf4")
MAX_MICRO_BATCH = 1024
MIN_SEQ_LEN = 128
FIGSIZE = (12, 4.8)
DPI = 100
#: Curves far past the device limit are cut here, so the region near the limit stays readable.
YLIM_OVER_CAPACITY = 2.0


@dataclass(frozen=True)
class Curve:
    label: str
    setup: Setup
    chosen: bool = False


@dataclass(frozen=True)
class Series:
    """One curve on one axis: x values and predicted device totals in bytes (None where it cannot be priced)."""

    label: str
    xs: tuple[int, ...]
    ys: tuple[int | None, ...]
    chosen: bool


def _powers_of_two(low: int, high: int, must: int) -> tuple[int, ...]:
    values = {1 << k for k in range(max(low, 1).bit_length() - 1, high.bit_length()) if low <= 1 << k <= high}
    return tuple(sorted(values | {must}))


def micro_batch_axis(setup: Setup) -> tuple[int, ...]:
    return _powers_of_two(1, min(MAX_MICRO_BATCH, max(16, 4 * setup.micro_batch_size)), setup.micro_batch_size)


def seq_len_axis(setup: Setup, max_positions: int | None) -> tuple[int, ...]:
    high = max(2 * setup.seq_len, 1024)
    if max_positions:
        high = max(min(high, max_positions), setup.seq_len)
    return _powers_of_two(min(MIN_SEQ_LEN, setup.seq_len), high, setup.seq_len)


def variants(setup: Setup) -> tuple[Curve, ...]:
    """Training: the chosen setup, checkpointing flipped, the other optimizers. Inference: quantized weights."""
    curves = [Curve(f"chosen ({setup.label})", setup, chosen=True)]
    if setup.task != "train":
        quantizable = setup.weights_dtype in ("bf16", "fp16", "fp32")
        return tuple(curves + [Curve(f"{w} weights", setup.replace(weights_dtype=w))
                               for w in ALTERNATIVE_WEIGHTS if quantizable])
    flipped = not setup.gradient_checkpointing
    curves.append(Curve(f"{'with' if flipped else 'without'} gradient checkpointing",
                        setup.replace(gradient_checkpointing=flipped)))
    curves += [Curve(f"optimizer {name}", setup.replace(optimizer=name))
               for name in ALTERNATIVE_OPTIMIZERS if name != setup.optimizer and setup.optimizer is not None]
    return tuple(curves)


def _price(rec: Recommendation, setup: Setup) -> int | None:
    """Device total of one point; a combination the model cannot price is a gap in the curve, not an error."""
    from ..memory import estimate_memory

    try:
        return estimate_memory(rec.model, setup, rec.hardware, rec.request.calibration).device_total
    except (PerfGuideError, NotImplementedError):
        return None


def sweep(rec: Recommendation, field: str, xs: tuple[int, ...]) -> tuple[Series, ...]:
    """Each variant priced at every x of one Setup field (``micro_batch_size`` or ``seq_len``)."""
    return tuple(
        Series(c.label, xs, tuple(_price(rec, c.setup.model_copy(update={field: x})) for x in xs), c.chosen)
        for c in variants(rec.setup)
    )


def _draw_limits(ax: Any, rec: Recommendation) -> None:
    capacity, planned = rec.memory.capacity, planned_limit(rec)
    if capacity is None or planned is None:
        return
    word = memory_labels(rec.setup.device).capacity
    ax.axhline(capacity / GiB, color="black", linewidth=1.5, label=f"{word} ({fmt_bytes(capacity)})")
    ax.axhline(planned / GiB, color="black", linestyle="--", linewidth=1, label=f"planned limit ({fmt_bytes(planned)})")


def _draw_panel(ax: Any, rec: Recommendation, series: tuple[Series, ...], chosen_x: int, xlabel: str) -> None:
    for s in series:
        points = [(x, y / GiB) for x, y in zip(s.xs, s.ys) if y is not None]
        if not points:
            continue
        xs, ys = zip(*points)
        ax.plot(xs, ys, marker="o", markersize=3, linewidth=2.2 if s.chosen else 1.2, label=s.label, zorder=3 if s.chosen else 2)
        if s.chosen and chosen_x in xs:
            ax.plot([chosen_x], [ys[xs.index(chosen_x)]], marker="*", markersize=14, color="black", zorder=4, linestyle="none")
    _draw_limits(ax, rec)
    ax.set_xscale("log", base=2)
    ticks = series[0].xs if series else ()
    ax.set_xticks(ticks, labels=[str(x) for x in ticks])
    ax.minorticks_off()
    ax.set_xlabel(xlabel)
    ax.set_ylabel(memory_labels(rec.setup.device).axis)
    ax.grid(True, alpha=0.3)


def y_top(rec: Recommendation, series: tuple[Series, ...]) -> float:
    """Show the highest point, but never more than twice the device: the region near the limit must stay readable."""
    highest = max((y for s in series for y in s.ys if y is not None), default=0) * 1.05
    capacity = rec.memory.capacity
    if capacity is None:
        return highest / GiB or 1.0
    return max(capacity * 1.1, min(highest, YLIM_OVER_CAPACITY * capacity)) / GiB


def _import_matplotlib() -> tuple[Any, Any]:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise PerfGuideError("plotting needs matplotlib: pip install perfguide[plot]") from None
    return Figure, FigureCanvasAgg


def memory_figure(rec: Recommendation) -> Any:
    """The two-panel matplotlib Figure (vs micro-batch, vs sequence length), on an Agg canvas, not yet saved."""
    Figure, FigureCanvasAgg = _import_matplotlib()
    setup = rec.setup
    fig = Figure(figsize=FIGSIZE, dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2, sharey=True)
    batch_word = "micro-batch" if setup.task == "train" else "batch"
    by_batch = sweep(rec, "micro_batch_size", micro_batch_axis(setup))
    by_seq = sweep(rec, "seq_len", seq_len_axis(setup, rec.model.max_position_embeddings))
    _draw_panel(left, rec, by_batch, setup.micro_batch_size, f"{batch_word} size per device, seq len {setup.seq_len}")
    _draw_panel(right, rec, by_seq, setup.seq_len, f"sequence length, {batch_word} {setup.micro_batch_size}")
    left.set_ylim(0, y_top(rec, by_batch + by_seq))
    right.legend(loc="upper left", fontsize=8)
    per = memory_labels(setup.device).per
    fig.suptitle(f"{rec.model.name} on {rec.hardware.name or 'this machine'}: memory {per} ({rec.scenario})")
    return fig


def memory_png(rec: Recommendation) -> bytes:
    """The two-panel plot as PNG bytes, for a caller that writes it together with other files."""
    import io

    buf = io.BytesIO()
    memory_figure(rec).savefig(buf, format="png")
    return buf.getvalue()


def plot_memory(rec: Recommendation, path: str | Path) -> Path:
    """Write a two-panel PNG (vs micro-batch, vs sequence length) and return its path."""
    from .._files import output_path, write_atomic

    target = output_path(path, "plot")  # refused before the (slow) figure is drawn
    return write_atomic(target, memory_png(rec), "plot")
