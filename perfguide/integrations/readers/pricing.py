"""The verdict on a Setup read from a user's configs: its memory and speed on one machine, and the smallest change
that makes it fit, written back in the configs' own keys. ``perfguide.check`` adds the move to the recommended plan;
the Trainer callback's pre-flight uses this alone (it must not plan, only judge what the Trainer is about to run).
"""

from __future__ import annotations

from typing import Any

from ... import sources
from ...errors import InvalidSetupError
from ...hardware.types import Hardware
from ...memory.linear_attention import KERNEL_PATHS, linear_kind, linear_share
from ...memory.moe_lora import linear_module_leaves, listed_targets
from ...memory.types import MemoryEstimate
from ...model.linears import linear_shapes
from ...model.types import ModelSpec
from ...scenarios.registry import DEFAULT_TRAIN_SEQ_LEN
from ...scenarios.speech import label_bound
from ...setup import Setup
from ...techniques.tiled_mlp import alst_shard_tokens
from . import module
from .base import LENGTH_FROM_MODEL, LINEAR_LEAVES, TILED_BY_HIDDEN, nest
from .combine import Combined
from .fitting import smallest_fit
from .verdict import GUESSED_LENGTH, Change, Check, Edit


def verdict(spec: ModelSpec, hw: Hardware, c: Combined) -> tuple[Check, Pricer]:
    """Price the Setup the configs describe (defaults assumed and said), with the fit change when it does not fit."""
    assume_defaults(c, spec, hw)
    setup = setup_of(c)
    if setup.attn_implementation == "sdpa" and not spec.supports_sdpa:   # named in a config: the load fails, as estimate says
        from ...scenarios.rules_attention import sdpa_refused

        raise InvalidSetupError(sdpa_refused(spec))
    if setup.sequence_parallel > 1 and spec.recurrent_layer_types and c.value("_deepspeed_split"):
        # accelerate's DeepSpeed split refuses them (Accelerator._prepare_deepspeed); ms-swift's own Ulysses runs
        # Qwen3.5's linear-attention layers (its examples/train/sequence_parallel/sequence_parallel_qwen3_5.sh)
        from ...scenarios.sequence_split import recurrent_problem

        raise InvalidSetupError(f"sequence_parallel={setup.sequence_parallel}: {recurrent_problem(spec.name, spec.recurrent_layer_types)}")
    price = Pricer(spec, hw, setup)
    memory = price.memory(setup)
    if memory.kernel_limit is not None:   # it crashes at any free memory: said, whatever the bytes
        c.notes.append(memory.kernel_limit)
    throughput = price.speed(setup)
    fit = fit_change(price, c, memory)
    if (reduce := c.split_reduce_note()) is not None:
        c.notes.append(reduce)
    check = Check(model=spec.name, hardware=label(hw, setup), setup=setup, fits=memory.fits, memory=memory, throughput=throughput,
                  read=c.settings(), ignored=c.ignored(), unknown=c.unknown(), changes=(fit,) if fit else (),
                  notes=tuple(dict.fromkeys(c.notes)))
    return check, price


#: what the Trainer does with keys no config gave (they also fill DeepSpeed's "auto")
_TRAINER_DEFAULTS = (
    ("micro_batch_size", 8, "TrainingArguments default per_device_train_batch_size (also what fills DeepSpeed's \"auto\")"),
    ("gradient_accumulation_steps", 1, "TrainingArguments default gradient_accumulation_steps"),
    ("optimizer", "adamw_torch_fused", "TrainingArguments default optim"),
    ("gradient_checkpointing", False, "TrainingArguments default activation_checkpointing"),
    ("autocast", None, "no bf16 / fp16 / mixed_precision in the configs: fp32 compute"),
    ("attn_implementation", "sdpa", "transformers 5 default attention (sdpa)"),
)


