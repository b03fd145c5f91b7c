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

Usage: python scripts/trace_trl_gemma_replay.py [--full-logits] [--full-mask] [--steps N] [--peak SEQ] [--search LO HI]
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from allocation_log import AllocationLog, live_peak
from caching_allocator import Allocator, replay_under

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


def sdpa_as_gpu(emulation: Any = None) -> Any:
    """F.scaled_dot_product_attention with a bool mask as the GPU runs it: at::where(mask, 0, -inf) in the query's
    dtype (2 B per row x s^2), then the emulation's memory-efficient kernel, which expands it over the heads. The
    query's dtype is the one SDPA runs in: under autocast (``emulation.casting``) the low dtype, which the emulation
    casts q, k, v to only after this mode (an fp32 model's rotary makes q fp32 before autocast's cast)."""
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
                    dtype = torch.bfloat16 if emulation is not None and emulation.casting and q.is_floating_point() else q.dtype
                    bias = torch.where(mask, torch.zeros((), dtype=dtype), torch.full((), float("-inf"), dtype=dtype))
                    args = tuple(args[:3])
                    kwargs["attn_mask"] = bias
            return func(*args, **kwargs)

    return Mode()


#: one training step's loss: (policy, reference or None, input ids [rows, s], the CUDA emulation) -> the loss tensor
Step = Callable[[Any, Any, Any, Any], Any]


def events_of_steps(seq: int, step: Step, steps: int = 2, layers: int | None = None, *, rows: int = 1,
                    reference: bool = False, prepare: Callable[[Any, Any, Any], None] | None = None,
                    unpadded: bool = True, modes: tuple[Any, ...] = ()) -> list[tuple[str, int, int]]:
    """The run's allocation events in order: the weights (the policy's, then a frozen reference copy's where
    ``reference``), then ``steps`` training steps of ``step`` over ``rows`` x ``seq`` ids. ``prepare(policy, reference,
    emulation)`` patches the models before they are placed (TRL's fused head, accelerate's forward wrapper);
    ``modes``: dispatch modes entered under the allocation log (their outputs are logged). ``unpadded``: the real
    run's choice of SDPA's is_causal for the full-attention layers is put back (below); False keeps the mask those
    layers get when the batch carries padding."""
    import torch
    import transformers.masking_utils as masking
    from torch._subclasses.fake_tensor import FakeTensorMode
    from transformers import Gemma3ForCausalLM

    from perfguide.memory.tracing.cuda_emulation import make_cuda_emulation, make_scalar_fallback

    # masking_utils reads a fake tensor as "tracing" and then builds the full-attention layers' s x s mask a real run
    # skips (SDPA's is_causal for an unpadded batch): not tracing here, so the real run's choice is put back
    stack_patch = contextlib.ExitStack()
    if unpadded:
        saved = masking.is_tracing
        masking.is_tracing = lambda tensor=None: False
        stack_patch.callback(setattr, masking, "is_tracing", saved)
    with torch.device("meta"):
        models = [Gemma3ForCausalLM._from_config(gemma_config(layers), attn_implementation="sdpa", dtype=torch.bfloat16)
                  for _ in range(1 + reference)]
    policy, ref = models[0], (models[1] if reference else None)
    emulation = make_cuda_emulation(torch.bfloat16, emulate_sdpa=True)
    if prepare is not None:
        prepare(policy, ref, emulation)
    policy.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    policy.train()
    if ref is not None:
        ref.eval()
    log = AllocationLog.noting(OPS, PHASE)
    events, charge = log.events, log.charge

    with stack_patch, contextlib.ExitStack() as stack:
        stack.enter_context(FakeTensorMode(allow_non_fake_inputs=True))
        stack.enter_context(make_scalar_fallback())
        for mode in modes:
            stack.enter_context(mode)
        for model in models:
            model.to_empty(device="cpu")
            model.lm_head.weight = model.model.embed_tokens.weight   # to_empty unties them; the checkpoint ties the head
            for p in model.parameters():   # model.to("cuda"): one block per parameter (the tied head is the embedding)
                charge(p, "to_empty")
            for b in model.buffers():
                charge(b, "to_empty")
        opt = torch.optim.AdamW(policy.parameters(), lr=1e-5, fused=True)   # adamw_torch_fused: no foreach transients
        ids = torch.randint(4, 262144, (rows, seq))
        stack.enter_context(log.mode())
        for i in range(steps):
            PHASE[0] = f"step {i + 1} forward"
            with emulation, sdpa_as_gpu(emulation):
                loss = step(policy, ref, ids, emulation)
                emulation.end_region()
                PHASE[0] = f"step {i + 1} backward"
                emulation.casting = True   # checkpoint's recompute runs under the forward's autocast state
                emulation.backward(loss)
                del loss
            PHASE[0] = f"step {i + 1} optimizer"
            torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0, foreach=True)
            opt.step()
            opt.zero_grad(set_to_none=True)
    return events


