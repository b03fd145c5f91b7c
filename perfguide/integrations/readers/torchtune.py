"""A torchtune recipe config (``tune run <recipe> --config x.yaml``) <-> Setup fields, as torchtune (commit bd2a0fc)
builds it: the model builder named by ``model._component_`` (``lora_`` / ``qlora_`` builders add adapters; qlora
quantizes the base to NF4), ``batch_size``, ``dtype`` (torchtune trains in it directly: bf16 weights, no autocast),
``enable_activation_checkpointing`` / ``enable_activation_offloading``, ``compile``, ``optimizer_in_bwd``, the
optimizer's ``_component_`` and ``tokenizer.max_seq_len``. The distributed recipes shard with FSDP2 ``fully_shard``,
so a multi-process run of this config is priced as FSDP (``fsdp_reshard_after_forward``, ``fsdp_cpu_offload``).
"""

from __future__ import annotations

import re
from typing import Any

from .base import Collector, ConfigReadError, as_bool, as_float, as_int, choice, set_kbit_dtypes, switched_on

FORMAT = "torchtune"
SYNTAX = "yaml"
#: every top-level key a torchtune recipe reads (``cfg.get("x")`` / ``cfg.x`` in recipes/*.py at that commit)
KNOWN = frozenset((
    "ac_mode", "ac_option", "activation_offloading_use_streams", "active_steps", "batch_size", "batch_size_val", "chat_template",
    "checkpointer", "clip_grad_norm", "collate_fn", "compile", "context_parallel_dim", "context_parallel_rotate_method",
    "cudnn_deterministic_mode", "custom_sharded_layers", "data_parallel_replicate_dim", "data_parallel_shard_dim", "dataset",
    "dataset_val", "device", "dtype", "enable_activation_checkpointing", "enable_activation_offloading", "enable_async_checkpointing",
    "enable_fp8_training", "enable_kv_cache", "enabled", "epochs", "fake_quant_after_n_steps", "forward_batch_size", "fp8_recipe_name",
    "fsdp_cpu_offload", "fsdp_reshard_after_forward", "gamma", "gradient_accumulation_steps", "include_path", "kd_loss", "kd_ratio",
    "kl_coeff", "limit", "lmbda", "log_every_n_steps", "log_level", "log_peak_memory_stats", "loss", "low_cpu_ram", "lr_scheduler",
    "max_generated_tokens", "max_new_tokens", "max_seq_length", "max_steps_per_epoch", "metric_logger", "min_response_length", "model",
    "num_steps", "optimizer", "optimizer_in_bwd", "output_dir", "penalise_no_eos", "policy_model", "ppo_batch_size", "ppo_epochs",
    "profile_memory", "profiler", "prompt", "quantizer", "ref_checkpointer", "ref_policy_checkpointer", "resize_token_embeddings",
    "resume_from_checkpoint", "reward_and_value_model", "reward_checkpointer", "reward_penalty", "run_val_every_n_steps",
    "save_adapter_weights_only", "save_every_n_steps", "seed", "shuffle", "stop_token_ids", "tasks", "teacher_checkpointer",
    "teacher_model", "temperature", "tensor_parallel_dim", "tensor_parallel_plan", "tokenizer", "top_k", "value_checkpointer",
    "wait_steps", "warmup_steps", "whiten_rewards",
))
PRICED = frozenset({"model", "tokenizer", "batch_size", "gradient_accumulation_steps", "dtype", "enable_activation_checkpointing", "enable_fp8_training",
                    "enable_activation_offloading", "compile", "optimizer_in_bwd", "optimizer", "fsdp_cpu_offload",
                    "fsdp_reshard_after_forward", "device", "loss", "tensor_parallel_dim", "context_parallel_dim",
                    "data_parallel_replicate_dim"})
