"""A serve command line: ``vllm serve MODEL [flags]`` or ``python -m sglang.launch_server --model-path MODEL [flags]``.

The flag names are the engine's own: each engine in perfguide/engines/ emits its command from a ServingSetup, so
the reader learns which flag carries which ServingSetup field by asking the engine for the command of setups that
differ in that one field (no flag name is written here twice). The setup read is priced by the engine's memory rule,
the one ``perfguide.estimate`` uses for a serving Setup, and a change that fits is written back as the engine's flags.
"""

from __future__ import annotations

import itertools
import shlex
from collections.abc import Iterable, Iterator
from functools import cache
from typing import Any

from ...engines import ServerEngine, servers
from ...errors import PerfGuideError, did_you_mean
from ...hardware.types import Hardware
from ...model.quantized import checkpoint_format
from ...model.types import ModelSpec
from ...setup import ServingSetup, Setup
from ...speed.types import Throughput
from .base import Collector, ConfigReadError, as_float, as_int, take_flags
from .verdict import Change, Check, Edit

FORMAT = "serve_command"
SYNTAX = "flags"
_PROBE = "PERFGUIDE_PROBE_MODEL"
#: flags every server has that say where and how it listens, not what it holds in memory (read, not priced)
NOT_PRICED = frozenset({"--host", "--port", "--served-model-name", "--api-key", "--trust-remote-code", "--download-dir", "--revision",
                        "--tokenizer", "--seed", "--chat-template", "--log-level", "--uvicorn-log-level", "--disable-log-requests",
                        "--nnodes", "--node-rank", "--master-addr", "--master-port", "--dist-init-addr"})
#: one value per field, different from the ServingSetup default: the engine's command for it shows the field's flag
_VARIANTS: dict[str, tuple[Any, ...]] = {
    "tensor_parallel_size": (2,), "pipeline_parallel_size": (2,), "data_parallel_size": (2,), "max_model_len": (1000,),
    "gpu_memory_utilization": (0.5,), "max_num_seqs": (10,), "max_num_batched_tokens": (1000,), "dtype": ("bf16", "fp16"),
    "kv_cache_dtype": ("auto", "fp8"), "enable_expert_parallel": (True,), "enforce_eager": (True,), "enable_prefix_caching": (False,),
}

Table = dict[str, tuple[str, dict[str | None, Any]]]   # flag -> (ServingSetup field, the engine's word -> the field's value)


@cache
def flag_table(engine: ServerEngine) -> Table:
    """Which of the engine's flags carries which ServingSetup field, and the words it writes for each value."""
    base = ServingSetup(engine=engine.name)
    before = dict(engine.flags(_PROBE, base))
    table: Table = {}
    variants = {**_VARIANTS, "weight_format": engine.quantizations()}
    for field, values in variants.items():
        for value in values:
            after = dict(engine.flags(_PROBE, base.model_copy(update={field: value})))
            for flag, word in after.items():
                if flag not in before or before[flag] != word:
                    table.setdefault(flag, (field, {}))[1].setdefault(word, value)
            for flag in before.keys() - after.keys():   # a switch the base setup turns on
                table.setdefault(flag, (field, {}))[1].setdefault(None, getattr(base, field))
    for flag, (field, words) in table.items():
        if flag in before and field != "weight_format":
            words.setdefault(before[flag], getattr(base, field))
        for word, value in engine.value_aliases.get(field, {}).items():   # the parser's other words for the same value
            words.setdefault(word, value)
    return table


def engine_of(words: list[str]) -> tuple[ServerEngine, list[str]] | None:
    """The engine whose launcher the command starts with, and the words after it (None: not a serve command)."""
    if words and words[0].rsplit("/", 1)[-1] in ("python", "python3"):
        words = ["python", *words[1:]]
    for engine in servers():
        head = [w for w in engine.launcher(_PROBE) if w != _PROBE]
        if words[:len(head)] == head:
            return engine, words[len(head):]
    return None


def is_serve_command(config: Any) -> bool:
    words = shlex.split(config) if isinstance(config, str) else config if isinstance(config, list) else []
    return bool(words) and all(isinstance(w, str) for w in words) and engine_of(list(words)) is not None