def sft_step(fused: bool) -> Step:
    """SFTTrainer's step: the model's own loss on ``labels`` (1.14.2's nll, full logits) or TRL's fused head."""

    def step(policy: Any, ref: Any, ids: Any, emulation: Any) -> Any:
        batch = {"input_ids": ids.clone(), "labels": ids.clone()}
        out = policy(**batch, fused_lm_head=True) if fused else policy(**batch)
        loss = out.loss
        del out, batch
        return loss

    return step


def add_fused_head(policy: Any, ref: Any, emulation: Any) -> None:
    from trl.trainer.utils import add_fused_lm_head

    add_fused_lm_head(policy)


def events_of_run(seq: int, fused: bool = True, steps: int = 2, layers: int | None = None,
                  unpadded: bool = True) -> list[tuple[str, int, int]]:
    """The SFT run's allocation events in order: the weights, then ``steps`` training steps (``unpadded`` False: the
    full-attention layers keep a bool mask too, as a padded batch's do)."""
    return events_of_steps(seq, sft_step(fused), steps, layers, prepare=add_fused_head if fused else None,
                           unpadded=unpadded)


def replay(events: list[tuple[str, int, int]], cap: int | None = CAP) -> Allocator:
    alloc = Allocator(limit=cap)
    alloc.replay(events)
    return alloc


def fits(events: list[tuple[str, int, int]]) -> tuple[bool, Allocator]:
    return replay_under(events, CAP, OPS.get)


def print_peak(events: list[tuple[str, int, int]], seq: int, label: str) -> None:
    """The uncapped replay's peaks and the storages of 0.25 GiB or more alive at the live peak."""
    a = replay(events, cap=None)
    peak, at = live_peak(events)
    print(f"s={seq} {label}: live peak {peak / GiB:.3f} GiB, allocator allocated "
          f"{a.peak_allocated / GiB:.3f}, reserved {a.peak_reserved / GiB:.3f}, segments {a.segments}")
    big = sorted(((b, k) for k, b in at.items() if b >= GiB // 4), reverse=True)
    print(f"alive at the peak: {len(at)} storages; those of 0.25 GiB or more ({sum(b for b, _ in big) / GiB:.3f} GiB):")
    for b, k in big:
        print(f"  {b / GiB:8.3f} GiB  {b / seq**2:6.3f} B/s^2  {OPS[k]}")


def search(events_at: Callable[[int], list[tuple[str, int, int]]], lo: int, hi: int) -> int:
    """The longest multiple of 1,024 in [lo, hi) whose events survive the capped replay (lo fits, hi does not)."""
    lo, hi = lo // 1024, hi // 1024
    while hi - lo > 1:
        mid = (lo + hi) // 2
        ok, a = fits(events_at(mid * 1024))
        print(f"s={mid * 1024}: {'fits' if ok else 'OOM'} reserved {a.reserved / GiB:.3f} allocated "
              f"{a.allocated / GiB:.3f} peak allocated {a.peak_allocated / GiB:.3f}", flush=True)
        lo, hi = (mid, hi) if ok else (lo, mid)
    print(f"longest fitting: {lo * 1024}")
    return lo * 1024


def main() -> int:
    args = sys.argv[1:]
    fused = "--full-logits" not in args
    steps = int(args[args.index("--steps") + 1]) if "--steps" in args else 2
    unpadded = "--full-mask" not in args   # the full-attention layers keep a mask, as a padded batch's do
    if "--peak" in args:
        seq = int(args[args.index("--peak") + 1])
        print_peak(events_of_run(seq, fused, steps, unpadded=unpadded), seq, f"fused={fused} unpadded={unpadded}")
    if "--search" in args:
        i = args.index("--search")
        search(lambda s: events_of_run(s, fused, steps, unpadded=unpadded), int(args[i + 1]), int(args[i + 2]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
