"""An axolotl YAML <-> Setup fields, as axolotl (commit 067b021c8) validates and normalises it.

``bf16: auto`` is true on a bf16 GPU, and the model then loads in bf16 (``resolve_dtype`` in
src/axolotl/utils/config/__init__.py: bf16 -> torch_dtype bfloat16; load_in_8bit or fp16 -> float16; else float32).
``sample_packing`` packs samples into rows with position ids (multipack), priced padding-free; the Liger plugin's
fused linear cross-entropy is Liger's, the CutCrossEntropyPlugin's loss Cut Cross-Entropy's. The world size comes from the launcher, not the YAML.
"""

from __future__ import annotations

import re
from typing import Any

from ...optimizer_facts import names as optimizer_names
from ...techniques.tiled_mlp import AXOLOTL_SHARD_TOKENS
from .base import (
    LINEAR_LEAVES,
    Collector,
    ConfigReadError,
    as_bool,
    as_float,
    as_int,
    attention,
    choice,
    listing,
    mapping,
    refuse_unpriced,
    regex_targets,
    set_kbit_dtypes,
    switched_on,
)
from .foreign_keys import AXOLOTL, AXOLOTL_PLUGINS, UNPRICED_EFFECTS, UNPRICED_KERNELS
from .training_args import read_fsdp

FORMAT = "axolotl"
SYNTAX = "yaml"
KNOWN = AXOLOTL | AXOLOTL_PLUGINS
PRICED = frozenset({
    "base_model", "micro_batch_size", "gradient_accumulation_steps", "batch_size", "sequence_len", "load_in_4bit", "load_in_8bit",
    "adapter", "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules", "lora_target_linear", "lora_target_parameters",
    "peft_use_dora", "peft_use_rslora",
    "bf16", "fp16", "bfloat16", "float16", "tf32", "optimizer", "gradient_checkpointing", "activation_offloading", "attn_implementation",
    "flash_attention", "sdp_attention", "eager_attention", "xformers_attention", "flex_attention", "sage_attention", "sample_packing",
    "plugins", "liger_fused_linear_cross_entropy", "torch_compile", "fsdp", "fsdp_config", "fsdp_version", "deepspeed",
    "dataloader_num_workers", "dataloader_pin_memory", "fp32_norms", "peft_autocast_adapter_dtype", "cut_cross_entropy", "fp8",
    "rl", "lora_modules_to_save", "tensor_parallel_size", "expert_parallel_size", "context_parallel_size",
    "sequence_parallel_degree", "tiled_mlp", "tiled_mlp_num_shards", "quantize_moe_experts", "llama4_linearized_experts",
    "chunked_cross_entropy", "chunked_cross_entropy_num_chunks",
})
#: axolotl attention words -> what perfguide prices; the memory-efficient kernels it cannot price are priced as sdpa (noted)
ATTENTION = {"flash_attention_2": "flash_attention_2", "sdpa": "sdpa", "eager": "eager", "xformers": "sdpa", "flex_attention": "sdpa",
             "sage": "sdpa", "flash_attention_3": "flash_attention_3"}
_LEGACY_ATTENTION = {"flash_attention": "flash_attention_2", "sdp_attention": "sdpa", "eager_attention": "eager", "xformers_attention": "xformers",
                     "flex_attention": "flex_attention", "sage_attention": "sage"}


#: axolotl's CutCrossEntropyPlugin (its ``cut_cross_entropy`` switch defaults to true once the plugin is listed); its
#: fork of apple/ml-cross-entropy patches any llama-like causal LM (integrations/cut_cross_entropy ``patch_llama_like``)
CCE_PLUGIN = "cut_cross_entropy"
CCE_PLUGIN_PATH = "axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin"
LIGER_PLUGIN_PATH = "axolotl.integrations.liger.LigerPlugin"

#: the only command that runs this format starts a process per visible GPU when it names no count
LAUNCH = ("axolotl train runs accelerate launch, one process per visible GPU unless its "
          "accelerate config says otherwise (--num-gpus N here)")