#: torchtune model builders (torchtune/models/<family>/_model_builders.py) -> the hub checkpoints they load
BUILDERS = {
    "llama3_2_1b": "meta-llama/Llama-3.2-1B", "llama3_2_3b": "meta-llama/Llama-3.2-3B", "llama3_1_8b": "meta-llama/Llama-3.1-8B",
    "llama3_1_70b": "meta-llama/Llama-3.1-70B", "llama3_1_405b": "meta-llama/Llama-3.1-405B", "llama3_8b": "meta-llama/Meta-Llama-3-8B",
    "llama3_70b": "meta-llama/Meta-Llama-3-70B", "llama2_7b": "meta-llama/Llama-2-7b-hf", "llama2_13b": "meta-llama/Llama-2-13b-hf",
    "llama2_70b": "meta-llama/Llama-2-70b-hf", "qwen2_5_0_5b": "Qwen/Qwen2.5-0.5B", "qwen2_5_1_5b": "Qwen/Qwen2.5-1.5B",
    "qwen2_5_3b": "Qwen/Qwen2.5-3B", "qwen2_5_7b": "Qwen/Qwen2.5-7B", "qwen2_5_14b": "Qwen/Qwen2.5-14B", "qwen2_5_32b": "Qwen/Qwen2.5-32B",
    "qwen2_5_72b": "Qwen/Qwen2.5-72B", "qwen2_0_5b": "Qwen/Qwen2-0.5B", "qwen2_1_5b": "Qwen/Qwen2-1.5B-Instruct",
    "qwen2_7b": "Qwen/Qwen2-7B-Instruct", "qwen3_0_6b": "Qwen/Qwen3-0.6B", "qwen3_1_7b": "Qwen/Qwen3-1.7B", "qwen3_4b": "Qwen/Qwen3-4B",
    "qwen3_8b": "Qwen/Qwen3-8B", "qwen3_14b": "Qwen/Qwen3-14B", "qwen3_32b": "Qwen/Qwen3-32B",
    "llama3_3_70b": "meta-llama/Llama-3.3-70B-Instruct", "gemma_2b": "google/gemma-2b", "gemma_7b": "google/gemma-7b",
    "gemma2_2b": "google/gemma-2-2b", "gemma2_9b": "google/gemma-2-9b", "gemma2_27b": "google/gemma-2-27b",
    "mistral_7b": "mistralai/Mistral-7B-v0.1", "phi3_mini": "microsoft/Phi-3-mini-4k-instruct", "phi4_14b": "microsoft/phi-4",
}
#: builders whose model is an image encoder fused with a decoder (torchtune/models/llama3_2_vision, llama4)
MULTIMODAL_BUILDERS = ("llama3_2_vision_", "llama4_")
#: optimizer classes as the configs spell them (the ``_component_`` torchtune imports) -> perfguide's names; the first
#: class of each name is the one a written change names
OPTIMIZER_CLASSES = {"torch.optim.AdamW": "adamw_torch", "torch.optim.Adam": "adamw_torch", "torch.optim.SGD": "sgd",
                     "bitsandbytes.optim.PagedAdamW8bit": "paged_adamw_8bit", "bitsandbytes.optim.AdamW8bit": "adamw_bnb_8bit",
                     "bitsandbytes.optim.PagedAdamW": "paged_adamw_32bit",
                     "torchao.optim.AdamW8bit": "adamw_torch_8bit", "torchao.optim.AdamW4bit": "adamw_torch_4bit"}
#: read case-blind (a config's ``torch.optim.adamw`` is not importable, but says what was meant)
OPTIMIZERS = {k.lower(): v for k, v in OPTIMIZER_CLASSES.items()}
#: losses of recipes that are not one model's fine-tuning step (DPO's reference, distillation's teacher, GRPO's
#: generation): refused rather than priced as SFT
OTHER_OBJECTIVES = {"DPOLoss": "a DPO recipe's (chosen and rejected rows, a reference model)",
                    "GRPOSimpleLoss": "a GRPO recipe's (generation, a reference model)",
                    "PPOLoss": "a PPO recipe's (a policy and a reward/value model)"}
DTYPES = {"bf16": "bf16", "fp32": "fp32", "fp16": "fp16"}
#: torchtune's LoRA module names -> the Hugging Face Linear names perfguide counts
ATTN_MODULES = {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "output_proj": "o_proj"}


