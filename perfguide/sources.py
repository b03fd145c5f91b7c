"""Public references the recommendations cite, each written once (docs pages, not files that do not ship).

Decisions carry these in ``source``; every one must be readable by a user without perfguide's repository.
"""

from __future__ import annotations

_HF = "https://huggingface.co/docs/transformers/"

TRAIN_GPU_ONE = _HF + "perf_train_gpu_one"
TRAIN_GPU_MANY = _HF + "perf_train_gpu_many"
TRAIN_CPU = _HF + "perf_train_cpu"
TRAIN_CPU_MANY = _HF + "perf_train_cpu_many"
INFER_GPU_ONE = _HF + "perf_infer_gpu_one"
INFER_GPU_MANY = _HF + "perf_infer_gpu_multi"
INFER_CPU = _HF + "perf_infer_cpu"
LLM_OPTIMS = _HF + "llm_optims"
LLM_TUTORIAL_OPTIMIZATION = _HF + "llm_tutorial_optimization"
DEEPSPEED = _HF + "deepspeed"
FSDP = _HF + "fsdp"
TRAINING_ARGUMENTS = _HF + "main_classes/trainer#transformers.TrainingArguments"
MEMORY_ANATOMY = _HF + "model_memory_anatomy"
#: SDPA, transformers' default attention, and the model classes that refuse it
SDPA = (_HF + "attention_interface; "
        "https://docs.pytorch.org/docs/stable/generated/torch.nn.functional.scaled_dot_product_attention.html")
FLASH_ATTENTION_3 = ("Shah et al. 2024, FlashAttention-3 (arXiv:2407.08608): 1.5-2.0x FlashAttention-2 on H100; "
                     "Dao-AILab/flash-attention hopper/ (flash_attn_interface); flash-attention issue #767 (FA2's 32-bit index)")
NO_SDPA = ("https://github.com/huggingface/transformers/blob/main/src/transformers/models/gemma2/modeling_gemma2.py "
           "(_supports_sdpa = False: sdpa does not support softcapping)")
BNB_QUANTIZATION = _HF + "quantization/bitsandbytes"
LITGPT_RESOURCE_TABLES = "https://github.com/Lightning-AI/litgpt/blob/main/tutorials/resource-tables.md"
BIG_MODEL_INFERENCE = "https://huggingface.co/docs/accelerate/usage_guides/big_modeling"
ZERO_ESTIMATORS = "https://deepspeed.readthedocs.io/en/latest/memory.html"
BF16_EMULATION = "https://docs.pytorch.org/docs/stable/generated/torch.cuda.is_bf16_supported.html"
#: QLoRA with every state sharded and, where that is what fits, offloaded: the published 70B-on-two-24GB recipes
FSDP_QLORA = ("https://www.answer.ai/posts/2024-03-06-fsdp-qlora.html; https://github.com/AnswerDotAI/fsdp_qlora "
              "(--use_cpu_offload: Llama-2 70B on two 24 GB GPUs); "
              "https://github.com/axolotl-ai-cloud/axolotl/blob/main/examples/llama-3/qlora-fsdp-70b.yaml (fsdp_offload_params: true); "
              "https://huggingface.co/docs/peft/accelerate/fsdp (QLoRA + FSDP, bnb_4bit_quant_storage)")
ZERO3_QLORA = "https://huggingface.co/docs/peft/accelerate/deepspeed (QLoRA + ZeRO-3: Llama 70B on 2x40GB, bnb_4bit_quant_storage)"
#: DeepSpeed ZeRO-1/2 cast the whole module to the 16-bit training dtype before sharding optimizer states only; torch's
#: Module.half()/bfloat16() touch floating-point tensors only, so bitsandbytes' packed uint8 4-bit weights survive it
ZERO12_CAST = ("https://github.com/deepspeedai/DeepSpeed/blob/master/deepspeed/runtime/engine.py "
               "(_configure_distributed_model: module.half() / module.bfloat16())")
ZERO12_QLORA = (f"{ZERO12_CAST}; https://docs.pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module.half "
                "('Casts all floating point parameters and buffers'); https://github.com/DAMO-NLP-SG/VideoLLaMA2/pull/37 "
                "(QLoRA with DeepSpeed: 'Adopting deepspeed zero2')")

#: gpt-oss fine-tuning upcasts the MXFP4 checkpoint to bf16 first ("Performing supervised fine-tuning (SFT) on an
#: upcasted BF16 version of the model"; LMSYS: "Most existing fine tuning examples convert gpt-oss to bf16 precision")
GPT_OSS_BF16_SFT = ("https://developer.nvidia.com/blog/fine-tuning-gpt-oss-for-accuracy-and-performance-with-quantization-aware-training/; "
                    "https://lmsys.org/blog/2025-08-28-gpt-oss-qat")

#: peft on transformers-5 MoE: a list naming the v4 expert / router names (0.19 on) or all-linear (0.20 on) becomes target_parameters
#: on the fused experts and the router; a list of other names (the attention projections) is left as Linear targets
PEFT_MOE_TARGETS = ("https://github.com/huggingface/peft/blob/main/src/peft/utils/transformers_weight_conversion.py "
                    "(_convert_peft_config_moe, _MOE_TARGET_MODULE_MAPPING)")

#: peft's DoRA: the weight norm ||W + sBA|| every forward, detached (the paper's section 4.3); the base output reused
#: only without dropout (and in eval) since peft 0.14 (huggingface/peft#2122), otherwise F.linear(dropout(x), W) again
PEFT_DORA = ("https://huggingface.co/docs/peft/main/package_reference/lora_variant_dora (Optimization: 'DoRA is "
             "optimized (computes faster and takes less memory) for models in the evaluation mode, or when dropout is set "
             "to 0'); https://github.com/huggingface/peft/pull/2122; https://huggingface.co/papers/2402.09353 (section 4.3)")
#: which code runs a hybrid model's gated-DeltaNet layers in transformers, and what the fast kernels keep
LINEAR_ATTENTION_KERNELS = ("https://github.com/huggingface/transformers/blob/main/src/transformers/integrations/hub_kernels.py "
                            "(use_kernel_func_from_hub_with_fallback: flash-linear-attention / mamba-ssm and causal-conv1d "
                            "when they import, else the PyTorch reference code); https://github.com/fla-org/flash-linear-attention "
                            "(fla/ops/gated_delta_rule/chunk.py) and https://github.com/state-spaces/mamba "
                            "(mamba_ssm/ops/triton/ssd_combined.py): the chunk states are recomputed in backward")
