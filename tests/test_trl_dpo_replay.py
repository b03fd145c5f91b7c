"""scripts/trace_trl_dpo_replay.py: TRL's DPO step on gemma-3-1b's shape as allocation events on fake tensors, run
with the release's own DPOTrainer.compute_loss (each wheel fetched from PyPI with ``pip download``, unpacked, and
imported ahead of the installed trl in a fresh interpreter). Checked against storages counted by hand from the
releases' lines:

1.14.2 (full logits; [2, s, V] with V = 262,144, one pair): dpo_trainer.py 1366 the policy's forward: the head's bf16
output (2 B per logit), accelerate's fp32 copy of it (4 B), the bf16 dropped; 1428 the reference's alike under
no_grad (its fp32 held to the end of _compute_loss); 1665 / 1667 the metrics copy the chosen, then the rejected row's
logits by a boolean index (fp32, one row each); backward: the kernel's grad_logits (logprob_entropy.py 210, fp32 of
the shifted shape), the shift's slice_backward (fp32, full), the upcast's backward (bf16). Most alive at once: 10 B per
logit in the forward (the policy's fp32, the reference's bf16 and fp32), 8 in backward.

1.15.0 (fused head): no logits-sized storage; the s x s storages are the sliding bool mask per forward (policy: kept
for the recompute; reference) and one bf16 bias per sliding block (forward, recompute, reference); most alive at once
the policy's kept mask, the reference's and one bias: 4 B per row x s^2. Padded pairs add the full layer's mask.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import pypi_release

ROOT = Path(__file__).resolve().parents[1]
V = 262144
pytestmark = pytest.mark.slow

TRACE = """
import json, sys
sys.path.insert(0, sys.argv[1])
import trace_trl_dpo_replay as d
import trace_trl_gemma_replay as t
seq, layers, padded, least = json.loads(sys.argv[2])
version = d.release()
events = d.events_of_run(seq, version, steps=1, layers=layers, padded=padded)
sizes, out = {}, []
for kind, k, nbytes in events:
    if kind == "a":
        sizes[k] = nbytes
    nbytes = sizes[k] if kind == "a" else sizes.pop(k)
    if nbytes >= least:
        op, shape, dtype, phase = t.OPS[k]
        out.append([kind, k, nbytes, op, list(shape), dtype, phase])
