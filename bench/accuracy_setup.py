"""A published-measurements row read as perfguide inputs: the hardware and the Setup it ran.

bench/accuracy.py prices what this module reads; a row perfguide's Setup cannot express raises Skip with the
reason the report shows. Its parallelism words are read in bench/accuracy_parallelism.py (with Skip). The row's card is read in bench/accuracy_hardware.py. The row's model is read in bench/accuracy_spec.py, its loss path and library releases in
bench/accuracy_loss.py, and the library releases and DeepSpeed knobs it is priced under in bench/accuracy_runtime.py.
"""

from __future__ import annotations

import re

from accuracy_gauge import recipe_nodes
from accuracy_parallelism import Skip, _int, _strategy, offloads  # noqa: F401  (re-exported: the readers and tests use them from here)

from perfguide.model.types import ModelSpec
from perfguide.setup import LoraSpec, Setup
from perfguide.techniques.tiled_mlp import alst_shard_tokens


def _nf4_library(row: dict[str, str]) -> str:
    """torchtune's rows quantize with torchao's NF4Tensor (the quantization field says so); every other nf4 row is bnb."""
    return "torchao" if row["quantization"].startswith("torchao") else "bitsandbytes"


def _precision(p: str) -> dict[str, object]:
    low = p.lower()
    if "float8" in low:
        raise Skip("Float8 linears are not expressible")
    if low.startswith("fp32") and "no autocast" in low:   # llama-recipes' bfSixteen_mixed: FSDP param_dtype fp32
        return {"weights_dtype": "fp32"}
    if low.startswith("bf16 + autocast"):   # 16-bit weights under Trainer bf16=True: autocast casts fp32 adapters only
        return {"weights_dtype": "bf16", "autocast": "bf16"}
    if "mixed" in low and "bf16" in low and "fsdp" not in low:
        return {"weights_dtype": "fp32", "autocast": "bf16"}
    if "fsdp mixed precision" in low:
        return {"weights_dtype": "fp32", "autocast": "bf16"}
    if "fp16 amp" in low:
        return {"weights_dtype": "fp32", "autocast": "fp16"}
    if "bf16" in low:
        return {"weights_dtype": "bf16"}
    if "16-true" in low or "fp16" in low or "float16" in low:
        return {"weights_dtype": "fp16"}
    if "32" in low:
        return {"weights_dtype": "fp32"}
    raise Skip(f"precision {p!r} not expressible")


_TARGET_WORDS = {
    "query": ("q_proj", "query", ".q", "qkv_proj", "c_attn", "query_key_value"),
    "key": ("k_proj", "key", ".k", "qkv_proj", "c_attn", "query_key_value"),
    "value": ("v_proj", "value", ".v", "qkv_proj", "c_attn", "query_key_value"),
    "projection": ("o_proj", "out_proj", "attention.output.dense", "attn.c_proj", "dense"),
    "mlp": ("gate_proj", "up_proj", "down_proj", "fc1", "fc2", "mlp.", "intermediate.dense", "dense_h_to_4h", "dense_4h_to_h"),
    "linear_attn": ("linear_attn.",),   # a hybrid's gated-DeltaNet projections (Qwen3-Next, Qwen3.5)
}


#: the peft releases that leave each new LoRA adapter in its base weight's dtype (LoraLayer.update_layer:
#: ``self.to(weight.device, dtype=weight.dtype)``): from 0.6.0 (2023-11-02; 0.3-0.5 only moved it to the device, fp32)
#: to 0.11.x; 0.12.0 (2024-07-24) added get_peft_model(autocast_adapter_dtype=True), which upcasts bf16/fp16 adapters to fp32
PEFT_BASE_DTYPE = (("2023-11-02", (0, 6)), ("2024-07-24", (0, 12)))


def _peft_keeps_base_dtype(row: dict[str, str]) -> bool:
    """A PEFT row whose release (stated, else the one current at its date) kept adapters in the base's dtype."""
    if "peft" not in row["method"].lower():
        return False
    (first_day, first), (last_day, last) = PEFT_BASE_DTYPE
    stated = re.search(r"peft[ =v]*(\d+)\.(\d+)", row["notes"] + " " + row["method"], re.I)
    if stated:
        return first <= (int(stated.group(1)), int(stated.group(2))) < last
    date = re.search(r"\d{4}-\d{2}-\d{2}", row["commit_or_date"])
    return date is not None and first_day <= date.group() < last_day


