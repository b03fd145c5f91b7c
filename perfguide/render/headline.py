"""The report's first block: what to run, whether it fits and what binds, the predicted memory and speed, and the
command or code that runs it.

Read from the plan's own fields (``rec.fits``, its memory and throughput, the byte limits the search itself used),
never re-derived, so the headline cannot disagree with the sections below it. A reader who stops after it knows
what to type; ``report(brief=True)`` / ``--brief`` print only this block, ``--json`` carries it as ``summary``.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Literal

from .._base import Model
from ..integrations.launch import needs_launcher
from ..model.tasks import auto_class_call
from ..scenarios.search import usable_bytes, usable_ram
from .units import fmt_bytes, fmt_count, fmt_percent, fmt_seconds

if TYPE_CHECKING:
    from ..recommendation import Recommendation

RunKind = Literal["launch", "serve", "trainer", "generate", "none"]
#: the script a launch command starts; the report's Launch section and the headline name the same one
TRAIN_SCRIPT, INFER_SCRIPT = "train.py", "generate.py"


class Limit(Model):
    """One memory budget the plan must stay within: what it uses and what the search allowed itself."""

    name: str
    used: int
    usable: int

    @property
    def fraction(self) -> float:
        return self.used / self.usable if self.usable > 0 else float("inf")


class Summary(Model):
    """The headline as data (``--json``'s ``summary``): the same fields the text shows, in bytes and seconds."""

    plan: str
    fits: bool
    verdict: str
    binding_limit: str | None
    gpu_memory: int          # the most loaded device's total (nvidia-smi), or the process's RSS on CPU
    host_ram: int            # host RAM the plan itself needs (offloaded states); 0 without offload
    step_time_s: float | None
    tokens_per_s: float | None
    run_kind: RunKind
    run: tuple[str, ...]


# --- plan and verdict ---------------------------------------------------------------------------

def _what(rec: Recommendation) -> str:
    s = rec.setup
    if s.task == "infer":
        return f"{s.serving.engine} serving" if s.serving is not None else "inference"
    if s.lora is None:
        return "full fine-tune"
    return "QLoRA" if s.quantized else "LoRA"


def _where(rec: Recommendation) -> str:
    s, hw = rec.setup, rec.hardware
    device = hw.smallest_gpu.name if s.device == "cuda" and hw.smallest_gpu else "CPU"
    nodes = f" x {s.nodes} nodes" if s.nodes > 1 else ""
    return f"{s.num_gpus}x {device}{nodes}" if s.device == "cuda" else f"{s.num_gpus} CPU process(es)"


def plan_line(rec: Recommendation) -> str:
    """'full fine-tune of meta-llama/Llama-3.1-8B on 1x a100-80gb: mb=4 ga=16 ...': the whole plan in one line."""
    return f"{_what(rec)} of {rec.model.name} on {_where(rec)}: {rec.setup.label}"


def limits(rec: Recommendation) -> tuple[Limit, ...]:
    """The budgets the search judged the plan by: device memory (less the headroom), and host RAM when states
    are offloaded to it."""
    headroom = rec.request.constraints.headroom
    found = []
    device_limit = usable_bytes(rec.memory, headroom)
    if device_limit is not None:
        name = "GPU memory per device" if rec.setup.device == "cuda" else "RAM per process"
        found.append(Limit(name=name, used=rec.memory.needed, usable=device_limit))
    if rec.memory.cpu_ram and rec.setup.device == "cuda":
        found.append(Limit(name="host RAM per node", used=rec.memory.cpu_ram, usable=usable_ram(rec.hardware, headroom)))
    return tuple(found)


def binding_limit(rec: Recommendation) -> Limit | None:
    """The budget closest to (or furthest over) its limit: the one to watch, or the one to raise."""
    return max(limits(rec), key=lambda lim: lim.fraction, default=None)


def _engine_verdict(rec: Recommendation, word: str) -> str:
    """A serving engine fills its memory budget by design (the KV cache takes what is left), so what binds is the
    cache: the engine refuses to start unless one max_model_len sequence fits it."""
    e = rec.engine_memory
    assert e is not None
    if e.weights > e.budget:   # no cache to speak of: the weights alone are over what the engine may use
        return (f"{word}; binding limit: weights, {fmt_bytes(e.weights)} per GPU over the engine's {fmt_bytes(e.budget)} "
                f"budget before any KV cache (needs one {e.max_model_len}-token sequence of cache)")
    return (f"{word}; binding limit: KV cache, {e.kv_cache_tokens:,} tokens in {fmt_bytes(max(e.kv_cache_bytes, 0))} of the "
            f"engine's {fmt_bytes(e.budget)} budget = {e.max_concurrency:.1f} sequences of {e.max_model_len} tokens (needs >= 1)")


def binding_name(rec: Recommendation) -> str | None:
    if rec.engine_memory is not None:
        return "weights" if rec.engine_memory.weights > rec.engine_memory.budget else "KV cache"
    limit = binding_limit(rec)
    return limit.name if limit else None


def verdict_line(rec: Recommendation) -> str:
    """The plan's own verdict (``rec.fits``), with the binding limit and its numbers."""
    word = "fits" if rec.fits else "DOES NOT FIT"
    if rec.engine_memory is not None:
        return _engine_verdict(rec, word)
    limit = binding_limit(rec)
    if limit is None:
        return f"{word} (no device memory to judge by)"
    if limit.used > limit.usable:
        numbers = f"needs {fmt_bytes(limit.used)} > {fmt_bytes(limit.usable)} usable"
    else:
        numbers = f"{fmt_bytes(limit.used)} of {fmt_bytes(limit.usable)} usable ({fmt_percent(limit.fraction)})"
    tail = "" if rec.fits or limit.used > limit.usable else "; see what would fit below"
    return f"{word}; binding limit: {limit.name}, {numbers}{tail}"


def memory_line(rec: Recommendation) -> str:
    m = rec.memory
    device = ("per GPU (nvidia-smi)" if rec.setup.device == "cuda" else "per process (RSS)")
    if m.needed != m.device_total:  # the allocator's cache while running vs what it needs before an OOM
        device = f"per GPU (nvidia-smi while running; {fmt_bytes(m.needed)} needed not to OOM)"
    host = f"host RAM {fmt_bytes(m.cpu_ram)} (offloaded states)" if m.cpu_ram and rec.setup.device == "cuda" else "host RAM: no offload"
    return f"{fmt_bytes(m.device_total)} {device}; {host}" if rec.setup.device == "cuda" else f"{fmt_bytes(m.device_total)} {device}"


def speed_line(rec: Recommendation) -> str:
    t = rec.throughput
    if rec.setup.task == "infer":
        parts = [f"{fmt_count(t.tokens_per_s)} tokens/s"]
        if t.time_per_output_token_ms:
            parts.append(f"{fmt_seconds(t.time_per_output_token_ms / 1e3)} per output token")
    else:
        parts = [f"{fmt_seconds(t.step_time_s)}/step", f"{fmt_count(t.tokens_per_s)} tokens/s"]
    if t.mfu:
        parts.append(f"MFU {fmt_percent(t.mfu)}")
    return ", ".join(parts)


# --- how to run it ------------------------------------------------------------------------------

def _py(value: object) -> str:
    """A Python literal in double quotes (the style of the lines around it); other values as repr writes them."""
    return json.dumps(value) if isinstance(value, str) else repr(value)


def recommend_call(rec: Recommendation) -> str:
    """The ``perfguide.recommend(...)`` call that reproduces this plan: the request's own values, constraints
    only where the user changed them."""
    args = [_py(rec.model.name), _py(rec.scenario)]
    if rec.hardware.source == "named" and rec.hardware.name:
        args.append(f"hardware={_py(rec.hardware.name)}")
    args += [f"seq_len={rec.request.seq_len}", f"global_batch_size={rec.request.global_batch_size}"]
    args += [f"{k}={_py(v)}" for k, v in rec.request.constraints.model_dump(exclude_defaults=True).items()]
    return f"rec = perfguide.recommend({', '.join(args)})"


def trainer_lines(rec: Recommendation) -> tuple[str, ...]:
    """The script's lines: TrainingArguments first (a ZeRO-3 plan must exist before from_pretrained, which then
    loads the weights already partitioned), then the model, then the Trainer."""
    auto, load = auto_class_call(rec.model, "rec.model_kwargs()")
    extra = ""
    if rec.setup.optimizer_in_backward:
        extra += ", optimizers=rec.optimizers(model, args)"
    if rec.setup.padding_free:
        extra += ", data_collator=rec.data_collator()"
    if rec.setup.objective == "dpo":   # TRL's DPOTrainer: its config carries the batch of pairs and the reference setting
        return ("import perfguide", f"from transformers import {auto}", "from trl import DPOTrainer", recommend_call(rec),
                'args = rec.dpo_config(output_dir="out")', f"model = rec.prepare_model({load})",
                f"DPOTrainer(model=model, args=args, train_dataset=pairs{extra}).train()   # prompt / chosen / rejected rows")
    if rec.setup.trainer == "trl":   # priced for SFTTrainer's own loss path: run SFTTrainer with the plan's SFTConfig
        return ("import perfguide", f"from transformers import {auto}", "from trl import SFTTrainer", recommend_call(rec),
                'args = rec.sft_config(output_dir="out")', f"model = rec.prepare_model({load})",
                f"SFTTrainer(model=model, args=args, train_dataset=train_dataset{extra}).train()")
    return (
        "import perfguide",
        f"from transformers import {auto}, Trainer",
        recommend_call(rec),
        'args = rec.training_args(output_dir="out")' + ("   # before from_pretrained (ZeRO-3 loads the weights sharded)"
                                                        if rec.setup.strategy == "zero3" else ""),
        f"model = rec.prepare_model({load})",
        f"Trainer(model=model, args=args, train_dataset=train_dataset{extra}).train()",
    )


def generate_lines(rec: Recommendation) -> tuple[str, ...]:
    auto, load = auto_class_call(rec.model, "rec.model_kwargs()")
    run = "model.generate(**inputs, **rec.generation_kwargs())" if rec.model.generates else "model(**inputs)"
    return ("import perfguide", f"from transformers import {auto}", recommend_call(rec), f"model = {load}", f"outputs = {run}")


def run_lines(rec: Recommendation) -> tuple[RunKind, tuple[str, ...]]:
    """The serve command for an engine plan, the launch command where a launcher is needed (several processes,
    DeepSpeed, FSDP), else the Python lines; nothing for a plan that does not fit (its suggestions say what would)."""
    if not rec.fits:
        return "none", ()
    if rec.setup.serving is not None:
        return "serve", (rec.serve_command(),)
    if needs_launcher(rec):
        script = TRAIN_SCRIPT if rec.setup.task == "train" else INFER_SCRIPT
        return "launch", (rec.launch_command(script),)
    return ("trainer", trainer_lines(rec)) if rec.setup.task == "train" else ("generate", generate_lines(rec))


def summary(rec: Recommendation) -> Summary:
    kind, lines = run_lines(rec)
    return Summary(
        plan=plan_line(rec), fits=rec.fits, verdict=verdict_line(rec), binding_limit=binding_name(rec),
        gpu_memory=rec.memory.device_total, host_ram=rec.memory.cpu_ram if rec.setup.device == "cuda" else 0,
        step_time_s=rec.throughput.step_time_s, tokens_per_s=rec.throughput.tokens_per_s, run_kind=kind, run=lines,
    )
