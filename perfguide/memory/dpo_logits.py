"""DPO's loss path before TRL's fused head (TRL 1.0-1.14): full ``[2b, s, V]`` logits, policy and reference.

Read in the released wheels (data/trl.json eras, ``dpo_loss`` / ``dpo_contiguous``): ``DPOTrainer._compute_loss``
runs the policy over the ``2 b`` concatenated rows and keeps its output (``outputs``, a local) to the end of the
function, then the reference under ``torch.no_grad()`` (``ref_outputs``, also kept to the end), then logs metrics
that copy the chosen rows' completion logits (``chosen_logits[chosen_mask.bool()]``, then the rejected alike).
Only the loss goes back to the Trainer, so backward starts with what autograd saved. What a logit costs:

* its dtype: a model prepared by accelerate for bf16/fp16 mixed precision returns through
  ``convert_outputs_to_fp32`` (fp32 logits, built while the head's 16-bit output is still alive); so does a
  transformers release whose model upcasts (``logits.float()`` before 4.46, memory/loss_path.py eras);
* 1.0-1.5 copy the shifted view (``.contiguous()``) for the policy and the reference, beside the output;
* ``torch`` (1.0-1.13, and 1.14 where its Triton kernel does not run: every CPU): ``selective_log_softmax``. fp32
  logits: ``gather``, then one ``logsumexp`` per row, whose ATen kernel makes a row-sized ``(x - max).exp_()``
  temporary; autograd saves the logits, and backward holds the gather's full-size gradient, every row's gradient
  (waiting for ``unbind``'s backward) and their ``stack``: four logits-sized tensors with the saved logits. The
  entropy metric (``entropy_from_logits`` on the detached shifted view, after the reference forward in 1.0-1.13,
  inside the policy's call in 1.14) reshapes it, a full copy where the view is not contiguous (1.6 on; in 1.0-1.5
  the policy's copy already is), and folds it in 128-row chunks (data/trl.json ``dpo_entropy_chunk_rows``).
  16-bit logits: one ``log_softmax`` per row, whose outputs autograd saves (a second copy); the reference's loop
  keeps two rows alive as it rebinds ``row_logps``; backward holds the gradient rows and their stack;
* ``kernel`` (1.14 on CUDA): ``trl/kernels/logprob_entropy.py`` reads the logits in place and writes four fp32
  numbers per position, saves the logits (and two of those numbers: left out, a few bytes per position); backward
  writes one ``grad_logits`` beside them, then the shift's backward pads it into a zeros tensor the size of the
  logits.

Units below are bytes per element of the ``[2b, s, V]`` logits (``s - 1`` shifted positions counted as ``s``).
"""

from __future__ import annotations

from ..model.types import ModelSpec
from ..setup import Setup
from .fused_head import DpoLoss, TrlEra, trl_data
from .loss_path import head_bytes, loss_era

FP32 = 4
KERNEL_FP32_PER_POSITION = 4   # logprobs, entropy, log_z, expected_logit (logprob_entropy.py forward)


def converts_to_fp32(setup: Setup) -> bool:
    """accelerate wraps a prepared model's forward in ``convert_outputs_to_fp32`` where it runs native AMP:
    bf16 (and fp8) mixed precision, fp16 except on a CPU; never under DeepSpeed (Accelerator.__init__)."""
    if not setup.autocast or setup.is_deepspeed:
        return False
    return not (setup.autocast == "fp16" and setup.device == "cpu")


def logit_bytes(setup: Setup, transformers_release: str | None) -> tuple[int, int]:
    """(bytes per logit TRL reads, bytes per logit of the head's 16-bit output alive while it is upcast)."""
    head = head_bytes(setup)
    model_upcasts = transformers_release is not None and loss_era(transformers_release).output_keeps == "fp32"
    if head == 2 and (converts_to_fp32(setup) or model_upcasts):
        return FP32, 2
    return head, 0


def units(kind: DpoLoss, contiguous: bool, d: int, upcast: int, rows: int, reference: bool, *,
          entropy_after_reference: bool = True, chunk_share: float = 0.0) -> tuple[float, float]:
    """(forward, backward) peak loss-path bytes per logit; ``rows`` = 2 b, ``reference``: a reference forward runs;
    ``entropy_after_reference``: 1.0-1.13 log the entropy after the reference forward, 1.14's torch fallback inside
    the policy's call; ``chunk_share``: the entropy chunk's rows over all 2 b x s positions."""
    k = d if contiguous else 0
    policy = d + k          # the output and (1.0-1.5) its shifted copy, held to the end of _compute_loss
    ref = (d + k) if reference else 0
    chosen_copy = d / 2     # metrics: the chosen rows' logits (then the rejected rows'), copied by a boolean index
    if kind == "kernel":
        forward = max(d + upcast, policy + ref + (upcast if reference else 0), policy + ref + chosen_copy)
        return forward, 2 * d
    row = d / rows
    saved = 0 if d == FP32 else d   # 16-bit logits: every row's log_softmax output, saved for backward
    # entropy_from_logits: a reshape of the shifted view (a copy unless 1.0-1.5's is contiguous), then per chunk
    # the log_softmax output, its exp and their product
    entropy = policy + saved + (ref if entropy_after_reference else 0) + (0 if contiguous else d) + 3 * d * chunk_share
    if d == FP32:
        forward = max(d + upcast, policy + row, entropy,                # one row's logsumexp temporary
                      policy + (d + upcast if reference else 0),      # the reference's output being upcast
                      policy + ref + (row if reference else 0),       # the reference's logsumexp rows
                      policy + ref + chosen_copy)
        return forward, 4 * d
    forward = max(entropy, policy + saved + ref + (2 * row if reference else 0), policy + saved + ref + chosen_copy)
    return forward, 2 * d


def path_kind(era: TrlEra, setup: Setup) -> DpoLoss:
    """The era's DPO path on this device: 1.14's Triton kernel runs on CUDA only (_supports_trl_loss_kernel)."""
    return "torch" if era.dpo_loss == "kernel" and setup.device == "cpu" else era.dpo_loss


def dpo_logits_bytes(spec: ModelSpec, setup: Setup, era: TrlEra, transformers_release: str | None,
                     reference_transient: int | None) -> int:
    """Peak loss-path bytes of a DPO micro-step of ``setup.micro_batch_size`` pairs on full logits (TRL 1.0-1.14).

    ``reference_transient``: the reference forward's own peak buffers (one layer's, its mask), alive beside the
    policy's held output before the reference has logits of its own; None where no reference forward runs."""
    d, upcast = logit_bytes(setup, transformers_release)
    rows = 2 * setup.micro_batch_size
    reference = reference_transient is not None
    kind, contiguous = path_kind(era, setup), era.dpo_contiguous
    positions = rows * setup.seq_len
    forward, backward = units(kind, contiguous, d, upcast, rows, reference, entropy_after_reference=era.dpo_loss == "torch",
                              chunk_share=min(1.0, trl_data().dpo_entropy_chunk_rows / positions))
    logits = positions * spec.logits_width
    stats = positions * KERNEL_FP32_PER_POSITION * FP32 * (1 + reference) if kind == "kernel" else 0
    held = (d + (d if contiguous else 0)) * logits
    return int(max(forward * logits + stats, backward * logits, held + (reference_transient or 0)))