def read(data: dict[str, Any], col: Collector, base_dir: str | None = None) -> None:
    col.spans_gpus = LAUNCH
    col.reject(sorted(k for k in data if k not in KNOWN), KNOWN)
    plugins = [str(p) for p in listing(data.get("plugins"), col.where("plugins"))]
    liger_kernels = _liger_beside_cce(data, plugins)
    effects = _unpriced_effects(data)
    col.ignore(*sorted(k for k in data if k in KNOWN and k not in PRICED | liger_kernels | set(UNPRICED_KERNELS) | effects
                       and data[k] is not None))
    for key in (k for k in UNPRICED_KERNELS if data.get(k) not in (None, False, "")):
        col.note(f"{col.where(key)}={data[key]!r}: {UNPRICED_KERNELS[key]} is not priced: the run is priced with transformers' "
                 "own modules in its place (its memory and speed differ)")
    for key in sorted(effects):
        col.note(f"{col.where(key)}={data[key]!r}: {UNPRICED_EFFECTS[key]}")
    _run_kind(data, col)
    if data.get("base_model"):
        col.set_model(data["base_model"], "base_model")
    _batch(data, col)
    if data.get("sequence_len") is not None:
        col.set("seq_len", as_int(data["sequence_len"], col.where("sequence_len")), "sequence_len")
    _precision(data, col)
    _adapter(data, col)
    if data.get("optimizer") is not None:
        col.set("optimizer", choice(data["optimizer"], col.where("optimizer"), {n: n for n in optimizer_names()}), "optimizer")
    ckpt = data.get("gradient_checkpointing")
    if ckpt is not None:
        offload = isinstance(ckpt, str) and ckpt.lower() == "offload"   # axolotl: checkpoint and offload to CPU
        col.set("gradient_checkpointing", True if offload else as_bool(ckpt, col.where("gradient_checkpointing")), "gradient_checkpointing")
        if offload:
            col.set("activation_offloading", True, "gradient_checkpointing")
    if data.get("activation_offloading") not in (None, False):
        col.set("activation_offloading", True, "activation_offloading")
    _attention(data, col)
    if switched_on(data, "sample_packing", col):
        col.set("padding_free", True, "sample_packing")
    if any("liger" in p.lower() for p in plugins) and data.get("liger_fused_linear_cross_entropy"):
        col.set("liger_kernel", True, "liger_fused_linear_cross_entropy")
    elif liger_kernels:
        col.set("liger_kernel", True, " + ".join(sorted(liger_kernels)) + " (the loss is Cut Cross-Entropy's)")
    if _cce_on(data, plugins):
        if not any(st.field == "autocast" or (st.field == "weights_dtype" and st.value in ("bf16", "fp16")) for st in col.settings):
            # CutCrossEntropyArgs.check_dtype_is_half: axolotl refuses the config before it trains
            raise ConfigReadError(f"{col.where(CCE_PLUGIN)}: axolotl's CutCrossEntropyPlugin needs bf16 or fp16 training "
                                  "(axolotl refuses this config); set bf16: true (or auto) or fp16: true, or remove the plugin")
        col.set("cut_cross_entropy", True, "plugins" if CCE_PLUGIN not in data else CCE_PLUGIN)
    if switched_on(data, "chunked_cross_entropy", col):   # its peak does not depend on the number of chunks
        col.set("chunked_cross_entropy", True, "chunked_cross_entropy")
        if data.get("chunked_cross_entropy_num_chunks") is not None:
            as_int(data["chunked_cross_entropy_num_chunks"], col.where("chunked_cross_entropy_num_chunks"))
    if data.get("torch_compile") not in (None, False):
        col.set("torch_compile", True, "torch_compile")
    for key in ("dataloader_num_workers", "dataloader_pin_memory"):
        if data.get(key) is not None:
            col.set(key, as_int(data[key], col.where(key), 0) if key.endswith("workers") else as_bool(data[key], col.where(key)), key)
    version = data.get("fsdp_version") or mapping(data.get("fsdp_config"), col.where("fsdp_config")).get("fsdp_version") or 1
    read_fsdp(data.get("fsdp") or (["full_shard"] if data.get("fsdp_config") else None), data.get("fsdp_config"), col,
              default_version=as_int(version, col.where("fsdp_version")))
    if data.get("deepspeed"):
        from . import deepspeed

        deepspeed.read_nested(data["deepspeed"], col, base_dir)


