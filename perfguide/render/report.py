"""The recommendation report: every choice with its reason and the number behind it, then the costs.

Built as a Document (render/document.py) so text, markdown and rich show the same content.
The report only renders what the rules decided; it never re-derives a decision.
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..decisions import Alternative, Decision
from ..errors import PerfGuideError
from ..integrations.launch import needs_launcher
from ..memory.types import MemoryEstimate
from ..setup import Setup
from ..speed.types import Throughput
from .bars import BarRow
from .document import Bars, Bullets, Code, Document, Fields, Section, Table, render_document
from .hardware import describe_hardware
from .units import fmt_bytes, fmt_count, fmt_number, fmt_percent, fmt_seconds, fmt_value

if TYPE_CHECKING:
    from ..recommendation import Recommendation
    from ..scenarios.types import Candidate

logger = logging.getLogger("perfguide.render")

#: Components drawn as bars: (MemoryEstimate field, label, always shown even when zero). The context's label
#: depends on the device (MemoryLabels.context).
COMPONENTS = (
    ("weights", "weights", True), ("gradients", "gradients", False), ("optimizer_states", "optimizer states", False),
    ("activations", "activations", True), ("logits", "logits", False), ("kv_cache", "kv cache", False),
    ("other", "other", False), ("nccl_buffers", "nccl buffers", False),
)


@dataclass(frozen=True)
class MemoryLabels:
    """The words for the memory totals on one kind of device, so a CPU plan never speaks of CUDA or nvidia-smi.

    On a GPU they are the counters users compare with (torch allocated / reserved, nvidia-smi). On CPU there is no
    CUDA context and no caching allocator: the fixed part is the Python + torch process baseline, reserved equals
    allocated (so that row is left out) and the total is the process's resident memory, checked against free RAM.
    """

    section: str
    per: str           # "memory per device" / "memory per process" in the plot's title
    context: str
    allocated: str
    reserved: str | None
    total: str
    total_short: str   # in "headroom: ... left after <total_short>"
    capacity: str      # the plot's limit line
    usable: str        # in "usable memory: 80.0 GiB <usable>, planned to ..."
    axis: str          # the plot's y axis


GPU_LABELS = MemoryLabels(
    section="Memory per device (most loaded)", per="per device", context="cuda context", allocated="peak allocated (torch)",
    reserved="peak reserved (torch)", total="device total (nvidia-smi)", total_short="device total",
    capacity="device memory", usable="per device", axis="predicted peak device memory (GiB)",
)
CPU_LABELS = MemoryLabels(
    section="Memory per process (host RAM)", per="per process", context="process baseline", allocated="peak allocated (tensors)",
    reserved=None, total="process total (RSS)", total_short="process total",
    capacity="available RAM", usable="of available RAM", axis="predicted peak process memory, RSS (GiB)",
)


def memory_labels(device: str) -> MemoryLabels:
    return CPU_LABELS if device == "cpu" else GPU_LABELS

TRAIN_ONLY = frozenset({"target_len", "gradient_accumulation_steps", "optimizer", "gradient_checkpointing", "lora",
                        "offload_optimizer", "dataloader_num_workers", "dataloader_pin_memory", "liger_kernel", "cut_cross_entropy", "sync_grads_each_micro_step",
                        "optimizer_in_backward", "activation_offloading", "tiled_mlp_shard_tokens", "padding_free", "avg_seq_len", "packed_doc_len",
                        "fsdp_version", "kbit_upcast", "kbit_recast_bf16", "kbit_recast_adapters",
                        "bnb_embedding_override", "hybrid_shard", "overlap_comm", "zero3_init", "objective",
                        "precompute_ref_log_probs", "trainer"})
INFER_ONLY = frozenset({"new_tokens", "cache_implementation", "serving"})
MAX_CANDIDATES = 20
HEADLINE_SUGGESTIONS = 3
DATAPARALLEL_WARNING = (
    "do not start this with plain `python train.py`: with several visible GPUs and no launcher, "
    "transformers silently wraps the model in nn.DataParallel (slower, and GPU 0 carries extra memory)"
)


# --- header and setup ---------------------------------------------------------------------------

def _global_batch(setup: Setup) -> tuple[str, str]:
    """Training keeps micro x accumulation x world = global; inference has concurrent sequences instead."""
    if setup.serving is not None:  # an engine replica spans its TP x PP GPUs: the batch is per replica
        return "batch", (f"{setup.micro_batch_size} concurrent sequence(s) per replica x {setup.serving.data_parallel_size} replica(s) "
                         f"of {setup.serving.tensor_parallel_size * setup.serving.pipeline_parallel_size} GPU(s), "
                         f"{setup.new_tokens} new tokens each")
    if setup.task == "infer":
        return "batch", (f"{setup.micro_batch_size} concurrent sequence(s) per process x {setup.world_size} process(es), "
                         f"{setup.new_tokens} new tokens each")
    return "global batch", f"{setup.global_batch_size} = {setup.batch_factors}"


def planned_limit(rec: Recommendation) -> int | None:
    """The bytes the search allowed itself (capacity, or what a probe saw free, less the headroom): the rules' own number."""
    from ..scenarios.search import usable_bytes

    return usable_bytes(rec.memory, rec.request.constraints.headroom)


