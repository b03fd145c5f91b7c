"""The two entry points: ``recommend`` (search) and ``estimate`` (price one Setup)."""

from __future__ import annotations

import logging
from typing import Any

from ._base import build_strict
from .decisions import Decision
from .errors import ConflictingConstraintsError, InvalidSetupError, PerfGuideError, WrongMachineError, unknown_value
from .hardware.types import Hardware
from .memory.factors import Factors
from .memory.types import MemoryEstimate
from .model.tasks import with_task
from .model.types import ModelSpec
from .recommendation import Recommendation
from .scenarios import registry
from .scenarios.applicable import check_applicable
from .scenarios.module_state import as_the_module_is
from .scenarios.registry import DEFAULT_GLOBAL_BATCH, DEFAULT_PROMPT_LEN, DEFAULT_TRAIN_SEQ_LEN, ScenarioInfo
from .scenarios.rules_attention import sdpa_refused
from .scenarios.speech import speech_lengths
from .scenarios.types import Constraints, Request
from .setup import Setup
from .speed.types import Throughput

logger = logging.getLogger("perfguide")

# Setup's own bounds: on one device the whole global batch may become accumulation steps (<= 1,000,000).
MAX_SEQ_LEN = 10_000_000
MAX_GLOBAL_BATCH = 1_000_000


def resolve_hardware(hardware: Hardware | str | None, host_ram: int | float | str | None = None) -> Hardware:
    """None probes this machine; a string is a named target ("a100-80gb:8", "dgx-h100"); a Hardware is used as is.
    ``host_ram`` (GiB, or a size such as "1.5TB") replaces the machine's RAM: a named host is a guess."""
    hw = _resolve_hardware(hardware)
    if host_ram is None:
        return hw
    from .hardware.named import with_host_ram

    return with_host_ram(hw, host_ram)


def _resolve_hardware(hardware: Hardware | str | None) -> Hardware:
    if hardware is None:
        return Hardware.probe()
    if isinstance(hardware, Hardware):
        return hardware
    if isinstance(hardware, str):
        return Hardware.from_name(hardware)
    raise PerfGuideError(f"hardware must be None (probe), a name like 'a100-80gb:8', or a perfguide.Hardware; got {type(hardware).__name__}")


def _constraints(values: dict[str, Any]) -> Constraints:
    return build_strict(Constraints, values, "constraint", PerfGuideError)


def _positive(name: str, value: int | None, limit: int) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1 or value > limit):
        raise PerfGuideError(f"{name} must be a positive integer (1..{limit:,}), got {value!r}")


def _generates(spec: ModelSpec) -> bool:
    """Decoder LMs append new tokens to the prompt; encoders and task heads only read it (ModelSpec.generates)."""
    return spec.generates


def _with_nodes(hw: Hardware, nodes: int) -> Hardware:
    """``nodes=N`` multiplies a one-node target; a target that already names its node count must agree with it."""
    if nodes == 1 or hw.nodes == nodes:
        return hw
    if hw.nodes > 1:
        per_node = hw.name.rsplit("x", 1)[0] if hw.name and hw.name.endswith(f"x{hw.nodes}") else None
        instead = f"hardware='{per_node}x{nodes}' or " if per_node else ""
        raise ConflictingConstraintsError(f"nodes={nodes} conflicts with hardware {hw.name or 'given'!r}, which describes {hw.nodes} "
                                          f"node(s); use {instead}nodes={hw.nodes} (one count, said once)")
    name = hw.name if hw.name is None or ":" in hw.name else f"{hw.name}:{hw.gpu_count}"
    return hw.model_copy(update={"nodes": nodes, "name": None if name is None else f"{name}x{nodes}"})


def _default_seq_len(spec: ModelSpec, info: ScenarioInfo, new_tokens: int) -> int:
    """Training: up to 2048. Serving: a 1024-token prompt, shortened so prompt + new tokens stay within the positions."""
    limit = spec.usable_positions or DEFAULT_TRAIN_SEQ_LEN
    if info.training:
        return min(limit, DEFAULT_TRAIN_SEQ_LEN)
    room = limit - new_tokens if _generates(spec) and limit > new_tokens else limit
    return min(room, DEFAULT_PROMPT_LEN)


