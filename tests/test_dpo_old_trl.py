"""objective='dpo' under TRL 1.0-1.14: DPOTrainer's full-logits loss path, by release and device.

Hand counts follow what the TRL wheels do (1.0.0, 1.6.0, 1.7.0, 1.13.0, 1.14.2 trl/trainer/dpo_trainer.py
DPOTrainer._compute_loss; trainer/utils.py selective_log_softmax; 1.14 trl/kernels/logprob_entropy.py) and what
accelerate's convert_outputs_to_fp32 builds; the traces replay those tensor ops on real CPU tensors under perfguide's
live-bytes tracker, with the real installed TRL selective_log_softmax / entropy_from_logits (the torch path, unchanged
since 1.7 but for the Triton gate) and accelerate's convert_outputs_to_fp32. Never perfguide's own output.
"""

from __future__ import annotations

import pytest

try:  # tests/ as a plain folder or as a package
    from helpers import TINY_LLAMA, load_bench, tiny_spec
except ImportError:  # pragma: no cover
    from tests.helpers import TINY_LLAMA, load_bench, tiny_spec

import perfguide
from perfguide import Setup
from perfguide.memory import dpo_logits, fused_head

V = 4096   # the tiny Llama with a vocabulary wide enough that the logits, not one layer's buffers, set the peak
GPU = "h100-80gb"


@pytest.mark.parametrize("release, kind, contiguous", [
    ("0.19.1", "unpriced", False),                       # concatenated_forward: not priced
    ("1.0.0", "torch", True), ("1.5.1", "torch", True),   # shift_logits = outputs.logits[..., :-1, :].contiguous()
    ("1.6.0", "torch", False), ("1.13.0", "torch", False),   # the view, selective_log_softmax's torch ops
    ("1.14.0", "kernel", False), ("1.14.2", "kernel", False),   # trl/kernels/logprob_entropy.py on CUDA
    ("1.15.0", "fused", False), (None, "fused", False),
])
def test_dpo_era_by_trl_release(release, kind, contiguous):
    era = fused_head.trl_era(release)
    assert (era.dpo_loss, era.dpo_contiguous) == (kind, contiguous)


def _priced(release: str, monkeypatch, **fields) -> int:
    monkeypatch.setattr(fused_head, "installed_trl", lambda: release)
    setup = Setup(objective="dpo", micro_batch_size=1, seq_len=16, **fields)
    spec = tiny_spec(vocab_size=V)
    assert spec.logits_width == V and spec.hidden_size == TINY_LLAMA["hidden_size"]
    return perfguide.estimate(spec, setup, hardware=GPU).logits


# bf16 weights trained with bf16=True: accelerate returns fp32 logits (4 B) built from the head's bf16 output (2 B).
# Per element of the [2b, s, V] = [2, 16, 4096] logits (131,072 elements):
#   1.14 kernel on CUDA: policy fp32 (4) + the reference's bf16 output (2) and its fp32 copy (4) = 10;
#       backward: the saved logits + grad_logits (4 + 4) = 8
#   1.6-1.13 torch: the entropy metric after the reference forward: policy 4 + reference 4 + the reshape's copy of
#       the shifted view 4 + one 128-row chunk (here all 32 positions) of log_softmax, exp and product 3 x 4 = 24;
#       backward: saved logits, gather's gradient, the row gradients and their stack 4 x 4 = 16
#   1.0-1.5: the policy's and the reference's .contiguous() copies (4 + 4 each), no reshape copy, the chunk 12 = 28
@pytest.mark.parametrize("release, per_logit", [("1.14.2", 10), ("1.13.0", 24), ("1.7.0", 24), ("1.2.0", 28)])
def test_full_logits_loss_path_counted_by_hand(monkeypatch, release, per_logit):
    elements = 2 * 16 * V
    stats = 2 * 16 * 4 * 4 * 2 if release == "1.14.2" else 0   # the kernel's 4 fp32 per position, policy + reference
    priced = _priced(release, monkeypatch, weights_dtype="bf16", autocast="bf16")
    assert priced == per_logit * elements + stats


