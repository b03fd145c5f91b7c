"""Memory terms of the modern technique stack, each a small pure function of (spec, setup).

* padding-free packing: a micro-batch is flattened into one row of ``micro_batch x avg_seq_len`` real tokens
  (``DataCollatorWithFlattening`` returns shape [1, total_tokens]); activations follow the real tokens.
  SDPA / eager then need a block-diagonal causal mask over the row (transformers' masking_utils detects packed
  ``position_ids``): one bool [T, T] tensor. flash_attention_2 takes ``cu_seq_lens`` and needs no mask.
* Liger fused linear cross-entropy: logits exist one chunk of tokens at a time; the chunk is
  ``next_pow2(ceil(BT / ceil(V / H)))`` rows (linkedin/Liger-Kernel src/liger_kernel/ops/fused_linear_cross_entropy.py),
  so the live [chunk, V] tile is about the size of the [BT, H] hidden states.
* activation offloading: checkpointed layer inputs go to pinned host RAM as forward leaves each layer and come
  back for its recompute; the GPU keeps the layers in flight (TRL/torchtune overlap one copy with compute).
* optimizer step in backward: each gradient is freed by its own step, so only the largest lives at once.
* paged optimizers (bitsandbytes ``paged_*``): state lives in CUDA unified memory from ``cudaMallocManaged``,
  outside torch's caching allocator (bitsandbytes functional.get_paged), evicted to the host under pressure.
"""

from __future__ import annotations

from ..model.types import ModelSpec
from ..setup import Setup

#: layers whose checkpointed inputs stay on the GPU while offloading: the one computing and the one copying
OFFLOAD_LAYERS_IN_FLIGHT = 2


def real_tokens(setup: Setup) -> int:
    """Real (non-padding) tokens of one micro-batch; without ``avg_seq_len`` every sample fills ``seq_len``."""
    return setup.micro_batch_size * (setup.avg_seq_len or setup.seq_len)


def shaped(setup: Setup) -> Setup:
    """The (batch, sequence) shape the model really computes on: padding-free flattens the micro-batch into one row
    of its real tokens; padded batches pay for ``seq_len`` whatever the real lengths."""
    if not setup.padding_free:
        return setup
    return setup.model_copy(update={"micro_batch_size": 1, "seq_len": real_tokens(setup), "padding_free": False, "avg_seq_len": None})


def packed_mask_bytes(setup: Setup) -> int:
    """The [T, T] bool block-diagonal mask SDPA / eager need for a flattened row; none for flash_attention_2."""
    if not setup.padding_free or setup.attn_implementation == "flash_attention_2":
        return 0
    return real_tokens(setup) ** 2


def liger_chunk_rows(spec: ModelSpec, tokens: int) -> int:
    """Rows of logits Liger's fused linear cross-entropy materialises at once."""
    inc = -(-spec.vocab_size // max(1, spec.hidden_size))
    rows = -(-tokens // max(1, inc))
    return min(tokens, 1 << max(0, (rows - 1).bit_length()))


def liger_loss_bytes(spec: ModelSpec, setup: Setup) -> int:
    """Loss-path bytes under Liger FLCE: one [chunk, V] logits tile and its in-place gradient in the compute dtype,
    the [BT, H] input gradient computed in forward, and the fp32 per-token loss. The head's weight gradient is
    produced here too; it is the head gradient the ledger already counts."""
    s = shaped(setup)
    tokens = s.micro_batch_size * s.seq_len
    cbytes = 4 if s.compute_dtype in ("fp32", "tf32") else 2
    return liger_chunk_rows(spec, tokens) * spec.vocab_size * cbytes * 2 + tokens * spec.hidden_size * cbytes + tokens * 4


def offloaded_boundary_bytes(boundaries: int, layers: int) -> tuple[int, int]:
    """(bytes kept on the GPU, bytes moved to host RAM) of the checkpointed layer inputs under activation offloading."""
    per_layer = boundaries // max(1, layers)
    on_gpu = per_layer * min(layers, OFFLOAD_LAYERS_IN_FLIGHT)
    return on_gpu, boundaries - on_gpu


def grads_in_backward(largest_param: int, elem_bytes: int) -> int:
    """Gradient bytes alive at once when every parameter steps inside backward: the largest single gradient."""
    return largest_param * elem_bytes
