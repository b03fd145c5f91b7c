"""The keys HfArgumentParser accepts for a TRL/transformers training script, as written in the pinned versions.

Listed here (not read from the classes) so that reading a config never imports transformers; tests/test_check_readers.py
checks each tuple against ``dataclasses.fields`` of transformers 5.24 ``TrainingArguments`` and TRL 1.16 ``SFTConfig``, ``DPOConfig``,
``ModelConfig`` and ``ScriptArguments`` (the dataclasses TRL's ``sft.py`` script parses).
"""

TRAINING_ARGUMENTS: tuple[str, ...] = (
    "accelerator_config", "activation_checkpointing", "activation_checkpointing_kwargs", "adam_beta1", "adam_beta2",
    "adam_epsilon", "auto_find_batch_size", "average_tokens_across_devices", "batch_eval_metrics", "bf16",
    "bf16_full_eval", "data_seed", "dataloader_drop_last", "dataloader_in_order",
    "dataloader_multiprocessing_context", "dataloader_num_workers", "dataloader_persistent_workers",
    "dataloader_pin_memory", "dataloader_prefetch_factor", "ddp_backend", "ddp_broadcast_buffers",
    "ddp_bucket_cap_mb", "ddp_find_unused_parameters", "ddp_static_graph", "ddp_timeout", "debug", "deepspeed",
    "disable_tqdm", "do_eval", "do_predict", "do_train", "enable_jit_checkpoint", "eval_accumulation_steps",
    "eval_delay", "eval_do_concat_batches", "eval_on_start", "eval_steps", "eval_strategy",
    "eval_use_gather_object", "fp16", "fp16_full_eval", "fsdp", "fsdp_config", "full_determinism",
    "gradient_accumulation_steps", "gradient_checkpointing", "gradient_checkpointing_kwargs", "greater_is_better",
    "hub_always_push", "hub_model_id", "hub_private_repo", "hub_revision", "hub_strategy", "hub_token",
    "ignore_data_skip", "include_for_metrics", "include_num_input_tokens_seen", "label_names",
    "label_smoothing_factor", "learning_rate", "length_column_name", "liger_kernel_config",
    "load_best_model_at_end", "local_rank", "log_level", "log_level_replica", "log_on_each_node",
    "logging_first_step", "logging_nan_inf_filter", "logging_steps", "logging_strategy", "lr_scheduler_kwargs",
    "lr_scheduler_type", "max_grad_norm", "max_steps", "metric_for_best_model", "neftune_noise_alpha",
    "num_train_epochs", "optim", "optim_args", "optim_target_modules", "output_dir", "parallelism_config",
    "per_device_eval_batch_size", "per_device_train_batch_size", "prediction_loss_only", "project", "push_to_hub",
    "remove_unused_columns", "report_to", "restore_callback_states_from_checkpoint", "resume_from_checkpoint",
    "run_name", "save_on_each_node", "save_only_model", "save_steps", "save_strategy", "save_total_limit", "seed",
    "skip_memory_metrics", "tf32", "torch_compile", "torch_compile_backend", "torch_compile_mode",
    "torch_empty_cache_steps", "trackio_bucket_id", "trackio_space_id", "trackio_static_space_id",
    "train_sampling_strategy", "use_cache", "use_cpu", "use_liger_kernel", "warmup_steps", "weight_decay",
)
SFT_CONFIG: tuple[str, ...] = (
    "activation_offloading", "assistant_only_loss", "chat_template_path", "completion_only_loss", "dataset_kwargs",
    "dataset_num_proc", "dataset_text_field", "eos_token", "eval_packing", "loss_type", "max_length",
    "model_init_kwargs", "packing", "packing_strategy", "pad_to_multiple_of", "pad_token", "padding_free",
    "router_aux_loss_coef", "shuffle_dataset", "truncation_mode", "trust_remote_code",
)
#: TRL 1.16 ``DPOConfig``'s own fields (beyond TrainingArguments and SFTConfig): any of them marks a DPO run
DPO_CONFIG: tuple[str, ...] = (
    "beta", "disable_dropout", "discopop_tau", "f_alpha_divergence_coef", "f_divergence_type", "label_smoothing", "ld_alpha",
    "loss_weights", "precompute_ref_batch_size", "precompute_ref_log_probs", "ref_model_mixup_alpha", "ref_model_sync_steps",
    "sync_ref_model", "use_weighting",
)
MODEL_CONFIG: tuple[str, ...] = (
    "attn_implementation", "bnb_4bit_quant_storage", "bnb_4bit_quant_type", "dtype", "load_in_4bit", "load_in_8bit",
    "lora_alpha", "lora_dropout", "lora_modules_to_save", "lora_r", "lora_target_modules", "lora_target_parameters",
    "lora_task_type", "model_name_or_path", "model_revision", "use_bnb_nested_quant", "use_dora", "use_peft",
    "use_rslora",
)
SCRIPT_ARGUMENTS: tuple[str, ...] = (
    "dataset_config", "dataset_name", "dataset_streaming", "dataset_test_split", "dataset_train_split",
    "ignore_bias_buffers",
)

#: transformers 4 names (removed in 5) and deprecated aliases -> the transformers 5 / TRL name they mean
RENAMED = {"no_cuda": "use_cpu", "per_gpu_train_batch_size": "per_device_train_batch_size", "evaluation_strategy": "eval_strategy",
           "gradient_checkpointing": "activation_checkpointing", "gradient_checkpointing_kwargs": "activation_checkpointing_kwargs",
           "torch_dtype": "dtype", "max_seq_length": "max_length"}
#: transformers 4 keys with no transformers 5 counterpart: read and named as not priced
REMOVED: tuple[str, ...] = ("fp16_backend", "half_precision_backend", "fp16_opt_level", "tpu_num_cores", "use_ipex", "use_mps_device",
                            "warmup_ratio", "overwrite_output_dir", "logging_dir", "max_prompt_length")
#: the first release whose class no longer has a legacy key, so that its parser stops on it (HfArgumentParser: "Some
#: specified arguments are not used"; TrlParser: "Unknown arguments from config file"). transformers' TrainingArguments
#: fields read in the wheels on either side of each removal (4.50.0 / 4.51.0, 4.56.0 / 4.57.0, 4.57.6 / 5.0.0,
#: 5.14.0 / 5.15.0); TRL's in its git history: ModelConfig's torch_dtype removed in 0.27.0 (#4651), SFTConfig's
#: max_seq_length in 0.20.0 (#3704), DPOConfig's max_prompt_length in 0.29.0 (#3906). gradient_checkpointing* are still
#: deprecated aliases in transformers 5.24.
GONE_IN: dict[str, tuple[str, str]] = {
    "evaluation_strategy": ("transformers", "4.51.0"), "use_ipex": ("transformers", "4.57.0"),
    **{k: ("transformers", "5.0.0") for k in ("no_cuda", "per_gpu_train_batch_size", "fp16_backend", "half_precision_backend",
                                              "fp16_opt_level", "tpu_num_cores", "use_mps_device", "overwrite_output_dir")},
    "warmup_ratio": ("transformers", "5.15.0"), "logging_dir": ("transformers", "5.15.0"),
    "torch_dtype": ("trl", "0.27.0"), "max_seq_length": ("trl", "0.20.0"), "max_prompt_length": ("trl", "0.29.0"),
}
#: Seq2SeqTrainingArguments' own fields (transformers), which LLaMA-Factory's TrainingArguments extends
SEQ2SEQ: tuple[str, ...] = ("predict_with_generate", "generation_max_length", "generation_num_beams", "generation_config", "sortish_sampler")
