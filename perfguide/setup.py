"""Setup: the one vocabulary shared by the rules, the cost model and the adapters.

The rules produce Setups, the cost model prices them, ``estimate(model, setup)`` prices one a user wrote,
and the adapters turn one into TrainingArguments / accelerate / DeepSpeed objects. Nothing downstream
re-derives a decision, so every knob a plan can turn lives here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Literal, NamedTuple, Protocol

from pydantic import Field, field_validator, model_validator
from pydantic.fields import FieldInfo

from ._base import Model, build_strict
from .errors import InvalidSetupError, did_you_mean
from .optimizer_facts import names as optimizer_names

Task = Literal["train", "infer"]
WeightsDtype = Literal["fp32", "bf16", "fp16", "int8", "nf4"]
Autocast = Literal["bf16", "fp16", "fp8"]
AttnImpl = Literal["eager", "sdpa", "flash_attention_2", "flash_attention_3"]
#: flash-attn's kernels as transformers names them: FlashAttention-2 (``flash_attn``) and FlashAttention-3 (the Hopper
#: build, ``flash_attn_interface``); both run through transformers' flash_attention_forward (no mask, varlen packing)
FLASH_ATTENTION = ("flash_attention_2", "flash_attention_3")
Strategy = Literal[
    "single", "ddp", "fsdp", "fsdp_shard_grad_op", "zero1", "zero2", "zero3",  # training
    "device_map", "tp",                                                         # inference across GPUs
]
Device = Literal["cuda", "cpu"]
#: The loss a training step computes: supervised next-token (``sft``) or TRL's Direct Preference Optimization (``dpo``).
Objective = Literal["sft", "dpo"]
TrainerLoop = Literal["transformers", "trl", "torchtune"]
WeightFormat = Literal["bf16", "fp16", "fp8", "fp8_block", "awq", "gptq", "w4a16", "mxfp4", "nvfp4", "nf4"]
#: What a saved checkpoint's quantization_config can store (model/quantized.py reads it): bnb 4/8-bit or a serving format.
CheckpointFormat = Literal["nf4", "int8", "gptq", "awq", "fp8", "fp8_block", "w4a16", "mxfp4", "nvfp4"]

#: Bytes per element of each weight dtype (nf4 packs two weights per byte); the one table every module reads.
DTYPE_BYTES: dict[str, float] = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "int8": 1, "nf4": 0.5}
QUANTIZED: frozenset[str] = frozenset({"int8", "nf4"})


class TechniqueRules(Protocol):
    """What every Setup asks the techniques (perfguide/techniques/base.py Technique): whether the fields it sets
    can run together, and its word in the label, listed in ``order``."""

    @property
    def order(self) -> int: ...

    @property
    def label_order(self) -> int | None: ...

    def implied(self, fields: dict[str, Any]) -> dict[str, Any]: ...

    def conflict(self, setup: Setup) -> str | None: ...

    def label_word(self, setup: Setup) -> str | None: ...

    def sequence_ranks(self, setup: Setup) -> int: ...


#: The techniques whose rules every Setup obeys. perfguide.techniques hands its registry over when it is imported
#: (``use_technique_rules``): setup.py sits below the techniques and names none of them.
_technique_rules: Callable[[], Sequence[TechniqueRules]] = tuple


def use_technique_rules(source: Callable[[], Sequence[TechniqueRules]]) -> None:
    """Called once by perfguide.techniques with its registry (``import perfguide`` imports it)."""
    global _technique_rules
    _technique_rules = source


def add_technique_field(name: str, annotation: Any, default: Any, description: str) -> None:
    """A switch a technique module declares (``Technique.setup_fields``), added to Setup when the registry finds it:
    a new technique is one module. Typed and validated like the fields written below; adding it twice is a no-op."""
    fields = Setup.__pydantic_fields__
    if name in fields:
        if fields[name].annotation != annotation:
            raise InvalidSetupError(f"Setup field {name!r} already exists with another type; a technique needs a new name")
        return
    fields[name] = FieldInfo.from_annotated_attribute(annotation, Field(default=default, description=description))
    Setup.model_rebuild(force=True)


#: Where the strategy's word sits among the techniques' words in ``Setup.label`` (their ``order``: after the
#: adapters, before the offload that depends on it).
_STRATEGY_LABEL_ORDER = 55


class StrategyFacts(NamedTuple):
    """What a strategy divides over the data-parallel ranks (ZeRO paper, Rajbhandari et al. 2019, arXiv:1910.02054;
    torch FSDP docs: FULL_SHARD = ZeRO-3, SHARD_GRAD_OP = ZeRO-2 with parameters sharded at rest)."""

    shards_optimizer: bool
    shards_grads: bool
    shards_params: bool          # parameters divided at rest
    gathers_params: bool         # full parameters gathered layer by layer in forward and backward (ZeRO-3 / FULL_SHARD)
    zero_stage: int | None       # DeepSpeed ZeRO stage
    fsdp: bool
    offloads_optimizer: bool     # offload_optimizer is accepted (DeepSpeed zero/offload_config.py: stages 1-3; FSDP)
    offloads_params: bool        # offload_params is accepted (DeepSpeed: stage 3 only; FSDP; device_map for inference)
    train: bool                  # a training (data-parallel) strategy


STRATEGIES: dict[str, StrategyFacts] = {
    "single": StrategyFacts(False, False, False, False, None, False, False, False, True),
    "ddp": StrategyFacts(False, False, False, False, None, False, False, False, True),
    "zero1": StrategyFacts(True, False, False, False, 1, False, True, False, True),
    "zero2": StrategyFacts(True, True, False, False, 2, False, True, False, True),
    "zero3": StrategyFacts(True, True, True, True, 3, False, True, True, True),
    "fsdp": StrategyFacts(True, True, True, True, None, True, True, True, True),
    "fsdp_shard_grad_op": StrategyFacts(True, True, True, False, None, True, True, True, True),
    "device_map": StrategyFacts(False, False, False, False, None, False, False, True, False),
    "tp": StrategyFacts(False, False, False, False, None, False, False, False, False),
}
TRAIN_STRATEGIES: tuple[str, ...] = tuple(k for k, f in STRATEGIES.items() if f.train)

#: Every TrainingArguments ``optim`` value perfguide can price (transformers 5.x names): the rows of data/optimizers.json.
OPTIMIZERS: tuple[str, ...] = optimizer_names()


class LoraSpec(Model):
    """The adapter a plan trains, in PEFT's terms (``peft.LoraConfig``: r, lora_alpha, target_modules, ...)."""

    r: int = Field(default=16, gt=0)
    alpha: int = Field(default=32, gt=0)
    target_modules: tuple[str, ...] | Literal["all-linear"] = "all-linear"
    dropout: float = Field(default=0.0, ge=0, lt=1, description="lora_dropout; above 0 each adapted Linear keeps a dropout mask")
    use_dora: bool = Field(default=False, description="DoRA (weight-decomposed LoRA): a magnitude vector per adapted Linear")
    use_rslora: bool = Field(default=False, description="rank-stabilized scaling alpha/sqrt(r) instead of alpha/r; same memory")
    autocast_adapter_dtype: bool = Field(default=True, description="PEFT get_peft_model's autocast_adapter_dtype (peft >= 0.12): adapters on a bf16/fp16 base upcast to fp32; False keeps them in the base's 16 bits, which every peft before 0.12 did (LoraLayer.update_layer casts the adapter to the base weight's dtype): parameters, gradients and AdamW moments then take 2 bytes")
    adapter_dtype: Literal["bf16", "fp16", "fp32"] | None = Field(default=None, description="the adapters' own dtype where the training stack sets it outside PEFT's rules: torchtune builds its LoRALinear (lora_a, lora_b) under set_default_dtype(dtype), so a bf16 run trains bf16 adapters on a 16-bit and an NF4 base alike; TRL's SFTTrainer (0.26 on) casts every trainable parameter of a quantized model but DoRA's magnitude to bf16 (perfguide's bf16 QLoRA plans set 'bf16' for it, and prepare_model casts); parameters, gradients and AdamW moments then take its bytes. None: PEFT's (autocast_adapter_dtype; fp32 on a quantized base)")
    modules_to_save: tuple[str, ...] = Field(default=(), description="modules PEFT trains in full beside the adapters (LoraConfig modules_to_save): a trainable copy of each, with its gradient and optimizer state; the token embedding and the LM head (embed_tokens, lm_head, ...) are priced")
    target_parameters: tuple[str, ...] = Field(default=(), description="parameters PEFT adapts as parameters, not modules (LoraConfig target_parameters, peft >= 0.17): a transformers-5 MoE's fused expert stacks (mlp.experts.gate_up_proj, mlp.experts.down_proj) and its router weight (mlp.gate.weight), each at rank r; a name with a layer index (22.mlp.experts.down_proj) adapts that layer only")

    @field_validator("modules_to_save", "target_parameters", mode="before")
    @classmethod
    def _one_name(cls, value: Any) -> Any:
        """One name (``--lora-modules-to-save lm_head``, ``modules_to_save="lm_head"``) is a list of one."""
        return (value,) if isinstance(value, str) else value