def _torchtune_run_dtype_adapters(row: dict[str, str]) -> bool:
    """torchtune builds the whole model, adapters included, under ``set_default_dtype(dtype)`` (recipes
    lora_finetune_single_device.py / lora_finetune_distributed.py: ``with training.set_default_dtype(self._dtype),
    self._device: model = config.instantiate(cfg_model)``; LoRALinear's lora_a / lora_b are plain nn.Linear made
    there; read at fef3ed10d and 1814feb17): a bf16 run trains bf16 adapters, whose gradients and AdamW moments take
    2 bytes each. No peft, so no fp32 upcast."""
    return "torchtune" in row["source"]


#: what a PEFT row trains that LoraSpec cannot say, as the row's method words name it (the PEFT method comparison's
#: result files: peft_type, LoraConfig use_bdlora / init_lora_weights, the run's optimizer_type)
PEFT_NOT_LORA = ((re.compile(r"^(?:PEFT|swift tuner) (\w+)"), "{0}: perfguide prices LoRA and DoRA adapters only"),
                 (re.compile(r"use_bdlora"), "block-diagonal LoRA (use_bdlora) is not expressible"),
                 (re.compile(r"init_lora_weights '(\w+)'"), "LoRA init '{0}' trains part of each adapter: not expressible"),
                 (re.compile(r"optimizer_type '(lora-fa)'"), "the {0} optimizer (A frozen, only B trained) is not expressible"))


def _peft_not_lora(method: str) -> None:
    """A PEFT method or LoRA variant whose trained parameters a LoraSpec cannot express raises Skip naming it."""
    for pattern, reason in PEFT_NOT_LORA:
        found = pattern.search(method)
        if found:
            raise Skip(reason.format(*found.groups()))


def _litgpt_lora_dropout(row: dict[str, str]) -> float:
    """litgpt's lora_dropout where the row ran litgpt (its rows do not state it): Lit-GPT 8641822b's finetune/lora.py
    (the resource tables) sets ``lora_dropout = 0.05``; the config hub's YAMLs (config_hub/finetune/*/lora.yaml and
    qlora.yaml, unchanged from each file's first commit through 00af8b0d, the README's last row) set 0.1 for the
    Gemma and Gemma 2 configs and 0.05 for every other. Other rows: 0 (a LoraConfig's dropout is stated)."""
    if not row["source_group"].startswith("litgpt"):
        return 0.0
    return 0.1 if "gemma" in row["method"].lower() else 0.05


def _lora(row: dict[str, str], spec: ModelSpec) -> LoraSpec | None:
    _peft_not_lora(row["method"])
    if not row["lora_rank"]:
        if "adapter" in row["method"].lower():
            raise Skip("litgpt Adapter v1/v2 is not expressible (only LoRA)")
        return None
    words = [w.strip() for w in row["lora_targets"].split("(")[0].split(",") if w.strip()]
    if "output" in words:   # torchtune's apply_lora_to_output: an adapter on the LM head, outside the blocks
        raise Skip("LoRA on the output projection (the LM head) is not expressible: LoraSpec adapts block Linears")
    names = [n for n in spec.linear_paths if any(n.endswith(t) or t in n for w in words if w in _TARGET_WORDS for t in _TARGET_WORDS[w])]
    if not names:
        raise Skip(f"LoRA targets {words} do not map onto {spec.name}'s Linears")
    dropout = re.search(r"dropout ([\d.]+)", row["method"])  # the row's LoraConfig lora_dropout: its masks are kept
    saved = re.search(r"modules_to_save \[([\w,]+)\]", row["method"])  # LoraConfig modules_to_save: trained copies
    params = re.search(r"target_parameters \[([\w.,]+)\]", row["method"])  # LoraConfig target_parameters: fused expert stacks
    return LoraSpec(r=int(row["lora_rank"]), alpha=_int(row["lora_alpha"], 16), target_modules=tuple(sorted(set(names))),
                    dropout=float(dropout.group(1)) if dropout else _litgpt_lora_dropout(row),
                    modules_to_save=tuple(saved.group(1).split(",")) if saved else (),
                    target_parameters=tuple(params.group(1).split(",")) if params else (),
                    use_dora="use_dora True" in row["method"], use_rslora="use_rslora True" in row["method"],
                    autocast_adapter_dtype=not (_peft_keeps_base_dtype(row) or _torchtune_run_dtype_adapters(row)),
                    adapter_dtype=_torchtune_adapter_dtype(row))