def _unpriced_effects(data: dict[str, Any]) -> set[str]:
    """The UNPRICED_EFFECTS keys this file sets so that they matter (an eval batch no larger than the training one
    cannot peak above it)."""
    on = {k for k in UNPRICED_EFFECTS if data.get(k) not in (None, False, "")}
    eval_batch, train_batch = data.get("eval_batch_size"), data.get("micro_batch_size") or 1
    if "eval_batch_size" in on and not (isinstance(eval_batch, int) and isinstance(train_batch, int) and eval_batch > train_batch):
        on.discard("eval_batch_size")
    return on


def _cce_on(data: dict[str, Any], plugins: list[str]) -> bool:
    return any(CCE_PLUGIN in p.lower() for p in plugins) and data.get(CCE_PLUGIN, True) not in (False, None)


def _liger_beside_cce(data: dict[str, Any], plugins: list[str]) -> frozenset[str]:
    """The LigerPlugin's RMSNorm and GLU kernels beside the Cut Cross-Entropy plugin (its fused cross-entropy left off,
    as axolotl's recent examples pair them): Setup's liger_kernel with cut_cross_entropy prices exactly that (Liger's
    fused loss off, its norm and SwiGLU kernels on). Without both kernels, or without CCE, nothing is priced from them."""
    keys = frozenset({"liger_rms_norm", "liger_glu_activation"})
    on = any("liger" in p.lower() for p in plugins) and _cce_on(data, plugins) and all(data.get(k) for k in keys)
    return keys if on and not data.get("liger_fused_linear_cross_entropy") else frozenset()


def _batch(data: dict[str, Any], col: Collector) -> None:
    if data.get("micro_batch_size") is not None:
        col.set("micro_batch_size", as_int(data["micro_batch_size"], col.where("micro_batch_size")), "micro_batch_size")
    if data.get("gradient_accumulation_steps") is not None:
        col.set("gradient_accumulation_steps", as_int(data["gradient_accumulation_steps"], col.where("gradient_accumulation_steps")),
                "gradient_accumulation_steps")
    elif data.get("batch_size") is not None and data.get("micro_batch_size"):
        # axolotl normalize_config: gradient_accumulation_steps = batch_size // micro_batch_size
        steps = as_int(data["batch_size"], col.where("batch_size")) // as_int(data["micro_batch_size"], col.where("micro_batch_size"))
        col.set("gradient_accumulation_steps", max(1, steps), "batch_size")


def _precision(data: dict[str, Any], col: Collector) -> None:
    fp16 = switched_on(data, "fp16", col)
    bf16_raw = data.get("bf16", "auto")
    bf16 = (not fp16) if bf16_raw == "auto" else bf16_raw not in (None, False) and (bf16_raw == "full" or as_bool(bf16_raw, col.where("bf16")))
    key = "bf16" if "bf16" in data else "bf16 (axolotl default: auto)"
    if bf16_raw == "auto" and bf16:
        col.note(f"{col.where('bf16')}: auto is true on a bf16 GPU (Ampere and newer): priced as bf16")
    if bf16:
        col.set("autocast", "bf16", key)
    elif fp16:
        col.set("autocast", "fp16", "fp16")
    if switched_on(data, "fp8", col):   # utils/trainer.py: ACCELERATE_MIXED_PRECISION
        col.set("autocast", "fp8", "fp8")   # = fp8, accelerate's torchao Float8Linear; the weights keep the bf16 load dtype
    # resolve_dtype: the load dtype follows the precision switches (8-bit loading implies float16); DeepSpeed then keeps
    # fp32 masters whatever the load dtype, which the check assumes when no dtype is set
    if data.get("deepspeed"):
        pass
    elif data.get("bfloat16") or bf16:
        col.set("weights_dtype", "bf16", "bfloat16" if data.get("bfloat16") else key)
    elif data.get("load_in_8bit") or fp16 or data.get("float16"):
        col.set("weights_dtype", "fp16", "fp16")
    else:
        col.set("weights_dtype", "fp32", key)
    if data.get("tf32") is not None and data["tf32"] != "auto":
        col.set("tf32", as_bool(data["tf32"], col.where("tf32")), "tf32")


