"""Loss-path bytes of TRL's trainers by TRL release: which copies of the logits SFTTrainer keeps.

HF's Trainer computes the model's own loss on the full ``[b, s, V]`` logits (memory/loss_path.py prices those by
transformers release). TRL's SFTTrainer stopped doing so in two steps, read in the released wheels:

* ``full`` (TRL < 1.7): ``loss_type="nll"`` is the default, the model's own loss on full logits, as HF Trainer;
* ``chunked`` (1.7 - 1.14): ``loss_type="chunked_nll"`` is the default: the label positions' hidden states are
  gathered and projected 256 at a time under ``torch.utils.checkpoint``, so one ``[256, V]`` logits chunk (and its
  fp32 cross-entropy tensors) lives at once, in forward and again in backward;
* ``fused`` (1.15 on): every trainer scores tokens with a fused LM head (``add_fused_lm_head``,
  ``ChunkedLogProbFunction``): one ``[4096, 32768]`` tile buffer, a dozen fp32 numbers per position, and in
  backward fp32 input (and trained-head weight) gradients. On a device without Triton (every CPU) the same tiles
  are folded by torch ops (``_forward_tile``, ``_backward_tile``): no full logits either, but a few fp32 tile-sized
  temporaries the Triton kernels never write (data/trl.json torch_fold_*).

The eras and their sources are rows of data/trl.json; the TRL release comes from the installed package, and with
no TRL installed the plan is priced as the newest era (what ``pip install 'perfguide[trl]'`` installs today).
DPO's fused head (techniques/dpo.py) is priced with the same pieces (``fused_head_parts``).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Literal, NamedTuple

from pydantic import Field

from .._data import DataModel, validated
from .._packages import installed_release
from ..model.types import ModelSpec
from ..setup import Setup
from . import activations as act
from .loss_path import era_at

FP32 = 4
SftLoss = Literal["full", "chunked", "fused"]
DpoLoss = Literal["unpriced", "torch", "kernel", "fused"]   # DPOTrainer's log-probs: memory/dpo_logits.py


class TrlEra(DataModel):
    since: str
    sft_loss: SftLoss
    fp32_head_copy: bool = False   # chunked_nll 1.7-1.12: each chunk projects through an fp32 copy of the head weight
    source: str = Field(min_length=10)
    dpo_loss: DpoLoss
    dpo_contiguous: bool = False   # 1.0-1.5: DPOTrainer copies the shifted logits (.contiguous()), policy and reference
    dpo_source: str = Field(min_length=10)


class TrlLoss(DataModel):
    source: str = Field(min_length=10)
    chunked_tokens: int = Field(ge=1)   # label positions one chunk of the 1.7-1.14 chunked_nll loss projects
    chunked_source: str = Field(min_length=10)
    sft_fp32_per_token: int = Field(ge=1)   # fp32 numbers the fused head keeps per position for SFTTrainer's outputs
    sft_fp32_source: str = Field(min_length=10)
    tile_tokens: int = Field(ge=1)   # label positions one fused-head tile projects (TOKEN_CHUNK_SIZE)
    tile_tokens_source: str = Field(min_length=10)
    tile_vocab: int = Field(ge=1)    # vocabulary columns of the tile buffer, whatever the vocabulary
    tile_vocab_source: str = Field(min_length=10)
    torch_fold_fp32_tiles_forward: float = Field(ge=0)   # fp32 tile-sized temporaries of the torch fallback (no Triton)
    torch_fold_fp32_tiles_backward: float = Field(ge=0)
    torch_fold_source: str = Field(min_length=10)
    dpo_entropy_chunk_rows: int = Field(ge=1)   # positions entropy_from_logits folds at a time (TRL 1.0-1.14 DPO)
    dpo_entropy_chunk_source: str = Field(min_length=10)
    eras: tuple[TrlEra, ...]


@lru_cache(maxsize=1)
def trl_data() -> TrlLoss:
    return validated("trl", TrlLoss)


@lru_cache(maxsize=1)
def installed_trl() -> str | None:
    """The TRL release installed next to perfguide (the one a trainer='trl' plan made here trains with)."""
    return installed_release("trl")


def trl_era(trl_version: str | None) -> TrlEra:
    """The last era whose first release is not newer than ``trl_version``; None (no TRL here): the newest era."""
    return era_at(trl_data().eras, trl_version, lambda e: e.since)


class FusedHead(NamedTuple):
    """The fused head's buffers (bytes): ``saved`` lives from its forward to its backward; beside it, at different
    times, ``forward`` (tile + fp32 statistics) and ``backward`` (fp32 input gradient, tile, head weight gradient)."""

    saved: int
    tile: int
    stats: int
    forward: int
    backward: int


def hidden_bytes(setup: Setup) -> int:
    """Bytes per element of the hidden states reaching the head: fp32 where the residual stream is fp32 (fp32 weights,
    with or without autocast), 16-bit where the weights (or FSDP's / DeepSpeed's compute copy) are."""
    return 2 if act.regime(setup) == "half" or setup.computes_on_16bit_copy else FP32


def compute_bytes(setup: Setup) -> int:
    """The tile buffer's dtype: the autocast dtype, else the hidden states' (chunked_logprob.py compute_dtype)."""
    return FP32 if act.regime(setup) == "fp32" else 2


def trains_head_in_fp32_copy(setup: Setup, grad_elem_bytes: int) -> bool:
    """A trained head whose parameter is not fp32: backward accumulates an fp32 weight gradient, then autograd
    casts it to a second, parameter-dtype gradient."""
    return setup.lora is None and grad_elem_bytes != FP32


def fused_head_parts(spec: ModelSpec, setup: Setup, positions: int, grad_elem_bytes: int, fp32_per_token: int) -> FusedHead:
    """ChunkedLogProbFunction's buffers for ``positions`` label positions (TRL 1.15+, trl/kernels/chunked_logprob.py)."""
    h, data = spec.hidden_size, trl_data()
    rows, width = min(positions, data.tile_tokens), data.tile_vocab
    tile = rows * width * compute_bytes(setup)   # mm_buf is allocated 32768 wide even for a narrower vocabulary
    cells = rows * min(spec.vocab_size, width)   # the tile view the fold reads
    stats = positions * fp32_per_token * FP32
    head_weight_grad = spec.vocab_size * h * FP32 if trains_head_in_fp32_copy(setup, grad_elem_bytes) else 0
    # no Triton on a CPU: the tiles are folded by torch ops, whose fp32 temporaries the GPU kernels never write
    fold_fwd, fold_bwd = ((data.torch_fold_fp32_tiles_forward, data.torch_fold_fp32_tiles_backward) if setup.device == "cpu" else (0, 0))
    return FusedHead(saved=positions * h * hidden_bytes(setup), tile=tile, stats=stats,
                     forward=tile + stats + int(fold_fwd * cells * FP32),
                     backward=positions * h * FP32 + tile + head_weight_grad + int(fold_bwd * cells * FP32))


