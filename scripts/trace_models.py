"""The models the block and phase traces run (scripts/trace_block_backward.py, trace_backward_phases.py,
trace_liger_unchecked.py): a random-init Mistral-shaped Llama (GQA 4:1, three blocks) saved and reloaded through
transformers, as a LoRA case (CASES: nf4 through bitsandbytes under peft's kbit preparation, or a 16-bit base) or a
full fine-tune (FULL_CASES), with gradient checkpointing in either variant. Kept apart from the measurements so each
trace script imports the same model.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")


#: the traced cases: (nf4 base, prepared by peft's kbit preparation (fp32 norms, embeddings, head), bf16 autocast).
#: ``nf4_half_stream`` is LLaMA-Factory's QLoRA of 2024 (its own preparation: norms and embeddings stay 16-bit)
CASES: dict[str, tuple[bool, bool, bool]] = {"fp32_stream": (True, True, True), "half_autocast": (False, False, True),
                                             "half": (False, False, False), "nf4_half_stream": (True, False, True)}
#: full fine-tuning (every weight trainable, no adapter): (weights dtype, bf16 autocast)
FULL_CASES: dict[str, tuple[str, bool]] = {"full_half": ("bf16", False), "full_half_autocast": ("bf16", True),
                                           "full_fp32_autocast": ("fp32", True), "full_fp32": ("fp32", False)}


def standins() -> Any:
    """scripts/liger_standins.py (a sibling module: this file is also loaded by path, from tests)."""
    import importlib

    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    return importlib.import_module("liger_standins")


def decoder(model: Any) -> Any:
    """The decoder stack (``.layers``, ``.norm``) of a peft-wrapped or a plain causal LM."""
    return (model.get_base_model() if hasattr(model, "get_base_model") else model).model


def dtype_keyword() -> str:
    """from_pretrained's dtype argument: ``torch_dtype`` before transformers 4.56 (the April-2024 stack, 4.39.3)."""
    import transformers

    from perfguide.memory.loss_path import version_tuple

    return "dtype" if version_tuple(transformers.__version__) >= version_tuple("4.56.0") else "torch_dtype"


def quantize_nf4(model: Any) -> Any:
    """Swap every decoder Linear for bitsandbytes' Linear4bit (nf4, double quant, bf16 compute), the modules
    transformers' bnb loader builds (lm_head is left as the loader leaves it), and flag the model as 4-bit loaded,
    the attribute peft reads (prepare_model_for_kbit_training, the LoRA dispatch). Used where the installed
    transformers' loader refuses to quantize without CUDA; the modeling code that runs is the installed one's."""
    import bitsandbytes as bnb
    import torch

    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, torch.nn.Linear) and f"{name}.{child_name}" != "lm_head" and child_name != "lm_head":
                q = bnb.nn.Linear4bit(child.in_features, child.out_features, bias=child.bias is not None,
                                      compute_dtype=torch.bfloat16, compress_statistics=True, quant_type="nf4")
                q.weight = bnb.nn.Params4bit(child.weight.data, requires_grad=False, compress_statistics=True,
                                             quant_type="nf4", module=q).to("cpu")
                setattr(module, child_name, q)
    model.is_loaded_in_4bit = True
    return model


