"""The 2021 HF blog's t5-large DDP fp32 step (bench row 761, 'Fit More and Train Faster With ZeRO via DeepSpeed and
FairScale') as a sequence of allocations and frees at the real shape, on fake tensors, replayed through the caching
allocator (scripts/caching_allocator.py).

Why: perfguide prices batch 16 x 128/128 tokens at 26.5 GiB of the TITAN RTX's 23.6 where the blog trained it (its
largest batch); docs/validation.md reads the gap as the run's padded length (each batch padded to its own longest) and
this is the independent check of the bytes at the cut-off: every tensor the step makes, in the order it makes them.

What runs: T5ForConditionalGeneration from t5-large's config (perfguide/data/architectures.json), fp32, dropout 0.1,
eager attention, with ``--freeze_embeds`` (the shared embedding and the head tied to it frozen, examples/seq2seq
utils.py ``freeze_embeds``), and the loop of examples/seq2seq/finetune_trainer.py on transformers 4.2 + PyTorch 1.7.1:

* the weights one block per parameter (Trainer's ``model.to(device)``);
* DistributedDataParallel's construction (PyTorch 1.7.1 distributed.py / reducer.cpp): ``_sync_params_and_buffers``
  broadcasts ``state_dict().values()`` (the tied embedding four times) as flat 250 MB buckets, two in flight at a
  time (c10d ``broadcast_coalesced``), then the Reducer's flat bucket per group of trainable
  parameters (``compute_bucket_assignment_by_size``, 1 MB first bucket then 25 MB, a bucket closing once it reaches its
  limit; ``gradient_as_bucket_view`` False, so the grads stay separate); before the second forward the Reducer rebuilds
  its buckets in the order the grads became ready (``rebuild_buckets``: the old ones are cleared first);
* Seq2SeqTrainer.compute_loss: ``labels = inputs.pop("labels")``, ``model(**inputs, use_cache=False)[0]``,
  ``log_softmax`` and examples/seq2seq utils.py ``label_smoothed_nll_loss`` (epsilon 0.1, ignore_index = pad);
* ``loss.backward()`` (DDP's copies into and out of its buckets are in-place ``copy_`` calls: no allocation);
* PyTorch 1.7's ``clip_grad_norm_`` (a 0-d norm per parameter, stacked), transformers 4.2 ``AdamW.step`` (states
  made lazily, ``denom = exp_avg_sq.sqrt().add_(eps)`` per parameter), ``model.zero_grad()`` (1.7: grads zeroed in
  place, kept).

transformers 4.2.0's modeling_t5 runs when ``--release DIR`` points at ``pip install --no-deps --target DIR
transformers==4.2.0 requests==2.31.0 urllib3==1.26.18 idna certifi charset_normalizer`` (its import-time version check
is skipped); else the installed release (same bytes in fp32: the 4.x/5.x differences are fp16-only, memory/t5_releases.py).
``torch.isinf(hidden_states).any()`` (4.2's unconditional clamp test) reads False, as in a run without overflow.

Usage: python scripts/trace_t5_blog_replay.py [--release DIR] [--batch B] [--len SRC TGT] [--steps N] [--search]
"""

from __future__ import annotations

import contextlib
import os
import sys
import types
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from allocation_log import AllocationLog, live_peak
from caching_allocator import Allocator, largest_fitting, replay_under

GiB = 2**30
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: the op, shape, dtype and phase that made each event's storage (for reading a replay)
OPS: dict[int, tuple[str, tuple[int, ...], str, str]] = {}
PHASE = ["weights"]
AMP = [False]
#: the event count when each step's loss is made (its backward not yet begun)
AFTER_LOSS: list[int] = []
#: torch 1.7 DistributedDataParallel: broadcast_bucket_size 250 MB, first bucket 1 MB (_DEFAULT_FIRST_BUCKET_BYTES),
#: bucket_cap_mb 25
BROADCAST_BUCKET, FIRST_BUCKET, BUCKET_CAP = 250 * 2**20, 2**20, 25 * 2**20
#: the run's flags (issue 8771 commands): --label_smoothing 0.1, --adam_eps 1e-06, Trainer's max_grad_norm 1.0
LABEL_SMOOTHING, ADAM_EPS, BETAS = 0.1, 1e-6, (0.9, 0.999)