def _usable_memory(rec: Recommendation) -> str:
    capacity, limit = rec.memory.capacity, planned_limit(rec)
    if capacity is None or limit is None:
        return "unknown (no device)"
    headroom, usable = rec.request.constraints.headroom, memory_labels(rec.setup.device).usable
    gpu = rec.hardware.smallest_gpu if rec.setup.device != "cpu" else None
    judged = f"; CUDA's total: {gpu.memory_usable_source}" if gpu is not None and gpu.memory_usable_source else ""
    return f"{fmt_bytes(capacity)} {usable}, planned to {fmt_bytes(limit)} ({fmt_percent(headroom)} kept free){judged}"


def _request_section(rec: Recommendation) -> Section:
    spec, setup = rec.model, rec.setup
    rows = (
        ("model", f"{spec.name} ({fmt_count(spec.total_params, ' params')}, {spec.model_type}, {spec.total_layers} layers, hidden {spec.hidden_size})"),
        ("hardware", describe_hardware(rec.hardware)),
        ("usable memory", _usable_memory(rec)),
        ("scenario", rec.scenario),
        ("sequence length", str(rec.request.seq_len)),
        _global_batch(setup),
        ("verdict", "fits" if rec.fits else "DOES NOT FIT: see the suggestions below"),
    )
    return Section("Request", (Fields(rows),))


def _setup_fields(setup: Setup) -> list[str]:
    skip = INFER_ONLY if setup.task == "train" else TRAIN_ONLY
    return [name for name in Setup.model_fields if name not in skip]


#: a value longer than this (a nested engine config) gets a line of its own below the table: in a cell it would
#: widen the whole column, and the two-pair table would no longer fit a screen
_CELL_CHARS = 40


def _setup_section(setup: Setup, title: str = "Chosen setup") -> Section:
    """Two setting/value pairs per row keeps the ~20 knobs on one screen."""
    values = [(name, fmt_value(getattr(setup, name))) for name in _setup_fields(setup)]
    pairs = [(name, value) for name, value in values if len(value) <= _CELL_CHARS]
    long = tuple((name, value) for name, value in values if len(value) > _CELL_CHARS)
    if len(pairs) % 2:
        pairs.append(("", ""))
    half = len(pairs) // 2
    rows = tuple((*left, *right) for left, right in zip(pairs[:half], pairs[half:]))
    table = Table(("setting", "value", "setting", "value"), rows)
    return Section(f"{title} ({setup.label})", (table, Fields(long)) if long else (table,))


# --- decisions ----------------------------------------------------------------------------------

def _alternative_line(alt: Alternative) -> str:
    """The number is appended unless the sentence already quotes it (rules often write "needs 76.1 GiB > ...")."""
    number = fmt_number(alt.number, alt.unit)
    shown = number and number not in alt.why_not
    return f"rejected {fmt_value(alt.value)}: {alt.why_not}" + (f" ({number})" if shown else "")


def decision_items(decision: Decision) -> list[tuple[int, str]]:
    """A decision as a heading (setting = value) and its evidence beneath it."""
    items = [(0, f"{decision.setting} = {fmt_value(decision.value)}"), (1, decision.reason)]
    number = fmt_number(decision.number, decision.unit)
    if number:
        items.append((1, f"decided by: {number}"))
    if decision.source:
        items.append((1, f"source: {decision.source}"))
    items += [(1, _alternative_line(alt)) for alt in decision.alternatives]
    return items


def _decisions_section(decisions: tuple[Decision, ...]) -> Section:
    items = [item for d in decisions for item in decision_items(d)]
    return Section("Decisions", (Bullets(tuple(items or [(0, "no decisions recorded")]), headed=True),))


# --- memory -------------------------------------------------------------------------------------

def memory_scale(memory: MemoryEstimate) -> int:
    """Bars are drawn against the device's usable memory; without a device, against the largest total."""
    return memory.capacity or max(memory.device_total, memory.peak_reserved, 1)


def _bar(label: str, value: int, scale: int) -> BarRow:
    return BarRow(label=label, value=value, scale=scale, text=f"{fmt_bytes(value)} ({fmt_percent(value / scale)})")


