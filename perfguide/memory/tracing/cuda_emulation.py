"""What a CUDA step does differently from the CPU ops we trace, modelled at the torch-function level.

* **Autocast.** ``torch.autocast('cuda')`` casts by op lists that differ from the CPU lists (on CUDA, softmax,
  layer_norm, pow, sum... run in fp32; matmuls, linear and SDPA in the low dtype), and it caches the low-precision
  copy of every weight until the autocast region ends. We apply the CUDA lists (torch AMP docs, "CUDA Ops that
  can autocast to float16 / float32 / widest type") to the fake CPU tensors, which CPU autocast would get wrong.
* **SDPA kernel.** On a GPU ``scaled_dot_product_attention`` picks flash (fp16/bf16, no mask) or memory-efficient
  attention, which keep O(s) per head, while the CPU path we would otherwise trace materialises b*h*s*s scores.
  We call the same fused aten ops explicitly; their fake kernels give the real output and logsumexp shapes.
* **Dropout.** CUDA runs the fused ``native_dropout`` kernel (1-byte bool mask kept for backward), the CPU
  the unfused one (a mask in the input's dtype); we call the fused op explicitly.
* **Scalars.** ``.item()`` on a fake tensor has no value; optimizers that branch on a norm get 1, which never
  changes which tensors are allocated.
"""

from __future__ import annotations

from typing import Any