class ServingSetup(Model):
    """A serving engine's layout and budget: what the engine's server command is told. ``num_gpus`` of the
    Setup is tensor x pipeline x data parallel. ``engine`` names a module of perfguide/engines/ (checked there:
    this vocabulary sits below the engines and knows none of them)."""

    engine: str = Field(min_length=1, max_length=64)
    weight_format: WeightFormat = "bf16"
    dtype: Literal["bf16", "fp16"] = Field(default="bf16", description="activations and unquantized weights (fp16 on GPUs without bf16)")
    tensor_parallel_size: int = Field(default=1, ge=1, le=1024)
    pipeline_parallel_size: int = Field(default=1, ge=1, le=1024)
    data_parallel_size: int = Field(default=1, ge=1, le=100_000)
    max_model_len: int = Field(default=4096, ge=1, le=10_000_000)
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    max_num_seqs: int = Field(default=256, ge=1, le=1_000_000)
    max_num_batched_tokens: int = Field(default=8192, ge=1, le=10_000_000)
    kv_cache_dtype: Literal["auto", "fp8"] = "auto"
    enable_prefix_caching: bool = True
    enforce_eager: bool = False
    enable_expert_parallel: bool = Field(default=False, description="MoE experts divided over every GPU (TP x DP) instead of split within each TP group")
    quantized_model: str | None = Field(default=None, max_length=512, description="the pre-quantized checkpoint served instead of the model (a repo id or local path)")
    checkpoint_format: WeightFormat | None = Field(default=None, description="the format the loaded checkpoint stores (None: 16-bit); a different weight_format is converted at load")