def builder_model(component: str, where: str) -> tuple[str, str]:
    """('lora', 'meta-llama/Llama-3.2-1B') from 'torchtune.models.llama3_2.lora_llama3_2_1b'; kind is '', 'lora' or 'qlora'."""
    name = component.rsplit(".", 1)[-1]
    match = re.fullmatch(r"(?:(q?lora)_)?(.+?)(?:_base|_instruct)?", name)
    kind, base = (match.group(1) or "", match.group(2)) if match else ("", name)
    if base.startswith(MULTIMODAL_BUILDERS):
        raise ConfigReadError(f"{where}={component!r}: a multimodal builder (an image encoder beside the decoder, the "
                              "encoder frozen by default), which perfguide check does not price; it prices torchtune's "
                              f"text decoders ({', '.join(sorted(BUILDERS))})")
    if base not in BUILDERS:
        raise ConfigReadError(f"{where}={component!r}: no checkpoint perfguide knows for this builder; pass --model "
                              f"(known builders: {', '.join(sorted(BUILDERS))})")
    return kind, BUILDERS[base]


def read(data: dict[str, Any], col: Collector, base_dir: str | None = None) -> None:
    col.reject(sorted(k for k in data if k not in KNOWN), KNOWN)
    _refuse_other_objectives(data, col)
    if "optimizer" not in data:
        raise ConfigReadError(f"{col.where('optimizer')} is missing: this torchtune config does not train (a generation or "
                              "evaluation recipe's); perfguide check prices training configs: for generation, perfguide "
                              "recommend MODEL --scenario infer_gpu_one")
    col.ignore(*sorted(k for k in data if k in KNOWN and k not in PRICED))
    if data.get("dtype") is not None:  # torchtune casts the model to dtype and trains in it: no autocast, no fp32 master
        col.set("weights_dtype", choice(data["dtype"], col.where("dtype"), DTYPES), "dtype")
        col.set("autocast", None, "dtype")
    model = _block(data, "model")
    if model.get("_component_"):
        kind, name = builder_model(str(model["_component_"]), col.where("model._component_"))
        col.set_model(name, "model._component_")
        if kind:
            _lora(model, kind, col, data.get("dtype"))
    tokenizer = _block(data, "tokenizer")
    if tokenizer.get("max_seq_len") is not None:
        col.set("seq_len", as_int(tokenizer["max_seq_len"], col.where("tokenizer.max_seq_len")), "tokenizer.max_seq_len")
    elif "max_seq_len" in tokenizer:
        col.note(f"{col.where('tokenizer.max_seq_len')} is null (no truncation): the sequence length comes from --seq-len")
    for key, field in (("batch_size", "micro_batch_size"), ("gradient_accumulation_steps", "gradient_accumulation_steps")):
        if data.get(key) is not None:
            col.set(field, as_int(data[key], col.where(key)), key)
    if data.get("device") is not None:
        col.set("device", choice(data["device"], col.where("device"), {"cuda": "cuda", "cpu": "cpu"}), "device")
    for key, field in (("enable_activation_checkpointing", "gradient_checkpointing"), ("enable_activation_offloading", "activation_offloading"),
                       ("compile", "torch_compile"), ("optimizer_in_bwd", "optimizer_in_backward")):
        if data.get(key) is not None:
            col.set(field, as_bool(data[key], col.where(key)), key)
    _optimizer(data.get("optimizer"), col)
    if switched_on(data, "fsdp_cpu_offload", col):
        col.set("offload_params", True, "fsdp_cpu_offload")
        col.set("offload_optimizer", True, "fsdp_cpu_offload")
    _loss(str(_block(data, "loss").get("_component_", "")), col)
    if switched_on(data, "enable_fp8_training", col):   # full_finetune_distributed: torchao convert_to_float8_training
        col.set("autocast", "fp8", "enable_fp8_training")
    # the recipes' StatefulDataLoader gets no num_workers or pin_memory: loaded in the main process, not pinned
    col.assume("dataloader_pin_memory", False, "torchtune's recipes build their StatefulDataLoader without pin_memory")
    _parallel_dims(data, col)
    reshard = data.get("fsdp_reshard_after_forward", True)
    col.multi_process = "fsdp" if as_bool(reshard, col.where("fsdp_reshard_after_forward")) else "fsdp_shard_grad_op"


