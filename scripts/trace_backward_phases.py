"""Name every storage alive as a checkpointed backward reaches each block (memory/block_backward.py, phase terms).

Run: ``HF_HUB_OFFLINE=1 .venv/bin/python scripts/trace_backward_phases.py [--liger] [--arch=A] [--grads] [CASE ...]``.
The models of scripts/trace_models.py (a random-init Llama, or ``--arch`` mistral / gemma3, three blocks, h 128, FFN
448, q = h, kv = h / 4, head_dim h / 4, SDPA): bf16 full fine-tuning, fp32 weights under bf16 autocast, LoRA r 8 on a bf16 base, and the nf4 base under peft's
kbit preparation (the fp32 stream), each with reentrant and non-reentrant checkpointing. perfguide's live-bytes
tracker counts every storage an op returns until Python frees it; forward hooks note which storage is which (each
block's input, the rotary cos / sin, the position ids, the attention mask), a tensor hook on each block's output which
storage is the gradient backward hands it, and a forward pre-hook on each block's input norm lists the live storages
as autograd starts to recompute that block (the top block: analytic.py's ``backward_start``; block 0:
``backward_end``); a forward hook on the head and a tensor hook on the logits do the same at the end of forward and
as the loss's backward is done (analytic.py's ``forward``: block_backward.step_input_bytes). Printed per token, in bytes per hidden unit, for two lengths (what does not grow is length-free):
each named storage, the parameters and their gradients (per parameter, the ledger's), and whatever is left unnamed:
non-reentrant checkpointing's gradients made before the recompute starts (data/activations.json
``before_recompute_per_token``) and the loss (8 B). ``--grads`` names the parameters without a ``.grad`` as block 0's
recompute starts and at its backward's peak (block_backward.first_step_pending_params).
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections import Counter
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from trace_models import decoder, traced

CASES = ("full_half", "full_fp32_autocast", "half", "fp32_stream")


#: the snapshot keys of the loss, beside the blocks' indices: the head's output (the end of forward) and the logits'
#: gradient (the loss's backward done, the model's forward returned: analytic's forward/loss phase)
LOSS, LOSS_BACKWARD = -1, -2


def live_at_recompute(case: str, reentrant: bool, seq: int, h: int = 128, i: int = 448,
                      liger: bool = False, arch: str = "llama", grads: dict[str, set[str]] | None = None) -> dict[int, Counter[str]]:
    """Per block whose recompute starts (0 and the top one), at the head's output (LOSS: the forward's end) and at
    the logits' gradient (LOSS_BACKWARD: the loss's backward, the model's forward returned), bytes of every live storage by name; ``liger``: the blocks patched with
    scripts/liger_standins.py (liger-kernel's RMSNorm and SwiGLU); ``arch``: trace_models.ARCHS. ``grads``, when
    given, receives the names of the parameters whose ``.grad`` exists as block 0's recompute starts ("start") and at
    the highest live bytes of block 0's backward ("peak", until the gradient of its input, the embedding's output, is
    made), and of every trainable one ("trainable")."""
    import torch

    from perfguide.memory.tracing.tracker import make_tracker

    with tempfile.TemporaryDirectory() as tmp:
        model, autocast = traced(case, h, i, reentrant, tmp, liger, arch)
    layers = decoder(model).layers
    names: dict[int, tuple[list[Any], str]] = {}   # by the tracker's record of a storage: a freed address is reused
    state: dict[str, Any] = {"backward": False, "open": False, "peak": 0}
    snaps: dict[int, Counter[str]] = {}
    tracker = make_tracker(1)
    params = dict(model.named_parameters())
    found = grads if grads is not None else {}
    found["trainable"] = {n for n, p in params.items() if p.requires_grad}

    def ptr(t: Any) -> int:
        return int(t.untyped_storage().data_ptr())

    def name(t: Any, label: str) -> None:
        rec = tracker.records.get(t.untyped_storage()) if isinstance(t, torch.Tensor) else None
        if rec is not None and id(rec) not in names:
            names[id(rec)] = (rec, label)

    def with_grad() -> set[str]:
        return {n for n, p in params.items() if p.grad is not None}

    def snapshot() -> Counter[str]:
        held = {ptr(p.grad) for p in params.values() if p.grad is not None}
        weights = {ptr(p) for p in params.values()}   # charged where an op returns a view (a transpose)
        count: Counter[str] = Counter()
        for storage, rec in list(tracker.records.items()):
            label = names[id(rec)][1] if id(rec) in names else "unnamed"
            key = storage.data_ptr()
            count["parameter gradients" if key in held else "parameters" if key in weights else label] += rec[0]
        return count

    def enter(k: int) -> Any:
        def pre(module: Any, args: Any) -> None:
            if not state["backward"]:
                name(args[0], f"block {k} input (the checkpoint keeps it)")
            elif k in (0, len(layers) - 1) and k not in snaps:
                snaps[k] = snapshot()
                if k == 0:
                    found["start"], state["open"], state["peak"] = with_grad(), True, tracker.total
        return pre

    def kind(module: Any) -> str:   # Gemma 3's local and global layers: a rotary pair and a mask of each kind
        layer_type = getattr(module, "layer_type", None)
        return f" ({layer_type})" if layer_type else ""

    def attn(module: Any, args: Any, kwargs: Any) -> None:
        if not state["backward"]:
            for t, label in zip(kwargs.get("position_embeddings") or (), ("rotary cos", "rotary sin")):
                name(t, label + kind(module))
            name(kwargs.get("attention_mask"), "the attention's mask" + kind(module))

    def rotary(module: Any, args: Any, kwargs: Any) -> None:
        name(kwargs.get("position_ids", args[1] if len(args) > 1 else None), "position ids")

    def out_hook(k: int) -> Any:
        def post(module: Any, args: Any, out: Any) -> None:
            hidden = out[0] if isinstance(out, tuple) else out
            if not state["backward"] and hidden.requires_grad:
                hidden.register_hook(lambda g: name(g, f"gradient into block {k} (its output's)"))
        return post

    def logits_grad(g: Any) -> None:
        name(g, "the logits' gradient")
        snaps[LOSS_BACKWARD] = snapshot()

    def head(module: Any, args: Any, out: Any) -> None:
        if not state["backward"]:
            name(out, "logits")
            snaps[LOSS] = snapshot()
            out.register_hook(logits_grad)

    def embedded(module: Any, args: Any, out: Any) -> None:
        if out.requires_grad:   # its gradient is block 0's input gradient: block 0's backward is over
            out.register_hook(lambda g: state.update(open=False))

    cls = type(tracker)
    original = cls.__torch_dispatch__

    def dispatch(self: Any, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = original(self, func, types, args, kwargs)
        if state["open"] and self.total > state["peak"]:
            state["peak"], found["peak"] = self.total, with_grad()
        return out

    handles = [m.input_layernorm.register_forward_pre_hook(enter(k)) for k, m in enumerate(layers)]
    handles += [m.register_forward_hook(out_hook(k)) for k, m in enumerate(layers)]
    handles += [m.self_attn.register_forward_pre_hook(attn, with_kwargs=True) for m in layers]
    handles.append(decoder(model).rotary_emb.register_forward_pre_hook(rotary, with_kwargs=True))
    handles.append(decoder(model).norm.register_forward_hook(lambda m, a, out: name(out, "the final norm's output")))
    handles.append(model.get_output_embeddings().register_forward_hook(head))
    handles.append(decoder(model).embed_tokens.register_forward_hook(embedded))
    torch.manual_seed(1)
    ids = torch.randint(0, 256, (1, seq))
    labels, mask = ids.clone(), torch.ones_like(ids)   # a collated batch: ids, labels, attention mask (int64)
    model.zero_grad(set_to_none=True)
    cls.__torch_dispatch__ = dispatch  # type: ignore[method-assign]
    try:
        with tracker, torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            ids, labels, mask = ids + 0, labels + 0, mask + 0   # born inside the tracker; the batch is alive all step
            for t, label in ((ids, "input ids"), (labels, "labels"), (mask, "batch attention mask")):
                name(t, label)
            loss = model(input_ids=ids, labels=labels, attention_mask=mask).loss
            state["backward"] = True
            loss.backward()
    finally:
        cls.__torch_dispatch__ = original  # type: ignore[method-assign]
        for handle in handles:
            handle.remove()
    return snaps


def missing_grads(case: str, reentrant: bool, arch: str, seq: int = 256, h: int = 128, i: int = 448) -> dict[str, list[str]]:
    """The trainable parameters without a ``.grad`` as block 0's recompute starts and at its backward's peak (a
    first micro-step: every ``.grad`` None before the step)."""
    found: dict[str, set[str]] = {}
    live_at_recompute(case, reentrant, seq, h, i, arch=arch, grads=found)
    return {moment: sorted(found["trainable"] - found[moment]) for moment in ("start", "peak")}


def main() -> int:
    h, s1, s2 = 128, 256, 512
    liger = "--liger" in sys.argv
    arch = next((a.removeprefix("--arch=") for a in sys.argv if a.startswith("--arch=")), "llama")
    for case in tuple(a for a in sys.argv[1:] if not a.startswith("--")) or CASES:
        for reentrant in (True, False):
            one, two = (live_at_recompute(case, reentrant, s, liger=liger, arch=arch) for s in (s1, s2))
            for k in sorted(one):
                where = ("the head's output (forward)" if k == LOSS else "the logits' gradient (forward/loss)" if k == LOSS_BACKWARD else "recompute of block 0 (backward_end)" if k == 0
                         else f"recompute of top block {k} (backward_start)")
                parts = ", ".join(f"{label} {(two[k][label] - one[k][label]) / (s2 - s1) / h:.3f}h"
                                  + (f" (+{2 * one[k][label] - two[k][label]} B length-free)" if 2 * one[k][label] != two[k][label] else "")
                                  for label in sorted(set(one[k]) | set(two[k])))
                print(f"{arch} {case}{' liger' if liger else ''} reentrant={reentrant}, {where}: per token {parts}")
                sys.stdout.flush()
            if "--grads" in sys.argv:
                for moment, missing in missing_grads(case, reentrant, arch).items():
                    print(f"{arch} {case} reentrant={reentrant}: no .grad at block 0's {moment}: {', '.join(missing)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