def keep_4bit_inputs() -> Any:
    """Make MatMul4Bit keep its input on the autograd node as bitsandbytes before 0.43.2 did (``ctx.tensors = (A, B)``
    in 0.43.0's autograd/_functions.py; PR #1270 made it ``(None, B)``): a plain ctx attribute, so the input lives
    as long as the node, not only until the node's backward. Returns an undo callable. Used to trace the April-2024
    stack (bitsandbytes 0.43.0/0.43.1), which has no CPU backend to run itself."""
    from bitsandbytes.autograd._functions import MatMul4Bit

    original = MatMul4Bit.forward

    def forward(ctx: Any, a: Any, b: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(ctx, a, b, *args, **kwargs)
        if any(ctx.needs_input_grad[:2]):
            ctx.kept_input = a
        return out

    MatMul4Bit.forward = staticmethod(forward)  # type: ignore[method-assign]

    def undo() -> None:
        MatMul4Bit.forward = staticmethod(original)  # type: ignore[method-assign]

    return undo



#: the architectures a trace can build: Llama (the default), Mistral-7B-v0.2's (no sliding window), Gemma 3's text
#: decoder (local and global layers, each kind with its own rotary pair and mask; Gemma ties its head) and Gemma 2's
#: (the same four fp32 norms per block, no q / k norms)
ARCHS = ("llama", "mistral", "gemma3", "gemma2")


def model_config(arch: str, h: int, i: int, dims: dict[str, Any] | None = None) -> Any:
    """The three-block config of ``arch`` (ARCHS) at hidden ``h`` and FFN ``i``: q = h, kv = h / 4, head_dim h / 4,
    vocabulary 256, unless ``dims`` says otherwise (``heads``, ``kv``, ``head_dim``; Gemma only: ``middle``, the
    middle block's kind, "full_attention" by default or "sliding_attention"). Gemma's blocks are local (sliding,
    window 64), global, local: the middle block, the one scripts/trace_block_backward.py measures, is global, so its
    SDPA runs without a mask as Llama's does (the local layers' mask is masks.py's); block 0 and the top block are
    local. Gemma 2's logit soft-caps are off (SDPA cannot run them; they act on the scores and the logits, not on the
    block's norms and MLP)."""
    from transformers import Gemma2Config, Gemma3TextConfig, LlamaConfig, MistralConfig

    dims = dims or {}
    heads, head_dim = dims.get("heads", 4), dims.get("head_dim", h // 4)
    shape = dict(hidden_size=h, intermediate_size=i, num_attention_heads=heads, num_key_value_heads=dims.get("kv", 1),
                 head_dim=head_dim, num_hidden_layers=3, vocab_size=256, max_position_embeddings=4096)
    if arch in ("gemma3", "gemma2"):
        middle = dims.get("middle", "full_attention")
        other = "full_attention" if middle == "sliding_attention" else "sliding_attention"
        gemma = dict(shape, sliding_window=64, query_pre_attn_scalar=head_dim, tie_word_embeddings=True,
                     layer_types=[other, middle, other])
        if arch == "gemma2":
            return Gemma2Config(**gemma, attn_logit_softcapping=None, final_logit_softcapping=None)
        return Gemma3TextConfig(**gemma)
    if arch == "mistral":
        return MistralConfig(**shape, sliding_window=None, tie_word_embeddings=False)
    if arch != "llama":
        raise ValueError(f"arch must be one of {', '.join(ARCHS)}, not {arch!r}")
    return LlamaConfig(**shape, tie_word_embeddings=False)



@contextmanager
def _sdpa_allowed(arch: str) -> Iterator[None]:
    """transformers 5.24's Gemma 2 declares no SDPA support (for its soft-caps, off in these configs); its attention
    calls the same interface as Gemma 3's, so while the traced model loads the class accepts SDPA, as the other
    architectures' traces run it. Restored after: a process that builds a soft-capped Gemma 2 next must not get SDPA."""
    if arch != "gemma2":
        yield
        return
    from transformers.models.gemma2.modeling_gemma2 import Gemma2PreTrainedModel

    before = Gemma2PreTrainedModel._supports_sdpa
    Gemma2PreTrainedModel._supports_sdpa = True
    try:
        yield
    finally:
        Gemma2PreTrainedModel._supports_sdpa = before

def build(h: int, i: int, kbit: bool, reentrant: bool, tmp: str, prepare: bool = True, liger: bool = False,
          full: str | None = None, arch: str = "llama", dims: dict[str, Any] | None = None) -> Any:
    """The traced model; ``full``: the weights dtype of a full fine-tune ("bf16" / "fp32": no adapter, every weight
    trainable), else LoRA r 8 on all seven Linears; ``arch``, ``dims``: model_config's."""
    import torch
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    torch.manual_seed(0)
    config = model_config(arch, h, i, dims)
    kwargs: dict[str, Any] = {"attn_implementation": "sdpa", dtype_keyword(): torch.float32 if full == "fp32" else torch.bfloat16}
    if kbit:
        kwargs["quantization_config"] = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                                           bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.bfloat16)
    with _sdpa_allowed(arch):
        AutoModelForCausalLM.from_config(config).save_pretrained(tmp)
        try:
            model = AutoModelForCausalLM.from_pretrained(tmp, **kwargs)
        except ImportError:  # transformers before CPU bitsandbytes support (4.39.3: its bnb quantizer requires CUDA)
            kwargs.pop("quantization_config")
            model = quantize_nf4(AutoModelForCausalLM.from_pretrained(tmp, **kwargs))
    ckpt = {"use_reentrant": reentrant}
    if kbit and prepare:
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=True, gradient_checkpointing_kwargs=ckpt)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=ckpt)
        if full is None:
            model.enable_input_require_grads()
    inner = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    if hasattr(inner, "_update_causal_mask"):
        # transformers 4.3x's sdpa path materialises an s x s float mask in the stream dtype (_update_causal_mask), and
        # under autocast sdpa saves its 16-bit cast: s^2 bytes that the FA2 runs being modelled never hold (4.39's
        # FA2 path returns None for an unpadded batch). None makes 4.39's sdpa attention call is_causal=True, as the
        # installed release's sdpa mask does for an unpadded batch (masking_utils skips the mask)
        inner._update_causal_mask = lambda *args, **kwargs: None
    if full is not None:
        model.train()
        if liger:
            standins().patch_liger(model)
        return model
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=targets))
    model.train()
    if liger:
        standins().patch_liger(model)
    return model


def traced(case: str, h: int, i: int, reentrant: bool, tmp: str, liger: bool = False,
           arch: str = "llama", dims: dict[str, Any] | None = None) -> tuple[Any, bool]:
    """(model, autocast) of a LoRA case (CASES) or a full fine-tuning one (FULL_CASES); ``dims``: model_config's."""
    if case in FULL_CASES:
        weights, autocast = FULL_CASES[case]
        return build(h, i, False, reentrant, tmp, liger=liger, full=weights, arch=arch, dims=dims), autocast
    kbit, prepare, autocast = CASES[case]
    return build(h, i, kbit, reentrant, tmp, prepare, liger, arch=arch, dims=dims), autocast