def _default_global_batch(info: ScenarioInfo, cons: Constraints, hw: Hardware) -> int:
    """Serving: the concurrency asked for. Training: 32, rounded up to a multiple of the world size, so that a
    default never conflicts with the machine (32 on 6 GPUs would not split evenly; 36 does)."""
    if not info.training:
        return cons.batch_size or 1
    world = (cons.num_gpus or hw.gpu_count) * hw.nodes if info.multi_gpu else 1
    return -(-DEFAULT_GLOBAL_BATCH // world) * world


def _check_context(spec: ModelSpec, info: ScenarioInfo, seq_len: int, cons: Constraints) -> list[str]:
    """Sequences past the model's position table fail (learned positions) or degrade (RoPE): refuse or warn."""
    limit = spec.usable_positions
    if not limit:
        return []
    train = info.training
    length, field = (seq_len, "seq_len") if train else (cons.prompt_len or seq_len, "prompt_len" if cons.prompt_len else "seq_len")
    if length > limit:
        raise ConflictingConstraintsError(
            f"{field}={length} exceeds {spec.name}'s "
            + (f"max_position_embeddings={limit}" if spec.max_position_embeddings == limit else
               f"{limit} usable positions (max_position_embeddings={spec.max_position_embeddings}, "
               f"{(spec.max_position_embeddings or limit) - limit} reserved for the padding offset)") + f"; use {field} <= {limit}, "
            "or a config with a longer context (rope_scaling / a larger max_position_embeddings)")
    if not train and _generates(spec) and length + cons.max_new_tokens > limit:
        return [f"prompt {length} + max_new_tokens {cons.max_new_tokens} = {length + cons.max_new_tokens} tokens exceeds "
                f"{spec.name}'s max_position_embeddings={limit}: generation past it fails (learned positions) or degrades "
                "(RoPE); lower prompt_len or max_new_tokens"]
    return []


def recommend(
    model: Any,
    scenario: str = "train_gpu_one",
    *,
    hardware: Hardware | str | None = None,
    seq_len: int | None = None,
    global_batch_size: int | None = None,
    host_ram: int | float | str | None = None,
    **constraints: Any,
) -> Recommendation:
    """Pick the fastest setup that fits, and say why.

    ``global_batch_size`` is kept fixed: micro-batch x accumulation x world size always equals it.
    """
    info = registry.get(scenario)
    _positive("seq_len", seq_len, MAX_SEQ_LEN)
    _positive("global_batch_size", global_batch_size, MAX_GLOBAL_BATCH)
    cons = _constraints(constraints)
    spec = with_task(ModelSpec.from_any(model, trust_remote_code=cons.trust_remote_code), cons.task, cons.num_labels)
    cons = as_the_module_is(info.task, spec, cons)
    hw = resolve_hardware(hardware, host_ram)
    if info.device == "cuda" and not hw.has_gpu:
        cpu = registry.find(info.task, "cpu", False)
        instead = f"use scenario={cpu.name!r}, or " if cpu else ""
        raise WrongMachineError(
            f"scenario {scenario!r} needs a GPU but this machine has none; {instead}"
            "plan for a GPU you do not have with hardware='a100-80gb' (see perfguide.hardware names)")
    check_applicable(info, cons, hw)
    hw = _with_nodes(hw, cons.nodes)
    seq_len, cons, speech_decision = speech_lengths(spec, info.training, seq_len, cons)   # Whisper's fixed encoder length
    seq_len = seq_len or _default_seq_len(spec, info, cons.max_new_tokens)
    if cons.avg_seq_len is not None and cons.avg_seq_len > seq_len:
        raise ConflictingConstraintsError(f"avg_seq_len={cons.avg_seq_len} exceeds seq_len={seq_len}: it is the mean real tokens per "
                                          f"sample, at most seq_len; use avg_seq_len <= {seq_len}")
    if (why := _target_len_refused(spec, cons.target_len)) is not None:
        raise ConflictingConstraintsError(why)
    if cons.objective == "dpo" and cons.trainer == "transformers":
        raise ConflictingConstraintsError("objective='dpo' runs in TRL's DPOTrainer, not the transformers Trainer; use trainer='trl' or drop trainer")
    if cons.precompute_ref_log_probs and cons.objective != "dpo":
        raise ConflictingConstraintsError("precompute_ref_log_probs is a DPO setting but objective='sft'; add objective='dpo' or drop it")
    context_warnings = _check_context(spec, info, seq_len, cons)
    request = Request(
        scenario=scenario,
        model=spec,
        hardware=hw,
        seq_len=seq_len,
        global_batch_size=global_batch_size or _default_global_batch(info, cons, hw),
        constraints=cons,
        model_id=model if isinstance(model, str) else None,
        calibration=_calibration(hw, spec) if info.training else None,
    )
    logger.debug("planning %s for %s on %s", scenario, spec.name, hw.name or "probed hardware")
    plan = info.plan(request)
    if context_warnings:
        plan = plan.model_copy(update={"warnings": (*context_warnings, *plan.warnings)})
    hardware_decision = _hardware_name_decision(hardware)
    for decision in (speech_decision, hardware_decision):
        if decision is not None:
            plan = plan.model_copy(update={"decisions": (decision, *plan.decisions)})
    return Recommendation(request=request, **dict(plan))


def _hardware_name_decision(hardware: Hardware | str | None) -> Decision | None:
    """A family name ('a100') read as one of its cards: the plan says which, and names the others."""
    from .hardware.named import name_decision

    return name_decision(hardware) if isinstance(hardware, str) else None


def _calibration(hw: Hardware | None, spec: ModelSpec) -> Factors | None:
    """The one place the calibration store is read: the cost model below only ever receives the factors."""
    from .measure.calibration import factors_for

    return factors_for(hw, spec)


def _check_setup_fits_machine(setup: Setup, hw: Hardware) -> None:
    """A Setup asking for GPUs the hardware lacks would be judged against the wrong memory; refuse it."""
    where = f"hardware {hw.name!r}" if hw.name else "this machine"
    if setup.device == "cuda" and not hw.has_gpu:
        raise WrongMachineError(f"setup device='cuda' but {where} has no GPU; use device='cpu', or a GPU target such as hardware='a100-80gb'")
    if setup.nodes > hw.nodes:
        name = hw.name.split(":")[0] if hw.name else "NAME"
        raise InvalidSetupError(f"setup nodes={setup.nodes} but {where} describes {hw.nodes} node(s); use nodes <= {hw.nodes}, "
                                f"or hardware='{name}:{max(1, hw.gpu_count)}x{setup.nodes}' (GPUs per node x nodes)")
    if setup.device == "cuda" and setup.num_gpus > hw.gpu_count:
        raise InvalidSetupError(f"setup num_gpus={setup.num_gpus} but {where} has {hw.gpu_count} GPU(s) per node; "
                                f"use num_gpus <= {hw.gpu_count}, or hardware='NAME:{setup.num_gpus}'")
    from . import techniques

    for t in techniques.active(setup):   # a kernel the card lacks does not run at all (fp8 matmuls on an A100)
        if (missing := t.missing_capability(setup, hw.smallest_gpu)) is not None:
            raise InvalidSetupError(f"{missing}, so this setup does not run there: drop {t.name}, or use a GPU that has it")


def _target_len_refused(spec: ModelSpec, target_len: int | None) -> str | None:
    """A second (decoder) length means something only where a separate decoder stack reads the encoder's output."""
    if target_len is None or spec.is_encoder_decoder:
        return None
    return (f"target_len={target_len} is the decoder length of an encoder-decoder (T5, BART, ...); {spec.name} "
            f"({spec.model_type}) has one stack, whose length is seq_len: drop target_len")


def _refuse_unpriceable(spec: ModelSpec, s: Setup, hw: Hardware | None) -> None:
    """A combination that does not run as priced is refused in one line, not priced (Liger on GPT-2, ...)."""
    from . import techniques

    if (why := _target_len_refused(spec, s.target_len)) is not None:
        raise InvalidSetupError(why)
    n = s.num_gpus
    if s.strategy == "tp" and n > 1 and (spec.num_attention_heads % n or spec.num_key_value_heads % n):
        # tensor parallelism shards whole heads (the same rule infer_gpu_many applies to its own TP degree)
        raise InvalidSetupError(f"strategy='tp' on {n} GPUs splits heads: {spec.name} has {spec.num_attention_heads} query and "
                                f"{spec.num_key_value_heads} KV heads; use num_gpus that divides both, or strategy='device_map'")
    for t in techniques.registry():
        why = t.why_not(s, hw, spec) if t.active(s) and s.task == "train" else None
        if why:
            raise InvalidSetupError(f"{t.name} cannot be priced here: {why}")


def _attention_that_runs(spec: ModelSpec, s: Setup) -> tuple[Setup, str | None]:
    """The attention transformers will run for ``s``: a class that refuses SDPA (Gemma 2's soft-capped scores,
    gpt-oss' sinks: ``_supports_sdpa = False``) loads eager when the user named none, so that is what is priced, and
    the estimate says so; naming SDPA for such a class is refused in one line rather than priced as if it ran."""
    if s.attn_implementation != "sdpa" or spec.supports_sdpa:
        return s, None
    if "attn_implementation" in s.model_fields_set:
        raise InvalidSetupError(sdpa_refused(spec))
    return s.replace(attn_implementation="eager"), (f"priced with eager attention: {spec.name}'s transformers class refuses "
                                                    "SDPA (_supports_sdpa = False) and loads eager by default")


def estimate(model: Any, setup: Setup | dict[str, Any], *, hardware: Hardware | str | None = None, method: str = "analytic",
             host_ram: int | float | str | None = None) -> MemoryEstimate:
    """Price one Setup the user wrote. ``hardware=None`` gives bytes with ``fits`` judged on no device."""
    spec = ModelSpec.from_any(model)
    s, attn_note = _attention_that_runs(spec, Setup.parse(setup))
    est = _estimate(spec, s, hardware, method, host_ram)
    return est.model_copy(update={"notes": (*est.notes, attn_note)}) if attn_note else est


def _estimate(spec: ModelSpec, s: Setup, hardware: Hardware | str | None, method: str,
              host_ram: int | float | str | None) -> MemoryEstimate:
    hw = resolve_hardware(hardware, host_ram) if hardware is not None else None
    if hw is not None:
        _check_setup_fits_machine(s, hw)
    _refuse_unpriceable(spec, s, hw)
    if s.serving is not None:
        return _engine_estimate(spec, s, hw)
    if method == "analytic":
        from .memory import estimate_memory

        return estimate_memory(spec, s, hw, _calibration(hw, spec) if s.task == "train" else None)
    if method == "trace":
        return _trace(spec, s, hw)
    raise unknown_value("estimate method", method, ("analytic", "trace"))


def _engine_estimate(spec: ModelSpec, setup: Setup, hw: Hardware | None) -> MemoryEstimate:
    """A serving setup priced by its engine's own memory rule: the KV-cache tokens and the concurrency at
    max_model_len it will log at start-up."""
    from .engines import server
    from .scenarios.serving_decisions import to_memory

    assert setup.serving is not None
    engine = server(setup.serving.engine)
    from .scenarios.serving_plan import servable

    servable(spec, engine)   # an encoder / encoder-decoder has no per-output-token account to price
    if hw is None or not hw.has_gpu:
        raise InvalidSetupError(f"a serving setup (engine={engine.name!r}) is priced on a GPU: pass hardware='a100-80gb' or another GPU name")
    return to_memory(engine.memory(spec, setup.serving, hw))


def estimate_speed(model: Any, setup: Setup | dict[str, Any], *, hardware: Hardware | str | None) -> Throughput:
    """Predicted step time, tokens/s and MFU of one Setup (same keys as ``estimate``) on ``hardware``: a named
    target, a Hardware, or None to probe this machine (whose recorded calibration then refines the rate)."""
    spec = ModelSpec.from_any(model)
    s, _ = _attention_that_runs(spec, Setup.parse(setup))
    hw = resolve_hardware(hardware)
    _check_setup_fits_machine(s, hw)
    _refuse_unpriceable(spec, s, hw)
    from .speed import estimate_speed as price

    return price(spec, s, hw, _calibration(hw, spec) if s.task == "train" else None)


def _trace(spec: ModelSpec, setup: Setup, hw: Hardware | None) -> MemoryEstimate:
    """The tracer runs transformers' own modules on fake tensors; a model class that cannot run there is a
    one-line error pointing at the analytic mode, never a traceback from deep inside torch."""
    from .memory.trace import trace_memory

    try:
        return trace_memory(spec, setup, hw)
    except PerfGuideError:
        raise
    except Exception as exc:
        reason = (str(exc).strip().splitlines() or [""])[0][:160]
        raise PerfGuideError(f"the exact trace of {spec.name} failed ({type(exc).__name__}: {reason}); "
                             "use method='analytic' for this model") from exc