def memory_bars(memory: MemoryEstimate, device: str = "cuda") -> tuple[BarRow, ...]:
    """Components at the peak (zero ones left out unless always relevant), then the totals, in the device's words."""
    scale, words = memory_scale(memory), memory_labels(device)
    parts = [(label, getattr(memory, f)) for f, label, always in COMPONENTS if always or getattr(memory, f)]
    if memory.cuda_context:
        parts.append((words.context, memory.cuda_context))
    totals = ((words.allocated, memory.peak_allocated), (words.reserved, memory.peak_reserved), (words.total, memory.device_total))
    return tuple(_bar(label, value, scale) for label, value in (*parts, *totals) if label is not None)


def _memory_fields(memory: MemoryEstimate, words: MemoryLabels) -> Fields:
    rows = [("capacity", fmt_bytes(memory.capacity) if memory.capacity is not None else "no device")]
    if memory.headroom is not None:
        word = "left" if memory.headroom >= 0 else "SHORT"
        judged = words.total_short if memory.fit_total is None else "what the step needs not to OOM"
        rows.append(("headroom", f"{fmt_bytes(abs(memory.headroom))} {word} after {judged}"))
    if memory.cpu_ram:
        rows.append(("host RAM needed", fmt_bytes(memory.cpu_ram)))
    if memory.needed != memory.device_total:  # the allocator releases its cache before an OOM (overhead.oom_footprint)
        rows.append(("needed not to OOM", f"{fmt_bytes(memory.needed)} (reserved ~{fmt_bytes(memory.device_total)} "
                                          "while running; the allocator frees its cache before it fails)"))
    rows += [("fits", "yes" if memory.fits else "no"), ("method", memory.method)]
    return Fields(tuple(rows))


def _memory_section(memory: MemoryEstimate, device: str) -> Section:
    words = memory_labels(device)
    blocks: list = [Bars(memory_bars(memory, device)), _memory_fields(memory, words)]
    if memory.notes:
        blocks.append(Bullets(tuple((1, n) for n in memory.notes)))
    return Section(words.section, tuple(blocks))


# --- speed --------------------------------------------------------------------------------------

def _throughput_rows(t: Throughput) -> list[tuple[str, str]]:
    rows = [("step time", fmt_seconds(t.step_time_s)), ("tokens/s (whole job)", fmt_number(t.tokens_per_s, "tokens/s")),
            ("MFU", fmt_percent(t.mfu)), ("bound by", t.bound or "unknown")]
    optional = (("compute time", t.compute_time_s), ("communication time", 0.0 if t.comm_total_s else t.comm_time_s),
                ("offload time", t.offload_time_s),
                ("prefill time", t.prefill_time_s))
    rows += [(name, fmt_seconds(v)) for name, v in optional if v]
    if t.comm_total_s:   # the collectives' total and the part compute does not hide, never one read as the other
        rows.append(("communication", f"{fmt_seconds(t.comm_total_s)} per step, {fmt_seconds(t.comm_time_s) if t.comm_time_s else '0 s'} exposed "
                                      "(not hidden by compute)"))
    if t.achievable_tflops:
        rows.append(("achievable TFLOP/s per device", f"{t.achievable_tflops:.1f}"))
    if t.decode_tokens_per_s:
        rows.append(("decode tokens/s per sequence", f"{t.decode_tokens_per_s:.1f}"))
    if t.time_per_output_token_ms:
        rows.append(("time per output token", fmt_seconds(t.time_per_output_token_ms / 1e3)))
    return rows


def _throughput_section(t: Throughput) -> Section:
    return Section("Throughput (predicted)", (Fields(tuple(_throughput_rows(t))),))


def _candidate_row(c: Candidate) -> tuple[str, ...]:
    return (c.verdict, c.setup.label, fmt_bytes(c.memory.device_total), fmt_seconds(c.throughput.step_time_s),
            fmt_number(c.throughput.tokens_per_s, "tokens/s"), c.why)


def _candidates_section(candidates: tuple[Candidate, ...]) -> Section | None:
    if not candidates:
        return None
    headers = ("verdict", "setup", "memory/device", "step time", "throughput", "why")
    blocks: list = [Table(headers, tuple(_candidate_row(c) for c in candidates[:MAX_CANDIDATES]))]
    if len(candidates) > MAX_CANDIDATES:
        blocks.append(Bullets(((1, f"... {len(candidates) - MAX_CANDIDATES} more in rec.candidates"),)))
    return Section("Candidates considered", tuple(blocks))


# --- launch, warnings, suggestions --------------------------------------------------------------

def is_multi_process(setup: Setup) -> bool:
    """Several processes must be started by a launcher; device_map inference stays one process."""
    return setup.world_size > 1 and setup.strategy not in ("single", "device_map")


def _launch_command(rec: Recommendation) -> str | None:
    """The command the report shows; a plan the launcher cannot start (one line why) shows none."""
    try:
        return rec.launch_command("train.py" if rec.setup.task == "train" else "generate.py")
    except PerfGuideError as exc:
        logger.debug("no launch command: %s", exc)
        return None


