"""bitsandbytes' kept matmul inputs outlive backward with the graph, and litgpt's loop holds that graph (issue 24).

The premise is checked on real CPU tensors (a context attribute against ``save_for_backward``, and the installed
bitsandbytes' own int8 and 4-bit Linears); the byte counts by hand from TinyLlama's and Llama-2-7B's config.json; the
effect against the publisher's own LoRA / QLoRA pairs (litgpt's config hub: same yaml, only ``quantize`` differs).
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from helpers import load_bench, published_rows, read_row

from perfguide.memory.bnb_inputs import kept_input_bytes, quantized_matmul_keeps_inputs

ROWS = published_rows()


class _KeptAsAttribute(torch.autograd.Function):
    """bitsandbytes' way up to 0.43.1 (MatMul4Bit) and still (MatMul8bitLt): ``ctx.tensors = (A, W)``."""

    @staticmethod
    def forward(ctx, a, w):  # type: ignore[no-untyped-def, override]
        ctx.tensors = (a, w)
        return a @ w.t()

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def, override]
        _, w = ctx.tensors
        return grad @ w, None


class _Saved(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, w):  # type: ignore[no-untyped-def, override]
        ctx.save_for_backward(a, w)
        return a @ w.t()

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def, override]
        _, w = ctx.saved_tensors
        return grad @ w, None


def _alive_after_backward(run, dtype: torch.dtype = torch.float32) -> tuple[bool, bool]:  # type: ignore[no-untyped-def]
    """(the layer input alive after backward while the output is referenced, alive once the output is dropped)."""
    x = torch.randn(4, 64, dtype=dtype, requires_grad=True)
    a = x * 2   # an intermediate only the matmul keeps
    ref = weakref.ref(a)
    out = run(a)
    del a
    out.float().sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0   # the backward ran through the matmul to the input
    gc.collect()
    held = ref() is not None
    del out
    gc.collect()
    return held, ref() is not None


def test_a_context_attribute_lives_with_the_graph_a_saved_tensor_does_not() -> None:
    w = torch.randn(32, 64)
    assert _alive_after_backward(lambda a: _KeptAsAttribute.apply(a, w)) == (True, False)
    assert _alive_after_backward(lambda a: _Saved.apply(a, w)) == (False, False)


def test_installed_bitsandbytes_int8_keeps_its_input_with_the_graph_4bit_no_longer_does() -> None:
    bnb = pytest.importorskip("bitsandbytes")
    int8 = bnb.nn.Linear8bitLt(64, 32, bias=False, has_fp16_weights=False, threshold=0.0)
    int8.weight = bnb.nn.Int8Params(torch.randn(32, 64, dtype=torch.float16), requires_grad=False, has_fp16_weights=False)
    int8 = int8.to("cpu")
    nf4 = bnb.nn.Linear4bit(64, 32, bias=False, compute_dtype=torch.float16, quant_type="nf4").to("cpu")
    assert _alive_after_backward(int8, torch.float16) == (True, False)
    assert _alive_after_backward(nf4, torch.float16) == (False, False)   # bitsandbytes >= 0.43.2: (None, B)


def test_kept_inputs_by_hand() -> None:
    """TinyLlama (2048 x 22, 32 x 64 query heads, FFN 5632) under litgpt's LoRA: per token and block the normed
    attention input (2 h), the attention output (2 q, q = h), the normed MLP input (2 h) and the gated product (2 i)."""
    _, spec, setup = read_row("2621")   # litgpt QLoRA, b 8 x 512
    by_hand = 8 * 512 * 22 * (2 * 2048 + 2 * 2048 + 2 * 2048 + 2 * 5632)
    assert kept_input_bytes(spec, setup, "0.42.0") == by_hand == 2_122_317_824
    assert kept_input_bytes(spec, setup, "0.43.2") == 0 and kept_input_bytes(spec, setup, None) == 0
    _, _, bf16 = read_row("2620")   # the same run without quantize
    assert kept_input_bytes(spec, bf16, "0.42.0") == 0
    int8 = setup.model_copy(update={"weights_dtype": "int8"})
    assert quantized_matmul_keeps_inputs(int8, None) and kept_input_bytes(spec, int8, None) == by_hand


def test_litgpt_loop_prices_the_previous_steps_inputs_at_a_cut_off_only() -> None:
    """At a ``max_seq_length`` cut-off consecutive steps share the length: the next forward ends with both steps'
    16-bit logits (4 B each) and the previous step's kept inputs. At one longest sample (lit-gpt 2023 runs it first)
    the next step is shorter: the chunked loss's 6 B per logit stays the peak term."""
    loss = load_bench("accuracy_loss")
    row, spec, setup = read_row("276")   # llama-2-7b/qlora.yaml: b 2 x 512, bitsandbytes 0.41 / 0.42
    logits = 2 * 512 * 32000
    kept = 2 * 512 * 32 * (6 * 4096 + 2 * 11008)
    assert loss._loss_bytes(row, spec, setup) == 4 * logits + kept > 6 * logits
    row, spec, setup = read_row("160")   # resource table, Llama 2 7B nf4: the longest sample, 1,304 tokens
    assert loss._loss_bytes(row, spec, setup) == 6 * setup.micro_batch_size * setup.seq_len * spec.vocab_size


@pytest.mark.parametrize("lora, qlora", [("309", "310"), ("2730", "2731")])
def test_quantizing_costs_what_the_publisher_measured(lora: str, qlora: str) -> None:
    """The same yaml with and without ``quantize: bnb.nf4`` (TinyLlama, b 8 x 512): the publisher's QLoRA peak is
    2.74 / 2.78 GB above its LoRA peak, although the base shrinks by 1.5 GB. perfguide's difference of the two
    rows, now with the held inputs, within 0.1 GB of the published one (it was 0.9 GB, about a third)."""
    accuracy = load_bench("accuracy")
    a, b = accuracy.evaluate(ROWS[lora], []), accuracy.evaluate(ROWS[qlora], [])
    assert abs((b.predicted - a.predicted) - (b.published - a.published)) < 0.1
