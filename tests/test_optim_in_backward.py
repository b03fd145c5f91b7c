"""Optimizer step inside backward (perfguide/integrations/optim_in_backward.py), on real CPU tensors.

References: torch's own AdamW stepping after backward (the same update, computed the usual way), gradients
counted while backward runs, and live bytes measured with the tracer's dispatch-mode accounting.
"""

from __future__ import annotations

import pytest

try:
    from helpers import make_rec, one_line, tiny_model, token_dataset
except ImportError:  # run from the repo root
    from tests.helpers import make_rec, one_line, tiny_model, token_dataset

torch = pytest.importorskip("torch")

from perfguide.errors import ConflictingConstraintsError  # noqa: E402
from perfguide.integrations.optim_in_backward import attach, check_compatible  # noqa: E402
from perfguide.memory import estimate_memory  # noqa: E402
from perfguide.setup import Setup  # noqa: E402

VOCAB = 1024   # a head much larger than any block Linear, as in real LMs


def _batch(seed: int = 0) -> object:
    return torch.randint(0, VOCAB, (4, 16), generator=torch.Generator().manual_seed(seed))


def _adamw(groups: object) -> object:
    return torch.optim.AdamW(groups, lr=1e-2, foreach=False)


def test_same_update_as_stepping_after_backward():
    ref, inb = tiny_model(vocab_size=VOCAB), tiny_model(vocab_size=VOCAB)
    ref_opt = torch.optim.AdamW([{"params": [p], "weight_decay": 0.1 if p.ndim >= 2 else 0.0} for p in ref.parameters()], lr=1e-2, foreach=False)
    opt = attach(inb, _adamw, weight_decay=0.1)
    for step in range(3):
        batch = _batch(step)
        ref(input_ids=batch, labels=batch).loss.backward()
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
        inb(input_ids=batch, labels=batch).loss.backward()
        opt.step()   # nothing left to do: the loop's call is harmless
    for a, b in zip(ref.parameters(), inb.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert all(p.grad is None for p in inb.parameters())


def _live_grad_peak(model: object, in_backward: bool) -> tuple[int, list[int]]:
    """Most gradient bytes alive at once during backward, counted at every parameter's post-accumulate hook."""
    params = list(model.parameters())
    peak = [0]

    def count(_: object) -> None:
        peak[0] = max(peak[0], sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None))

    for p in params:
        p.register_post_accumulate_grad_hook(count)   # registered first: runs before the step hook frees the grad
    opt = attach(model, _adamw) if in_backward else torch.optim.AdamW(model.parameters(), lr=1e-2)
    batch = _batch()
    model(input_ids=batch, labels=batch).loss.backward()
    opt.step()
    return peak[0], [p.numel() * p.element_size() for p in params]


def test_gradients_are_never_all_held():
    without, sizes = _live_grad_peak(tiny_model(vocab_size=VOCAB), in_backward=False)
    with_hooks, _ = _live_grad_peak(tiny_model(vocab_size=VOCAB), in_backward=True)
    assert without == sum(sizes)
    assert with_hooks == max(sizes)


#: a tiny Llama whose parameters outweigh its activations (as in LLM fine-tuning at small micro-batches)
WIDE = dict(hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2)


def _measured_peak(in_backward: bool) -> tuple[int, object]:
    """Peak live bytes of two real CPU steps, every tensor counted from its birth (model, states, grads,
    activations) by the tracer's dispatch-mode accounting, which is what the CUDA allocator would report."""
    from perfguide.memory.tracing.tracker import make_tracker

    tracker = make_tracker(1)
    with tracker:
        model = tiny_model(**WIDE)
        opt = attach(model, _adamw) if in_backward else torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
        batch = torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(0))
        for _ in range(2):
            tracker.set_phase("forward")
            loss = model(input_ids=batch, labels=batch).loss
            tracker.set_phase("backward")
            loss.backward()
            tracker.set_phase("optimizer")
            opt.step()
            opt.zero_grad(set_to_none=True)
            del loss
    return max(p for p, _ in tracker.peaks.values()), model