def resolve_targets(c: Combined, spec: ModelSpec) -> None:
    """A LoRA target a reader could only name as the model's Linear leaves (base.LINEAR_LEAVES), now that it is known;
    and, said in a note, the listed names peft reads as a MoE's v4 expert names."""
    chosen = c.chosen.get("lora")
    lora = chosen.value if chosen is not None else None
    targets = lora.get("target_modules") if isinstance(lora, dict) else None
    if isinstance(targets, tuple) and LINEAR_LEAVES not in targets:
        _converted_note(c, spec, targets)
    if chosen is None or not isinstance(lora, dict) or not isinstance(targets, tuple) or LINEAR_LEAVES not in targets:
        return
    named = [t for t in targets if t != LINEAR_LEAVES]
    c.chosen["lora"] = chosen.model_copy(update={"value": {**lora, "target_modules": tuple(dict.fromkeys((*named, *linear_module_leaves(spec))))}})


def _converted_note(c: Combined, spec: ModelSpec, targets: tuple[str, ...]) -> None:
    """peft rewrites a listed name ending in a v4 expert name (``shared_expert.down_proj`` ends in ``down_proj``) to the
    fused routed-expert stack: the Linear the user named is not adapted, and the experts are, at twice the rank for
    gate_up. axolotl's own Qwen3-Next example lists such names; say so where it happens."""
    try:
        kept, stacks = listed_targets(spec, targets, linear_shapes(spec))
    except InvalidSetupError:
        return   # one half of a fused pair: the estimate refuses it in its own words
    converted = [t for t in targets if t not in kept]
    if stacks and converted:
        c.notes.append(f"LoRA target_modules {', '.join(converted)} on {spec.model_type}: peft 0.19 and later read them as the "
                       f"MoE's v4 expert names and adapt the routed experts' fused stacks instead "
                       f"({', '.join(sorted({s[0] for s in stacks}))}, as target_parameters; gate_up at rank 2r), not the "
                       f"Linears they name; priced so ({sources.PEFT_MOE_TARGETS})")


def resolve_model_keyed(c: Combined, spec: ModelSpec) -> None:
    """Values a reader could only name by the model's shape (ArcticTraining: TiledMLP's shards of hidden_size tokens,
    a length from the model's max_position_embeddings), now that it is known."""
    if c.value(TILED_BY_HIDDEN):
        c.assume("tiled_mlp_shard_tokens", alst_shard_tokens(spec),
                 f"tiled_mlp_compute: ceil(s / hidden) shards, at most hidden_size = {spec.hidden_size:,} tokens each")
    if c.value(LENGTH_FROM_MODEL) and spec.max_position_embeddings:
        c.assume("seq_len", spec.max_position_embeddings,
                 f"data.max_length unset: ArcticTraining takes the model's max_position_embeddings ({spec.max_position_embeddings:,})")


def assume_defaults(c: Combined, spec: ModelSpec, hw: Hardware) -> None:
    """What a config left to its library's defaults or to the launcher, said as an assumption in the report."""
    resolve_targets(c, spec)
    resolve_model_keyed(c, spec)
    c.assume("device", "cuda" if hw.has_gpu else "cpu", "the hardware checked on" + ("" if hw.has_gpu else " has no GPU"))
    span = next((r.spans_gpus for r in c.readings if r.spans_gpus), "")
    if span and hw.gpu_count > 1:
        c.assume("num_gpus", hw.gpu_count, span)
    c.assume("num_gpus", 1, "one process (`python train.py`); pass --num-gpus N, or the accelerate config, for a launcher")
    if not spec.supports_sdpa:   # e.g. Gemma 2's soft-capped scores: transformers loads eager (as estimate prices it)
        c.assume("attn_implementation", "eager", f"{spec.name}'s transformers class refuses SDPA (_supports_sdpa = False) "
                                                 "and loads eager by default")
    for field, value, why in _TRAINER_DEFAULTS:
        c.assume(field, value, why)
    sharded = str(c.value("strategy", "")).startswith(("zero", "fsdp"))
    if sharded and c.value("autocast") in ("bf16", "fp16"):
        c.assume("weights_dtype", "fp32", "DeepSpeed / FSDP mixed precision keep fp32 master weights whatever dtype the model loads in")
    c.assume("weights_dtype", spec.native_dtype, "transformers 5 from_pretrained loads dtype='auto': the checkpoint's own dtype")
    if (audio := spec.audio_input) is not None:   # Whisper: the lengths are the model's (scenarios/speech.py)
        c.assume("seq_len", audio.positions, f"{spec.name}'s encoder runs its {audio.positions} positions for every clip (padded to 30 s)")
        if (bound := label_bound(spec)) is not None:
            c.assume("target_len", bound, "labels padded to the longest in each batch, at most max_target_positions; pass --target-len")
    length = min(spec.usable_positions or DEFAULT_TRAIN_SEQ_LEN, DEFAULT_TRAIN_SEQ_LEN)
    c.assume("seq_len", length, f"{GUESSED_LENGTH}: min({DEFAULT_TRAIN_SEQ_LEN}, the model's positions); pass --seq-len")
    assume_linear_kernels(c, spec, hw)


