"""The 2022 PyTorch FSDP blog's FSDP rows as replayed under torch 1.12's FSDP1 (scripts/fsdp1_emulation.py, the
``--fsdp`` mode of scripts/trace_gpt2_fsdp_blog_replay.py), checked at a tiny GPT-2 against bytes counted by hand from
torch 1.12.0's fully_sharded_data_parallel.py: the units the size policy makes, each unit's padded shard, the padded
full parameter gathered on the all_gather stream, the unsharded gradient (the ``cat`` of its views' gradients), the
reduce-scatter's padded input and output on the post_backward stream, the saved gradient shard, AdamW's states on
the shards, and what CPU offload leaves on the GPU. The full-size replays need the transformers 4.18.0 wheel and
minutes (docs/validation.md 36); their results are in bench/data/allocator_max_batch.csv."""

from __future__ import annotations

import os
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))

import trace_gpt2_fsdp_blog_replay as g  # noqa: E402
from allocation_log import live_at  # noqa: E402
from fsdp1_emulation import ALL_GATHER, POST_BACKWARD, size_wrap_units  # noqa: E402

#: the tiny GPT-2: h 64, 2 blocks, vocabulary 1000, 128 positions; batch 2 x 16 tokens on 2 ranks
H, L, V, P, B, S = 64, 2, 1000, 128, 2, 16
WTE, WPE = V * H, P * H
C_ATTN, ATTN_PROJ, C_FC, MLP_PROJ = H * 3 * H + 3 * H, H * H + H, H * 4 * H + 4 * H, 4 * H * H + H
LN = 2 * H
#: at min_num_params 2000 every Conv1D, both embeddings and the (untied) head are units; the LayerNorms (128 < 2000)
#: are the root's
UNITS = [WTE, WPE] + [C_ATTN, ATTN_PROJ, C_FC, MLP_PROJ] * L + [V * H]
ROOT = (2 * L + 1) * LN


