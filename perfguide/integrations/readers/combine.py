"""Several configs of one run (a script's TrainingArguments, the accelerate YAML, its DeepSpeed JSON) -> one Setup dict.

Each reader says what its keys set; here they meet. The same value from two files is fine. Different values are
resolved as the libraries resolve them: the script's TrainingArguments win over the accelerate config's precision
(the Trainer builds its Accelerator from them), and a DeepSpeed value that contradicts another explicit one is an
error, as transformers' ``HfTrainerDeepSpeedConfig`` raises on such a mismatch. DeepSpeed's "auto" takes the
value the other files give, else the default the Trainer would fill in.
"""

from __future__ import annotations

from typing import Any

from .base import ConfigReadError, Reading, Setting

#: (winner, loser) -> the fields where the winner's explicit value overrides the loser's: the script's TrainingArguments
#: over the launcher's config; DeepSpeed's optimizer block over ``optim`` (the Trainer then builds DeepSpeed's optimizer)
OUTRANKS: dict[tuple[str, str], frozenset[str] | None] = {("training_args", "accelerate"): None, ("script_flags", "accelerate"): None,
                                                          ("script_flags", "launcher"): None, ("training_args", "launcher"): None,
                                                          ("launcher", "accelerate"): None,
                                                          ("deepspeed", "training_args"): frozenset({"optimizer"}),
                                                          ("deepspeed", "script_flags"): frozenset({"optimizer"}),
                                                          ("peft_example", "accelerate"): None, ("peft_example", "launcher"): None,
                                                          ("deepspeed", "peft_example"): frozenset({"optimizer"}),
                                                          ("fsdp_qlora", "launcher"): None, ("swift", "accelerate"): None,
                                                          ("swift", "launcher"): None}


#: (format, field) of a switch of its own beside the same field from another file: accelerate sets
#: gradient_checkpointing from fsdp_activation_checkpointing only, FSDP's checkpointing, which the Trainer's does not
#: turn off (Combined._fsdp_checkpointing)
OWN_SWITCH = ("accelerate", "gradient_checkpointing")


def outranks(winner: Setting, loser: Setting) -> bool:
    if (winner.format, loser.format) not in OUTRANKS:
        return False
    fields = OUTRANKS[(winner.format, loser.format)]
    return fields is None or winner.field in fields