def parse(words: list[str]) -> tuple[ServerEngine, str | None, dict[str, str | None]]:
    """(engine, the model named, flag -> its word or None for a switch), flags spelled as the engine emits them."""
    found = engine_of(words)
    if found is None:
        raise ConfigReadError(f"not a serve command: {' '.join(words[:3])!r}; accepted: "
                              + ", ".join(" ".join(w for w in e.launcher("MODEL")) for e in servers()))
    engine, rest = found
    positional = "MODEL" in engine.launcher("MODEL")
    model_flag = next((f for f, v in engine.flags(_PROBE, ServingSetup(engine=engine.name)) if v == _PROBE), None)
    model = rest.pop(0) if positional and rest and not rest[0].startswith("-") else None
    switches = {f for f, (_, words_) in flag_table(engine).items() if None in words_}
    flags, i = take_flags(rest, lambda w: engine.flag_aliases.get(w, w), switches, on=None)
    if i < len(rest):
        raise ConfigReadError(f"{engine.title} command: unexpected word {rest[i]!r}; flags are `--name value` (the model is "
                              + ("the word after the command)" if positional else f"{model_flag} MODEL)"))
    if model_flag and model_flag in flags:
        model = flags.pop(model_flag)
    return engine, model, flags


def read(argv: list[str] | str, spec_of: Any, hw: Hardware) -> tuple[ServerEngine, str, ServingSetup, Collector]:
    """The ServingSetup the command runs, each field traced to its flag or to the engine default assumed."""
    words = shlex.split(argv) if isinstance(argv, str) else list(argv)
    engine, model, flags = parse(words)
    col = Collector(FORMAT, f"{engine.title} flags")
    if model is None:
        raise ConfigReadError(f"the {engine.title} command names no model; write " + " ".join(engine.launcher("MODEL")))
    col.set_model(model, "model")
    table = flag_table(engine)
    values: dict[str, Any] = {}
    expert_sizes = {flag: word for flag, word in flags.items() if flag in engine.expert_parallel_flags}
    for flag, word in flags.items():
        if flag in expert_sizes:
            continue
        if flag not in table:
            if flag in NOT_PRICED:
                col.ignore(flag)
            else:
                col.reject([flag], table)
            continue
        field, words_ = table[flag]
        if field == "weight_format" and word in engine.facts.dropped_choices:
            raise ConfigReadError(f"{col.where(flag)}={word!r}: {engine.facts.dropped_choices[word]}. Accepted: "
                                  + ", ".join(sorted(str(w) for w in words_ if w is not None)))
        unpriced, why = engine.unpriced_values.get(field, ((), ""))
        if word in unpriced:
            raise ConfigReadError(f"{col.where(flag)}={word!r} is a valid {engine.title} value, but {why}")
        values[field] = _value(field, word, words_, col.where(flag))
        col.set(f"serving.{field}", values[field], flag)
    spec: ModelSpec = spec_of(model)
    for flag, word in expert_sizes.items():   # a size, not a ServingSetup field: the engine says what it does to the bytes
        size = as_int(word, col.where(flag))
        try:
            col.note(engine.expert_parallel_note(size, ServingSetup(engine=engine.name, **{k: v for k, v in values.items()
                                                                                             if k == "tensor_parallel_size"}), spec.num_experts))
        except PerfGuideError as exc:
            raise ConfigReadError(str(exc)) from None
    _assume(engine, spec, hw, values, col)
    try:
        serving = ServingSetup(engine=engine.name, **values)
    except ValueError as exc:
        raise ConfigReadError(f"the {engine.title} command describes a setup perfguide cannot price: {str(exc).splitlines()[-1].strip()}") from None
    return engine, model, serving, col


def _value(field: str, word: str | None, words: dict[str | None, Any], where: str) -> Any:
    default = ServingSetup.model_fields[field].default
    if word is not None and isinstance(default, int | float) and not isinstance(default, bool):
        return as_int(word, where) if isinstance(default, int) else as_float(word, where)
    if word == "auto" and field == "dtype":
        return None   # the checkpoint's own dtype: filled in by _assume
    if word not in words:
        accepted = ", ".join(sorted(str(w) for w in words if w is not None)) or "no value (a switch)"
        raise ConfigReadError(f"{where}={word!r} is not a value perfguide can price.{did_you_mean(str(word), [str(w) for w in words])} "
                              f"Accepted: {accepted}")
    return words[word]


