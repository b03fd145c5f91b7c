"""TRL's gemma-3-1b long-context SFT step (bench rows 1182-1185) as a sequence of allocations and frees at the real
shape and length, on fake tensors, replayed through the caching allocator with the release's 79 GiB cap.

Why: perfguide fits rows 1183-1185 (SFT, fused LM head) at ~131k tokens where the release measured 107,520; the
open lead was the caching allocator around the 10-22 GiB s x s blocks (docs/validation.md 28). This builds
Gemma3ForCausalLM from gemma-3-1b's config (perfguide/data/architectures.json) on meta, bf16, SDPA, checkpointing
with use_reentrant=False (the trainers' default), batch 1, and runs Trainer's step on fake tensors: the weights'
allocations, forward + loss, backward, AdamW (its states made lazily in the first step, as in a real run), grads set
to None. The loss is either TRL's fused head (trl's ``add_fused_lm_head``, ``fused_lm_head=True``: TRL 1.15's path)
or the model's own full-logits loss (``labels=``: TRL 1.14.2's ``nll``). SDPA runs as on the GPU: the bool mask is
turned into a bf16 bias with ``where(mask, 0, -inf)`` (no logical_not transient), expanded over the heads and kept
for backward by the memory-efficient kernel (cuDNN's takes the same 2 B per row x s^2).

The allocator (scripts/caching_allocator.py) replays ``STEPS`` steps under the cap: a request that does not fit
frees the cached whole segments and retries, then is an OOM. The longest surviving multiple of 1,024 is found by
bisection.

Usage: python scripts/trace_trl_gemma_replay.py [--full-logits] [--steps N] [--peak SEQ] [--search LO HI]
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from allocation_log import AllocationLog
from caching_allocator import Allocator, OutOfMemory

GiB = 2**30
#: the op, shape and dtype that made each event's storage, and the phase it was made in (for reading a replay)
OPS: dict[int, tuple[str, tuple[int, ...], str, str]] = {}
PHASE = ["weights"]
#: the release's cap on the allocator (reserved bytes), release details quoted in bench/data row notes
CAP = 79 * GiB
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def gemma_config(layers: int | None = None) -> Any:
    from transformers import Gemma3TextConfig

    with open(os.path.join(ROOT, "perfguide", "data", "architectures.json")) as f:
        cfg = dict(json.load(f)["models"]["google/gemma-3-1b-pt"]["config"])
    for k in ("model_type", "architectures", "torch_dtype"):
        cfg.pop(k)
    if layers is not None:   # fewer blocks, the same 5 sliding : 1 full pattern (tests)
        cfg["num_hidden_layers"] = layers
    return Gemma3TextConfig(**cfg, pad_token_id=0)


def sdpa_as_gpu() -> Any:
    """F.scaled_dot_product_attention with a bool mask as the GPU runs it: at::where(mask, 0, -inf) in the query's
    dtype (2 B per row x s^2), then the emulation's memory-efficient kernel, which expands it over the heads."""
    import torch
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode

    class Mode(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = dict(kwargs or {})
            if func is F.scaled_dot_product_attention:
                q = args[0]
                mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
                if mask is not None and mask.dtype == torch.bool:
                    bias = torch.where(mask, torch.zeros((), dtype=q.dtype), torch.full((), float("-inf"), dtype=q.dtype))
                    args = tuple(args[:3])
                    kwargs["attn_mask"] = bias
            return func(*args, **kwargs)

    return Mode()


def events_of_run(seq: int, fused: bool = True, steps: int = 2, layers: int | None = None) -> list[tuple[str, int, int]]:
    """The run's allocation events in order: the weights, then ``steps`` training steps."""
    import torch
    import transformers.masking_utils as masking
    from torch._subclasses.fake_tensor import FakeTensorMode
    from transformers import Gemma3ForCausalLM

    from perfguide.memory.tracing.cuda_emulation import make_cuda_emulation, make_scalar_fallback

    # masking_utils reads a fake tensor as "tracing" and then builds the full-attention layers' s x s mask a real run
    # skips (SDPA's is_causal for an unpadded batch): not tracing here, so the real run's choice is put back
    stack_patch = contextlib.ExitStack()
    saved = masking.is_tracing
    masking.is_tracing = lambda tensor=None: False
    stack_patch.callback(setattr, masking, "is_tracing", saved)
    with torch.device("meta"):
        model = Gemma3ForCausalLM._from_config(gemma_config(layers), attn_implementation="sdpa", dtype=torch.bfloat16)
    if fused:
        from trl.trainer.utils import add_fused_lm_head

        add_fused_lm_head(model)
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    log = AllocationLog(lambda i, op, t: OPS.__setitem__(i, (op, tuple(t.shape), str(t.dtype).removeprefix("torch."),
                                                              PHASE[0])))
    events, charge = log.events, log.charge

    emulation = make_cuda_emulation(torch.bfloat16, emulate_sdpa=True)
    with stack_patch, contextlib.ExitStack() as stack:
        stack.enter_context(FakeTensorMode(allow_non_fake_inputs=True))
        stack.enter_context(make_scalar_fallback())
        model.to_empty(device="cpu")
        model.lm_head.weight = model.model.embed_tokens.weight   # to_empty unties them; the checkpoint ties the head
        for p in model.parameters():   # model.to("cuda"): one block per parameter (the tied head is the embedding)
            charge(p, "to_empty")
        for b in model.buffers():
            charge(b, "to_empty")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)   # adamw_torch_fused: no foreach transients
        ids = torch.randint(4, 262144, (1, seq))
        stack.enter_context(log.mode())
        for step in range(steps):
            PHASE[0] = f"step {step + 1} forward"
            batch = {"input_ids": ids.clone(), "labels": ids.clone()}
            with emulation, sdpa_as_gpu():
                out = model(**batch, fused_lm_head=True) if fused else model(**batch)
                loss = out.loss
                del out, batch
                emulation.end_region()
                PHASE[0] = f"step {step + 1} backward"
                emulation.backward(loss)
                del loss
            PHASE[0] = f"step {step + 1} optimizer"
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
            opt.step()
            opt.zero_grad(set_to_none=True)
    return events