def test_without_mixed_precision_the_logits_stay_16_bit(monkeypatch):
    """Pure bf16 (bf16=False: perfguide's plans write it out): no convert_outputs_to_fp32. 1.13's torch path on bf16
    logits, at the entropy metric: policy 2 + its saved log_softmax rows 2 + the reference's 2 + the reshape copy 2
    + the chunk's three 2-byte tensors 6 = 14 per logit; the kernel: policy 2 + reference 2 + the chosen rows' copy 1
    = 5."""
    elements = 2 * 16 * V
    assert _priced("1.13.0", monkeypatch, weights_dtype="bf16") == 14 * elements
    assert _priced("1.14.2", monkeypatch, weights_dtype="bf16") == 5 * elements + 2 * 16 * 4 * 4 * 2


def test_precomputed_reference_and_cpu(monkeypatch):
    """No reference forward: the policy's peak alone, the kernel's backward (saved fp32 logits + grad_logits, 4 + 4;
    forward: 4 + the chosen rows' copy 2); on a CPU 1.14 runs the torch ops."""
    elements = 2 * 16 * V
    assert _priced("1.14.2", monkeypatch, weights_dtype="bf16", autocast="bf16", precompute_ref_log_probs=True) == 8 * elements
    cpu = Setup(objective="dpo", device="cpu", weights_dtype="fp32", micro_batch_size=1, seq_len=16)
    assert dpo_logits.path_kind(fused_head.trl_era("1.14.2"), cpu) == "torch"


# --- traces: the old code's tensor ops on real CPU tensors ------------------------------------------------------------

def _kernel_replay():
    """trl 1.14's _LogProbEntropyFunction with its Triton launches replaced by small torch chunks: the same
    allocations (four fp32 outputs per position, the logits saved, one empty_like gradient), checked against the
    installed kernel's source."""
    import importlib.util
    from pathlib import Path

    import torch

    spec = importlib.util.find_spec("trl")   # the kernel module imports Triton, absent on a CPU box: read its text
    assert spec is not None and spec.submodule_search_locations
    src = (Path(next(iter(spec.submodule_search_locations))) / "kernels" / "logprob_entropy.py").read_text()
    assert "ctx.save_for_backward(logits, index, log_z, expected_logit, row_mask)" in src
    assert "grad_logits = torch.empty_like(logits, memory_format=torch.contiguous_format)" in src

    class Replay(torch.autograd.Function):
        @staticmethod
        def forward(ctx, logits, index):   # type: ignore[override]
            logprobs = torch.empty(logits.shape[:-1], dtype=torch.float32)
            entropy, log_z, expected = (torch.empty_like(logprobs) for _ in range(3))
            for r in range(logits.shape[0]):
                for p in range(0, logits.shape[1], 64):
                    x = logits[r, p:p + 64].float()
                    lz = torch.logsumexp(x, -1)
                    log_z[r, p:p + 64] = lz
                    logprobs[r, p:p + 64] = x.gather(-1, index[r, p:p + 64, None])[:, 0] - lz
                    entropy[r, p:p + 64] = lz - (x.softmax(-1) * x).sum(-1)
                    expected[r, p:p + 64] = (x.softmax(-1) * x).sum(-1)
            ctx.save_for_backward(logits, index, log_z, expected)
            return logprobs, entropy

        @staticmethod
        def backward(ctx, grad_logprobs, grad_entropy):   # type: ignore[override]
            logits, index, log_z, _ = ctx.saved_tensors
            grad = torch.empty_like(logits, memory_format=torch.contiguous_format)
            for r in range(logits.shape[0]):
                for p in range(0, logits.shape[1], 64):
                    x = logits[r, p:p + 64].float()
                    g = -(x - log_z[r, p:p + 64, None]).exp() * grad_logprobs[r, p:p + 64, None]
                    g.scatter_add_(-1, index[r, p:p + 64, None], grad_logprobs[r, p:p + 64, None])
                    grad[r, p:p + 64] = g.to(grad.dtype)
            return grad, None

    return Replay