def sft_positions(setup: Setup) -> int:
    """Label positions of one SFT micro-step: every next-token label (an upper bound: prompt and padding positions
    carry -100 and are skipped)."""
    return setup.micro_batch_size * max(1, setup.seq_len - 1)


def chunked_loss_bytes(spec: ModelSpec, setup: Setup, grad_elem_bytes: int, fp32_head_copy: bool) -> int:
    """TRL 1.7-1.14 ``chunked_nll`` (sft_trainer.py _chunked_cross_entropy_loss, _chunk): the gathered label hidden
    states (``hidden[order]``, a copy) live through backward. One checkpointed chunk at a time holds four fp32 chunk
    tensors: in forward the upcast logits, ``log_softmax``, ``log_p.exp()`` and the entropy product; in its backward
    the recomputed log_p and exp and two gradients at a time. Through 1.12 the fp32 copy of the head weight
    (``w.float()``) sits beside them. The projection's backward runs last, on the logits' fp32 gradient alone: the
    hidden states' gradient, a trained head's weight gradient (fp32 for the fp32 copy, then cast), which from the
    second chunk on sits beside the accumulated one."""
    n, h, v = sft_positions(setup), spec.hidden_size, spec.vocab_size
    rows = min(n, trl_data().chunked_tokens)
    saved = n * h * hidden_bytes(setup)
    chunk = 4 * rows * v * FP32
    copy = v * h * FP32 if fp32_head_copy else 0
    trained = setup.lora is None
    weight_grad = v * h * grad_elem_bytes if trained and n > rows else 0
    projection = rows * v * FP32 + copy + (copy if trained else 0) + weight_grad
    return 2 * saved + max(chunk + copy, projection)