print(json.dumps({"trl": version, "events": out}))
"""


@pytest.fixture(scope="module")
def releases(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """trl ``version`` unpacked once per module (its wheel from PyPI, no dependencies)."""
    unpacked: dict[str, Path] = {}

    def get(version: str) -> Path:
        if version not in unpacked:
            unpacked[version] = _release(version, tmp_path_factory.mktemp(f"trl-{version}"))
        return unpacked[version]

    return get


def _release(version: str, tmp: Path) -> Path:
    return pypi_release("trl", version, tmp)


def _traced(release: Path, version: str, seq: int, layers: int, padded: bool, least: int) -> list[list[Any]]:
    """The step's allocations and frees of storages of ``least`` bytes or more: [kind, id, bytes, op, shape, dtype, phase]."""
    env = {**os.environ, "PYTHONPATH": str(release), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", TRACE, str(ROOT / "scripts"), json.dumps([seq, layers, padded, least])],
                         capture_output=True, text=True, env=env, timeout=900, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["trl"] == version
    events: list[list[Any]] = result["events"]
    return events


def _most_alive(events: list[list[Any]], phase: str) -> int:
    """The most bytes of the step's listed storages alive at once in ``phase`` (the weights left out); a free is
    listed with the phase its storage was made in, so the phase is the latest allocation's."""
    live = most = 0
    now = ""
    for kind, _, nbytes, *_rest, at in events:
        if at == "weights":
            continue
        live += nbytes if kind == "a" else -nbytes
        now = at if kind == "a" else now
        if now.endswith(phase):
            most = max(most, live)
    return most


def test_full_logits_step_of_trl_1_14_2(releases: Callable[[str], Path]) -> None:
    s = 1024
    logits = 2 * s * V                     # elements of the pair's [2, s, V] logits
    row = (s - 1) * V                      # one row's shifted logits (every position read as a completion token)
    events = _traced(releases("1.14.2"), "1.14.2", s, 2, False, logits // 4)
    # (kind, bytes, dtype, the phase the storage was made in)
    step = [(kind, nbytes, dtype, phase.split()[-1]) for kind, _, nbytes, _, _, dtype, phase in events if phase != "weights"]
    assert step[:13] == [
        ("a", 2 * logits, "bfloat16", "forward"), ("a", 4 * logits, "float32", "forward"),    # policy head, upcast
        ("f", 2 * logits, "bfloat16", "forward"),
        ("a", 2 * logits, "bfloat16", "forward"), ("a", 4 * logits, "float32", "forward"),    # the reference's
        ("f", 2 * logits, "bfloat16", "forward"),
        ("a", 4 * row, "float32", "forward"), ("f", 4 * row, "float32", "forward"),           # chosen metric copy
        ("a", 4 * row, "float32", "forward"), ("f", 4 * row, "float32", "forward"),           # rejected
        ("f", 4 * logits, "float32", "forward"),                       # the reference's fp32, when _compute_loss returns
        ("a", 4 * 2 * row, "float32", "backward"),                     # the kernel's grad_logits (the shifted shape)
        ("f", 4 * logits, "float32", "forward"),                       # the saved logits, once the kernel's node ran
    ]
    ops = [(kind, op, dtype) for kind, _, _, op, _, dtype, phase in events if phase != "weights"][13:16]
    assert ops == [("a", "aten.slice_backward.default", "float32"), ("f", "aten.empty_like.default", "float32"),
                   ("a", "aten._to_copy.default", "bfloat16")]      # the shift's backward, then the upcast's
    # 10 B per logit alive at once in the forward (policy fp32, reference bf16 + fp32), 8 in backward
    assert _most_alive(events, "forward") == 10 * logits
    assert _most_alive(events, "backward") == 4 * logits + 4 * 2 * row


@pytest.mark.parametrize("padded, masks, biases, most", [
    # unpadded: the sliding mask per forward (the policy's, kept for the recompute; the reference's), a bias per
    # sliding block (5) in the policy's forward, the reference's and the recompute; most alive in the reference's
    # forward: the policy's kept mask (1 B per row), the reference's own (1) and one bias (2)
    (False, 2, 3 * 5, 4),
    # padded: the full layer's mask too in both forwards, and a bias at every block; the policy's two kept masks, the
    # reference's two and one bias
    (True, 4, 3 * 6, 6),
])
def test_fused_head_step_of_trl_1_15_0(releases: Callable[[str], Path], padded: bool, masks: int, biases: int,
                                       most: int) -> None:
    s = 16384
    events = _traced(releases("1.15.0"), "1.15.0", s, 6, padded, s * s)   # 1 B per s^2 or more
    step = [e for e in events if e[6] != "weights"]
    assert max(nbytes for _, _, nbytes, *_ in step) < s * V          # nothing logits-sized: the head runs in tiles
    square = [e for e in step if e[4][-2:] == [s, s]]
    pair = sorted((dtype, phase.split()[-1]) for kind, _, _, _, shape, dtype, phase in square if kind == "a" and shape[0] == 2)
    assert pair == sorted([("bool", "forward")] * masks + [("bfloat16", "forward")] * (2 * biases // 3)
                          + [("bfloat16", "backward")] * (biases // 3))
    # the rest are the masks' batch-free bool pieces (causal, window, their conjunction) before the pair's expand
    assert all(dtype == "bool" and shape[0] == 1 for _, _, _, _, shape, dtype, _ in square if shape[0] != 2)
    assert all(nbytes == (2 if dtype == "bfloat16" else 1) * shape[0] * s * s for _, _, nbytes, _, shape, dtype, _ in square)
    assert _most_alive(square, "forward") == most * 2 * s * s


@pytest.mark.parametrize("casting, bias", [(True, "torch.bfloat16"), (False, "torch.float32")])
def test_sdpa_bias_takes_the_dtype_sdpa_runs_in(casting: bool, bias: str) -> None:
    """An fp32 model's rotary leaves q fp32 (the reference loaded at float32); under autocast SDPA runs in bf16 and
    converts its bool mask to that dtype (at::scaled_dot_product_attention, after autocast's cast): one bf16 s x s
    bias, 2 B per s^2, not an fp32 one and its bf16 cast. Without autocast the query's own dtype."""
    import torch
    import torch.nn.functional as F
    from torch._subclasses.fake_tensor import FakeTensorMode

    from perfguide.memory.tracing.cuda_emulation import make_cuda_emulation

    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import trace_trl_gemma_replay as t
        from allocation_log import AllocationLog
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    emulation = make_cuda_emulation(torch.bfloat16, emulate_sdpa=True)
    emulation.casting = casting
    made: list[tuple[str, tuple[int, ...], str]] = []
    log = AllocationLog(lambda i, op, x: made.append((op, tuple(x.shape), str(x.dtype))))
    with FakeTensorMode():
        q = torch.randn(1, 2, 64, 16)
        mask = torch.ones(1, 1, 64, 64, dtype=torch.bool)
        with log.mode(), emulation, t.sdpa_as_gpu(emulation):
            F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
    assert [(op, dtype) for op, shape, dtype in made if shape[-2:] == (64, 64)] == [("aten.where.self", bias)]