def _torchtune_adapter_dtype(row: dict[str, str]) -> str | None:
    """The run dtype torchtune makes its adapters in (``_torchtune_run_dtype_adapters``), on an NF4 base too: its
    QLoRA builders quantize the base Linears with torchao's ``to_nf4`` after building them, and the adapters stay
    the plain bf16 ``nn.Linear`` they were made as. None for every other stack (PEFT's rules)."""
    if not _torchtune_run_dtype_adapters(row):
        return None
    run = str(_precision(row["precision"]).get("weights_dtype"))
    return run if run in ("bf16", "fp16", "fp32") else None


def _pre_torch2(row: dict[str, str]) -> bool:
    """Run before PyTorch 2.0: eager attention only, per-tensor AdamW, and zero_grad(set_to_none=False) by default
    (2.0 release notes: "set_to_none=True by default" for Optimizer.zero_grad and Module.zero_grad)."""
    return re.search(r"PyTorch (nightly ~)?1\.", row["notes"] + row["gpu_type"]) is not None


#: loops that rebind ``outputs = model(**batch)`` at the top of each step without deleting the old one: the previous
#: step's output (its logits and any cache it returned) is alive until the next forward returns, through that
#: forward's loss peak (eras.training_cache_bytes ``outputs_alive`` = 2)
LOOP_REBINDS_OUTPUTS = {
    "hf_blog_pytorch_fsdp": "blog assets/62_pytorch_fsdp/run_clm_no_trainer.py: 'for step, batch in ...: outputs = "
                            "model(**batch)'; no del, and the eval loop rebinds the same name",
    "peft_method_comparison_metamathqa": "peft method_comparison/MetaMathQA/run.py train(): 'for step, batch in ...: "
                                         "outputs = model(**batch, num_items_in_batch=...)'; no del before the next step",
    "peft_issue_76_tracemalloc": "peft examples/causal_language_modeling/peft_lora_clm_accelerate_ds_zero3_offload.py "
                                 "@83ded43e: 'for step, batch in enumerate(tqdm(train_dataloader)): outputs = "
                                 "model(**batch)'; no del before the next step",
    "peft_readme_memory_table": "pet examples/{conditional_generation/pet_lora_seq2seq,causal_language_modeling/"
                                "pet_lora_clm}_accelerate_ds_zero3_offload.py @61c577fc4: the same loop",
}


#: loops whose model accelerate prepared, so that under its fp16/bf16 mixed precision the forward returns through
#: ``convert_outputs_to_fp32`` (fp32 copies of every 16-bit output tensor: eras.amp_output_conversion_bytes)
ACCELERATE_AMP_OUTPUTS = {
    "hf_blog_pytorch_fsdp": "blog assets/62_pytorch_fsdp/run_clm_no_trainer.py: model, optimizer, ... = "
                            "accelerator.prepare(...); accelerate 0.7.0 Accelerator.prepare_model: model.forward = "
                            "convert_outputs_to_fp32(torch.cuda.amp.autocast(dtype=torch.float16)(model.forward))",
}


def _attn(row: dict[str, str]) -> str:
    """The row's attention; before PyTorch 2.0 there was no scaled_dot_product_attention, so HF ran eager.
    FlashAttention-3 (flash-attn's hopper flash_attn_interface, transformers' "flash_attention_3") keeps for backward
    what FlashAttention-2 keeps (q, k, v, the output and the fp32 log-sum-exp per head and token; Dao-AILab/flash-attention
    hopper/flash_attn_interface.py @c082294e FlashAttnFunc.forward ctx.save_for_backward(q, k, v, out, softmax_lse)) and
    is priced as Setup's flash_attention_3 (its own backward workspace and index width)."""
    attn = row["attn_impl"] or ("eager" if _pre_torch2(row) else "sdpa")
    return "flash_attention_3" if attn.startswith("flash_attention_3") else attn


