"""QLoRA: LoRA adapters on a 4-bit NF4 base (bitsandbytes), dequantized per matmul.

The base takes ~0.5 byte per weight (plus double-quantized absmax), so models several times the GPU's
memory train; each matmul pays a dequantization. The same bitsandbytes config serves quantized inference
(int8 / nf4), so this module is where ``quantization_config`` comes from.
"""

from __future__ import annotations

from typing import Any

from .base import LadderContext, Requires, Rung, Technique

SOURCES = (
    "Dettmers et al. 2023, QLoRA: Efficient Finetuning of Quantized LLMs (arXiv:2305.14314)",
    "https://huggingface.co/docs/transformers/quantization/bitsandbytes",
)
#: why perfguide's own QLoRA plans keep the non-quantized parameters 16-bit (Setup.kbit_upcast=False)
PLAN_CAST_SOURCE = ("TRL SFTTrainer on a quantized model (trl/trainer/sft_trainer.py, read in 1.16.0; 0.26.0 already calls "
                    "neither peft's prepare_model_for_kbit_training nor peft_module_casting_to_bf16): the embeddings, head "
                    "and norms keep the load dtype, only the trainable adapter weights are cast (to bf16); "
                    "https://huggingface.co/docs/trl/sft_trainer")
#: why perfguide's QLoRA plans train bf16 adapters (LoraSpec.adapter_dtype, trl_adapters)
ADAPTER_CAST_SOURCE = ("TRL SFTTrainer on a quantized model (trl/trainer/sft_trainer.py, added in 0.26.0 by 'Clean up model "
                       "preparation' #4577, read in 1.16.0): 'the PEFT adapter weights are converted to bf16 to follow the "
                       "recommendations from the original paper' (arXiv:2305.14314)")
_TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


class QLora(Technique):
    name = "qlora"
    fields = ("kbit_upcast", "kbit_quantizer", "nf4_double_quant", "bnb_4bit_quant_type", "kbit_recast_bf16", "kbit_recast_adapters")
    summary = "LoRA adapters on a 4-bit NF4 base; also the bitsandbytes config of int8/nf4 inference"
    sources = SOURCES
    requires = Requires(devices=("cuda",), packages=("bitsandbytes", "peft"), finetune=("qlora",))
    order = 51
    ladder_order = 50

    def active(self, setup: Any) -> bool:
        return setup.quantized

    def conflict(self, setup: Any) -> str | None:
        """``kbit_recast_bf16`` undoes part of peft's kbit upcast on a bf16-autocast QLoRA run; anywhere else it
        would price a cast no stack makes. ``kbit_recast_adapters`` is one branch of that same cast (TRL 0.7.5-0.8.6)."""
        if setup.kbit_recast_adapters and not setup.kbit_recast_bf16:
            return ("kbit_recast_adapters is a branch of TRL's bf16 recast (TRL 0.7.5-0.8.6), which casts the embeddings "
                    "and head too: set kbit_recast_bf16=True with it, or turn it off (kbit_recast_adapters=False)")
        if setup.kbit_recast_bf16 and not (setup.quantized and setup.kbit_upcast and setup.lora is not None
                                           and setup.autocast == "bf16"):
            return ("kbit_recast_bf16 re-casts a kbit-upcast (kbit_upcast=True) quantized base's embeddings and head to bf16 under "
                    "autocast='bf16' with LoRA; or turn it off (kbit_recast_bf16=False)")
        if setup.kbit_recast_bf16 and setup.shards_params:
            # TRL skips both the upcast and the recast for sharded QLoRA (sft_trainer.py is_sharded_qlora)
            return (f"kbit_recast_bf16 is TRL's single-process cast, which TRL skips when parameters are sharded "
                    f"(strategy {setup.strategy!r}); or turn it off (kbit_recast_bf16=False)")
        return super().conflict(setup)

    def rungs(self, ctx: LadderContext) -> list[Rung]:
        if ctx.finetune != "qlora":
            return []
        from .optimizers import chosen_optimizer

        # the rest of the model stays in its 16-bit load dtype, as TRL's SFTTrainer (0.26 on) leaves it: no
        # peft prepare_model_for_kbit_training, whose fp32 embeddings, head and norms (and the fp32 residual stream they
        # make) cost an 8B model ~3-4 GiB more (PLAN_CAST_SOURCE; the Decision prices the difference)
        template = ctx.base.replace(weights_dtype="nf4", autocast=ctx.autocast, lora=trl_adapters(ctx.lora, ctx.autocast),
                                    optimizer=chosen_optimizer(ctx), kbit_upcast=False)
        return [Rung("QLoRA", "trains adapters on a 4-bit NF4 base (dequantized per matmul)", (template,))]