def use_release(path: str) -> None:
    """Import transformers from ``path`` (an old release's wheel): its dependency_versions_check wants that era's
    tokenizers."""
    sys.path.insert(0, path)
    stub = types.ModuleType("transformers.dependency_versions_check")
    stub.dep_version_check = lambda pkg, hint=None: None   # type: ignore[attr-defined]
    sys.modules["transformers.dependency_versions_check"] = stub


def t5_config(model: str = "google-t5/t5-large", layers: int | None = None, **over: Any) -> Any:
    from transformers import T5Config

    from perfguide.model.catalog import config_of

    cfg = config_of(model)   # the catalog's config.json values, its ``extends`` followed
    for k in ("model_type", "architectures"):
        cfg.pop(k, None)
    if layers is not None:
        cfg["num_layers"] = cfg["num_decoder_layers"] = layers
    cfg.update(over)
    config = T5Config(**cfg, dropout_rate=cfg.pop("dropout_rate", 0.1), pad_token_id=0, eos_token_id=1,
                      decoder_start_token_id=0)
    config._attn_implementation = "eager"   # 4.x T5 has only eager attention; 5.x would pick SDPA
    return config


def bucket_sizes(numels: list[int], limits: tuple[int, ...] = (FIRST_BUCKET, BUCKET_CAP), elem: int = 4) -> list[int]:
    """torch 1.7 ``compute_bucket_assignment_by_size`` for one dtype: tensors join the open bucket in order, a bucket
    closes once its bytes reach the current limit (then the next limit applies; the last repeats). Elements per bucket."""
    out, cur, i = [], 0, 0
    for n in numels:
        cur += n
        if cur * elem >= limits[min(i, len(limits) - 1)]:
            out.append(cur)
            cur, i = 0, i + 1
    return out + ([cur] if cur else [])


def broadcast_coalesced(tensors: list[Any], limit: int = BROADCAST_BUCKET) -> None:
    """torch 1.x c10d ``broadcast_coalesced`` (DDP's parameter and buffer sync): flat buckets of up to ``limit`` bytes
    per dtype, at most two in flight (``max_in_flight = 2``: the oldest finishes and its flat is freed before a third
    is made), the last two freed at the end."""
    import torch

    in_flight: list[Any] = []
    for dtype in dict.fromkeys(t.dtype for t in tensors):
        for n in bucket_sizes([t.numel() for t in tensors if t.dtype == dtype], (limit,), dtype.itemsize):
            if len(in_flight) >= 2:
                in_flight.pop(0)
            in_flight.append(torch.empty(n, dtype=dtype))
    while in_flight:
        in_flight.pop(0)


def ddp_start(phase: list[str], broadcast: list[Any], trainable: list[Any]) -> list[Any]:
    """DDP's construction as torch 1.x allocates it: the broadcast of ``broadcast`` (the module's state), then the
    Reducer's flat fp32 buckets, in reverse parameter order."""
    import torch

    phase[0] = "ddp broadcast"
    broadcast_coalesced(broadcast)
    phase[0] = "ddp buckets"
    return [torch.empty(n) for n in reversed(bucket_sizes([p.numel() for p in trainable]))]


def ddp_rebuild(phase: list[str], trainable: list[Any], buckets: list[Any]) -> list[Any]:
    """``rebuild_buckets`` before the second forward: the old buckets freed, new ones in grad-ready order (about the
    parameters' reverse)."""
    import torch

    phase[0] = "ddp rebuild"
    buckets.clear()
    return [torch.empty(n) for n in bucket_sizes([p.numel() for p in reversed(trainable)])]


def label_smoothed_nll_loss(lprobs: Any, target: Any, epsilon: float, ignore_index: int) -> Any:
    """examples/seq2seq/utils.py (transformers 4.2) ``label_smoothed_nll_loss`` ("From fairseq"), the loss only."""
    if target.dim() == lprobs.dim() - 1:
        target = target.unsqueeze(-1)
    nll_loss = -lprobs.gather(dim=-1, index=target)
    smooth_loss = -lprobs.sum(dim=-1, keepdim=True)
    pad_mask = target.eq(ignore_index)
    nll_loss.masked_fill_(pad_mask, 0.0)
    smooth_loss.masked_fill_(pad_mask, 0.0)
    nll_loss = nll_loss.sum()
    smooth_loss = smooth_loss.sum()
    eps_i = epsilon / lprobs.size(-1)
    return (1.0 - epsilon) * nll_loss + eps_i * smooth_loss