#: optimizers whose state lives in CUDA unified memory (bitsandbytes paged_* ; data/optimizers.json "paged")
PAGED = ("paged_adamw_8bit", "paged_adamw_32bit", "paged_lion_8bit", "paged_lion_32bit")


def _optimizer(row: dict[str, str]) -> str | None:
    opt = row["optimizer"].lower()
    if opt in ("none", ""):
        return None
    if opt.startswith("adafactor"):
        return "adafactor"
    if opt.startswith("adamw_torch_fused") or "fused=true" in opt.replace(" ", ""):
        return "adamw_torch_fused"   # TrainingArguments' adamw_torch_fused, torch.optim.AdamW(fused=True): one kernel
    if "fusedadam" in opt.replace(" ", ""):
        # DeepSpeed's FusedAdam (a ds config "optimizer" AdamW section without torch_adam): one multi-tensor CUDA kernel
        # over the fp32 partition, no parameter-sized temporary, as torch's fused AdamW (deepspeed/ops/adam/fused_adam.py)
        return "adamw_torch_fused"
    eight_bit = "8bit" in opt or "8-bit" in opt
    if "paged" in opt:  # bnb PagedAdamW / PagedAdamW8bit: states in CUDA unified memory (see PAGED)
        return "paged_adamw_8bit" if eight_bit else "paged_adamw_32bit"
    if eight_bit:
        return "adamw_bnb_8bit"  # bnb Adam8bit / TrainingArguments adamw_8bit: both moments in 8-bit blocks
    if _pre_torch2(row):
        # before PyTorch 2.0 torch.optim.AdamW ran the per-tensor loop (foreach became the CUDA default in 2.0):
        # no parameter-sized temporary, the same memory as perfguide's per-tensor fused AdamW
        return "adamw_torch_fused"
    return "adamw_torch"  # torch.optim.AdamW default since PyTorch 2.0: foreach on CUDA


def _seq_len(text: str) -> int:
    """Padded-per-batch rows peak at their longest sample; a value the source marks as truncated in print
    ("'12' as printed (probably truncated 128)") is read as the value the source gives for it."""
    for marker in ("probably truncated", "longest sample"):
        if marker in text:
            return _int(text.split(marker)[-1])
    return _int(text)


def _target_len(text: str) -> int | None:
    """An encoder-decoder row's decoder length: the labels' padded length its script states (``--max_target_length``,
    or the reading the row's cell gives as ``target_len``); None where the cell states none (one length)."""
    found = re.search(r"target_len (\d+)", text) or re.search(r"max_target_length\)? (\d+)", text)
    return int(found.group(1)) if found else None


def _kbit_upcast(row: dict[str, str]) -> bool:
    """litgpt, Answer.AI's fsdp_qlora and torchtune quantize the Linears themselves and never run peft's
    prepare_model_for_kbit_training, so nothing is cast to fp32; HF + PEFT rows do. DeepSpeed in bf16/fp16 casting
    the upcast back is the model's (``memory/kbit.kbit_fp32_parts``), read from the row's strategy and precision.

    litgpt under Fabric's ``bf16-mixed`` lands in that state without peft: the MixedPrecision plugin only autocasts
    and converts no module, so the embedding, the norms and the LoRA matrices stay the fp32 they were built in
    (``bf16-true`` builds under the bf16 default dtype instead), and bitsandbytes' Linear4bit returns
    ``out.to(input dtype)``, so the stream stays fp32 (lit-gpt 064fd523 finetune/lora.py with ``--quantize`` and no
    ``--precision``: rows 2702-2703 and 2708-2709)."""
    if "skips prepare_model_for_kbit_training" in row["method"]:  # TRL's SFTTrainer on FSDP-sharded QLoRA
        return False
    if _kbit_quantizer(row) == "litgpt" and _precision(row["precision"]) == {"weights_dtype": "fp32", "autocast": "bf16"}:
        return True
    return not any(k in row["source"].lower() for k in ("litgpt", "fsdp_qlora", "torchtune"))