def _adapter(data: dict[str, Any], col: Collector) -> None:
    adapter = data.get("adapter")
    if data.get("load_in_4bit") and as_bool(data["load_in_4bit"], col.where("load_in_4bit")):
        col.set("weights_dtype", "nf4", "load_in_4bit")
    elif data.get("load_in_8bit") and as_bool(data["load_in_8bit"], col.where("load_in_8bit")):
        col.set("weights_dtype", "int8", "load_in_8bit")
    if data.get("quantize_moe_experts") and as_bool(data["quantize_moe_experts"], col.where("quantize_moe_experts")):
        # monkeypatch/moe_quant.py: the fused expert tensors quantized on load (axolotl requires load_in_4bit / 8bit)
        col.set("quantized_experts", True, "quantize_moe_experts")
    if data.get("llama4_linearized_experts") and as_bool(data["llama4_linearized_experts"], col.where("llama4_linearized_experts")):
        # monkeypatch/models/llama4/modeling.py: one nn.Linear per expert projection, quantized as any Linear
        col.set("linearized_experts", True, "llama4_linearized_experts")
    if not adapter:
        return
    if str(adapter).lower() not in ("lora", "qlora"):
        raise ConfigReadError(f"{col.where('adapter')}={adapter!r} is not an adapter perfguide can price; accepted: lora, qlora (or no adapter: full fine-tuning)")
    lora: dict[str, Any] = {"r": as_int(data.get("lora_r", 8), col.where("lora_r")), "alpha": as_int(data.get("lora_alpha", 16), col.where("lora_alpha")),
                            "dropout": as_float(data.get("lora_dropout") or 0.0, col.where("lora_dropout")),
                            "target_modules": _lora_targets(data, col)}
    if data.get("lora_target_parameters"):   # PEFT's target_parameters: fused expert stacks adapted as parameters
        lora["target_parameters"] = tuple(str(p) for p in listing(data["lora_target_parameters"], col.where("lora_target_parameters")))
    if data.get("lora_modules_to_save"):   # PEFT's modules_to_save: a trained copy of each (embed_tokens, lm_head)
        lora["modules_to_save"] = tuple(str(m) for m in listing(data["lora_modules_to_save"], col.where("lora_modules_to_save")))
    for src, dst in (("peft_use_dora", "use_dora"), ("peft_use_rslora", "use_rslora"),
                     ("peft_autocast_adapter_dtype", "autocast_adapter_dtype")):   # loaders/adapter.py: get_peft_model's
        if data.get(src) is not None:
            lora[dst] = as_bool(data[src], col.where(src))
    kbit = bool(data.get("load_in_4bit") or data.get("load_in_8bit"))
    if kbit:   # the stack's own dtype, so a plan compared with this one keeps it (no cast axolotl cannot make)
        lora["adapter_dtype"] = "fp32"
    col.set("lora", lora, f"adapter ({KEEPS_FP32_ADAPTERS})" if kbit else "adapter")
    if kbit:
        _kbit_dtypes(data, col)


#: where axolotl leaves a k-bit base's other parameters (commit 067b021c8, src/axolotl/loaders/model.py): after
#: peft's prepare_model_for_kbit_training (or none: QLoRA under FSDP or ZeRO-3 skips it), every LoRA / QLoRA run casts
#: the norms and the embedding and head (``get_linear_embedding_layers``) to ``torch_dtype``
#: (``_convert_embedding_modules_dtype``, ``should_convert``: ``needs_fa2_dtype`` is set for any adapter); with
#: ``fp32_norms`` the norm classes stay fp32
#: axolotl's adapters on a k-bit base (commit 067b021c8, src/axolotl/loaders/adapter.py): get_peft_model with PEFT's
#: defaults, which create them fp32 there, and no cast after it but for fp8 bases
KEEPS_FP32_ADAPTERS = "axolotl keeps PEFT's fp32 adapters on a k-bit base (loaders/adapter.py)"
KBIT_DTYPES = "axolotl casts the norms, embeddings and head back to torch_dtype after k-bit preparation (loaders/model.py)"