def test_measured_peak_and_its_drop_match_the_model():
    from perfguide.model.types import ModelSpec

    plain_bytes, model = _measured_peak(False)
    inb_bytes, _ = _measured_peak(True)
    spec = ModelSpec.from_any(model)
    setup = dict(device="cpu", seq_len=8, micro_batch_size=1, optimizer="adamw_torch_fused")
    plain, inb = estimate_memory(spec, Setup(**setup)), estimate_memory(spec, Setup(**setup, optimizer_in_backward=True))
    assert inb.gradients == max(p.numel() * 4 for p in model.parameters())
    for predicted, measured in ((plain.peak_allocated, plain_bytes), (inb.peak_allocated, inb_bytes)):
        assert abs(predicted / measured - 1) < 0.10, (predicted, measured)
    saved, predicted_saving = plain_bytes - inb_bytes, plain.peak_allocated - inb.peak_allocated
    assert saved > 0.15 * plain_bytes                 # a real drop, not noise
    assert abs(predicted_saving / saved - 1) < 0.15, (predicted_saving, saved)


@pytest.mark.parametrize(("ga", "clip"), [(2, 0.0), (1, 1.0)])
def test_accumulation_and_global_clipping_are_refused(ga, clip):
    with pytest.raises(ConflictingConstraintsError) as exc:
        check_compatible(ga, clip)
    one_line(exc, "optimizer_in_backward")


def test_setup_refuses_accumulation_sharding_and_fp16():
    from perfguide.errors import InvalidSetupError

    for bad in ({"gradient_accumulation_steps": 4}, {"strategy": "ddp", "num_gpus": 2}, {"autocast": "fp16"}):
        with pytest.raises(InvalidSetupError) as exc:
            Setup.parse({"optimizer_in_backward": True, **bad})
        one_line(exc, "optimizer_in_backward")


def _trainer_run(tmp_path: object, optim: str, **args: object) -> tuple[object, object, object]:
    from transformers import Trainer

    rec = make_rec({"device": "cpu", "seq_len": 16, "micro_batch_size": 4, "optimizer": optim, "optimizer_in_backward": True})
    targs = rec.training_args(output_dir=str(tmp_path), max_steps=3, report_to=[], save_strategy="no", learning_rate=1e-3,
                              lr_scheduler_type="linear", warmup_steps=0, **args)
    assert targs.max_grad_norm == 0.0 and targs.gradient_accumulation_steps == 1
    model = rec.prepare_model(tiny_model())
    before = [p.detach().clone() for p in model.parameters()]
    trainer = Trainer(model=model, args=targs, train_dataset=token_dataset(12), optimizers=rec.optimizers(model, targs))
    trainer.train()
    return trainer, before, model


@pytest.mark.slow
@pytest.mark.parametrize("optim", ["adamw_torch", "paged_adamw_8bit", "adamw_torch_8bit"])
def test_plan_trains_in_a_real_trainer_and_the_scheduler_reaches_the_hooks(tmp_path, optim):
    trainer, before, model = _trainer_run(tmp_path, optim)
    moved = [not torch.equal(b, p.detach()) for b, p in zip(before, model.parameters())]
    assert all(moved)
    inner = next(iter(trainer.optimizer.optimizer.optimizers.values()))   # accelerate wraps the optimizer once
    # linear decay to 0 over 3 steps: the per-parameter optimizer sees the scheduler's lr, not the initial 1e-3
    assert inner.param_groups[0]["lr"] == pytest.approx(trainer.lr_scheduler.get_last_lr()[0])
    assert inner.param_groups[0]["lr"] < 1e-3


@pytest.mark.slow
def test_trainer_with_clipping_is_refused(tmp_path):
    from transformers import TrainingArguments

    rec = make_rec({"device": "cpu", "seq_len": 16, "micro_batch_size": 4, "optimizer_in_backward": True})
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, max_grad_norm=1.0, report_to=[])
    with pytest.raises(ConflictingConstraintsError) as exc:
        rec.optimizers(tiny_model(), args)
    one_line(exc, "max_grad_norm")