def assume_linear_kernels(c: Combined, spec: ModelSpec, hw: Hardware) -> None:
    """What runs a hybrid's recurrent layers, which no config key says: packed rows (sample_packing, a flattening
    collator) run only with the kernels installed (transformers' reference code raises on their ``cu_seqlens`` /
    ``seq_idx``), so a packed run is priced with them; otherwise the reference code, the larger, as a plan for a named
    GPU is."""
    kind = linear_kind(spec)
    if kind is None or not linear_share(spec):
        return
    path = KERNEL_PATHS[kind]
    fast = path.value
    if c.value("padding_free") and hw.has_gpu:
        c.assume("linear_attention_kernels", fast, f"packed rows through {path.layers} layers run only with {path.names} "
                                                   "installed (transformers' reference code raises on them): priced with them")
    c.assume("linear_attention_kernels", "torch", f"transformers' reference code for the {path.layers} layers unless "
                                                  f"{path.names} are installed where it trains; pass "
                                                  f"--linear-attention-kernels {fast} if they are")


def setup_of(c: Combined) -> Setup:
    fields = c.fields()
    try:
        return Setup.parse(fields)
    except InvalidSetupError as exc:
        raise InvalidSetupError(f"the configs describe a setup perfguide cannot run: {exc}") from None


def label(hw: Hardware, s: Setup) -> str:
    base = hw.name or (hw.smallest_gpu.name if hw.smallest_gpu and s.device == "cuda" else "this machine")
    return f"{base} ({s.world_size} process{'es' if s.world_size > 1 else ''})"


class Pricer:
    """Memory and speed of Setups on one model and machine, with the calibration read once."""

    def __init__(self, spec: ModelSpec, hw: Hardware, setup: Setup) -> None:
        self.spec, self.hw, self.setup = spec, hw, setup
        from ...measure.calibration import factors_for

        self.factors = factors_for(hw, spec) if setup.task == "train" else None

    def memory(self, s: Setup) -> Any:
        from ...memory import estimate_memory

        return estimate_memory(self.spec, s, self.hw, self.factors)

    def speed(self, s: Setup) -> Any:
        from ...speed import estimate_speed

        if s.device == "cuda" and not self.hw.has_gpu:
            return None
        return estimate_speed(self.spec, s, self.hw, self.factors)

    def rate(self, s: Setup) -> float:
        t = self.speed(s)
        return t.tokens_per_s if t is not None else 0.0

    @property
    def bf16_ok(self) -> bool:
        gpu = self.hw.smallest_gpu
        return self.setup.device == "cpu" or (gpu is not None and gpu.supports_bf16)