def shard(n: int) -> int:
    return -(-n // 2)


def _config() -> object:
    return g.gpt2_config("openai-community/gpt2-large", layers=L, n_embd=H, n_head=4, vocab_size=V, n_positions=P,
                         bos_token_id=0, eos_token_id=0)


def _run(row: str) -> list[tuple[str, int, int]]:
    return g.events_of_fsdp_run(row, B, 3, config=_config(), seq=S)


def _made(events: list[tuple[str, int, int]], lo: int, hi: int, stream: int, phase: str = "") -> list[int]:
    return [n for kind, key, n in events[lo:hi]
            if kind == "a" and g.STREAMS.get(key, 0) == stream and g.OPS[key][3].endswith(phase)]


def _alive(events: list[tuple[str, int, int]], at: int, stream: int) -> int:
    return sum(n for key, n in live_at(events, at).items() if g.STREAMS.get(key, 0) == stream)


def test_size_policy_units_by_hand() -> None:
    """torch 1.12 ``_recursive_wrap``: at 10,000 the attention's c_proj (4,160), wpe (8,192) and the LayerNorms stay
    below the threshold in their blocks (4,416 each), and GPT2Model wraps what they leave (17,152 with ln_f); at 2,000
    only the LayerNorms fall to the root."""
    from transformers import GPT2LMHeadModel

    with torch.device("meta"):
        model = GPT2LMHeadModel(_config())
    model.lm_head.weight = torch.nn.Parameter(torch.empty_like(model.lm_head.weight))
    units = size_wrap_units(model, 10_000)
    sizes = [(type(m).__name__, sum(getattr(sub, n).numel() for sub, n in places)) for m, places in units]
    assert sizes == [("Embedding", WTE)] + [("Conv1D", C_ATTN), ("Conv1D", C_FC), ("Conv1D", MLP_PROJ)] * L + [
        ("GPT2Model", WPE + L * (ATTN_PROJ + 2 * LN) + LN), ("Linear", V * H), ("GPT2LMHeadModel", 0)]
    with torch.device("meta"):
        model = GPT2LMHeadModel(_config())
    model.lm_head.weight = torch.nn.Parameter(torch.empty_like(model.lm_head.weight))
    units = size_wrap_units(model, 2000)
    assert sorted(sum(getattr(sub, n).numel() for sub, n in places) for _, places in units) == sorted([*UNITS, ROOT])


def test_full_shard_gathers_and_reduce_scatters_by_hand() -> None:
    """Row 644's FSDP (FULL_SHARD, 2K): in step 2's forward each unit's padded full parameter (2 x ceil(n / 2) fp32) is
    gathered in module order, the root's (the LayerNorms) first, and freed after the unit's forward, the root's kept;
    in its backward every unit but the root is gathered again, and each gets its unsharded gradient (n x 4 B, the
    ``cat`` of its views' gradients) and, on the post_backward stream, the padded copy and a shard for the
    reduce-scatter output, which is added into the saved gradient shard made in step 1."""
    events = _run("644")
    f1, f2, f3 = g.AFTER_FORWARD
    full = [8 * shard(n) for n in [ROOT, *UNITS]]
    assert _made(events, f1, f2, ALL_GATHER, "forward") == full
    assert sorted(_made(events, f2, f3, ALL_GATHER, "backward")) == sorted(full[1:])
    assert _alive(events, f2, ALL_GATHER) == 8 * shard(ROOT)   # at step 2's loss: only the root's LayerNorms
    cats = [n for kind, key, n in events[f2:f3] if kind == "a" and g.OPS[key][0] == "aten.cat.default"
            and g.OPS[key][3] == "step 2 backward" and len(g.OPS[key][1]) == 1]
    assert sorted(cats) == sorted(4 * n for n in [*UNITS, ROOT])
    assert sorted(_made(events, f2, f3, POST_BACKWARD, "backward")) == sorted(
        [8 * shard(n) for n in [*UNITS, ROOT]] + [4 * shard(n) for n in [*UNITS, ROOT]])
    shards = sum(4 * shard(n) for n in [*UNITS, ROOT])
    assert _alive(events, f2, POST_BACKWARD) == shards   # the saved gradient shards, from step 1
    # on the default stream across step 2's forward: the shards (weights), AdamW's two states, and the model's buffers
    buffers = sum(n for kind, key, n in events[:f1] if kind == "a" and g.OPS[key][3] == "weights") - shards
    assert 0 <= buffers < 2**21
    persistent = [n for key, n in live_at(events, f2).items() if g.OPS[key][3] in ("weights", "step 1 optimizer")]
    assert sum(persistent) == 3 * shards + buffers


def test_shard_grad_op_keeps_every_unit_gathered_to_its_backward() -> None:
    """SHARD_GRAD_OP (row 642's strategy): nothing is freed after a forward, so at step 2's loss every unit's padded full
    parameter is alive on the all_gather stream, and the backward gathers none again."""
    events = _run("642")
    _f1, f2, f3 = g.AFTER_FORWARD
    assert _alive(events, f2, ALL_GATHER) == sum(8 * shard(n) for n in [ROOT, *UNITS])
    assert _made(events, f2, f3, ALL_GATHER, "backward") == []


def test_cpu_offload_leaves_copies_and_gradient_shards_until_the_backward_ends() -> None:
    """CPU offload (row 646's FSDP): no shard, gradient shard or AdamW state stays on the GPU; each gather first copies
    the CPU shard to the GPU (ceil(n / 2) x 4 B) and then allocates the padded full parameter; the reduce-scatter's
    output shard stays on the GPU until the backward ends (``_finalize_params``), so none is alive at the next loss."""
    events = _run("646")
    f1, f2, _f3 = g.AFTER_FORWARD
    expected = []
    for n in [ROOT, *UNITS]:
        expected += [4 * shard(n), 8 * shard(n)]
    assert _made(events, f1, f2, ALL_GATHER, "forward") == expected
    assert _alive(events, f2, POST_BACKWARD) == 0
    assert not [n for kind, key, n in events if kind == "a" and g.OPS[key][3].endswith("optimizer")]
    weights = [n for kind, key, n in events[:f1] if kind == "a" and g.OPS[key][3] == "weights"]
    assert sum(weights) < 2**21   # the model's buffers only


def test_one_rank_under_offload_copies_whole_flat_parameters() -> None:
    """Row 651's FSDP (one GPU, CPU offload): nothing is sharded, gathered or reduce-scattered; each forward and each
    pre-backward hook copies the unit's whole flat parameter to the GPU (n x 4 B, ``p.data.to(device)``). The forward's
    copies stay alive through the module's view attributes (FlattenParamsWrapper's) until the next forward, so at the
    loss the whole model is on the GPU once; each unit's unsharded gradient (the ``cat``) stays ``p.grad`` to the end
    of the backward, where ``_cpu_grad`` replaces it."""
    events = _run("651")
    f1, f2, f3 = g.AFTER_FORWARD
    whole = [4 * n for n in [ROOT, *UNITS]]
    assert _made(events, f1, f2, ALL_GATHER, "forward") == whole
    assert sorted(_made(events, f2, f3, ALL_GATHER, "backward")) == sorted(whole)
    assert _alive(events, f2, ALL_GATHER) == sum(whole)
    assert not [n for kind, key, n in events if kind == "a" and g.STREAMS.get(key) == POST_BACKWARD]
    last = max(i for i, (kind, key, _) in enumerate(events[:f3]) if kind == "a" and g.OPS[key][3] == "step 2 backward")
    grads = [n for key, n in live_at(events, last + 1).items()
             if g.OPS[key][0] == "aten.cat.default" and g.OPS[key][3] == "step 2 backward" and len(g.OPS[key][1]) == 1]
    assert sorted(grads) == sorted(whole)
    assert not [key for key in live_at(events, f3) if g.OPS[key][3] == "step 2 backward"]