def _trace(kind: str, contiguous: bool, rows: int, s: int, v: int, dtype: str, convert: bool) -> float:
    """Peak live bytes per element of the [rows, s, v] logits over one replayed DPO micro-step's loss path."""
    import torch
    import torch.nn.functional as F
    from accelerate.utils import convert_outputs_to_fp32
    from trl.trainer.utils import entropy_from_logits, selective_log_softmax

    from perfguide.memory.tracing.tracker import make_tracker

    dt = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(rows, s, 8, generator=g, dtype=dt, requires_grad=True)
    weight = torch.randn(v, 8, generator=g, dtype=dt, requires_grad=True)
    ref_weight = weight.detach().clone()
    ids = torch.randint(0, v, (rows, s), generator=g)
    mask = torch.ones(rows, s, dtype=torch.long)

    def head(w):
        def forward(h):
            return {"logits": h @ w.t()}
        return convert_outputs_to_fp32(forward) if convert else forward

    kernel = _kernel_replay() if kind == "kernel" else None

    def logps(shift, labels):
        return kernel.apply(shift, labels)[0] if kernel is not None else selective_log_softmax(shift, labels)

    tracker = make_tracker(1)
    with tracker:
        outputs = head(weight)(hidden)                                  # model(**model_kwargs)
        shift = outputs["logits"][..., :-1, :]
        shift = shift.contiguous() if contiguous else shift
        labels = ids[..., 1:]
        policy = logps(shift, labels).sum(1)
        with torch.no_grad():
            ref_outputs = head(ref_weight)(hidden.detach())             # the frozen reference
            ref_shift = ref_outputs["logits"][..., :-1, :]
            ref_shift = ref_shift.contiguous() if contiguous else ref_shift
            reference = logps(ref_shift, labels).sum(1)
        ratios = (policy - reference).view(2, -1)
        loss = -F.logsigmoid(ratios[0] - ratios[1]).mean()
        if kernel is None:   # 1.0-1.13: the entropy metric, logged after the loss (the kernel returns its own)
            entropy_from_logits(shift.detach())
        chosen, rejected = shift.detach().chunk(2, dim=0)               # metrics: logits/chosen, logits/rejected
        chosen_mask, rejected_mask = mask[..., 1:].chunk(2, dim=0)
        chosen[chosen_mask.bool()].mean(-1).sum()
        rejected[rejected_mask.bool()].mean(-1).sum()
        chosen.argmax(dim=-1)
        del outputs, shift, ref_outputs, ref_shift, chosen, rejected   # _compute_loss returns only the loss
        tracker.set_phase("backward")
        loss.backward()
    return max(peak for peak, _ in tracker.peaks.values()) / (rows * s * v)


@pytest.mark.parametrize("kind, contiguous, rows, dtype, convert", [
    ("torch", False, 2, "bf16", True), ("torch", False, 4, "bf16", True),   # 1.6-1.13 (and 1.14 on CPU), bf16=True
    ("torch", True, 2, "bf16", True),                                       # 1.0-1.5
    ("torch", False, 2, "fp32", False),                                     # fp32 weights, no mixed precision
    ("torch", False, 2, "bf16", False), ("torch", False, 4, "bf16", False),   # pure bf16: 16-bit log_softmax rows
    ("kernel", False, 2, "bf16", True), ("kernel", False, 2, "bf16", False),   # 1.14 on CUDA
])
def test_loss_path_per_logit_against_a_trace(kind, contiguous, rows, dtype, convert):
    """The priced bytes per logit against the replayed step's live-bytes peak (the head's and hidden states' own
    gradients are a fraction of a percent here). The tracker does not see temporaries inside one ATen kernel
    (logsumexp's row-sized exp), but those never set these peaks: the metrics' chosen-rows copy is larger.
    scripts/trace_dpo_old_trl.py runs the released DPOTrainer's own training_step the same way."""
    pytest.importorskip("trl")
    s, v = 1025, 2048
    traced = _trace(kind, contiguous, rows, s, v, dtype, convert)
    d, upcast = (4, 2) if convert else ({"bf16": 2, "fp32": 4}[dtype], 0)
    chunk = fused_head.trl_data().dpo_entropy_chunk_rows / (rows * s)
    forward, backward = dpo_logits.units(kind, contiguous, d, upcast, rows, reference=True, chunk_share=chunk)   # type: ignore[arg-type]
    assert abs(max(forward, backward) - traced) / traced < 0.03, (forward, backward, traced)


def test_bench_reads_bf16_true_as_accelerates_mixed_precision():
    """A DPO row trained with bf16=True on bf16 weights: accelerate's native AMP wraps the forward (its fp32 logits
    are what DPOTrainer reads), so the row is priced with autocast='bf16' on its bf16 weights."""
    acc_trl = load_bench("accuracy_trl")
    row = {"method": "full fine-tuning, TRL DPOTrainer (trl==1.14.2)", "precision": "bf16 (bf16 weights, bf16=True)"}
    assert acc_trl.trl_fields(row) == {"objective": "dpo", "trainer": "trl", "autocast": "bf16"}
    assert acc_trl.trl_fields(dict(row, precision="bf16")) == {"objective": "dpo", "trainer": "trl"}