def _nf4_double_quant(row: dict[str, str]) -> bool:
    """Whether the 4-bit absmax statistics were quantized again. litgpt's bnb.nf4 is Lightning's _NF4Linear
    (compress_statistics=False), bnb.nf4-dq its _NF4DQLinear; a row whose quantization cell says "no double quant"
    ran transformers' BitsAndBytesConfig with bnb_4bit_use_double_quant False (its default; TRL's
    get_quantization_config passes use_bnb_nested_quant, default False); every other HF, Unsloth, fsdp_qlora and
    axolotl row is read with double quant (stated, or Linear4bit's default)."""
    q = row["quantization"]
    if "no double quant" in q:
        return False
    return not (_kbit_quantizer(row) == "litgpt" and not q.endswith("-dq"))


def _kbit_quantizer(row: dict[str, str]) -> str:
    """litgpt's ``--quantize bnb.*`` runs Lightning Fabric's BitsandbytesPrecision, which replaces every nn.Linear of
    litgpt's GPT, lm_head included (``ignore_modules`` left empty by litgpt/finetune/lora.py), quantizing each from
    fp16 (lightning/fabric/plugins/precision/bitsandbytes.py ``_quantize_weight``). HF + PEFT, Unsloth (transformers'
    loader), Answer.AI's fsdp_qlora (``replace_linear`` on ``model.model`` only) and torchtune (its builders leave
    ``output`` unquantized) keep the head 16-bit."""
    return "litgpt" if row["source_group"].startswith("litgpt") else "transformers"


def bnb_embedding_override(stack: str, optimizer: str) -> bool:
    """Whether the run's stack gave embeddings 32-bit bnb state: the HF Trainer registers bnb's GlobalOptimManager
    override when it builds the optimizer from ``TrainingArguments.optim`` (Trainer.create_optimizer); a bnb class the
    script or recipe instantiates itself gets none: torchtune's ``config.instantiate`` (no GlobalOptimManager anywhere in
    pytorch/torchtune's history), HF's v4.18 performance doc handing ``bnb.optim.Adam8bit`` to ``Trainer(optimizers=...)``
    (docs/source/en/perf_train_gpu_one.mdx at 0016acf7), torchao's benchmark loop."""
    return not ("torchtune" in stack.lower() or re.search(r"bnb\.optim\.|Adam8bit|PagedAdamW8bit|bnb 8-bit", optimizer))


#: the SFTTrainer release a row that ran TRL's recast states ("trl SFTTrainer 0.7.10")
_SFT_TRAINER_RELEASE = re.compile(r"\btrl SFTTrainer (\d+\.\d+\.\d+)", re.IGNORECASE)
#: the last TRL release whose peft_module_casting_to_bf16 casts every PEFT tuner layer to bf16 (trl/trainer/utils.py
#: 'if isinstance(module, BaseTunerLayer): module = module.to(torch.bfloat16)', read in the 0.7.5, 0.8.0 and 0.8.6
#: wheels); 0.9.2, the next release on PyPI, and every later one dropped that branch (read in 0.9.2, 0.9.6, 0.12.1,
#: 0.13.0 and 0.21.0)
TRL_LAST_ADAPTER_RECAST = (0, 8, 6)


#: a training script's own copy of the recast, run before the optimizer is built, whose LoraLayer branch casts the
#: adapters too: DHS-LLM-Workshop's personal_copilot/training/train.py at 797a0af ('if isinstance(module, LoraLayer):
#: if args.bf16: module = module.to(torch.bfloat16)', then norms to fp32 and wte/wpe/lm_head to bf16, after
#: Trainer() and before trainer.train()); the row's method says so in these words
OWN_RECAST_WITH_ADAPTERS = "peft_module_casting_to_bf16 with its LoraLayer branch"