def _kbit_dtypes(data: dict[str, Any], col: Collector) -> None:
    fp32_norms = bool(data.get("fp32_norms")) and as_bool(data["fp32_norms"], col.where("fp32_norms"))
    sharded = bool(data.get("fsdp") or data.get("fsdp_config") or data.get("deepspeed"))
    bf16 = any(s.field == "autocast" and s.value == "bf16" for s in col.settings)
    recast = fp32_norms and not sharded and bf16
    set_kbit_dtypes(col, "fp32_norms" if recast else "adapter", KBIT_DTYPES + ("; the norms stay fp32" if recast else ""),
                    recast=recast, fp32_norms_key="fp32_norms" if fp32_norms else None)


def _attention(data: dict[str, Any], col: Collector) -> None:
    word, key = data.get("attn_implementation"), "attn_implementation"
    if word is None:
        key = next((k for k in _LEGACY_ATTENTION if data.get(k)), "")
        word = _LEGACY_ATTENTION.get(key)
    if word is None:
        return
    priced = attention(word, col.where(key), ATTENTION, col)
    if priced != word and "/" not in str(word):
        col.note(f"{col.where(key)}={word!r} is priced as {priced} (the same memory order: no s x s score matrix kept)")
    col.set("attn_implementation", priced, key)


def write(changes: dict[str, Any], setup: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Setup changes as axolotl keys."""
    keys: dict[str, Any] = {}
    rest: dict[str, Any] = {}
    simple = {"micro_batch_size": "micro_batch_size", "gradient_accumulation_steps": "gradient_accumulation_steps", "seq_len": "sequence_len",
              "optimizer": "optimizer", "gradient_checkpointing": "gradient_checkpointing", "torch_compile": "torch_compile",
              "padding_free": "sample_packing", "attn_implementation": "attn_implementation", "tf32": "tf32",
              "activation_offloading": "activation_offloading", "dataloader_num_workers": "dataloader_num_workers",
              "sequence_parallel": "context_parallel_size"}
    for field, value in changes.items():
        if field in simple:
            keys[simple[field]] = value
        elif field == "liger_kernel" and getattr(setup, "cut_cross_entropy", False):
            keys.update({"plugins": [CCE_PLUGIN_PATH, LIGER_PLUGIN_PATH], "liger_rms_norm": value, "liger_glu_activation": value})
        elif field == "liger_kernel":
            keys.update({"plugins": [LIGER_PLUGIN_PATH], "liger_fused_linear_cross_entropy": value})
        elif field == "cut_cross_entropy" and value:
            plugins = [CCE_PLUGIN_PATH, LIGER_PLUGIN_PATH] if getattr(setup, "liger_kernel", False) else [CCE_PLUGIN_PATH]
            keys.update({"plugins": plugins, "cut_cross_entropy": True})
        elif field == "cut_cross_entropy":
            keys["cut_cross_entropy"] = False   # the plugin stays listed, switched off
        elif field == "autocast":   # fp8 keeps bf16 as the load dtype; fp8: false where a fp8 config is moved off it
            keys.update(bf16=value in ("bf16", "fp8"), fp16=value == "fp16", fp8=value == "fp8")
        elif field == "weights_dtype" and value in ("nf4", "int8"):
            keys.update(load_in_4bit=value == "nf4", load_in_8bit=value == "int8", adapter="qlora" if value == "nf4" else "lora")
        elif field == "lora" and value is not None:
            keys.update(adapter="qlora" if setup.quantized else "lora", lora_r=value["r"], lora_alpha=value["alpha"])
        elif field == "strategy" and setup.is_deepspeed:
            keys["deepspeed"] = f"deepspeed_configs/zero{setup.zero_stage}.json"   # the files axolotl ships
        elif field == "strategy" and setup.is_fsdp:
            keys.update({"fsdp_version": setup.fsdp_version, "fsdp_config.reshard_after_forward": setup.gathers_params})
        elif field in ("offload_optimizer", "offload_params") and setup.is_fsdp:
            keys["fsdp_config.offload_params"] = value
        else:
            rest[field] = value
    return keys, rest


def _lora_targets(data: dict[str, Any], col: Collector) -> str | tuple[str, ...]:
    """``lora_target_modules``, with ``lora_target_linear`` adding the model's ``nn.Linear`` leaf names, as axolotl
    lists them (find_all_linear_names: not peft's "all-linear", which also wraps a transformers-5 MoE's fused experts
    and router, parameters that are no Linear); neither: axolotl's "all-linear"."""
    listed = data.get("lora_target_modules")
    if not data.get("lora_target_linear"):
        return _targets(listed or "all-linear", col.where("lora_target_modules"))
    named = _targets(listed, col.where("lora_target_modules")) if listed and not isinstance(listed, str) else ()
    return (*named, LINEAR_LEAVES)


def _targets(targets: Any, where: str) -> str | tuple[str, ...]:
    """A list of names; ``all-linear``; or one string, which PEFT reads as a regex (axolotl passes it through)."""
    if not isinstance(targets, str):
        return tuple(str(t) for t in targets)
    return targets if targets == "all-linear" else regex_targets(targets, where)


#: axolotl runs perfguide does not price, refused in one line (each was listed as "read, not priced": priced as SFT)
NOT_PRICED = {"reward_model": "reward-model training (a sequence-classification head on pairs)",
              "qat": "quantization-aware training (fake-quantized Linears)", "relora": "ReLoRA (adapters merged and restarted)",
              "lisa_n_layers": "LISA (a few sampled layers trained at a time)", "diffusion": "diffusion-LM training"}
#: ``rl`` values whose step perfguide prices: DPO (TRL's DPOTrainer; IPO is its loss on the same step)
RL_PRICED = ("dpo", "ipo")


def _run_kind(data: dict[str, Any], col: Collector) -> None:
    """The training axolotl runs: SFT, DPO (``rl: dpo``), or one perfguide refuses rather than price as SFT. A
    context-parallel split is priced per rank (Setup.sequence_parallel); tensor parallelism is refused."""
    refuse_unpriced(data, col, NOT_PRICED, "axolotl's SFT and DPO runs (full, LoRA, QLoRA)")
    if data.get("unfrozen_parameters"):
        _unfrozen(listing(data["unfrozen_parameters"], col.where("unfrozen_parameters")), col, bool(data.get("adapter")))
    rl = data.get("rl")
    if rl not in (None, False, ""):
        if str(rl).lower() not in RL_PRICED:
            raise ConfigReadError(f"{col.where('rl')}={rl!r}: axolotl's {rl} trainer is not priced; accepted: "
                                  f"{', '.join(RL_PRICED)} (DPO's step), or no rl (SFT)")
        col.set("objective", "dpo", "rl")
    for key, kind in (("tensor_parallel_size", "tensor-parallel"), ("expert_parallel_size", "expert-parallel")):
        if as_int(data.get(key) or 1, col.where(key)) > 1:
            raise ConfigReadError(f"{col.where(key)}={data[key]}: {kind} training is not priced; perfguide check prices "
                                  "data-parallel, FSDP and DeepSpeed runs")
    _context_parallel(data, col)


def _context_parallel(data: dict[str, Any], col: Collector) -> None:
    """axolotl's context parallelism (ring-flash-attn; ``sequence_parallel_degree`` is its deprecated name, which
    axolotl copies into ``context_parallel_size``): each rank holds its slice of the sequence (Setup.sequence_parallel)."""
    key = "context_parallel_size" if data.get("context_parallel_size") else "sequence_parallel_degree"
    size = as_int(data.get(key) or 1, col.where(key))
    if size > 1:
        attn = str(data.get("attn_implementation") or ("flash_attention_2" if data.get("flash_attention") else ""))
        if not attn.startswith("flash_attention"):
            raise ConfigReadError(f"{col.where(key)}={size} needs flash attention (axolotl refuses it otherwise: "
                                  "attn_implementation flash_attention_2 or flash_attention_3, or flash_attention: true)")
        col.set("sequence_parallel", size, key)
    if data.get("tiled_mlp"):
        _tiled_mlp(data, col, size)


def _tiled_mlp(data: dict[str, Any], col: Collector, ranks: int) -> None:
    """axolotl's tiled MLP (monkeypatch/tiled_mlp/patch.py, DeepSpeed's TiledMLP under ZeRO): 32,768-token shards of the
    rank's tokens by default, or ``tiled_mlp_num_shards`` equal shards (Setup.tiled_mlp_shard_tokens)."""
    shards = data.get("tiled_mlp_num_shards")
    tokens = AXOLOTL_SHARD_TOKENS
    if shards is not None and data.get("sequence_len") is not None:
        local = -(-as_int(data["sequence_len"], col.where("sequence_len")) // ranks)
        tokens = max(1, -(-local // max(1, as_int(shards, col.where("tiled_mlp_num_shards")))))
    col.set("tiled_mlp_shard_tokens", tokens, "tiled_mlp_num_shards" if shards is not None else "tiled_mlp")


#: parameter names of a decoder's text model, in a text model and in a vision-language one
_TEXT_PARAMS = ("layers.0.self_attn.q_proj.weight", "layers.0.mlp.down_proj.weight", "layers.0.input_layernorm.weight",
                "embed_tokens.weight")
_TEXT_PREFIXES = ("model.", "model.language_model.")


def _unfrozen(patterns: list[Any], col: Collector, adapter: bool) -> None:
    """``unfrozen_parameters``: axolotl trains only the parameters its patterns match (utils/freeze.py: a '.' is a
    literal dot unless '+' follows, ``re.match`` from the start, an optional ``[a:b]`` row range). Patterns that cover a
    whole text model (a vision-language model's language model and head: the vision tower frozen) are what perfguide
    prices anyway; fewer parameters are refused. Beside an adapter, PEFT decides what trains: said, not priced."""
    where = col.where("unfrozen_parameters")
    if adapter:
        col.note(f"{where} beside an adapter is not priced (the adapters are what is priced as trained)")
        return
    texts = [str(p) for p in patterns]
    if any(re.search(r"\[[0-9]*:?[0-9]*\]$", p) for p in texts):
        raise ConfigReadError(f"{where}: a row range trains part of a tensor, which is not priced; perfguide prices whole-model "
                              "full fine-tuning, LoRA and QLoRA")
    escaped = [p for p in texts if "\\." in p]
    if escaped and len(escaped) == len(texts):
        raise ConfigReadError(f"{where}={texts!r} matches no parameter, so nothing trains: axolotl escapes every '.' itself "
                              "(utils/freeze.py), so a written '\\.' asks for a backslash in the name; write "
                              f"{escaped[0].replace(chr(92) + '.', '.').replace('..*', '.*')!r}")
    for p in escaped:
        col.note(f"{where}: {p!r} matches no parameter (axolotl escapes every '.' itself, so '\\.' asks for a backslash in "
                 "the name)")
    rx = [re.compile(re.sub(r"\.(?!\+)", r"\\.", p)) for p in texts]
    whole = any(all(any(r.match(pre + n) for r in rx) for n in _TEXT_PARAMS) for pre in _TEXT_PREFIXES)
    if not whole:
        raise ConfigReadError(f"{where}={texts!r} trains part of the model only, which is not priced; perfguide prices the whole "
                              "text model (patterns covering its embedding and every block), LoRA and QLoRA")
    col.note(f"{where} covers the whole text model: priced as its full fine-tune (a vision tower, where there is one, frozen)")

