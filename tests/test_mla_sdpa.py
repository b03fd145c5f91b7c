"""SDPA kernel choice for latent attention (DeepSeek-V2/V3), whose values are narrower than its queries and keys.

CUDA's flash kernel needs q, k and v of one head dim (torch's sdp_utils ``check_head_dim_size_flash``: "Flash
attention requires q,k,v to have the same last dimension"); the memory-efficient kernel needs only q = k. MLA
hands SDPA q and k of qk_nope + qk_rope (192 in DeepSeek-V3) and v of v_head_dim (128), so it runs
memory-efficient, which keeps its logsumexp padded to 32 query rows where flash keeps one row per query.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from perfguide.memory.tracing.cuda_emulation import make_cuda_emulation  # noqa: E402


def _choose(v_dim: int) -> tuple[dict[str, int], tuple[int, ...]]:
    """Kernel counts and the logsumexp's shape of one causal bf16 SDPA call on fake tensors (b 1, 4 heads, 40 tokens,
    q/k head dim 24)."""
    import torch.nn.functional as F
    from torch._subclasses.fake_tensor import FakeTensorMode

    shapes: list[tuple[int, ...]] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        shapes.append(tuple(t.shape))
        return t

    with FakeTensorMode():
        q, k = (torch.empty(1, 4, 40, 24, dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
        v = torch.empty(1, 4, 40, v_dim, dtype=torch.bfloat16, requires_grad=True)
        emulation = make_cuda_emulation(None, emulate_sdpa=True)
        with emulation, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            F.scaled_dot_product_attention(q, k, v, is_causal=True)
    lse = [s for s in shapes if len(s) == 3]
    assert len(lse) == 1, shapes
    return dict(emulation.kernels), lse[0]


def test_equal_head_dims_run_flash_with_one_lse_row_per_query():
    kernels, lse = _choose(24)
    assert kernels.get("flash") == 1 and not kernels.get("efficient")
    assert lse == (1, 4, 40)


def test_narrower_values_run_memory_efficient_with_lse_padded_to_32_rows():
    kernels, lse = _choose(16)
    assert kernels.get("efficient") == 1 and not kernels.get("flash")
    assert lse == (1, 4, 64)          # 40 query rows rounded up to 32's multiple