def trl_recasts_adapters(row: dict[str, str]) -> bool:
    """Whether the recast a row ran also cast the adapters (Setup.kbit_recast_adapters): the TRL release it names
    (0.7.5-0.8.6 did), or a script's own copy with the LoraLayer branch (OWN_RECAST_WITH_ADAPTERS)."""
    if OWN_RECAST_WITH_ADAPTERS in row["method"]:
        return True
    m = _SFT_TRAINER_RELEASE.search(row["method"])
    if m is None:
        raise ValueError(f"row {row['row_id']}: a peft_module_casting_to_bf16 row names its release ('trl SFTTrainer X.Y.Z' "
                         "in its method): TRL 0.7.5-0.8.6 cast the adapters too, later releases do not")
    return tuple(int(x) for x in m.group(1).split(".")) <= TRL_LAST_ADAPTER_RECAST


#: Liger runs whose kernels Setup.liger_kernel (fused linear cross-entropy with fused RMSNorm, RoPE and SwiGLU) cannot
#: say: a post-init class patch leaves the built norms and MLPs HF's (only the CausalLM forward and the rotary function
#: are looked up at call time), and Liger's gemma2 patch of September 2024 had a plain cross-entropy kernel, no fused one
LIGER_PARTIAL = ("Liger partially applied", "Liger kernels without fused linear cross-entropy")
#: how the rows say Liger's full patch ran (ALST's later recipes: "Liger kernels (model type liger)", the same
#: AutoLigerKernelForCausalLM as the earlier rows' "Liger kernels on (model type liger: ...)")
LIGER_ON = ("Liger kernels on", "Liger kernels (model type liger)")


#: Arctic Long Sequence Training's own memory tricks (ArcticTraining recipes): the MLP run in sequence shards and
#: recomputed in backward (DeepSpeed's TiledMLP through ArcticTraining's model/tiled_compute.py: ceil(s / hidden) shards,
#: at most hidden_size tokens each), and its own patch of the reentrant checkpoint function that moves each checkpointed
#: layer's input to the CPU in forward and back in backward (monkey_patches.py CheckpointFunctionWithCPUOffload), read
#: as activation offloading of the checkpointed inputs (its synchronous copy keeps one layer's input on the GPU, the
#: technique's side-stream copy two: one layer's input more, priced)
ALST_TILED_MLP = "tiled_mlp_compute"
ALST_CHECKPOINT_OFFLOAD = "activation_checkpoint_cpu_offload"


#: a row whose setup its own source puts outside what a Setup says (another era's model code, unstated lengths) says so
#: in its notes after this marker, and is listed with that reason
NOT_EXPRESSIBLE = "not expressible here: "