def _parallel_dims(data: dict[str, Any], col: Collector) -> None:
    """The distributed recipes' device mesh (ParallelDims): tensor parallelism splits the weights, which the check does
    not price (refused); context parallelism splits each sequence over ranks (Setup.sequence_parallel); a replicate
    dimension above 1 (HSDP) is noted, FSDP priced over every rank."""
    if as_int(data.get("tensor_parallel_dim") or 1, col.where("tensor_parallel_dim")) > 1:
        raise ConfigReadError(f"{col.where('tensor_parallel_dim')}={data['tensor_parallel_dim']}: tensor-parallel training is "
                              "not priced; perfguide check prices torchtune's FSDP recipes (set tensor_parallel_dim: 1 to check "
                              "the layout without TP)")
    cp = as_int(data.get("context_parallel_dim") or 1, col.where("context_parallel_dim"))
    if cp > 1:
        col.set("sequence_parallel", cp, "context_parallel_dim")
    if as_int(data.get("data_parallel_replicate_dim") or 1, col.where("data_parallel_replicate_dim")) > 1:
        col.note(f"{col.where('data_parallel_replicate_dim')}={data['data_parallel_replicate_dim']} (HSDP replicas) is not "
                 "priced: FSDP is priced sharded over every rank, fewer bytes than each replica group holds")


def _refuse_other_objectives(data: dict[str, Any], col: Collector) -> None:
    """PPO, DPO, GRPO and knowledge-distillation recipes run more than the one model a fine-tuning step prices."""
    loss = str(_block(data, "loss").get("_component_", "")).rsplit(".", 1)[-1]
    if "policy_model" in data or "reward_and_value_model" in data:
        what, key = OTHER_OBJECTIVES["PPOLoss"], "policy_model"
    elif loss in OTHER_OBJECTIVES:
        what, key = OTHER_OBJECTIVES[loss], "loss._component_"
    elif "teacher_model" in data or "kd_loss" in data:
        what, key = "a knowledge-distillation recipe's (a teacher model beside the student)", "teacher_model"
    else:
        return
    hint = "; for DPO, perfguide recommend MODEL --objective dpo prices TRL's DPOTrainer" if "DPO" in what else ""
    raise ConfigReadError(f"{col.where(key)}: this is {what} config, which is not priced; perfguide check prices "
                          f"torchtune's fine-tuning configs (one model, one optimizer, the next-token loss){hint}")


def _block(data: dict[str, Any], key: str) -> dict[str, Any]:
    value = data.get(key)
    return value if isinstance(value, dict) else {}


