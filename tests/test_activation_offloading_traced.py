"""An independent memory reference for activation offloading (issue 11 item 6): a real tiny Llama trained one step
on CPU with checkpointing, every tensor autograd saves seen through torch's ``saved_tensors_hooks``. What offloading
moves is the saved activations (parameters stay where they are); perfguide's on-device / to-host split of the
checkpointed boundaries must add up to what the trace saw, and its prepare hook must leave parameters alone."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from perfguide import Setup  # noqa: E402
from perfguide.model.from_module import spec_from_module  # noqa: E402
from perfguide.techniques.activation_offloading import (  # noqa: E402
    LAYERS_IN_FLIGHT,
    MIN_OFFLOAD_BYTES,
    offload_saved_tensors,
    split_boundaries,
)
from perfguide.techniques.gradient_checkpointing import held_activations  # noqa: E402

try:
    from helpers import tiny_config
except ImportError:  # pragma: no cover
    from tests.helpers import tiny_config

LAYERS, BATCH, SEQ = 6, 2, 32


def _model():
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config(num_hidden_layers=LAYERS, max_position_embeddings=SEQ), attn_implementation="sdpa")
    model.gradient_checkpointing_enable()
    model.train()
    return model


def _saved_between_blocks(model) -> tuple[int, int]:
    """(activation bytes, parameter bytes) autograd saves inside the decoder blocks of one forward, each storage once."""
    seen: set[int] = set()
    acts = params = 0
    params_ptrs = {p.data_ptr() for p in model.parameters()}
    inside = [0]

    def pack(t):
        nonlocal acts, params
        if inside[0] and t.untyped_storage().data_ptr() not in seen:
            seen.add(t.untyped_storage().data_ptr())
            if t.data_ptr() in params_ptrs or isinstance(t, torch.nn.Parameter):
                params += t.untyped_storage().nbytes()
            else:
                acts += t.untyped_storage().nbytes()
        return t

    for layer in model.model.layers:
        layer.register_forward_pre_hook(lambda *_: inside.__setitem__(0, inside[0] + 1))
        layer.register_forward_hook(lambda *_: inside.__setitem__(0, inside[0] - 1))
    ids = torch.randint(0, 128, (BATCH, SEQ))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(input_ids=ids)
    out.logits.float().sum().backward()
    return acts, params


def test_checkpointed_boundaries_match_the_trace():
    model = _model()
    acts, _ = _saved_between_blocks(model)
    spec = spec_from_module(model)
    setup = Setup(task="train", device="cuda", micro_batch_size=BATCH, seq_len=SEQ, gradient_checkpointing=True, optimizer=None)
    held = held_activations(spec, setup)
    # the trace sees each block's input hidden states (fp32 here): b * s * h * 4 per block
    assert acts == BATCH * SEQ * model.config.hidden_size * 4 * LAYERS
    assert held == pytest.approx(acts, rel=0.05)
    on_gpu, to_host = split_boundaries(held, LAYERS)
    assert on_gpu + to_host == held
    assert on_gpu == pytest.approx(acts * LAYERS_IN_FLIGHT / LAYERS, rel=0.05)


def _every_pack(model) -> tuple[int, int]:
    """(bytes of saved non-parameter tensors of at least MIN_OFFLOAD_BYTES, bytes of saved parameters), per pack call."""
    moved = params = 0

    def pack(t):
        nonlocal moved, params
        nbytes = t.numel() * t.element_size()
        if isinstance(t, torch.nn.Parameter):
            params += nbytes
        elif nbytes >= MIN_OFFLOAD_BYTES:
            moved += nbytes
        return t

    ids = torch.randint(0, 128, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=ids, labels=ids).loss.backward()
    return moved, params


def test_prepare_hook_moves_activations_not_parameters():
    """perfguide's prepare step for the plain Trainer: what it copies to host RAM is exactly the saved activations an
    independent trace sees, the weights autograd saves stay in place, and the gradients are unchanged."""
    reference = _model()
    traced_moved, traced_params = _every_pack(reference)
    model = _model()
    stats = offload_saved_tensors(model, pin_memory=False)
    ids = torch.randint(0, 128, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    model(input_ids=ids, labels=ids).loss.backward()
    assert traced_params > 0 and stats.moved_bytes == traced_moved
    assert stats.kept_bytes >= traced_params
    for a, b in zip(reference.parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad)
    assert offload_saved_tensors(model, pin_memory=False) is stats   # idempotent: hooks are attached once
