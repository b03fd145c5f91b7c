"""Attention, decided once for training and inference: which ``attn_implementation`` the model is loaded with.

SDPA is transformers' default and picks a flash / memory-efficient kernel without extra packages; eager where the
model class refuses SDPA (Gemma-2's soft-capped scores, GPT-OSS's sinks). flash_attention_2 is chosen unasked only
when the plan targets this machine (a probe) and flash-attn is installed here, on a card it supports, with 16-bit
compute: for a named target the planning machine's packages say nothing about the target's. A forced value is
honoured, or refused in one line where it cannot run (the class refuses SDPA; FA2 on a card or dtype it lacks).
"""

from __future__ import annotations

import importlib.util

from .. import sources
from ..decisions import Alternative, Decision
from ..errors import ConflictingConstraintsError
from ..hardware.types import GPU
from ..memory.index_limits import index_overflow
from ..model.types import ModelSpec
from ..setup import FLASH_ATTENTION, Setup


def flash_attn_available() -> bool:
    """Whether the flash-attn package is importable on this (the planning) machine."""
    return importlib.util.find_spec("flash_attn") is not None


def flash_attn_3_available() -> bool:
    """Whether flash-attn's Hopper build (``flash_attn_interface``, what transformers loads for flash_attention_3) is
    importable on this (the planning) machine."""
    return importlib.util.find_spec("flash_attn_interface") is not None


def sdpa_refused(spec: ModelSpec) -> str:
    """The one line for naming SDPA on a class that refuses it (``_supports_sdpa = False``), plan or estimate."""
    return (f"attn_implementation='sdpa' is refused by {spec.name}'s transformers class (soft-capped or sink attention: "
            "_supports_sdpa = False); use 'eager' or 'flash_attention_2'")


def _check_forced(spec: ModelSpec, forced: str | None, gpu: GPU | None, compute: str | None) -> None:
    if forced == "sdpa" and not spec.supports_sdpa:
        raise ConflictingConstraintsError(sdpa_refused(spec))
    if forced == "flash_attention_2":
        if gpu is None or not gpu.supports_flash_attention:
            where = f"{gpu.name} ({gpu.generation})" if gpu is not None else "the CPU"
            raise ConflictingConstraintsError(f"attn_implementation='flash_attention_2' needs a GPU flash-attn supports (NVIDIA Ampere+, "
                                              f"AMD MI200/MI300), but the plan runs on {where}; use 'sdpa'")
    if forced == "flash_attention_3" and (gpu is None or not gpu.supports_flash_attention_3):
        where = f"{gpu.name} ({gpu.generation})" if gpu is not None else "the CPU"
        raise ConflictingConstraintsError(f"attn_implementation='flash_attention_3' needs a GPU flash-attn's Hopper build runs on "
                                          f"(H100 / H200 / H20), but the plan runs on {where}; use 'flash_attention_2' or 'sdpa'")
    if forced in FLASH_ATTENTION and compute is None:
        raise ConflictingConstraintsError(f"attn_implementation={forced!r} needs fp16/bf16 compute, but the plan runs in "
                                          "fp32; use 'sdpa'")


def _why_not_fa2(gpu: GPU | None, compute: str | None, local: bool) -> str | None:
    """Why flash_attention_2 is not chosen unasked (None: it is)."""
    if gpu is None:
        return "needs a CUDA GPU"
    if not gpu.supports_flash_attention:
        return "flash-attn does not support this GPU"
    if compute is None:
        return "needs 16-bit compute"
    if not local:
        return ("whether flash-attn is installed on the target is unknown (a named GPU); pass attn_implementation="
                "'flash_attention_2' if it is: pays off for long sequences with packed batches")
    if not flash_attn_available():
        return "flash-attn is not installed; pays off for long sequences with packed batches"
    return None


def _past_fa2_reach(spec: ModelSpec, seq_len: int | None) -> str | None:
    """flash-attn 2 is not chosen unasked for a sequence whose q it cannot index in one call (memory/index_limits.py)."""
    return None if seq_len is None else index_overflow(spec, Setup(seq_len=seq_len, attn_implementation="flash_attention_2"))


def decide_attention(spec: ModelSpec, forced: str | None, gpu: GPU | None, compute: str | None, *, local: bool,
                     seq_len: int | None = None) -> Decision:
    """``compute``: the matmul dtype ("bf16" / "fp16"; None for fp32). ``local``: the plan targets this machine.
    The deciding number: the s x s scores eager attention holds per sample and layer at ``seq_len`` (what the fused
    kernels never materialise)."""
    _check_forced(spec, forced, gpu, compute)
    scores = {"number": float(spec.num_attention_heads * seq_len**2 * (2 if compute else 4)),
              "unit": "bytes of s x s scores per sample and layer in eager"} if seq_len else {}
    if forced:
        return Decision(setting="attn_implementation", value=forced, reason=f"attn_implementation={forced!r} was requested",
                        source=sources.SDPA if forced == "sdpa" else sources.FLASH_ATTENTION_3 if forced == "flash_attention_3"
                        else sources.INFER_GPU_ONE if forced == "flash_attention_2" else "",
                        **scores)
    if local and gpu is not None and gpu.supports_flash_attention_3 and compute and spec.supports_sdpa and flash_attn_3_available():
        return Decision(setting="attn_implementation", value="flash_attention_3", source=sources.FLASH_ATTENTION_3, **scores,
                        reason="flash-attn's Hopper build is installed and the GPU is a Hopper: FlashAttention-3, faster there "
                               "than FlashAttention-2 and without its 32-bit index limit",
                        alternatives=(Alternative(value="flash_attention_2", why_not="slower on Hopper (no wgmma / TMA)"),
                                      Alternative(value="sdpa", why_not="slower at long sequences; fine otherwise")))
    why_not = _why_not_fa2(gpu, compute, local) or _past_fa2_reach(spec, seq_len)
    if why_not is None and spec.supports_sdpa:
        return Decision(setting="attn_implementation", value="flash_attention_2", source=sources.INFER_GPU_ONE, **scores,
                        reason="flash-attn is installed, supports the GPU and compute is 16-bit: no s x s scores, fastest prefill",
                        alternatives=(Alternative(value="sdpa", why_not="slower at long sequences; fine otherwise"),))
    if not spec.supports_sdpa:
        return Decision(setting="attn_implementation", value="eager", source=sources.NO_SDPA, **scores,
                        reason=f"{spec.name}'s transformers class does not accept SDPA (soft-capped or sink attention scores): eager, "
                               "which materialises the s x s scores",
                        alternatives=(Alternative(value="flash_attention_2", why_not=why_not or "not chosen unasked for this class"),
                                      Alternative(value="sdpa", why_not="refused by this model class (_supports_sdpa = False)")))
    return Decision(setting="attn_implementation", value="sdpa", source=sources.SDPA, **scores,
                    reason="SDPA is the default and picks a flash / memory-efficient kernel: no s x s score matrix, no extra package",
                    alternatives=(Alternative(value="flash_attention_2", why_not=str(why_not)),
                                  Alternative(value="eager", why_not="materialises the s x s attention scores: slower and more memory")))