def replay(events: list[tuple[str, int, int]], cap: int | None = CAP) -> Allocator:
    alloc = Allocator(limit=cap)
    alloc.replay(events)
    return alloc


def live_peak(events: list[tuple[str, int, int]]) -> tuple[int, dict[int, int]]:
    """The most bytes alive at once, and the storages alive then (key -> bytes)."""
    live = peak = 0
    sizes: dict[int, int] = {}
    at: dict[int, int] = {}
    for kind, key, nbytes in events:
        if kind == "a":
            sizes[key] = nbytes
            live += nbytes
            if live > peak:
                peak, at = live, dict(sizes)
        else:
            live -= sizes.pop(key)
    return peak, at


def fits(seq: int, fused: bool, steps: int) -> tuple[bool, Allocator]:
    events = events_of_run(seq, fused, steps)
    try:
        return True, replay(events)
    except OutOfMemory as e:
        print(f"  OOM: a {e.size / GiB:.3f} GiB segment for {OPS[e.key]}", flush=True)
        return False, e.allocator


def main() -> int:
    args = sys.argv[1:]
    fused = "--full-logits" not in args
    steps = int(args[args.index("--steps") + 1]) if "--steps" in args else 2
    if "--peak" in args:
        seq = int(args[args.index("--peak") + 1])
        events = events_of_run(seq, fused, steps)
        a = replay(events, cap=None)
        peak, at = live_peak(events)
        print(f"s={seq} fused={fused}: live peak {peak / GiB:.3f} GiB, allocator allocated "
              f"{a.peak_allocated / GiB:.3f}, reserved {a.peak_reserved / GiB:.3f}, segments {a.segments}")
        big = sorted(((b, k) for k, b in at.items() if b >= GiB // 4), reverse=True)
        print(f"alive at the peak: {len(at)} storages; those of 0.25 GiB or more ({sum(b for b, _ in big) / GiB:.3f} GiB):")
        for b, k in big:
            print(f"  {b / GiB:8.3f} GiB  {b / seq**2:6.3f} B/s^2  {OPS[k]}")
    if "--search" in args:
        i = args.index("--search")
        lo, hi = int(args[i + 1]) // 1024, int(args[i + 2]) // 1024   # lo fits, hi does not (the caller's bounds)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            ok, a = fits(mid * 1024, fused, steps)
            print(f"s={mid * 1024}: {'fits' if ok else 'OOM'} reserved {a.reserved / GiB:.3f} allocated "
                  f"{a.allocated / GiB:.3f} peak allocated {a.peak_allocated / GiB:.3f}", flush=True)
            lo, hi = (mid, hi) if ok else (lo, mid)
        print(f"longest fitting: {lo * 1024}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