_LOW = (
    "linear", "matmul", "mm", "bmm", "baddbmm", "addmm", "addbmm", "addmv", "addr", "mv", "chain_matmul",
    "multi_dot", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
    "prelu", "__matmul__", "__rmatmul__", "einsum",
)
_FP32 = (
    "__pow__", "__rpow__", "__rtruediv__", "__rdiv__", "pow", "acos", "asin", "cosh", "sinh", "tan", "erfinv",
    "exp", "expm1", "log", "log10", "log1p", "log2", "reciprocal", "rsqrt", "softplus", "softmax", "log_softmax",
    "softmin", "layer_norm", "group_norm", "norm", "normalize", "cumsum", "cumprod", "sum", "prod", "dist",
    "cdist", "pdist", "renorm", "cosine_similarity", "cross_entropy", "nll_loss", "binary_cross_entropy_with_logits",
    "kl_div", "l1_loss", "mse_loss", "smooth_l1_loss", "huber_loss", "logsumexp", "poisson_nll_loss",
    "cosine_embedding_loss", "hinge_embedding_loss", "margin_ranking_loss", "multilabel_margin_loss",
    "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss",
)
_WIDEST = ("addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "grid_sample", "index_put", "scatter_add", "tensordot")


def _name(func: Any) -> str:
    return getattr(func, "__name__", "") or ""


def make_cuda_emulation(autocast_dtype: Any | None, emulate_sdpa: bool) -> Any:
    """A TorchFunctionMode applying CUDA autocast lists and CUDA SDPA kernel choice to fake CPU tensors.

    ``autocast_dtype`` is a torch dtype or None. ``mode.casting`` switches autocast on and off (the Trainer wraps
    only the forward in autocast; checkpoint recomputation in backward re-enters it), ``mode.end_region()``
    drops the weight-cast cache the way leaving ``torch.autocast`` does. ``mode.kernels`` counts SDPA choices.
    """
    import torch
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode
    from torch.utils._pytree import tree_map

    low, fp32, widest = set(_LOW), set(_FP32), set(_WIDEST)

    class CudaEmulation(TorchFunctionMode):
        def __init__(self) -> None:
            super().__init__()
            self.casting = autocast_dtype is not None
            self.cache: dict[int, Any] = {}
            self.cache_enabled = True
            self.kernels = {"flash": 0, "efficient": 0, "math": 0}

        def backward(self, loss: Any) -> None:
            """``loss.backward()`` with this mode still active: checkpointing recomputes the forward in there.

            ``Tensor.backward`` would enter ``__torch_function__``, which runs with the mode popped, so we call
            the engine the way ``torch.autograd.backward`` does.
            """
            from torch.autograd.graph import _engine_run_backward

            grad = torch.ones_like(loss)
            _engine_run_backward((loss,), (grad,), False, False, (), allow_unreachable=True, accumulate_grad=True)

        def end_region(self) -> None:
            self.cache.clear()
            self.cache_enabled = False

        def _cast(self, x: Any, dtype: Any) -> Any:
            if not (isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != dtype and x.dtype != torch.float64):
                return x
            # torch caches only fp32 leaf weights cast down (autocast_mode.cpp, cached_cast)
            cacheable = self.cache_enabled and dtype == autocast_dtype and x.dtype == torch.float32 and x.is_leaf and x.requires_grad
            if cacheable and id(x) in self.cache:
                return self.cache[id(x)][1]
            y = x.to(dtype)
            if cacheable:
                self.cache[id(x)] = (x, y)
            return y

        def _autocast(self, name: str, args: Any, kwargs: Any) -> tuple[Any, Any]:
            if name in low:
                dtype = autocast_dtype
            elif name in fp32:
                dtype = torch.float32
            elif name in widest:
                floats = [t.dtype for t in _tensors(args, kwargs) if t.is_floating_point()]
                dtype = torch.float32 if torch.float32 in floats else None
                if dtype is None:
                    return args, kwargs
            else:
                return args, kwargs
            return tree_map(lambda v: self._cast(v, dtype), args), tree_map(lambda v: self._cast(v, dtype), kwargs)

        def _sdpa(self, q: Any, k: Any, v: Any, attn_mask: Any = None, dropout_p: float = 0.0, is_causal: bool = False,
                  scale: float | None = None, enable_gqa: bool = False) -> Any:
            head_dim = q.shape[-1]
            # flash needs one head dim for q, k and v (sdp_utils_cpp.h check_head_dim_size_flash): MLA's values
            # (DeepSeek-V2/V3: v_head_dim 128 beside qk 192) take the memory-efficient kernel, which only needs q = k
            flash = (attn_mask is None and q.dtype in (torch.float16, torch.bfloat16) and head_dim <= 256
                     and head_dim % 8 == 0 and k.shape[-1] == v.shape[-1] == head_dim)
            if k.shape[-3] != q.shape[-3] and not enable_gqa:
                # heads broadcast, not grouped (Falcon-7B's and GPT-BigCode's one K/V head handed over as is): every
                # fused CUDA kernel needs q, k and v with the same head count (sdp_utils_cpp.h
                # check_batch_size_and_num_heads_dense), so torch runs the math path, which keeps the s x s scores
                self.kernels["math"] += 1
                return torch.ops.aten._scaled_dot_product_attention_math(q, k, v, attn_mask, dropout_p, is_causal, scale=scale)[0]
            if k.shape[-3] != q.shape[-3] and not flash:
                # only the flash kernel reads grouped K/V natively; other paths see them expanded
                rep = q.shape[-3] // k.shape[-3]
                k, v = k.repeat_interleave(rep, dim=-3), v.repeat_interleave(rep, dim=-3)
            if flash:
                self.kernels["flash"] += 1
                return torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, dropout_p, is_causal, False, scale=scale)[0]
            if head_dim % 8 == 0 or q.dtype == torch.float32:
                self.kernels["efficient"] += 1
                if attn_mask is not None:
                    if attn_mask.dtype == torch.bool:
                        attn_mask = torch.zeros(attn_mask.shape, dtype=q.dtype).masked_fill_(~attn_mask, float("-inf"))
                    attn_mask = attn_mask.to(q.dtype).expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
                return torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, attn_mask, True, dropout_p, is_causal, scale=scale)[0]
            self.kernels["math"] += 1
            return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale)

        def _dropout(self, x: Any, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
            """CUDA's fused dropout: ``at::dropout`` takes ``native_dropout`` for CUDA inputs (ATen Dropout.cpp,
            ``is_fused_kernel_acceptable``), which saves a 1-byte bool mask for backward; the CPU path we would
            trace instead multiplies by a saved noise tensor of the input's dtype (2-4x the bytes)."""
            if not training or p <= 0.0 or inplace:
                return F.dropout(x, p, training, inplace)
            if p >= 1.0:
                return x * 0.0
            return torch.ops.aten.native_dropout(x, p, True)[0]

        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            name = _name(func)
            if name == "scaled_dot_product_attention" and emulate_sdpa:
                if self.casting:
                    args, kwargs = tree_map(lambda v: self._cast(v, autocast_dtype), (args, kwargs))
                return self._sdpa(*args, **kwargs)
            if name == "dropout" and emulate_sdpa:
                return self._dropout(*args, **kwargs)
            if self.casting:
                args, kwargs = self._autocast(name, args, kwargs)
            return func(*args, **kwargs)

    def _tensors(args: Any, kwargs: Any) -> list[Any]:
        from torch.utils._pytree import tree_flatten

        return [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]

    return CudaEmulation()


def make_scalar_fallback(bool_answer: bool = True) -> Any:
    """A dispatch mode answering ``.item()`` on fake tensors with 1 (1.0, ``bool_answer``), where the value is
    unknowable; a caller whose code branches on an overflow check passes False (no overflow)."""
    import torch
    from torch._subclasses.fake_tensor import DataDependentOutputException
    from torch.utils._python_dispatch import TorchDispatchMode

    class ScalarFallback(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if func is torch.ops.aten._local_scalar_dense.default:
                try:
                    return func(*args, **(kwargs or {}))
                except DataDependentOutputException:
                    t = args[0]
                    return bool_answer if t.dtype == torch.bool else (1.0 if t.is_floating_point() else 1)
            return func(*args, **(kwargs or {}))

    return ScalarFallback()