def adamw_42(params: list[Any], state: dict[int, dict[str, Any]], lr: float = 3e-5) -> None:
    """transformers 4.2 optimization.py ``AdamW.step`` (weight_decay 0: the run sets none), per parameter."""
    import torch

    for p in params:
        if p.grad is None:
            continue
        grad = p.grad.data
        st = state.setdefault(id(p), {})
        if not st:
            st["step"] = 0
            st["exp_avg"] = torch.zeros_like(p.data)
            st["exp_avg_sq"] = torch.zeros_like(p.data)
        exp_avg, exp_avg_sq = st["exp_avg"], st["exp_avg_sq"]
        st["step"] += 1
        exp_avg.mul_(BETAS[0]).add_(grad, alpha=1.0 - BETAS[0])
        exp_avg_sq.mul_(BETAS[1]).addcmul_(grad, grad, value=1.0 - BETAS[1])
        denom = exp_avg_sq.sqrt().add_(ADAM_EPS)
        p.data.addcdiv_(exp_avg, denom, value=-lr)


def clip_grad_norm_17(params: list[Any], max_norm: float = 1.0) -> None:
    """PyTorch 1.7 ``clip_grad_norm_`` (norm_type 2): a 0-d norm per grad, stacked, then an in-place scale."""
    import torch

    grads = [p.grad for p in params if p.grad is not None]
    total = torch.norm(torch.stack([torch.norm(g.detach(), 2.0) for g in grads]), 2.0)
    coef = max_norm / (total + 1e-6)
    for g in grads:   # the real run scales only when coef < 1: in place either way, no allocation
        g.detach().mul_(coef)


def scalar_fallback() -> Any:
    """``.item()`` / ``bool()`` on a fake tensor: False for a bool (4.2's ``isinf(...).any()``: no overflow), else 1."""
    from perfguide.memory.tracing.cuda_emulation import make_scalar_fallback

    return make_scalar_fallback(bool_answer=False)