def _assume(engine: ServerEngine, spec: ModelSpec, hw: Hardware, values: dict[str, Any], col: Collector) -> None:
    """What the command leaves to the engine: its own defaults, said as assumptions."""
    if values.get("dtype") is None:
        values["dtype"] = "fp16" if spec.native_dtype == "fp16" else "bf16"
        col.assume("serving.dtype", values["dtype"], "dtype auto: the checkpoint's own 16-bit dtype (fp32 checkpoints served in bf16)")
    if "max_model_len" not in values and spec.usable_positions:
        values["max_model_len"] = spec.usable_positions
        col.assume("serving.max_model_len", values["max_model_len"], "the engine's default: the model's own context length")
    stored = checkpoint_format(spec.config)   # a quantized checkpoint: the engine reads its quantization_config
    values["checkpoint_format"] = stored
    if "weight_format" not in values:
        values["weight_format"] = stored or values["dtype"]
        col.assume("serving.weight_format", values["weight_format"],
                   "the checkpoint's own quantization_config" if stored else "no --quantization: the 16-bit weights as loaded")
    row = engine.formats.get(values["weight_format"])
    if row is not None and not row.at_load and values["weight_format"] != stored:
        col.note(f"{values['weight_format']} weights need a pre-quantized checkpoint and {spec.name}'s config.json has "
                 f"{'a ' + stored if stored else 'no'} quantization_config: {engine.title} refuses it at load; priced as if it were one")
    if "enable_prefix_caching" not in values and not engine.prefix_caching_default(spec):
        values["enable_prefix_caching"] = False
        col.assume("serving.enable_prefix_caching", False, f"{engine.title}'s own default for a model with recurrent layers")
    gpu = hw.smallest_gpu
    # the batching first: SGLang's default memory fraction reserves room by its chunked-prefill size
    own = engine.server_defaults(gpu, int(values.get("tensor_parallel_size", 1))) if gpu is not None else {}
    for field in ("tensor_parallel_size", "max_num_seqs", "max_num_batched_tokens"):
        if field in values:
            continue
        if field in own:   # what the engine itself takes on this GPU when the command does not say
            values[field] = own[field]
            col.assume(f"serving.{field}", own[field], f"{engine.title}'s own default on {gpu.name if gpu else 'this GPU'}")
        else:
            col.assume(f"serving.{field}", ServingSetup.model_fields[field].default, "perfguide's ServingSetup default")
    if "gpu_memory_utilization" not in values and gpu is not None:
        values["gpu_memory_utilization"] = round(engine.default_utilization(gpu, ServingSetup(engine=engine.name, **values)), 3)
        col.assume("serving.gpu_memory_utilization", values["gpu_memory_utilization"], f"{engine.title}'s own default on {gpu.name}")


def price(engine: ServerEngine, spec: ModelSpec, serving: ServingSetup, hw: Hardware) -> Any:
    from ...scenarios.serving_decisions import to_memory
    from ...scenarios.serving_plan import servable

    servable(spec, engine)   # the rule recommend applies: no serving account for encoders / encoder-decoders

    return to_memory(engine.memory(spec, serving, hw))


