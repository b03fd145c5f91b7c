"""Bytes that depend on the transformers release that ran: what older modeling code kept beyond the installed
release's traced coefficients (data/activations.json ``training_cache`` and ``attention_eras``, each entry keyed by
model type, attention and the release it took effect in). A release the data has no entry for is charged nothing.
"""

from __future__ import annotations

from typing import TypeVar

from ..model.types import ModelSpec
from ..setup import Setup
from .activations import head_positions, regime
from .activations_data import AttentionEra, CacheEntry, activations_data
from .ledger import ledger
from .loss_path import version_tuple

#: transformers releases whose Trainer builds its optimizer and lr scheduler on the unwrapped model and only then hands
#: model and optimizer to accelerate's FSDP (trainer.py _inner_training_loop: create_optimizer_and_scheduler before
#: accelerator.prepare(self.model, self.optimizer); read in the 4.30.2 and 4.31.0 wheels). 4.29.2 wraps FSDP itself
#: before building the optimizer; 4.32.1 calls accelerator.prepare(self.model) first. 4.30.0/4.30.1 and 4.32.0 not
#: read: the range starts at the first release with the accelerate Trainer and ends at the first 4.32.
TRAINER_FSDP_PRE_WRAP_OPTIMIZER = ("4.30.0", "4.32.0")


def training_cache_bytes(spec: ModelSpec, setup: Setup, release: str, outputs_alive: int = 1, *,
                         checkpointed: bool = False) -> int:
    """Bytes the KV cache returned by a training forward keeps alive at the forward/loss peak (``release``: the
    transformers release that ran; data/activations.json ``training_cache``, traced per release).

    HF models return ``past_key_values`` whenever ``config.use_cache`` is true, in training too (it is switched off
    only under gradient checkpointing). Where the cached keys and values are views of a fused projection output
    (GPT-2's c_attn before transformers 5), that whole output outlives the forward although autograd saved copies.
    The cache exists at the loss peak inside the forward in every loop; ``outputs_alive`` counts the outputs alive
    there: 2 for a loop that rebinds ``outputs = model(**batch)`` each step, whose previous output lives until the
    next forward returns. A model type or release without a traced entry is charged nothing. ``checkpointed``:
    the blocks are recomputed in backward (the caller reads it off the checkpointing hook's recompute term).
    """
    if checkpointed or not (spec.config or {}).get("use_cache", True):
        return 0
    entry = _in_force(activations_data().training_cache.entries, spec, setup, release)
    if entry is None:
        return 0
    nbytes = 4 if regime(setup) == "fp32" else 2
    per_token = entry.hidden_elements * spec.hidden_size * nbytes * spec.total_layers
    return int(outputs_alive * per_token * setup.micro_batch_size * setup.seq_len)


def amp_output_conversion_bytes(spec: ModelSpec, setup: Setup, release: str, outputs_alive: int = 1, *,
                                checkpointed: bool = False) -> int:
    """Loss-path and returned-cache bytes alive when accelerate's ``convert_outputs_to_fp32`` returns: the end of
    the forward of a model that accelerate prepared for fp16/bf16 autocast (0 without autocast).

    accelerate wraps the prepared model's forward as ``convert_outputs_to_fp32(autocast(...)(model.forward))``
    (0.7.0 ``Accelerator.prepare_model``); ``convert_to_fp32`` rebuilds the output with ``tensor.float()`` of every
    16-bit tensor in it (``recursively_apply`` over the ModelOutput mapping and the nested cache tuples), while the
    16-bit output is still referenced. For a model that returns its head's 16-bit logits (GPT-2 has no
    ``logits.float()``), that moment holds per logit the saved fp32 log-softmax output of the loss (``ce_bytes``),
    the 16-bit logits (2) and their fp32 copy (4); per token and block the returned cache's 16-bit storage (the
    traced ``training_cache`` entry: GPT-2's views keep the fused 3h c_attn output) and an fp32 copy of each
    returned key and value (``kv_elements_per_token`` x 4: a ``.float()`` of a strided view is a new contiguous
    tensor). Each earlier output still alive (``outputs_alive`` - 1: a loop that rebinds ``outputs``) holds its
    fp32 logits and fp32 key/value copies. The 16-bit output is freed as the wrapper returns; activations are
    those of the end of the forward, as at the loss peak. ``checkpointed``: HF turns the cache off.
    """
    if not setup.autocast or regime(setup) != "amp":
        return 0
    ce = activations_data().loss_paths.ce_bytes
    earlier = max(0, outputs_alive - 1)
    logits = setup.micro_batch_size * head_positions(spec, setup) * spec.logits_width * (ce + 2 + 4 + 4 * earlier)
    entry = None if checkpointed or not (spec.config or {}).get("use_cache", True) else _in_force(
        activations_data().training_cache.entries, spec, setup, release)
    if entry is None:
        return int(logits)
    per_block = entry.hidden_elements * spec.hidden_size * 2 + spec.kv_elements_per_token() * 4 * (1 + earlier)
    return int(logits + per_block * spec.total_layers * setup.micro_batch_size * setup.seq_len)


