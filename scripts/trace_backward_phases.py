"""Name every storage alive as a checkpointed backward reaches each block (memory/block_backward.py, phase terms).

Run: ``HF_HUB_OFFLINE=1 .venv/bin/python scripts/trace_backward_phases.py [--liger] [CASE ...]``. The models of
scripts/trace_models.py (a random-init Llama, three blocks, h 128, FFN 448, q = h, kv = h / 4, head_dim h / 4,
SDPA): bf16 full fine-tuning, fp32 weights under bf16 autocast, LoRA r 8 on a bf16 base, and the nf4 base under peft's
kbit preparation (the fp32 stream), each with reentrant and non-reentrant checkpointing. perfguide's live-bytes
tracker counts every storage an op returns until Python frees it; forward hooks note which storage is which (each
block's input, the rotary cos / sin, the position ids, the attention mask), a tensor hook on each block's output which
storage is the gradient backward hands it, and a forward pre-hook on each block's input norm lists the live storages
as autograd starts to recompute that block (the top block: analytic.py's ``backward_start``; block 0:
``backward_end``). Printed per token, in bytes per hidden unit, for two lengths (what does not grow is length-free):
each named storage, the parameters and their gradients (per parameter, the ledger's), and whatever is left unnamed:
non-reentrant checkpointing's gradients made before the recompute starts (data/activations.json
``before_recompute_per_token``) and the loss (8 B).
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


def live_at_recompute(case: str, reentrant: bool, seq: int, h: int = 128, i: int = 448,
                      liger: bool = False) -> dict[int, Counter[str]]:
    """Per block whose recompute starts (0 and the top one), bytes of every live storage by name; ``liger``: the
    blocks patched with scripts/liger_standins.py (liger-kernel's RMSNorm and SwiGLU)."""
    import torch

    from perfguide.memory.tracing.tracker import make_tracker

    with tempfile.TemporaryDirectory() as tmp:
        model, autocast = traced(case, h, i, reentrant, tmp, liger)
    layers = decoder(model).layers
    names: dict[int, tuple[list[Any], str]] = {}   # by the tracker's record of a storage: a freed address is reused
    state = {"backward": False}
    snaps: dict[int, Counter[str]] = {}
    tracker = make_tracker(1)

    def ptr(t: Any) -> int:
        return int(t.untyped_storage().data_ptr())

    def name(t: Any, label: str) -> None:
        rec = tracker.records.get(t.untyped_storage()) if isinstance(t, torch.Tensor) else None
        if rec is not None and id(rec) not in names:
            names[id(rec)] = (rec, label)

    def enter(k: int) -> Any:
        def pre(module: Any, args: Any) -> None:
            if not state["backward"]:
                name(args[0], f"block {k} input (the checkpoint keeps it)")
            elif k in (0, len(layers) - 1) and k not in snaps:
                grads = {ptr(p.grad) for p in model.parameters() if p.grad is not None}
                weights = {ptr(p) for p in model.parameters()}   # charged where an op returns a view (a transpose)
                count: Counter[str] = Counter()
                for storage, rec in list(tracker.records.items()):
                    label = names[id(rec)][1] if id(rec) in names else "unnamed"
                    key = storage.data_ptr()
                    count["parameter gradients" if key in grads else "parameters" if key in weights else label] += rec[0]
                snaps[k] = count
        return pre

    def attn(module: Any, args: Any, kwargs: Any) -> None:
        if not state["backward"]:
            for t, label in zip(kwargs.get("position_embeddings") or (), ("rotary cos", "rotary sin")):
                name(t, label)
            name(kwargs.get("attention_mask"), "the attention's mask")

    def rotary(module: Any, args: Any, kwargs: Any) -> None:
        name(kwargs.get("position_ids", args[1] if len(args) > 1 else None), "position ids")

    def out_hook(k: int) -> Any:
        def post(module: Any, args: Any, out: Any) -> None:
            hidden = out[0] if isinstance(out, tuple) else out
            if not state["backward"] and hidden.requires_grad:
                hidden.register_hook(lambda g: name(g, f"gradient into block {k} (its output's)"))
        return post

    handles = [m.input_layernorm.register_forward_pre_hook(enter(k)) for k, m in enumerate(layers)]
    handles += [m.register_forward_hook(out_hook(k)) for k, m in enumerate(layers)]
    handles += [m.self_attn.register_forward_pre_hook(attn, with_kwargs=True) for m in layers]
    handles.append(decoder(model).rotary_emb.register_forward_pre_hook(rotary, with_kwargs=True))
    torch.manual_seed(1)
    ids = torch.randint(0, 256, (1, seq))
    labels, mask = ids.clone(), torch.ones_like(ids)   # a collated batch: ids, labels, attention mask (int64)
    model.zero_grad(set_to_none=True)
    try:
        with tracker, torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            ids, labels, mask = ids + 0, labels + 0, mask + 0   # born inside the tracker; the batch is alive all step
            for t, label in ((ids, "input ids"), (labels, "labels"), (mask, "batch attention mask")):
                name(t, label)
            loss = model(input_ids=ids, labels=labels, attention_mask=mask).loss
            state["backward"] = True
            loss.backward()
    finally:
        for handle in handles:
            handle.remove()
    return snaps


def main() -> int:
    h, s1, s2 = 128, 256, 512
    liger = "--liger" in sys.argv
    for case in tuple(a for a in sys.argv[1:] if not a.startswith("--")) or CASES:
        for reentrant in (True, False):
            one, two = (live_at_recompute(case, reentrant, s, liger=liger) for s in (s1, s2))
            for k in sorted(one):
                where = "block 0 (backward_end)" if k == 0 else f"top block {k} (backward_start)"
                parts = ", ".join(f"{label} {(two[k][label] - one[k][label]) / (s2 - s1) / h:.3f}h"
                                  + (f" (+{2 * one[k][label] - two[k][label]} B length-free)" if 2 * one[k][label] != two[k][label] else "")
                                  for label in sorted(set(one[k]) | set(two[k])))
                print(f"{case}{' liger' if liger else ''} reentrant={reentrant}, recompute of {where}: per token {parts}")
                sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
