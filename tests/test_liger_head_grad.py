"""Liger's fused linear cross-entropy allocates the head's weight gradient in forward (``torch.zeros_like(weight)``,
liger_kernel/ops/fused_linear_cross_entropy.py) and hands it to autograd in backward. On a later accumulation
micro-step the head's ``.grad`` is already there, so the buffer lives beside it from the loss to the start of backward,
when AccumulateGrad adds it in place and frees it. Liger-Kernel's own FLCE benchmark rows hold both
(bench/results/kernels.md). The lifetime is torch's, checked here on real CPU tensors with an autograd Function that
allocates and returns what Liger's does (Triton does not run on CPU)."""

from __future__ import annotations

from typing import Any

from perfguide import Hardware, ModelSpec, Setup
from perfguide.memory import estimate_memory
from perfguide.techniques.liger_kernel import accumulating_head_grad_bytes


def _liger_like() -> Any:
    import torch

    class FusedLinearCE(torch.autograd.Function):
        """Liger's storage: grad_input and grad_weight allocated (zeros_like) and filled in forward, returned in backward."""

        @staticmethod
        def forward(ctx: Any, x: Any, w: Any, y: Any) -> Any:
            grad_w, grad_x = torch.zeros_like(w), torch.zeros_like(x)
            with torch.no_grad():
                p = torch.softmax((x @ w.t()).float(), -1)
                p[torch.arange(len(y)), y] -= 1
                g = (p / len(y)).to(x.dtype)
                grad_x.copy_(g @ w)
                grad_w.addmm_(g.t(), x)
            ctx.save_for_backward(grad_x, grad_w)
            return torch.zeros((), dtype=torch.float32)

        @staticmethod
        def backward(ctx: Any, _: Any) -> Any:
            grad_x, grad_w = ctx.saved_tensors
            return grad_x, grad_w, None

    return FusedLinearCE


def test_a_later_micro_step_holds_the_buffer_beside_grad_until_backward() -> None:
    import torch

    from perfguide.memory.tracing.tracker import make_tracker

    v, h, bt = 1024, 64, 32
    fn, tracker = _liger_like(), make_tracker(1)
    with tracker:
        w = torch.nn.Parameter(torch.randn(v, h, dtype=torch.bfloat16))
        x = torch.randn(bt, h, dtype=torch.bfloat16, requires_grad=True)
        y = torch.randint(v, (bt,))
        fn.apply(x, w, y).backward()            # first micro-step: the buffer becomes .grad
        first = tracker.total
        loss = fn.apply(x, w, y)                # second: .grad is there, a new buffer beside it
        during = tracker.total
        loss.backward()
        del loss
        after = tracker.total
    assert first == 2 * v * h * 2 + 2 * bt * h * 2 + 8 * bt   # w, w.grad, x, x.grad, labels: nothing else alive
    assert during - first == v * h * 2 + bt * h * 2 + 4        # the head-sized buffer, grad_input's, the loss scalar
    assert after == first                                      # added into .grad in place, then freed


def _setup(**kw: Any) -> Setup:
    base = dict(task="train", device="cuda", micro_batch_size=2, seq_len=1024, weights_dtype="bf16",
                optimizer="adamw_torch_fused", liger_kernel=True)
    return Setup(**{**base, **kw})


def test_the_term_is_the_head_on_later_micro_steps_of_a_whole_gradient() -> None:
    spec = ModelSpec.from_any("meta-llama/Llama-3.1-8B")
    head = 128256 * 4096 * 2
    assert accumulating_head_grad_bytes(spec, _setup(gradient_accumulation_steps=4), 2) == head
    assert accumulating_head_grad_bytes(spec, _setup(gradient_accumulation_steps=1), 2) == 0
    from perfguide.setup import LoraSpec

    assert accumulating_head_grad_bytes(spec, _setup(gradient_accumulation_steps=4, lora=LoraSpec()), 2) == 0
    fsdp = _setup(gradient_accumulation_steps=4, strategy="fsdp", num_gpus=2)
    assert accumulating_head_grad_bytes(spec, fsdp, 2) == 0


def test_estimate_adds_it_to_the_loss_path_under_accumulation_only() -> None:
    spec = ModelSpec.from_any("meta-llama/Llama-3.2-1B")   # tied head: the buffer is the embedding-sized one
    hw = Hardware.from_name("h100-80gb")
    one, four = (estimate_memory(spec, _setup(gradient_accumulation_steps=ga), hw) for ga in (1, 4))
    hf_one, hf_four = (estimate_memory(spec, _setup(gradient_accumulation_steps=ga, liger_kernel=False), hw) for ga in (1, 4))
    head = spec.vocab_size * spec.hidden_size * 2
    assert four.logits - one.logits == head
    assert hf_four.logits == hf_one.logits