class Combined:
    """The merged fields, each with the Setting that decided it, plus what every reading left unpriced."""

    def __init__(self, readings: list[Reading], overrides: dict[str, Any]) -> None:
        self.readings = readings
        self.notes: list[str] = [n for r in readings for n in r.notes]
        self.chosen: dict[str, Setting] = {}
        explicit = [s for r in readings for s in r.settings if not s.assumed and s.field != "model"]
        for field in dict.fromkeys(s.field for s in explicit):
            self.chosen[field] = self._resolve([s for s in explicit if s.field == field])
        for r in readings:
            for field, key in r.auto.items():
                if field in self.chosen:
                    self.notes.append(f"{key} is \"auto\": filled with {self.chosen[field].value!r} from {self.chosen[field].source}")
        for s in (s for r in readings for s in r.settings if s.assumed):
            self.chosen.setdefault(s.field, s)
        for field, value in overrides.items():
            self.chosen[field] = Setting(field=field, value=value, source="given to perfguide check (overrides the configs)")
        models = [s for r in readings for s in r.settings if s.field == "model"]
        self.model: Setting | None = models[0] if models else None
        headed = next((r for r in readings if r.task is not None), None)   # a command that trains another head says so
        self.task, self.num_labels = (headed.task, headed.num_labels) if headed is not None else (None, None)
        if len({m.value for m in models}) > 1:
            raise ConfigReadError(f"the configs name different models: {models[0].source}={models[0].value!r}, "
                                  f"{models[1].source}={models[1].value!r}; pass one config per run, or --model")

    def _resolve(self, settings: list[Setting]) -> Setting:
        """The value every disagreeing setting is outranked by (the launcher's precedence), else one line naming both."""
        fsdp_ac = next((x for x in settings if (x.format, x.field) == OWN_SWITCH), None)
        if fsdp_ac is not None and fsdp_ac.value is True:
            return self._fsdp_checkpointing(fsdp_ac, [x for x in settings if x.format != fsdp_ac.format])
        values = list(dict.fromkeys(repr(x.value) for x in settings))
        if len(values) == 1:
            return settings[0]
        for value in values:
            mine = [x for x in settings if repr(x.value) == value]
            others = [x for x in settings if repr(x.value) != value]
            if all(any(outranks(m, o) for m in mine) for o in others):
                for o in others:
                    self.notes.append(f"{o.source}={o.value!r} is overridden by {mine[0].source}={mine[0].value!r}")
                return mine[0]
        a, b = settings[0], next(x for x in settings if repr(x.value) != repr(settings[0].value))
        raise ConfigReadError(f"{a.field} is set twice, differently: {a.source}={a.value!r} but {b.source}={b.value!r}; "
                              "make them agree (the launcher refuses the mismatch)")

    def _fsdp_checkpointing(self, fsdp_ac: Setting, others: list[Setting]) -> Setting:
        """accelerate's FSDP activation checkpointing and the Trainer's own are two switches (transformers 5's Trainer
        reads ``fsdp_plugin.activation_checkpointing`` beside ``args.activation_checkpointing``): the training argument's
        False does not turn FSDP's off, and both on is a run the Trainer refuses ("can't both be set to True")."""
        for o in others:
            if o.value is False:
                self.notes.append(f"{o.source}=False leaves {fsdp_ac.source}=True on: FSDP checkpoints the blocks itself, "
                                  "whatever the Trainer's own switch says")
            elif o.value is True:
                self.notes.append(f"does not start here: {o.source}=True beside {fsdp_ac.source}=True, which transformers' "
                                  "Trainer refuses (\"can't both be set to True\"); set the training argument False, as "
                                  "FSDP's checkpointing needs no second pass")
        return fsdp_ac

    def assume(self, field: str, value: Any, why: str) -> None:
        """A default for a field no config set (kept out when one did)."""
        if field not in self.chosen:
            self.chosen[field] = Setting(field=field, value=value, source=why, assumed=True)

    def value(self, field: str, default: Any = None) -> Any:
        return self.chosen[field].value if field in self.chosen else default

    def fields(self) -> dict[str, Any]:
        """The Setup dict, with the strategy made whole from the world size and checked against DeepSpeed's batch rule."""
        world = int(self.value("num_gpus", 1)) * int(self.value("nodes", 1))
        if "strategy" not in self.chosen or (self.value("strategy") == "ddp" and world == 1):
            zero0 = " (ZeRO stage 0 is plain data parallelism)" if "_zero0" in self.chosen else ""
            launcher = self.readings[0].multi_process if self.readings else "ddp"
            # one process of a sharded recipe that offloads (torchtune's fsdp_cpu_offload) still runs under FSDP
            offloaded = launcher.startswith("fsdp") and self.value("offload_params", False)
            word = launcher if world > 1 or offloaded else "single"
            why = f"{world} process(es) without FSDP or ZeRO sharding{zero0}" if word in ("ddp", "single") else \
                f"{world} process{'es' if world > 1 else ''} of {self.readings[0].format}'s distributed recipe ({word})"
            self.chosen["strategy"] = Setting(field="strategy", value=word, assumed=True, source=why)
        out = {f: s.value for f, s in self.chosen.items() if not f.startswith("_")}
        if "_train_batch_size" in self.chosen:
            # DeepSpeed's batch world is the ranks over the sequence split (runtime/config.py: world / sequence_parallel_size)
            sp = int(out.get("sequence_parallel", 1))
            total = int(out.get("micro_batch_size", 1)) * int(out.get("gradient_accumulation_steps", 1)) * world // sp
            said = self.chosen["_train_batch_size"]
            if said.value != total:
                split = f" / {sp} (each sequence split over {sp})" if sp > 1 else ""
                raise ConfigReadError(f"{said.source}={said.value} but micro-batch {out.get('micro_batch_size', 1)} x accumulation "
                                      f"{out.get('gradient_accumulation_steps', 1)} x {world} process(es){split} = {total}; DeepSpeed asserts they are equal")
        return out

    def split_reduce_note(self) -> str | None:
        """What a DeepSpeed JSON's ``seq_parallel_communication_data_type`` does to this reading's plan: where DeepSpeed
        runs the split itself (accelerate's ``sp_size`` registers its Ulysses process groups) it reduces gradients in it
        (runtime/engine.py), fp32 when unset (runtime/constants.py), where the priced reduce is 16-bit; a split another
        library runs (axolotl's ring attention, ms-swift's own Ulysses) registers no DeepSpeed groups, and without a
        split the key has no effect either."""
        said = self.chosen.get("_split_reduce_dtype")
        split = (bool(self.value("_deepspeed_split")) and int(self.value("sequence_parallel", 1)) > 1
                 and str(self.value("strategy", "")).startswith("zero"))
        if not split:
            return None if said is None else f"{said.source}={said.value!r} has no effect: DeepSpeed splits no sequence here"
        if said is not None and str(said.value) in ("bf16", "bfloat16", "fp16", "float16"):
            return f"{said.source}={said.value!r}: DeepSpeed reduces the split plan's gradients in 16 bits, as priced"
        where = f"{said.source}={said.value!r}" if said is not None else "seq_parallel_communication_data_type unset (DeepSpeed's default fp32)"
        return (f"{where}: DeepSpeed reduces the split plan's gradients in fp32 (runtime/engine.py), twice the 16-bit bytes "
                "priced; set it to \"bf16\" in the DeepSpeed JSON, as the ALST recipes do")

    def settings(self) -> tuple[Setting, ...]:
        shown = [s for f, s in self.chosen.items() if not f.startswith("_")]
        return ((self.model,) if self.model else ()) + tuple(shown)

    def ignored(self) -> tuple[str, ...]:
        return tuple(k for r in self.readings for k in r.ignored)

    def unknown(self) -> tuple[str, ...]:
        return tuple(k for r in self.readings for k in r.unknown)