#: the first TRL releases whose SFTTrainer / DPOTrainer cast every trainable parameter of a quantized model but DoRA's
#: magnitude to bf16: SFT from 0.26.0 ('Clean up model preparation' #4577), DPO from 0.29.0 ('Refactor DPO' #3906);
#: read in trl/trainer/sft_trainer.py and dpo_trainer.py of the 1.16 wheel
TRL_ADAPTER_CAST = {"sft": (0, 26), "dpo": (0, 29)}


def trl_casts_adapters(release: str | None, *, dpo: bool = False, use_dora: bool = False) -> bool:
    """Whether TRL at ``release`` (None: a current one) trains a quantized model's LoRA adapters in bf16: the one rule
    perfguide's plans, its config reader (the installed release) and the memory bench (a row's release) apply."""
    from ..memory.loss_path import version_tuple

    if use_dora:
        return False
    return release is None or version_tuple(release)[:2] >= TRL_ADAPTER_CAST["dpo" if dpo else "sft"]


def trl_adapters(lora: Any, autocast: str | None) -> Any:
    """The LoRA spec with the adapters in the dtype TRL's SFTTrainer (0.26 on) trains them in on a quantized base: every
    trainable parameter but DoRA's magnitude cast to bf16 (``param.data.to(torch.bfloat16)``, read in 1.16.0; PEFT's
    ``autocast_adapter_dtype=False`` is refused on quantized models, huggingface/peft#2889), so parameters, gradients
    and AdamW moments take 2 bytes, not 4 (ADAPTER_CAST_SOURCE). Only under bf16 autocast: an fp16 run's GradScaler
    unscales fp32 gradients, so there the plan keeps PEFT's fp32 adapters (TRL's bf16 would cost less, not more);
    DoRA keeps PEFT's fp32 too (its magnitude stays fp32 in TRL). A dtype the user named stays theirs."""
    if lora is None or lora.adapter_dtype is not None or autocast != "bf16" or not trl_casts_adapters(None, use_dora=lora.use_dora):
        return lora
    return lora.model_copy(update={"adapter_dtype": "bf16"})


def bnb_config(weights_dtype: str, compute_dtype: str, quant_storage: str | None = None, double_quant: bool = True,
               quant_type: str = "nf4") -> Any:
    """``BitsAndBytesConfig`` for int8 / nf4 weights (None for any other dtype).

    ``quant_storage``: under FSDP / ZeRO-3 the packed 4-bit storage is flattened with the other parameters,
    so it must share their dtype (accelerate utils/fsdp_utils.py; PEFT's FSDP+QLoRA guide). ``double_quant``: the
    Setup's ``nf4_double_quant``, which the memory model priced; ``quant_type``: its ``bnb_4bit_quant_type``, which
    the speed model's dequantize kernel priced.
    """
    if weights_dtype not in ("int8", "nf4"):
        return None
    from transformers import BitsAndBytesConfig

    if weights_dtype == "int8":
        return BitsAndBytesConfig(load_in_8bit=True)
    import torch

    compute = getattr(torch, _TORCH_DTYPES[compute_dtype])
    extra: dict[str, Any] = {"bnb_4bit_quant_storage": getattr(torch, _TORCH_DTYPES[quant_storage])} if quant_storage else {}
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=quant_type, bnb_4bit_use_double_quant=double_quant,
                              bnb_4bit_compute_dtype=compute, **extra)




TECHNIQUES = (QLora(),)