def _launch_section(rec: Recommendation) -> Section | None:
    if rec.setup.serving is not None:  # an engine plan is started by the engine's own server, whatever its layout
        return Section("Launch", (Bullets(((0, "serve with:"), (1, rec.serve_command())), headed=True),))
    if not is_multi_process(rec.setup) and not needs_launcher(rec):   # one process without DeepSpeed / FSDP: python
        return None
    dataparallel_risk = is_multi_process(rec.setup) and rec.setup.device == "cuda" and rec.setup.task == "train"
    items = [(0, DATAPARALLEL_WARNING)] if dataparallel_risk else []
    command = _launch_command(rec)
    if command:
        items += [(0, "launch with:"), (1, command)]
    return Section("Launch", (Bullets(tuple(items), headed=True),)) if items else None


def _warnings_section(rec: Recommendation) -> Section | None:
    warnings = list(dict.fromkeys((*rec.warnings, *rec.hardware.warnings)))
    return Section("Warnings", (Bullets(tuple((0, w) for w in warnings)),)) if warnings else None


def _suggestions_section(rec: Recommendation) -> Section | None:
    if rec.fits and not rec.suggestions:
        return None
    items = [(0, s) for s in rec.suggestions] or [(0, "no suggestion available: try a larger GPU, more GPUs or QLoRA")]
    title = "Nothing fits: what would" if not rec.fits else "Suggestions"
    return Section(title, (Bullets(tuple(items)),))


def headline_section(rec: Recommendation) -> Section:
    """The answer first: the plan, its verdict with the binding limit, memory, speed and what to run."""
    from .headline import memory_line, plan_line, run_lines, speed_line, verdict_line

    kind, lines = run_lines(rec)
    fields = Fields((("plan", plan_line(rec)), ("verdict", verdict_line(rec)), ("memory", memory_line(rec)),
                     ("speed", speed_line(rec))))
    if kind == "none":
        would = rec.suggestions[:HEADLINE_SUGGESTIONS] or ("no suggestion available: try a larger GPU, more GPUs or QLoRA",)
        return Section("In short", (fields, Bullets(((0, "what would fit:"), *((1, s) for s in would)))))
    label = {"launch": "launch with", "serve": "serve with", "trainer": "train with", "generate": "run with"}[kind]
    code = Code(lines, "bash" if kind in ("launch", "serve") else "python")
    return Section("In short", (fields, Bullets(((0, f"{label}:"),)), code))


def report_title(rec: Recommendation) -> str:
    """Names the target as planned: nodes asked for with ``nodes=`` (``--nodes 2``) show even when the hardware
    name has none."""
    where, nodes = rec.hardware.name or "this machine", rec.setup.nodes
    if nodes > 1 and not where.endswith(f"x{nodes}"):   # "h100-80gb:8x2" already says it
        where += f" x {nodes} nodes"
    return f"perfguide {rec.scenario}: {rec.model.name} on {where}"


def report_document(rec: Recommendation, brief: bool = False) -> Document:
    title = report_title(rec)
    if brief:
        return Document(title=title, sections=(headline_section(rec),))
    sections = (
        headline_section(rec), _request_section(rec), _setup_section(rec.setup), _decisions_section(rec.decisions),
        _memory_section(rec.memory, rec.setup.device), _throughput_section(rec.throughput), _candidates_section(rec.candidates),
        _launch_section(rec), _warnings_section(rec), _suggestions_section(rec),
    )
    return Document(title=title, sections=tuple(s for s in sections if s is not None))


def _check_rich(fmt: str) -> None:
    if fmt == "rich" and importlib.util.find_spec("rich") is None:
        raise PerfGuideError("fmt='rich' needs the rich library: pip install perfguide[rich] (or use fmt='text')")


def render(rec: Recommendation, fmt: str = "text", brief: bool = False) -> str:
    """Render a Recommendation as 'text', 'markdown' or 'rich' (ANSI); rich must be installed for the last.
    ``brief``: the headline block only."""
    _check_rich(fmt)
    return render_document(report_document(rec, brief), fmt)


def render_estimate(model_name: str, setup: Setup, memory: MemoryEstimate, fmt: str = "text",
                    speed: Throughput | None = None) -> str:
    """What ``perfguide estimate`` prints: the priced Setup, its memory and (given hardware) its speed; no decisions."""
    _check_rich(fmt)
    sections: tuple[Section, ...] = (_setup_section(setup, "Setup"), _memory_section(memory, setup.device))
    if speed is not None:
        sections = (*sections, _throughput_section(speed))
    doc = Document(title=f"perfguide estimate: {model_name}", sections=sections)
    return render_document(doc, fmt)