def attention_era_bytes(spec: ModelSpec, setup: Setup, release: str, *, checkpointed: bool = False) -> int:
    """Bytes the attention of transformers ``release`` saves for backward beyond the installed release's traced
    coefficients (data/activations.json ``attention_eras``; the traces behind ``families`` ran the installed code).

    Older modeling code saved more: OPT before 4.49 clamped the masked scores with ``torch.max`` (the maximum's
    backward keeps its s x s input) and made q/k/v contiguous head-first, so SDPA's output needed a copy before
    out_proj. GPT-NeoX before 4.45 kept its rotary cos/sin tables in fp32 (computed from an fp32 ``inv_freq`` and
    left alone by from_pretrained's ``torch_dtype``), so ``q * cos`` promotes the rotated query and key to fp32: the
    eager path saves them at 4 B instead of 2 (and scores the attention in fp32), SDPA casts them back for the kernel
    while the returned cache keeps the fp32 key (``fp32_rope_bytes_per_h``; nothing where activations are fp32
    already). The bytes are alive from their block's forward to its backward, like the block's other activations.
    Mistral's FlashAttention2 before 4.48 expanded the grouped keys and values to the query heads (``repeat_kv``)
    and then cast them to the 16-bit kernel dtype, so flash_attn saved query-wide keys and values (``repeats_kv``;
    traced on 4.39.3's sdpa path, which expands the same way: scripts/trace_block_backward.py ``--compare``).
    ``checkpointed``: the blocks are recomputed in backward, so only the one block being recomputed holds them.
    Buffers an old release registers are attention_buffer_bytes, not these. A model type or release without an entry is charged nothing.
    """
    e = _era_entry(spec, setup, release)
    if e is None:
        return 0
    # element sizes (traced in half and fp32): under autocast the 16-bit scores meet the fp32 mask and become fp32,
    # while SDPA's output stays 16-bit
    r = regime(setup)
    s2_bytes, hidden_bytes = (2, 2) if r == "half" else (4, 4) if r == "fp32" else (4, 2)
    b, s = setup.micro_batch_size, setup.seq_len
    rope = 0.0 if r == "fp32" else e.fp32_rope_bytes_per_h   # 16-bit tensors promoted by fp32 rotary tables
    repeated = 2 * spec.num_attention_heads * spec.head_dim - spec.kv_elements_per_token() if e.repeats_kv else 0
    per_block = (e.per_head_s2_elements * b * spec.num_attention_heads * s * s * s2_bytes
                 + (e.hidden_elements * hidden_bytes + rope) * spec.hidden_size * b * s + repeated * hidden_bytes * b * s)
    return int(per_block * (1 if checkpointed else spec.total_layers))


def attention_buffer_bytes(spec: ModelSpec, setup: Setup, release: str) -> int:
    """Bytes of the buffers transformers ``release``'s attention registers in every block beyond the installed one
    (data/activations.json ``attention_eras`` ``mask_buffer_bytes_per_position2``): GPT-NeoX before 4.49 kept a bool
    tril of max_position_embeddings^2 per block (``_init_bias``). Resident from load on, in every phase, like the
    weights, and independent of batch, length and checkpointing."""
    e = _era_entry(spec, setup, release)
    if e is None:
        return 0
    return int(e.mask_buffer_bytes_per_position2 * (spec.max_position_embeddings or 0) ** 2 * spec.total_layers)


def _era_entry(spec: ModelSpec, setup: Setup, release: str) -> AttentionEra | None:
    return _in_force(activations_data().attention_eras.entries, spec, setup, release)


_Entry = TypeVar("_Entry", CacheEntry, AttentionEra)


def _in_force(entries: tuple[_Entry, ...], spec: ModelSpec, setup: Setup, release: str) -> _Entry | None:
    """The entry for this model type and attention in force at ``release``: the newest one at or before it (none: None).
    flash_attention_3 reads flash_attention_2's rows: transformers runs both through one flash_attention_forward."""
    v = version_tuple(release)
    attn = "flash_attention_2" if setup.flash_attention else setup.attn_implementation
    found = [e for e in entries if e.model_type == spec.model_type and e.attn_implementation == attn
             and version_tuple(e.since) <= v]
    return max(found, key=lambda e: version_tuple(e.since)) if found else None


def trainer_fsdp_pre_wrap_bytes(spec: ModelSpec, setup: Setup, release: str) -> int:
    """Bytes per GPU the HF Trainer of ``release`` keeps alive beside FSDP's shards: the trainable parameters as
    loaded, whole, on every GPU (TRAINER_FSDP_PRE_WRAP_OPTIMIZER releases; other releases and strategies: 0).

    Those releases build the optimizer on the unwrapped model's parameters and the lr scheduler on that optimizer,
    then call ``accelerator.prepare(model, optimizer)``. FSDP moves the module to the GPU with ``module.to(device_id)``
    (torch 2.0 ``_move_module_to_device``, which swaps each Parameter's ``.data`` in place) and copies the parameters
    into its flat parameter; accelerate's ``_prepare_fsdp`` builds a new optimizer over the flat parameters, but the
    scheduler still holds the old one, whose param groups hold the original Parameters, now full-size on the GPU.
    Resident from the wrap on, like the weights.
    """
    v = version_tuple(release)
    lo, hi = (version_tuple(r) for r in TRAINER_FSDP_PRE_WRAP_OPTIMIZER)
    if not setup.is_fsdp or not lo <= v < hi:
        return 0
    return ledger(spec, setup).trainable_bytes