def edits_for(changes: dict[str, Any], new: Setup, c: Combined) -> tuple[Edit, ...]:
    """Setup changes as keys of the config that set each field (else the first config), in its own syntax."""
    primary = c.readings[0]
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for field, value in changes.items():
        owners = {(s.format, s.source.split(":")[0]) for r in c.readings for s in r.settings if s.field == field and not s.assumed}
        for owner in sorted(owners) or [(primary.format, primary.source)]:
            groups.setdefault(owner, {})[field] = plain(value)
    edits: list[Edit] = []
    leftover: dict[str, Any] = {}
    for (fmt, src), fields in groups.items():
        mod = module(fmt)
        keys, rest = mod.write(fields, new)
        if rest and fmt != primary.format:
            more, rest = module(primary.format).write(rest, new)
            if more:
                edits.append(Edit(format=primary.format, source=primary.source, syntax=module(primary.format).SYNTAX, keys=more))
        if keys:
            edits.append(Edit(format=fmt, source=src, syntax=mod.SYNTAX, keys=keys))
        leftover.update(rest)
    for other in c.readings[1:]:   # a field no config set, that another of them has a key for (a launcher's FSDP version)
        if not leftover:
            break
        if not other.settings:   # a launcher that says nothing (`python train.py`) takes no keys either
            continue
        keys, leftover = module(other.format).write(leftover, new)
        if keys:
            edits.append(Edit(format=other.format, source=other.source, syntax=module(other.format).SYNTAX, keys=keys))
    # the script's TrainingArguments say what a launcher's files cannot (a recipe tool's config is the whole run)
    if leftover and primary.format in ("accelerate", "deepspeed", "launcher"):
        keys, leftover = module("training_args").write(leftover, new)
        if keys:
            edits.append(Edit(format="training_args", source="TrainingArguments (your script)", syntax="kwargs", keys=keys))
    if leftover:
        edits.append(Edit(format="setup", source="perfguide.Setup", syntax="setup", keys=nest({k: plain(v) for k, v in leftover.items()})))
    return tuple(edits)


def plain(value: Any) -> Any:
    return value.to_dict() if hasattr(value, "to_dict") else value


def more_gpus(price: Pricer, c: Combined) -> tuple[dict[str, Any], ...]:
    """A sharded recipe (torchtune's distributed ones, an FSDP / ZeRO launcher config) read as one process on a machine
    with more GPUs: launching it on all of them is one edit (the launcher's process count)."""
    s, hw = price.setup, price.hw
    sharded = c.readings[0].multi_process if c.readings else "ddp"
    assumed = "num_gpus" not in c.chosen or c.chosen["num_gpus"].assumed
    if s.world_size > 1 or hw.gpu_count < 2 or not assumed or not sharded.startswith(("fsdp", "zero")):
        return ()
    return ({"num_gpus": hw.gpu_count, "strategy": sharded},)


def fit_change(price: Pricer, c: Combined, memory: MemoryEstimate) -> Change | None:
    """The smallest change that fits, for the config's own ``memory`` (None when it fits)."""
    if memory.fits:
        return None
    fixed = frozenset(f for r in c.readings for f in r.fixed)
    # an attention kernel that cannot index the run's q: FlashAttention-3 on Hopper (what the crash's reporters were
    # told to use), else SDPA, is one more single edit
    hopper = bool(price.hw.gpus) and all(g.supports_flash_attention_3 for g in price.hw.gpus)
    unindexed = ({"attn_implementation": "flash_attention_3" if hopper else "sdpa"},) \
        if memory.kernel_limit is not None else ()
    found = smallest_fit(price.setup, price.bf16_ok, lambda s: bool(price.memory(s).fits), price.rate,
                         (*more_gpus(price, c), *unindexed), fixed)
    if found is None:
        return Change(kind="fit", setup={}, edits=(), fits=False, peak_gib=memory.device_total / 2**30,
                      reason="no change of up to three settings fits: see the recommended plan (LoRA / QLoRA, more GPUs, a larger GPU)")
    changes, new = found
    rate = price.rate(new)
    return Change(kind="fit", setup={k: plain(v) for k, v in changes.items()}, edits=edits_for(changes, new, c), fits=True,
                  peak_gib=price.memory(new).device_total / 2**30, tokens_per_s=rate or None)
