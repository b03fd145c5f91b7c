"""liger-kernel's SwiGLU and RMSNorm as CPU autograd Functions with the kernels' storage semantics, and the instance
patch Trainer's ``use_liger_kernel=True`` applies (scripts/trace_block_backward.py ``--liger`` / ``--full``).

Triton does not run on CPU. What each Function allocates and keeps is liger-kernel 0.8.5's (ops/swiglu.py,
ops/rms_norm.py): the SwiGLU forward keeps gate and up and returns a new product, its backward writes d(gate) and
d(up) into the saved gate and up buffers and returns them; the RMSNorm forward keeps its input and one fp32 rstd per
row and returns a new output, its backward (``in_place=True``, the Llama default) writes d(input) into the incoming
gradient and returns it, and a trainable weight's gradient accumulates in fp32 rows (length-free). Row-chunked
arithmetic keeps the stand-ins' own temporaries length-free, so they drop out of per-token differences.
"""

from __future__ import annotations

from typing import Any


def liger_functions() -> tuple[Any, Any]:
    """(SwiGLU, RMSNorm) autograd Functions with liger-kernel's storage semantics (see the module docstring): what
    they allocate and what they keep is the kernels'; the arithmetic runs on row chunks (fixed size, so its
    temporaries do not grow with the sequence) under autocast disabled, as a Triton kernel is."""
    import torch

    rows = 8

    def chunks(n: int) -> range:
        return range(0, n, rows)

    class SwiGLU(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, a: Any, b: Any) -> Any:
            c = torch.empty_like(a)   # swiglu_forward: c = torch.empty_like(a), written by the kernel
            a2, b2, c2 = a.view(-1, a.shape[-1]), b.view(-1, b.shape[-1]), c.view(-1, c.shape[-1])
            with torch.no_grad(), torch.autocast("cpu", enabled=False):
                for r in chunks(a2.shape[0]):
                    x = a2[r:r + rows].float()
                    c2[r:r + rows] = torch.nn.functional.silu(x) * b2[r:r + rows]
            ctx.save_for_backward(a, b)
            return c

        @staticmethod
        def backward(ctx: Any, dc: Any) -> Any:
            a, b = ctx.saved_tensors
            a2, b2, d2 = a.view(-1, a.shape[-1]), b.view(-1, b.shape[-1]), dc.reshape(-1, dc.shape[-1])
            with torch.no_grad(), torch.autocast("cpu", enabled=False):
                for r in chunks(a2.shape[0]):
                    x, y, g = a2[r:r + rows].float(), b2[r:r + rows].float(), d2[r:r + rows].float()
                    sig = torch.sigmoid(x)
                    silu = x * sig
                    a2[r:r + rows] = g * (silu * (1 - sig) + sig) * y   # _swiglu_backward_kernel: tl.store(a_ptr, da)
                    b2[r:r + rows] = g * silu                           # and tl.store(b_ptr, db)
            return a, b

    class RMSNorm(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any, weight: Any, eps: float) -> Any:
            x2 = x.view(-1, x.shape[-1])
            y = torch.empty_like(x2)                                     # Y: X's dtype
            rstd = torch.empty(x2.shape[0], dtype=torch.float32)         # RSTD: fp32 in the llama casting mode
            with torch.no_grad(), torch.autocast("cpu", enabled=False):
                for r in chunks(x2.shape[0]):
                    v = x2[r:r + rows].float()
                    rstd[r:r + rows] = torch.rsqrt(v.pow(2).mean(-1) + eps)
                    y[r:r + rows] = (v * rstd[r:r + rows, None]).to(x.dtype) * weight
            ctx.save_for_backward(x, weight, rstd)
            return y.view(x.shape)

        @staticmethod
        def backward(ctx: Any, dy: Any) -> Any:
            x, weight, rstd = ctx.saved_tensors
            x2, d2 = x.view(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
            n = x2.shape[-1]
            dw = torch.zeros(n, dtype=torch.float32) if ctx.needs_input_grad[1] else None   # _dW: fp32, length-free
            with torch.no_grad(), torch.autocast("cpu", enabled=False):
                for r in chunks(x2.shape[0]):
                    v, s = x2[r:r + rows].float(), rstd[r:r + rows, None]
                    if dw is not None:
                        dw += (d2[r:r + rows].float() * v * s).sum(0)   # before dY is overwritten with dX
                    g = d2[r:r + rows].float() * weight.float()
                    d2[r:r + rows] = s * (g - (s * s / n) * (g * v).sum(-1, keepdim=True) * v)  # dX stored into dY
            return d2.view(dy.shape), None if dw is None else dw.to(weight.dtype), None

    return SwiGLU, RMSNorm


def patch_liger(model: Any) -> None:
    """Rebind every decoder MLP's and RMSNorm's forward as liger-kernel's instance patch does (the peft wrapper's
    base model: Trainer applies it to ``model.get_base_model()``)."""
    import types

    swiglu, rmsnorm = liger_functions()

    def mlp_forward(self: Any, x: Any) -> Any:
        return self.down_proj(swiglu.apply(self.gate_proj(x), self.up_proj(x)))

    def norm_forward(self: Any, x: Any) -> Any:
        return rmsnorm.apply(x, self.weight, self.variance_epsilon)

    inner = (model.get_base_model() if hasattr(model, "get_base_model") else model).model
    for norm in [inner.norm] + [n for layer in inner.layers for n in (layer.input_layernorm, layer.post_attention_layernorm)]:
        norm.forward = types.MethodType(norm_forward, norm)
    for layer in inner.layers:
        layer.mlp.forward = types.MethodType(mlp_forward, layer.mlp)