class Setup(Model):
    """A concrete, runnable configuration. Sizes are per device unless named global."""

    task: Task = "train"
    device: Device = "cuda"
    micro_batch_size: int = Field(default=1, ge=1, le=1_000_000)
    seq_len: int = Field(default=512, ge=1, le=10_000_000)
    target_len: int | None = Field(default=None, ge=1, le=10_000_000, description="encoder-decoder training: tokens the decoder runs (the labels' padded length, Seq2Seq scripts' max_target_length); seq_len is then the encoder's (source) length. None: the decoder runs seq_len tokens too")
    gradient_accumulation_steps: int = Field(default=1, ge=1, le=1_000_000)
    weights_dtype: WeightsDtype = "fp32"
    autocast: Autocast | None = None
    tf32: bool = False
    optimizer: str | None = "adamw_torch_fused"
    gradient_checkpointing: bool = False
    attn_implementation: AttnImpl = "sdpa"
    linear_attention_kernels: Literal["torch", "fla", "mamba_ssm"] = Field(default="torch", description="what runs a hybrid model's recurrent layers: transformers' PyTorch reference code ('torch'), which keeps fp32 copies and every chunk's state for backward (what transformers runs unless the packages below import), or the packages' kernels, which recompute the states: 'fla' (flash-linear-attention's chunk kernel with causal-conv1d's convolution) for gated-DeltaNet layers (Qwen3.5, Qwen3-Next), 'mamba_ssm' (mamba-ssm's fused Mamba-2 kernel) for Mamba-2 layers (Granite-4.0-H, Bamba) (perfguide/memory/linear_attention.py). Other models ignore it")
    lora: LoraSpec | None = None
    strategy: Strategy = "single"
    num_gpus: int = Field(default=1, ge=1, le=100_000, description="data-parallel processes per node (GPUs, or CPU processes)")
    nodes: int = Field(default=1, ge=1, le=100_000)
    offload_optimizer: bool = False
    offload_params: bool = False
    # inference
    new_tokens: int = Field(default=0, ge=0, le=10_000_000)
    cache_implementation: Literal["dynamic", "static"] = "dynamic"
    torch_compile: bool = False
    checkpoint_format: CheckpointFormat | None = Field(default=None, description="the quantized format the checkpoint is saved in, "
                                                       "loaded as it is (no second quantization_config); None: 16/32-bit")
    serving: ServingSetup | None = None   # set when a serving engine runs the model (None: transformers in the user's script)
    # host side
    dataloader_num_workers: int = Field(default=0, ge=0)
    dataloader_pin_memory: bool = True
    cpu_threads: int | None = Field(default=None, ge=1)
    # the modern technique stack (perfguide/techniques/; each field's rules live with its technique)
    liger_kernel: bool = Field(default=False, description="Liger Triton kernels: fused linear cross-entropy (no full logits), RMSNorm, RoPE, SwiGLU")
    cut_cross_entropy: bool = Field(default=False, description="Cut Cross-Entropy (apple/ml-cross-entropy cce_patch, axolotl's CutCrossEntropyPlugin): the head and the loss in kernels that write no logits")
    chunked_cross_entropy: bool = Field(default=False, description="axolotl's chunked_cross_entropy: transformers' loss replaced by a compiled cross-entropy over chunks of the 16-bit logits (never upcast whole)")
    sync_grads_each_micro_step: bool = Field(default=False, description="FSDP reduce-scatters gradients on every accumulation micro-step (accelerate's gradient_accumulation_kwargs sync_each_batch) instead of holding them unsharded until the last")
    optimizer_in_backward: bool = Field(default=False, description="each parameter steps as its gradient is ready; gradients are never all held")
    activation_offloading: bool = Field(default=False, description="checkpointed activations kept in pinned host RAM during forward")
    tiled_mlp_shard_tokens: int = Field(default=0, ge=0, le=10_000_000, description="tokens one shard of a tiled MLP runs at once (DeepSpeed's TiledMLP: ALST's tiled_mlp_compute, ceil(s / hidden) shards of at most hidden_size tokens; axolotl's tiled_mlp, 32,768-token shards by default or tiled_mlp_num_shards): each block's MLP keeps its FFN-wide intermediates for one shard of the rank's tokens, recomputed in backward; 0: the MLP runs over the whole sequence (perfguide/techniques/tiled_mlp.py)")
    padding_free: bool = Field(default=False, description="samples concatenated without padding (DataCollatorWithFlattening / TRL padding_free)")
    avg_seq_len: int | None = Field(default=None, ge=1, le=10_000_000, description="mean real tokens per sample (None: every sample fills seq_len)")
    packed_doc_len: int | None = Field(default=None, ge=1, le=10_000_000, description="mean tokens per document inside each packed sequence when attention is masked per document (torchtune packed=True: a FlexAttention BlockMask, whose empty 128 x 128 blocks are skipped); None: no document mask, causal attention over the whole sequence (HF Trainer / TRL packing without padding_free)")
    sequence_parallel: int = Field(default=1, ge=1, le=100_000, description="ranks that split each sequence (DeepSpeed Ulysses / ALST sequence_parallel_size, accelerate sp_size, ms-swift sequence_parallel_size, axolotl context_parallel_size): each rank holds and computes seq_len / sequence_parallel tokens and a 1 / sequence_parallel share of the whole sequence's attention; the data-parallel degree is the world size over it (perfguide/techniques/sequence_parallel.py)")
    fsdp_version: int = Field(default=2, ge=1, le=2, description="FSDP2 (fully_shard, per-parameter: what perfguide's plans emit) or FSDP1 (FlatParameter, use_orig_params)")
    fsdp_adapter_units: bool | None = Field(default=None, description="FSDP1 with LoRA: each trainable leaf (lora_A, lora_B) wrapped in an FSDP unit of its own, as the HF Trainer does (transformers distributed/fsdp.py update_fsdp_plugin_peft: peft's fsdp_auto_wrap_policy), so the blocks' FlatParameters are all frozen and get no gradient; False: the adapters share their block's FlatParameter (accelerate's transformer wrap alone, Lightning Fabric), whose frozen weights then get gradients and keep their inputs. None: by the loop (litgpt: False; the HF Trainer / TRL: True)")
    kbit_upcast: bool = Field(default=True, description="a quantized base's non-quantized parameters (embeddings, head, norms) in fp32: peft's prepare_model_for_kbit_training, which prepare_model runs; False: they stay 16-bit (frameworks that skip it, e.g. litgpt)")
    kbit_quantizer: Literal["transformers", "litgpt"] = Field(default="transformers", description="what quantized an int8/nf4 base: transformers' bitsandbytes integration (the plans'; also torchtune's and Answer.AI's fsdp_qlora layout) keeps the LM head 16-bit; litgpt (Lightning Fabric's BitsandbytesPrecision) quantizes every nn.Linear of its GPT, its own lm_head too, from fp16 (memory/top_of_stack.py)")
    model_code: Literal["transformers", "litgpt"] = Field(default="transformers", description="the model code that runs the step: transformers' modeling classes (the plans'), or litgpt's own GPT (litgpt finetune_lora / finetune / generate), whose lm_head is an nn.Linear of its own: a Hub checkpoint with tied embeddings is converted with a copy of the embedding, so a tied model holds its head twice, and full fine-tuning keeps the copy's gradient and optimizer state too (model/code.py); its one Block class keeps what litgpt's code keeps (memory/litgpt_blocks.py: no dropout, F.gelu, fp32 rope cache, expanded k/v), and its LoRA adapters take the run's dtype with q/k/v fused into one adapted Linear (ledger.py)")
    nf4_double_quant: bool = Field(default=True, description="nf4 absmax statistics quantized again (bnb_4bit_use_double_quant, the plans'; litgpt's bnb.nf4-dq): 1 B per 64 weights plus fp32 per 256 blocks; False: one fp32 absmax per 64 (litgpt's bnb.nf4)")
    quantized_experts: bool = Field(default=False, description="an int8/nf4 base's fused 3-D MoE expert tensors quantized too (axolotl's quantize_moe_experts: bitsandbytes parametrize.replace_parameter_4bit, or its own int8 row-wise parametrization), each MoE block's experts dequantized to 16 bits while it runs; False: bitsandbytes quantizes nn.Linear only and fused experts stay 16-bit")
    linearized_experts: bool = Field(default=False, description="a Llama-4's fused experts rebuilt as one nn.Linear per expert projection (axolotl's llama4_linearized_experts, monkeypatch/models/llama4/modeling.py), so bitsandbytes quantizes them and dequantizes one expert's Linear at a time; every expert still runs over every token (model/code.py)")
    bnb_4bit_quant_type: Literal["nf4", "fp4"] = Field(default="nf4", description="the 4-bit code of a bitsandbytes 4-bit base (BitsAndBytesConfig bnb_4bit_quant_type): nf4, the plans' and QLoRA's, or fp4, transformers' default when a config sets only load_in_4bit; both store 0.5 B a weight plus absmax, their dequantize kernels decode differently (speed/dequant.py)")
    kbit_recast_bf16: bool = Field(default=False, description="after peft's kbit upcast, the fp32 token / position embeddings and LM head cast back to bf16 (norms stay fp32): TRL's SFTTrainer given a peft_config on a 4-bit base with bf16=True (peft_module_casting_to_bf16: trl/trainer/sft_trainer.py 0.7.5 to 0.21.0, then trl/models/utils.py prepare_peft_model 0.22.0 to 0.25.1; 0.26.0's SFTTrainer calls neither it nor peft's kbit preparation), modules_to_save copies of them included (their names contain the original's)")
    kbit_recast_adapters: bool = Field(default=False, description="with kbit_recast_bf16, the same cast also takes every PEFT tuner layer (the LoRA adapters) to bf16, so adapter parameters, gradients and AdamW states take 2 bytes, not 4: TRL 0.7.5 to 0.8.6 only (their peft_module_casting_to_bf16 opens with 'if isinstance(module, BaseTunerLayer): module.to(torch.bfloat16)'; read in the 0.7.5, 0.8.0 and 0.8.6 wheels; 0.9.2, the next release, and every later one through 0.21.0 have no such branch: read in 0.9.2, 0.9.6, 0.12.1, 0.13.0, 0.21.0), so from 0.9.2 the adapters stay fp32")
    bnb_embedding_override: bool = Field(default=True, description="a bitsandbytes 8-bit optimizer keeps nn.Embedding weights' state in 32 bits: the override the HF Trainer registers with bnb's GlobalOptimManager when it builds the optimizer from optim (Trainer.create_optimizer; perfguide's prepare_model too); False: the optimizer is built with none (torchtune's recipes instantiate bnb's class directly; a bnb optimizer handed to Trainer(optimizers=...)), so every tensor of >= 4096 elements has 8-bit state")
    hybrid_shard: bool = Field(default=False, description="FSDP2 HSDP: shard over the GPUs of a node, replicate across nodes (a 2-D device mesh)")
    overlap_comm: bool = Field(default=True, description="DeepSpeed ZeRO-1/2 overlap_comm: the gradient reduce overlaps backward through a second reduce_bucket_size ipg buffer (stage_1_and_2.py: buf_1 only 'if self.overlap_comm'). True is what perfguide's configs and the transformers ZeRO-2/3 templates set; a DeepSpeed config that leaves the key out runs DeepSpeed's own default, stage == 3 (zero/config.py overlap_comm_valid), which the config readers fill. ZeRO-3's buffers are priced as gathered parameters, so only stages 1-2 read it")
    zero3_init: bool = Field(default=True, description="DeepSpeed ZeRO-3: the model is built under zero.Init, each rank holding only its shard from the start (TrainingArguments(deepspeed=...) or HfDeepSpeedConfig created before from_pretrained, or accelerate's zero3_init_flag); False: it is loaded whole first and deepspeed.initialize casts it to the engine's dtype and moves it whole onto every GPU before partitioning it (runtime/engine.py _configure_distributed_model). Only ZeRO-3 reads it: the other strategies hold the whole model on every GPU anyway")
    # the training objective (perfguide/techniques/dpo.py prices and emits it)
    objective: Objective = Field(default="sft", description="what the step optimizes: sft (next-token loss, SFTTrainer / Trainer) or dpo (TRL DPOTrainer: chosen + rejected in one forward, plus a frozen reference model's forward)")
    precompute_ref_log_probs: bool = Field(default=False, description="DPO: the reference log-probs are computed once before training (DPOConfig precompute_ref_log_probs), so no reference model is kept and no reference forward runs per step")
    trainer: TrainerLoop = Field(default="transformers", description="the training loop that runs the step: transformers (HF Trainer: the model's loss on full [b, s, V] logits) or trl (TRL's SFTTrainer / DPOTrainer, whose loss by TRL release builds no full logits: memory/fused_head.py) or torchtune (a torchtune recipe: its LinearCrossEntropyLoss, techniques/torchtune_loss.py); objective='dpo' implies trl")

    @model_validator(mode="before")
    @classmethod
    def _implied(cls, data: Any) -> Any:
        """Fields a technique's switch decides when the input leaves them out (Technique.implied)."""
        if not isinstance(data, dict):
            return data
        for t in _technique_rules():
            data = {**t.implied(data), **data}
        return data

    @model_validator(mode="after")
    def _techniques(self) -> Setup:
        for problem in (_own_conflict(self), *(t.conflict(self) for t in _technique_rules())):
            if problem:
                raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _consistent(self) -> Setup:
        if self.optimizer is not None and self.optimizer not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {self.optimizer!r}.{did_you_mean(self.optimizer, OPTIMIZERS)} Accepted: {', '.join(OPTIMIZERS)}")
        if self.weights_dtype in QUANTIZED and self.task == "train" and self.lora is None:
            raise ValueError("training a purely quantized (int8/nf4) model needs LoRA adapters (lora={...}); transformers refuses it otherwise")
        if self.checkpoint_format is not None and (self.weights_dtype in QUANTIZED or self.checkpoint_format in QUANTIZED) \
                and self.weights_dtype != self.checkpoint_format:
            raise ValueError(f"a {self.checkpoint_format} checkpoint loads as it is stored, not as weights_dtype={self.weights_dtype!r}")
        if self.quantized_experts and self.weights_dtype not in QUANTIZED:
            raise ValueError(f"quantized_experts quantizes the experts with an int8/nf4 base; weights_dtype is {self.weights_dtype!r}")
        if self.autocast == "fp16" and self.device == "cpu":
            raise ValueError("fp16 autocast does nothing on CPU (accelerate silently trains in fp32); use autocast='bf16' or None")
        return self

    def replace(self, **changes: Any) -> Setup:
        """A copy with ``changes`` applied and validated again: ``model_copy(update=...)`` would skip the checks
        above and build a Setup that cannot run (an offloaded DDP, an unknown optimizer) without a word."""
        data = {name: getattr(self, name) for name in type(self).model_fields}
        data.update(changes)
        return type(self).model_validate(data)

    # --- facts derived from the strategy and dtypes: written here once, read everywhere ---------------
    @property
    def facts(self) -> StrategyFacts:
        return STRATEGIES[self.strategy]

    @property
    def shards_optimizer(self) -> bool:
        return self.facts.shards_optimizer

    @property
    def shards_grads(self) -> bool:
        return self.facts.shards_grads

    @property
    def shards_params(self) -> bool:
        """Parameters divided over the ranks at rest (ZeRO-3, FSDP FULL_SHARD and SHARD_GRAD_OP)."""
        return self.facts.shards_params

    @property
    def gathers_params(self) -> bool:
        """Parameters all-gathered layer by layer in forward and backward (ZeRO-3, FSDP FULL_SHARD)."""
        return self.facts.gathers_params

    @property
    def zero_stage(self) -> int | None:
        return self.facts.zero_stage

    @property
    def is_deepspeed(self) -> bool:
        return self.facts.zero_stage is not None

    @property
    def is_fsdp(self) -> bool:
        return self.facts.fsdp

    @property
    def computes_on_16bit_copy(self) -> bool:
        """Mixed precision under FSDP or DeepSpeed ZeRO runs the model on a 16-bit copy of its fp32 weights (FSDP
        MixedPrecision param_dtype, DeepSpeed's bf16/fp16 modes): activations are 16-bit from the embedding on and
        autocast casts no weight per op. fp8 training gathers the same 16-bit copy (torchtitan's float8 recipes run FSDP2
        with param_dtype bf16; only the float8 Linears' GEMMs cast to fp8, Setup.compute_dtype). Plain AMP (single GPU,
        DDP) computes on the fp32 weights through autocast."""
        return self.autocast in ("bf16", "fp16", "fp8") and self.weights_dtype == "fp32" and (self.is_fsdp or self.is_deepspeed)

    @property
    def flash_attention(self) -> bool:
        """flash-attn's kernel (2 or 3) runs attention: no mask tensor, samples kept apart by cu_seq_lens, and the
        output and log-sum-exp saved for backward; what differs between them is the backward workspace, the index
        width and the speed on Hopper."""
        return self.attn_implementation in FLASH_ATTENTION

    @property
    def decoder_len(self) -> int:
        """Tokens an encoder-decoder's decoder runs (its blocks, the head's logits and the loss): a seq2seq batch
        pads sources and labels separately (DataCollatorForSeq2Seq), so the two stacks have their own lengths."""
        return self.target_len or self.seq_len

    @property
    def quantized(self) -> bool:
        return self.weights_dtype in QUANTIZED

    @property
    def weight_bytes(self) -> float:
        """Bytes per stored weight element (0.5 for nf4)."""
        return DTYPE_BYTES[self.weights_dtype]

    @property
    def world_size(self) -> int:
        return self.num_gpus * self.nodes

    @property
    def shard_degree(self) -> int:
        """Ranks one copy of the model states is divided over: the node's GPUs under HSDP, else every rank."""
        return self.num_gpus if self.hybrid_shard else self.world_size

    @property
    def sequence_ranks(self) -> int:
        """Ranks that split each sequence (a technique's ``sequence_ranks``; 1 without a split)."""
        return math.prod(t.sequence_ranks(self) for t in _technique_rules())

    @property
    def global_batch_size(self) -> int:
        """Samples per optimizer step: the ranks that split one sequence share its samples (transformers
        Trainer.get_total_train_batch_size: micro x accumulation x world / sequence-parallel size)."""
        return self.micro_batch_size * self.gradient_accumulation_steps * self.world_size // self.sequence_ranks

    @property
    def batch_factors(self) -> str:
        """How the global batch is made, in words: "m micro-batch x a accumulation x w process(es)", over the split when there is one."""
        n = self.sequence_ranks
        split = f" / {n} (each sequence split over {n})" if n > 1 else ""
        return (f"{self.micro_batch_size} micro-batch x {self.gradient_accumulation_steps} accumulation x "
                f"{self.world_size} process(es){split}")

    @property
    def compute_dtype(self) -> str:
        """The dtype matmuls run in: autocast wins, else the (de)quantized weight dtype."""
        if self.autocast == "fp8":
            return "bf16"  # only the block Linears' GEMMs run in fp8; everything else (and the dtype names) stays bf16
        if self.autocast:
            return self.autocast
        if self.weights_dtype in QUANTIZED:
            return "bf16"
        if self.weights_dtype == "fp32" and self.tf32:
            return "tf32"
        return self.weights_dtype

    @property
    def label(self) -> str:
        """A short human label, used in reports and candidate tables."""
        if self.serving is not None:  # what the engine serves: its weight format and layout, the batch per replica
            s = self.serving
            layout = f"TP{s.tensor_parallel_size}" + (f" PP{s.pipeline_parallel_size}" if s.pipeline_parallel_size > 1 else "")
            return (f"{s.engine} {s.weight_format} weights {layout}{' EP' if s.enable_expert_parallel else ''} x {s.data_parallel_size} "
                    f"replica(s), batch {self.micro_batch_size}/replica")
        words = [(0, f"mb={self.micro_batch_size}"), (0, f"ga={self.gradient_accumulation_steps}"), (0, self.weights_dtype)]
        if self.strategy != "single":
            words.append((_STRATEGY_LABEL_ORDER, self.strategy + ("-hybrid" if self.hybrid_shard else "")))
        words += [(t.order if t.label_order is None else t.label_order, word)
                  for t in _technique_rules() if (word := t.label_word(self))]
        return " ".join(word for _, word in sorted(words, key=lambda w: w[0]))

    @classmethod
    def parse(cls, value: Setup | dict[str, Any]) -> Setup:
        """Accept a Setup or a plain dict; unknown keys or values give one clear line."""
        if isinstance(value, Setup):
            return value
        if isinstance(value, ServingSetup):
            raise InvalidSetupError("setup must be a perfguide.Setup or a dict, got a ServingSetup; wrap it: "
                                    "Setup(task='infer', device='cuda', serving=ServingSetup(...))")
        if not isinstance(value, dict):
            raise InvalidSetupError(f"setup must be a perfguide.Setup or a dict, got {type(value).__name__}")
        return build_strict(cls, value, "setup", InvalidSetupError, key=" key")


def _own_conflict(s: Setup) -> str | None:
    """The Setup's own cross-field rules (strategy layout, data shape); the techniques' are their modules'."""
    if s.hybrid_shard and not (s.strategy == "fsdp" and s.fsdp_version == 2 and s.nodes > 1 and s.num_gpus > 1):
        return ("hybrid_shard (HSDP) shards within a node and replicates across nodes: it needs strategy='fsdp' with FSDP2, "
                f"nodes > 1 and several GPUs per node, not {s.strategy!r} on {s.nodes} node(s) x {s.num_gpus} GPU(s)")
    if s.target_len is not None and s.task != "train":
        return (f"target_len={s.target_len} is the decoder length of an encoder-decoder training step; generation's "
                "decoder length is new_tokens: leave target_len unset for task='infer'")
    if s.packed_doc_len is not None and s.packed_doc_len > s.seq_len:
        return (f"packed_doc_len={s.packed_doc_len} is the mean document inside a packed sequence of seq_len={s.seq_len}: "
                "it must be at most seq_len")
    return None
