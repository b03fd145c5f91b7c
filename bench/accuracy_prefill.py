"""Prefill logits and decode caches of ``generate`` under older transformers releases (bench rows that state their
release).

Until 4.45.0 ``generate`` did not ask the model for the last position only (``num_logits_to_keep``, added in
4.45.0, which generate sets to 1): the prefill forward returns the logits of every prompt position. Llama, Mistral,
Mixtral, Gemma and Qwen2's ``*ForCausalLM.forward`` then upcast them (``logits = logits.float()``), so at the
upcast the 16-bit head output and its fp32 copy coexist: 2 + 4 bytes per prompt position per vocabulary entry,
next to the prompt's KV cache. perfguide's inference model prices the current release (last position only); this
prices the rows' own. Evidence beyond the code: Qwen2's speed benchmark (transformers 4.38.2) grows 0.93 MiB per
prompt token for Qwen2-7B (6,144 -> 30,720 tokens: 20.26 -> 42.62 GiB) = 6 B x 152,064 logits + 57 KiB of cache.
"""

from __future__ import annotations

from perfguide.memory.inference import cached_tokens
from perfguide.memory.loss_path import version_tuple
from perfguide.memory.types import MemoryEstimate
from perfguide.model.types import ModelSpec
from perfguide.setup import Setup

#: first release whose generate computes last-position logits only
LAST_POSITION_SINCE = (4, 45)
#: model types whose causal-LM forward upcast the logits to fp32 in the 4.3x-4.44 releases
UPCASTS = frozenset({"llama", "mistral", "mixtral", "gemma", "qwen2"})


def prompt_logits_bytes(spec: ModelSpec, setup: Setup, release: str) -> int:
    """Bytes of the full-prompt logits at the prefill's upcast (0 from 4.45 on)."""
    if version_tuple(release)[:2] >= LAST_POSITION_SINCE or not spec.generates or spec.is_encoder_decoder:
        return 0
    head = 4 if setup.weights_dtype == "fp32" else 2
    per = head + (4 if head == 2 and spec.model_type in UPCASTS else 0)
    return setup.micro_batch_size * setup.seq_len * spec.vocab_size * per


def with_prompt_logits(est: MemoryEstimate, spec: ModelSpec, setup: Setup, release: str) -> MemoryEstimate:
    """``est`` with the prefill peak of an older release: weights + the prompt's KV cache + full-prompt logits."""
    full = prompt_logits_bytes(spec, setup, release)
    if not full:
        return est
    prompt_kv = est.kv_cache * setup.seq_len // max(1, setup.seq_len + setup.new_tokens)
    return _with_peak(est, est.weights + prompt_kv + full)


def _with_peak(est: MemoryEstimate, candidate: int) -> MemoryEstimate:
    """``est`` with its allocated peak raised to ``candidate`` where that is higher, and every total above it with it."""
    delta = max(candidate - est.peak_allocated, 0)
    if not delta:
        return est
    return est.model_copy(update={"peak_allocated": est.peak_allocated + delta, "peak_reserved": est.peak_reserved + delta,
                                  "device_total": est.device_total + delta, "fit_total": est.needed + delta})


#: first release whose generate hands the model a Cache object it updates in place (DynamicCache by default): before
#: it the legacy tuple cache of the previous step stays referenced by generate's ``model_inputs`` / ``model_kwargs``
#: while the forward builds the next one (traced: tests/test_legacy_decode_cache.py)
CACHE_OBJECT_SINCE = (4, 42)


def previous_cache_bytes(est: MemoryEstimate, spec: ModelSpec, setup: Setup, release: str) -> int:
    """The previous decode step's whole KV cache, alive beside the new one at the end of each decode forward under a
    release before 4.42 (0 from 4.42 on, for a static cache, with nothing to decode, or for a cache split over several
    GPUs, where the estimate holds the most loaded GPU's share: not traced).

    Releases up to 4.41 pass the cache as a tuple of per-layer tensors: each layer's ``torch.cat`` makes a new tensor
    one position longer while generate still holds the old tuple (it rebinds ``model_inputs`` only at the next step),
    so the old cache, one position shorter, lives through the whole forward: traced on 4.31.0, 4.33.0, 4.38.2 and
    4.41.2, gone in 4.42.0, 4.42.4, 4.43.4-4.46.0 and 5.x. perfguide's model prices the current release: one layer's
    old tensor at a time.
    """
    if (version_tuple(release)[:2] >= CACHE_OBJECT_SINCE or not spec.generates or spec.is_encoder_decoder
            or setup.cache_implementation == "static" or setup.new_tokens < 2 or setup.num_gpus > 1):
        return 0
    cached = cached_tokens(setup, spec)   # positions in the cache the last decode forward builds
    return est.kv_cache * (cached - 1) // cached


def with_previous_cache(est: MemoryEstimate, spec: ModelSpec, setup: Setup, release: str) -> MemoryEstimate:
    """``est`` with the decode peak of an older release: weights + both steps' caches + the step's logits."""
    old = previous_cache_bytes(est, spec, setup, release)
    if not old:
        return est
    layer = est.kv_cache // max(1, spec.num_decoder_layers or spec.num_layers)   # the one the model already prices
    return _with_peak(est, est.weights + est.kv_cache + est.logits + max(old, layer))