def priced(engine: ServerEngine, spec: ModelSpec, serving: ServingSetup, hw: Hardware) -> tuple[Setup, Throughput | None, str]:
    """The Setup ``estimate`` prices and the steady-state speed at the workload ``recommend`` plans for by default
    (1024-token prompts, 256 new tokens), as many of them per replica as the KV cache holds up to max_num_seqs."""
    from ...scenarios.registry import DEFAULT_PROMPT_LEN
    from ...scenarios.serving_decisions import Priced, to_setup, to_throughput
    from ...scenarios.serving_plan import on_nodes
    from ...scenarios.types import Constraints

    mem = engine.memory(spec, serving, hw)
    output = min(int(Constraints.model_fields["max_new_tokens"].default), max(1, serving.max_model_len // 2))
    prompt = max(1, min(DEFAULT_PROMPT_LEN, serving.max_model_len - output))
    per_node = max(1, hw.gpu_count)
    if not mem.fits:
        return on_nodes(to_setup(Priced(serving, mem, None), prompt, output), per_node), None, ""
    batch = max(1, min(serving.max_num_seqs, mem.kv_cache_tokens // (prompt + output)))
    p = Priced(serving, mem, engine.speed(spec, serving, hw, prompt, output, batch))
    gpu = hw.smallest_gpu
    peak = (gpu.half_tflops(serving.dtype) or 0.0) * 1e12 if gpu else 0.0
    why = f"speed at {prompt}-token prompts and {output} new tokens, {batch} requests per replica (what the KV cache and max_num_seqs allow)"
    return on_nodes(to_setup(p, prompt, output), per_node), to_throughput(spec, p, peak), why


def check(argv: list[str] | str, spec_of: Any, hw: Hardware) -> Check:
    """The verdict on a serve command as written, with the changes (as its flags) that make it start."""
    if not hw.has_gpu:
        raise PerfGuideError("a serve command is checked on a GPU: pass --hardware h100-80gb (or another GPU name, :N for N GPUs)")
    engine, model, serving, col = read(argv, spec_of, hw)
    spec: ModelSpec = spec_of(model)
    memory = price(engine, spec, serving, hw)
    setup, throughput, why = priced(engine, spec, serving, hw)
    reading = col.reading()
    changes = () if memory.fits else fit_changes(engine, spec, serving, hw, model)
    gpus = setup.num_gpus * setup.nodes
    return Check(model=spec.name, hardware=f"{hw.name or hw.smallest_gpu.name} ({gpus} GPU{'s' if gpus > 1 else ''})",  # type: ignore[union-attr]
                 setup=setup, fits=memory.fits, memory=memory, throughput=throughput, read=reading.settings, ignored=reading.ignored,
                 unknown=reading.unknown, changes=changes,
                 notes=(*reading.notes, *((memory.start_limit,) if memory.start_limit else ()), *((why,) if why else ())))


def fit_changes(engine: ServerEngine, spec: ModelSpec, s: ServingSetup, hw: Hardware, model: str) -> tuple[Change, ...]:
    """The longest max_model_len (halving) that starts on these GPUs, eager mode (no CUDA-graph memory), the most
    sequences (halving max_num_seqs: vLLM profiles its sampler over that many rows of the vocabulary) and the smallest
    larger tensor-parallel size; when no one of them is enough, the most sequences at the longest length that starts
    (the lengths halving from the command's own), with CUDA graphs and, where that holds more sequences, in eager mode."""
    def first_fit(base: ServingSetup, field: str, values: Iterable[object]) -> list[ServingSetup]:
        """The first value of ``field`` (in order) at which ``base`` starts, or none."""
        for value in values:
            new = base.model_copy(update={field: value})
            if price(engine, spec, new, hw).fits:
                return [new]
        return []

    def halving(start: int, floor: int) -> Iterator[int]:
        while start >= floor:
            yield start
            start //= 2

    tps = itertools.takewhile(lambda tp: tp * s.pipeline_parallel_size * s.data_parallel_size <= hw.gpu_count
                              and spec.num_attention_heads % tp == 0, (s.tensor_parallel_size * 2 ** k for k in itertools.count(1)))
    found = [*first_fit(s, "max_model_len", halving(s.max_model_len // 2, 256)),
             # no CUDA graphs captured: their memory goes to the KV cache (vLLM 0.21+ sizes it in)
             *(first_fit(s, "enforce_eager", (True,)) if not s.enforce_eager else []),
             *first_fit(s, "max_num_seqs", halving(s.max_num_seqs // 2, 1)),
             *first_fit(s, "tensor_parallel_size", tps)]
    if not found:   # no one change is enough: the most sequences at the longest length that starts, with CUDA
        for length in halving(s.max_model_len, 256):   # graphs and (where that holds more sequences) in eager mode
            hits = [hit for eager in dict.fromkeys((s.enforce_eager, True))
                    for hit in first_fit(s.model_copy(update={"max_model_len": length, "enforce_eager": eager}),
                                              "max_num_seqs", halving(s.max_num_seqs, 1))]
            found = [h for i, h in enumerate(hits) if i == 0 or h.max_num_seqs > hits[0].max_num_seqs]
            if found:
                break
    if not found:
        return (Change(kind="fit", setup={}, edits=(), fits=False, peak_gib=price(engine, spec, s, hw).device_total / 2**30,
                       reason="no shorter max_model_len (down to 256), eager mode, fewer max_num_seqs (down to 1), the three "
                              "together, or larger tensor-parallel size on these GPUs fits: "
                              "a quantized checkpoint or more / larger GPUs (perfguide recommend MODEL --scenario infer_gpu_one)"),)
    return tuple(_change(engine, spec, s, new, hw, model) for new in found)


def _change(engine: ServerEngine, spec: ModelSpec, old: ServingSetup, new: ServingSetup, hw: Hardware, model: str) -> Change:
    fields = {f: getattr(new, f) for f in ServingSetup.model_fields if getattr(new, f) != getattr(old, f)}
    emitted = dict(engine.flags(model, new))
    keys = {flag: True if emitted[flag] is None else emitted[flag]   # a switch is written bare
            for flag, (field, _) in flag_table(engine).items() if field in fields and flag in emitted}
    return Change(kind="fit", setup={f"serving.{k}": v for k, v in fields.items()}, fits=True,
                  edits=(Edit(format=FORMAT, source=f"{engine.title} command", syntax="flags", keys=keys),),
                  peak_gib=price(engine, spec, new, hw).device_total / 2**30)
