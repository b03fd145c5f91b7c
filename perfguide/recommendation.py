"""Recommendation: a Plan plus the objects users pass straight on. Adapters do the converting."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import model_validator

from .decisions import Decision
from .errors import PerfGuideError, needs_packages
from .hardware.types import Hardware
from .model.types import ModelSpec
from .optimizer_facts import steps_in_backward
from .scenarios.types import Plan, Request

if TYPE_CHECKING:  # heavy types only for annotations
    import accelerate
    import peft
    import transformers
    import trl

    from .engines import ServerEngine
    from .render.headline import Summary
    from .setup import ServingSetup


class Recommendation(Plan):
    """A Plan (setup, memory, throughput, decisions, candidates...) plus the request it answers."""

    request: Request

    @property
    def scenario(self) -> str:
        return self.request.scenario

    @property
    def model(self) -> ModelSpec:
        return self.request.model

    @property
    def hardware(self) -> Hardware:
        return self.request.hardware

    def decision(self, setting: str) -> Decision | None:
        """The decision about one setting (e.g. ``"optim"``), or None."""
        return next((d for d in self.decisions if d.setting == setting), None)

    # --- transformers -------------------------------------------------------------------------
    @needs_packages
    def training_args_dict(self, **overrides: Any) -> dict[str, Any]:
        """TrainingArguments kwargs as plain data: works on any machine (plan on a laptop, run on an A100)."""
        from .integrations.transformers import training_args_dict

        return training_args_dict(self, **overrides)

    @needs_packages
    def training_args(self, **overrides: Any) -> transformers.TrainingArguments:
        from .integrations.transformers import training_args

        return training_args(self, **overrides)

    @needs_packages
    def model_kwargs(self) -> dict[str, Any]:
        """``from_pretrained`` kwargs: dtype, attn_implementation, quantization_config, device_map..."""
        from .integrations.transformers import model_kwargs

        return model_kwargs(self)

    @needs_packages
    def prepare_model(self, model: Any) -> Any:
        """Apply what cannot be a TrainingArguments flag: LoRA adapters, checkpointing, bnb embedding overrides."""
        from .integrations.prepare import prepare_model

        return prepare_model(self, model)

    @needs_packages
    def optimizers(self, model: Any, args: Any) -> tuple[Any, Any]:
        """``Trainer(optimizers=...)``: the plan's optimizer stepped inside backward when ``optimizer_in_backward``,
        else ``(None, None)`` (the Trainer builds its own from ``optim``)."""
        if not self.setup.optimizer_in_backward or steps_in_backward(self.setup.optimizer):
            return None, None   # the Trainer builds it from ``optim`` (LOMO / layer-wise optimizers step inside backward themselves)
        from .integrations.optim_in_backward import trainer_optimizers

        return trainer_optimizers(self, model, args)

    @needs_packages
    def data_collator(self, tokenizer: Any = None) -> Any:
        """The collator the plan's tokens/s assume: ``DataCollatorWithFlattening`` when padding-free, else None
        (the Trainer's default); a plan that splits each sequence gets batches padded to a multiple of the split, with
        position_ids (``SplitBatches``; pass the tokenizer for its pad id and causal-LM labels)."""
        from .integrations.collate import data_collator

        return data_collator(self, tokenizer)

    @needs_packages
    def generation_kwargs(self) -> dict[str, Any]:
        from .integrations.transformers import generation_kwargs

        return generation_kwargs(self)

    # --- TRL / PEFT ----------------------------------------------------------------------------
    @needs_packages
    def sft_config_dict(self, **overrides: Any) -> dict[str, Any]:
        """``trl.SFTConfig`` kwargs as plain data: every memory/speed setting explicit, so TRL's defaults
        (checkpointing on, bf16 on, max_length=1024) never change the planned run."""
        from .integrations.trl import sft_config_dict

        return sft_config_dict(self, **overrides)

    @needs_packages
    def sft_config(self, **overrides: Any) -> trl.SFTConfig:
        from .integrations.trl import sft_config

        return sft_config(self, **overrides)

    def dpo_config_dict(self, **overrides: Any) -> dict[str, Any]:
        """``trl.DPOConfig`` kwargs as plain data for a plan made with ``objective='dpo'``: the batch counts
        preference pairs, the reference model's setting (``precompute_ref_log_probs``) is the one priced."""
        from .integrations.trl_dpo import dpo_config_dict

        return dpo_config_dict(self, **overrides)

    @needs_packages
    def dpo_config(self, **overrides: Any) -> trl.DPOConfig:
        from .integrations.trl_dpo import dpo_config

        return dpo_config(self, **overrides)

    @needs_packages
    def lora_config(self, **overrides: Any) -> peft.LoraConfig:
        """The plan's adapter as a ``peft.LoraConfig`` (task type of the model's head, the priced targets)."""
        from .integrations.lora import lora_config

        return lora_config(self, **overrides)

    # --- accelerate / deepspeed / launching ---------------------------------------------------
    @needs_packages
    def accelerator_kwargs(self) -> dict[str, Any]:
        from .integrations.accelerate import accelerator_kwargs

        return accelerator_kwargs(self)

    @needs_packages
    def accelerator(self, **overrides: Any) -> accelerate.Accelerator:
        from .integrations.accelerate import accelerator

        return accelerator(self, **overrides)

    @needs_packages
    def accelerate_config(self) -> dict[str, Any]:
        """The dict ``accelerate launch --config_file`` reads (YAML when written)."""
        from .integrations.accelerate import accelerate_config

        return accelerate_config(self)

    @needs_packages
    def write_accelerate_config(self, path: str | Path = "accelerate.yaml", *, overwrite: bool = False) -> Path:
        """The YAML (+ ``<stem>_deepspeed.json`` for ZeRO plans); existing files are kept unless ``overwrite=True``."""
        from .integrations.accelerate import write_accelerate_config

        return write_accelerate_config(self, path, overwrite=overwrite)

    @needs_packages
    def deepspeed_config(self) -> dict[str, Any] | None:
        from .integrations.deepspeed import deepspeed_config

        return deepspeed_config(self)

    @needs_packages
    def launch_command(self, script: str = "train.py", *script_args: str, config_file: str | None = None) -> str:
        from .integrations.launch import launch_command

        return launch_command(self, script, *script_args, config_file=config_file)

    # --- serving engines (perfguide.engines) ---------------------------------------------------
    @property
    def kv_cache_tokens(self) -> int | None:
        """The KV-cache size the engine logs at start-up (vLLM: 'GPU KV cache size: N tokens'); None without one."""
        return self.engine_memory.kv_cache_tokens if self.engine_memory is not None else None

    @property
    def max_concurrency(self) -> float | None:
        """Sequences of max_model_len tokens the engine's KV cache holds at once."""
        return self.engine_memory.max_concurrency if self.engine_memory is not None else None

    def _server(self) -> tuple[ServerEngine, ServingSetup]:
        """The plan's serving engine; a plan that runs in the user's script is one line naming the servers."""
        from .engines import default, server, servers

        s = self.setup.serving
        if s is None:
            names = " or ".join(repr(e.name) for e in servers())
            raise PerfGuideError(f"this plan runs in your script (engine={default().name!r}) and has no server settings; "
                                 f"use recommend(..., scenario='infer_gpu_one' or 'infer_gpu_many', engine={names})")
        return server(s.engine), s

    @needs_packages
    def engine_args(self) -> dict[str, Any]:
        """Kwargs of the serving engine's Python entry point (vLLM: ``vllm.LLM`` / ``EngineArgs``)."""
        engine, s = self._server()
        return engine.args(self.served_model, s)

    @needs_packages
    def serve_command(self) -> str:
        """The server command line of the plan's engine, loading ``served_model``."""
        engine, s = self._server()
        return engine.command(self.served_model, s)

    @property
    def served_model(self) -> str:
        """What the engine loads: the user's pre-quantized checkpoint, else the model id exactly as given."""
        s = self.setup.serving
        return (s.quantized_model if s is not None else None) or self.request.model_id or self.model.name

    # --- rendering -----------------------------------------------------------------------------
    def report(self, fmt: str = "text", brief: bool = False) -> str:
        """Every choice with its reason and numbers. fmt: 'text', 'rich' (ANSI) or 'markdown'; ``brief=True``:
        only the headline (plan, verdict, memory, speed, what to run)."""
        from .render.report import render

        return render(self, fmt, brief)

    def summary(self) -> Summary:
        """The report's headline as data: plan, verdict and binding limit, memory, speed, and the lines to run."""
        from .render.headline import summary

        return summary(self)

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON data, its headline first as ``summary`` (dropped again when read back)."""
        return {"summary": self.summary().to_dict(), **super().to_dict()}

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @model_validator(mode="before")
    @classmethod
    def _drop_summary(cls, data: Any) -> Any:
        """``summary`` is derived from the fields, so JSON written by ``to_json`` reads back without it."""
        if isinstance(data, dict) and "summary" in data:
            return {k: v for k, v in data.items() if k != "summary"}
        return data

    def _repr_markdown_(self) -> str:
        return self.report("markdown")

    def __str__(self) -> str:
        return self.report("text")

    @needs_packages
    def plot(self, path: str | Path) -> Path:
        from .render.plot import plot_memory

        return plot_memory(self, path)