def _lora(model: dict[str, Any], kind: str, col: Collector, dtype: Any) -> None:
    modules = [ATTN_MODULES.get(str(m), str(m)) for m in model.get("lora_attn_modules") or []]
    if model.get("apply_lora_to_mlp"):
        modules += ["gate_proj", "up_proj", "down_proj"]
    everything = set(modules) >= {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    if model.get("apply_lora_to_output"):
        col.note(f"{col.where('model.apply_lora_to_output')}: the output projection's adapter is priced as one more LoRA Linear is (small)")
    lora = {"r": as_int(model.get("lora_rank", 8), col.where("model.lora_rank")),
            "alpha": int(as_float(model.get("lora_alpha", 16), col.where("model.lora_alpha"))),
            "dropout": as_float(model.get("lora_dropout", 0.0), col.where("model.lora_dropout")),
            "use_dora": bool(model.get("use_dora", False)),
            "target_modules": "all-linear" if everything else tuple(modules)}
    if dtype is not None:   # the recipes build the model, adapters included, under set_default_dtype(dtype): no peft
        lora["adapter_dtype"] = choice(dtype, col.where("dtype"), DTYPES)
    col.set("lora", lora, "model._component_")
    if kind == "qlora" or model.get("quantize_base"):
        col.set("weights_dtype", "nf4", "model._component_" if kind == "qlora" else "model.quantize_base")
        # torchtune builds the model in its run dtype and turns only the Linears into torchao NF4Tensors
        set_kbit_dtypes(col, "model._component_", "torchtune quantizes the Linears only and runs no peft k-bit preparation")


def _optimizer(opt: Any, col: Collector) -> None:
    if not isinstance(opt, dict) or not opt.get("_component_"):
        return
    component = str(opt["_component_"])
    name = choice(component.lower(), col.where("optimizer._component_"), OPTIMIZERS)
    if name == "adamw_torch" and opt.get("fused"):
        name = "adamw_torch_fused"
    col.set("optimizer", name, "optimizer._component_")
    # the recipe instantiates the class itself: no GlobalOptimManager override (a bnb 8-bit optimizer keeps 8-bit
    # embedding state), whatever the class
    col.set("bnb_embedding_override", False, "optimizer._component_")


def _loss(component: str, col: Collector) -> None:
    """The recipe's loss: LinearCrossEntropyLoss (162 of torchtune's 168 training configs) is priced as torchtune's
    own loop (techniques/torchtune_loss.py); CEWithChunkedOutputLoss the same, said with what it holds more; any other
    loss with full logits, said."""
    name = component.rsplit(".", 1)[-1]
    where = col.where("loss._component_")
    if name in ("LinearCrossEntropyLoss", "CEWithChunkedOutputLoss"):
        col.set("trainer", "torchtune", "loss._component_")
    if name == "CEWithChunkedOutputLoss":
        col.note(f"{where}=CEWithChunkedOutputLoss is priced as LinearCrossEntropyLoss; it also keeps every chunk's 16-bit "
                 "logits until the loss returns (2 B per logit more in eager)")
    elif name and name != "LinearCrossEntropyLoss":
        col.note(f"{where}={name} is priced on full logits (an upper bound for a chunked loss)")


def write(changes: dict[str, Any], setup: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Setup changes as torchtune config keys (``key=value`` overrides on the ``tune run`` command line work too)."""
    keys: dict[str, Any] = {}
    rest: dict[str, Any] = {}
    simple = {"micro_batch_size": "batch_size", "gradient_accumulation_steps": "gradient_accumulation_steps", "seq_len": "tokenizer.max_seq_len",
              "gradient_checkpointing": "enable_activation_checkpointing", "activation_offloading": "enable_activation_offloading",
              "torch_compile": "compile", "optimizer_in_backward": "optimizer_in_bwd"}
    inverse = {v: k for k, v in reversed(OPTIMIZER_CLASSES.items())} | {"adamw_8bit": "bitsandbytes.optim.AdamW8bit"}   # HF's alias
    for field, value in changes.items():
        if field in simple:
            keys[simple[field]] = value
        elif field == "weights_dtype" and value in DTYPES.values():
            keys["dtype"] = value
        elif field == "optimizer" and (value in inverse or value == "adamw_torch_fused"):
            keys["optimizer._component_"] = "torch.optim.AdamW" if value == "adamw_torch_fused" else inverse[value]
            if value in ("adamw_torch", "adamw_torch_fused"):   # torch's AdamW only: torchao's classes take no `fused`
                keys["optimizer.fused"] = value == "adamw_torch_fused"
        elif field in ("offload_optimizer", "offload_params"):
            keys["fsdp_cpu_offload"] = value
        elif field == "autocast" and value in ("fp8", None) and setup.trainer == "torchtune":
            keys["enable_fp8_training"] = value == "fp8"   # None: the recipe's dtype is its compute, nothing else to write
        elif field == "lora" and value is not None:
            keys.update({"model.lora_rank": value["r"], "model.lora_alpha": value["alpha"]})
        else:
            rest[field] = value
    return keys, rest