def _train_setup(row: dict[str, str], spec: ModelSpec) -> Setup:
    if NOT_EXPRESSIBLE in row["notes"]:
        raise Skip(row["notes"].split(NOT_EXPRESSIBLE)[-1].split(";")[0])
    if row["grad_checkpointing"].startswith("selective"):
        raise Skip("selective (per-op) activation checkpointing is not expressible")
    partial = next((p for p in LIGER_PARTIAL if p in row["method"]), None)
    if partial:
        raise Skip(f"{partial}: Setup.liger_kernel prices fused linear cross-entropy with every fused kernel")
    q = row["quantization"]
    if q.startswith(("GPTQ", "AWQ", "AQLM")):   # pre-quantized checkpoints: perfguide's training bases are bnb nf4 / int8
        raise Skip(f"{q.split()[0]} weights are not expressible")
    fields: dict[str, object] = dict(task="train", micro_batch_size=_int(row["micro_batch"], 1),
                                     seq_len=_seq_len(row["seq_len"]),
                                     target_len=_target_len(row["seq_len"]),
                                     gradient_accumulation_steps=_int(row["grad_accum"], 1),
                                     optimizer=_optimizer(row),
                                     gradient_checkpointing=row["grad_checkpointing"] not in ("", "no"),
                                     attn_implementation=_attn(row),
                                     num_gpus=_int(row["num_gpus"], 1),
                                     optimizer_in_backward="optimizer_in_bwd True" in row["method"],
                                     torch_compile="torch.compile enabled" in row["method"],
                                     liger_kernel=any(w in row["method"] for w in LIGER_ON),
                                     cut_cross_entropy="CutCrossEntropyPlugin" in row["method"],
                                     chunked_cross_entropy="chunked_cross_entropy: true" in row["method"],
                                     quantized_experts="quantize_moe_experts" in row["method"],
                                     linear_attention_kernels="fla" if "on flash-linear-attention" in row["method"] else "torch",
                                     activation_offloading=any(w in row["method"] for w in ("activation_offloading=True", ALST_CHECKPOINT_OFFLOAD)),  # TRL SFTConfig, ALST
                                     tiled_mlp_shard_tokens=alst_shard_tokens(spec) if ALST_TILED_MLP in row["method"] else 0,
                                     bnb_embedding_override=bnb_embedding_override(row["source"], row["optimizer"]))
    fields.update(_precision(row["precision"]))
    fields.update(_strategy(row))
    fields.update(recipe_nodes(row, _int(row["num_gpus"], 1)))
    if row["source_group"].startswith("litgpt"):   # litgpt's own GPT: an LM head of its own (perfguide/model/code.py)
        fields["model_code"] = "litgpt"
    if q:
        fields["weights_dtype"] = "int8" if "int8" in q else "nf4"
        fields["kbit_upcast"] = _kbit_upcast(row)
        fields["kbit_quantizer"] = _kbit_quantizer(row)
        fields["nf4_double_quant"] = _nf4_double_quant(row)
        # TRL 0.7.5-0.25 SFTTrainer given a peft_config with bf16 re-casts embeddings and head to bf16; 0.7.5-0.8.6 the
        # adapters too
        fields["kbit_recast_bf16"] = "peft_module_casting_to_bf16" in row["method"]
        fields["kbit_recast_adapters"] = fields["kbit_recast_bf16"] and trl_recasts_adapters(row)
    fields["lora"] = _lora(row, spec)
    from accuracy_trl import trl_fields, trl_kbit_fields

    fields.update(trl_fields(row))   # a row that names its TRL release: its trainer and objective
    fields.update(trl_kbit_fields(row, fields))   # and the dtypes it leaves a quantized model in
    return Setup(**fields)  # type: ignore[arg-type]


def _infer_setup(row: dict[str, str], spec: ModelSpec | None = None) -> Setup:
    text = row["seq_len"]
    beams = re.search(r"(\d+) beams", text)
    if beams and int(beams.group(1)) > 1:  # beam search keeps num_beams sequences (and caches) per prompt
        raise Skip(f"beam search ({beams.group(1)} beams) is not expressible: a Setup generates one sequence per prompt")
    if "token count not stated" in text:
        raise Skip("the prompt's token count is not stated")
    nums = [int(x) for x in re.findall(r"\d+", text)]
    if spec is not None and not spec.generates and text.strip().isdigit():
        seq, new = nums[0], 0  # an encoder is served by one forward pass over the stated length: nothing is generated
    elif "short prompt" in text:
        seq, new = 8, nums[0]
    elif "generated" in text:
        seq, new = nums[0], nums[1]
    elif "prompt" in text:
        seq, new = nums[0], 1
    else:
        raise Skip(f"inference rows without a stated prompt/generation length ({text!r}) are not compared")
    par = row["parallelism"]
    n = _int(row["num_gpus"], 1)
    strat = "tp" if "tensor parallel" in par else ("device_map" if n > 1 else "single")
    fields: dict[str, object] = dict(task="infer", micro_batch_size=_int(row["micro_batch"], 1), seq_len=seq,
                                     new_tokens=new, optimizer=None, strategy=strat, num_gpus=n,
                                     attn_implementation=_attn(row))
    fields.update(_precision(row["precision"]))
    if fields.get("autocast"):
        fields.pop("autocast")
    q = row["quantization"]
    if q.startswith("GPTQ"):   # a GPTQ checkpoint loads as stored (AutoGPTQ's QuantLinear), in the row's 16-bit dtype
        fields["checkpoint_format"] = "gptq"
    elif q:
        fields["weights_dtype"] = "int8" if "int8" in q else "nf4"
        fields["kbit_upcast"] = _kbit_upcast(row)
        fields["nf4_double_quant"] = _nf4_double_quant(row)
    return Setup(**fields)  # type: ignore[arg-type]