def events_of_run(batch: int, src: int, tgt: int, steps: int = 3, config: Any = None,
                  amp: bool = False) -> list[tuple[str, int, int]]:
    """The run's allocation events in order: weights, DDP's construction, then ``steps`` training steps. ``amp``: row
    762's ``--fp16`` (Trainer 4.2's native amp: ``with autocast(): loss = self.compute_loss(...)``, then
    ``scaler.scale(loss).backward()``; the scaler's unscale and step work in place on the fp32 grads)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from transformers import T5ForConditionalGeneration

    from perfguide.memory.tracing.cuda_emulation import make_cuda_emulation

    AFTER_LOSS.clear()
    OPS.clear()
    PHASE[0] = "weights"
    config = config if config is not None else t5_config()
    log = AllocationLog.noting(OPS, PHASE)
    charge = log.charge
    # CUDA's autocast lists (amp) and fused dropout (1-byte mask)
    emulation = make_cuda_emulation(torch.float16 if amp else None, emulate_sdpa=True)
    with contextlib.ExitStack() as stack:
        stack.enter_context(FakeTensorMode(allow_non_fake_inputs=True))
        stack.enter_context(scalar_fallback())
        model = T5ForConditionalGeneration(config)   # built on fake tensors (its init runs on them; ties kept)
        model.train()
        assert model.lm_head.weight is model.shared.weight
        for p in model.shared.parameters():   # --freeze_embeds
            p.requires_grad_(False)
        params = list(model.parameters())
        for p in params:   # model.to("cuda"): one block per parameter
            charge(p, "to(cuda)")
        trainable = [p for p in params if p.requires_grad]
        stack.enter_context(log.mode())
        # the tied embedding four times in the state, as 1.7 passes it
        buckets = ddp_start(PHASE, list(model.state_dict().values()), trainable)
        state: dict[int, dict[str, Any]] = {}
        for step in range(steps):
            if step == 1:
                buckets = ddp_rebuild(PHASE, trainable, buckets)
            PHASE[0] = f"step {step + 1} forward"
            inputs = {"input_ids": torch.randint(2, 32128, (batch, src)), "attention_mask": torch.ones(batch, src, dtype=torch.long),
                      "decoder_input_ids": torch.randint(2, 32128, (batch, tgt))}
            labels = torch.randint(2, 32128, (batch, tgt))
            emulation.cache_enabled = True   # a new autocast region: its weight-cast cache starts empty
            with emulation:
                logits = model(**inputs, use_cache=False)[0]
                lprobs = torch.nn.functional.log_softmax(logits, dim=-1)
                loss = label_smoothed_nll_loss(lprobs, labels, LABEL_SMOOTHING, config.pad_token_id)
                del logits, lprobs, inputs, labels
                emulation.end_region()
                AFTER_LOSS.append(len(log.events))
                if amp:
                    loss = loss * 65536.0   # GradScaler.scale: a 0-d product
                PHASE[0] = f"step {step + 1} backward"
                emulation.backward(loss)
                del loss
            PHASE[0] = f"step {step + 1} optimizer"
            clip_grad_norm_17(params)
            adamw_42(params, state)
            for p in trainable:   # torch 1.7 Module.zero_grad: detach_() and zero_() in place
                p.grad.detach_().zero_()
    return log.events


def breakdown(at: dict[int, int], ops: dict[int, tuple[str, tuple[int, ...], str, str]] = OPS) -> dict[str, int]:
    """Bytes alive at the peak by the phase that made them (and, for steps, by op)."""
    out: dict[str, int] = {}
    for k, b in at.items():
        op, _, _, phase = ops[k]
        key = phase if not phase.endswith(("forward", "backward")) else f"{phase}: {op}"
        out[key] = out.get(key, 0) + b
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def fits(batch: int, src: int, tgt: int, cap: int, steps: int = 3) -> tuple[bool, Allocator]:
    return replay_under(events_of_run(batch, src, tgt, steps, amp=AMP[0]), cap, OPS.get)


def card_cap(row_id: str = "761") -> int:
    """The bytes the allocator may reserve on the row's card: perfguide's TITAN RTX (CUDA's allocatable bytes) less
    the CUDA context and NCCL's buffers it prices for the row (bench/accuracy.py: 761 fp32, 762 amp)."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import csv

    import accuracy as acc

    row = next(r for r in csv.DictReader(open(acc.CSV)) if r["row_id"] == row_id)
    with acc.held_out(row["source_group"]), acc.t5_release(row), acc.torch_era(row):
        spec = acc._spec(row["model_hf_id"])
        setup = acc._train_setup(row, spec)
        spec = acc.trained_spec(row, spec)
        hw = acc._hardware(row["gpu_type"], setup.num_gpus)
        est = acc._verdict_estimate(row, spec, setup, hw)
    assert est.capacity is not None
    return int(est.capacity - est.cuda_context - est.nccl_buffers)


def main() -> int:
    args = sys.argv[1:]
    if "--release" in args:
        use_release(args[args.index("--release") + 1])
    batch = int(args[args.index("--batch") + 1]) if "--batch" in args else 16
    src, tgt = (int(args[args.index("--len") + 1]), int(args[args.index("--len") + 2])) if "--len" in args else (128, 128)
    steps = int(args[args.index("--steps") + 1]) if "--steps" in args else 3
    AMP[0] = "--amp" in args
    import transformers

    print(f"transformers {transformers.__version__}")
    if "--search-len" in args:   # the longest padded length (source = target) at which --batch fits
        cap = card_cap("762" if AMP[0] else "761")
        lo, hi = 32, src + 1   # lo fits, hi does not (checked below for hi = src)
        ok, _ = fits(batch, src, src, cap, steps)
        if ok:
            print(f"b={batch}: fits at {src}/{src}")
            return 0
        while hi - lo > 1:
            mid = (lo + hi) // 2
            ok, a = fits(batch, mid, mid, cap, steps)
            print(f"b={batch} {mid}/{mid}: {'fits' if ok else 'OOM'} peak allocated {a.peak_allocated / GiB:.3f} "
                  f"reserved {a.peak_reserved / GiB:.3f}", flush=True)
            lo, hi = (mid, hi) if ok else (lo, mid)
        print(f"b={batch}: longest fitting length {lo}")
        return 0
    if "--search" in args:
        cap = card_cap("762" if AMP[0] else "761")
        print(f"cap on reserved bytes: {cap / GiB:.3f} GiB")
        largest_fitting(lambda b: fits(b, src, tgt, cap, steps), max(1, batch - 6), lambda b: f"b={b} {src}/{tgt}")
        return 0
    events = events_of_run(batch, src, tgt, steps, amp=AMP[0])
    a = Allocator()
    a.replay(events)
    peak, at = live_peak(events)
    print(f"b={batch} {src}/{tgt}: live peak {peak / GiB:.3f} GiB, allocator allocated {a.peak_allocated / GiB:.3f}, "
          f"reserved {a.peak_reserved / GiB:.3f}, segments {a.segments}")
    for k, v in breakdown(at).items():
        if v >= 2**20:
            print(f"  {v / GiB:8.4f} GiB  {k}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
