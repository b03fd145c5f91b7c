"""The 2022 HF blog 'Accelerate Large Model Training using DeepSpeed' DDP rows (bench rows 1159: DeBERTa-v2-xlarge-mnli
on MRPC, published max batch 8; 1161: BlenderBot-400M-distill on MuDoConv, source 128 / target 64 tokens, max batch
100; 2x TITAN RTX, fp16 AMP) as a sequence of allocations and frees at the real shape, on fake tensors, replayed
through the caching allocator (scripts/caching_allocator.py) under the card's cap.

Why: perfguide prices row 1159's batch 9 under the card (max batch 9 against 8) and row 1161's 128 (against 100);
the replay runs the release's own modeling code and the blog's loop, so it reads every tensor the step makes in the
order it makes it, and the reserved bytes that order leaves.

What runs: DebertaV2ForSequenceClassification (2 labels, --ignore_mismatched_sizes) and
BlenderbotForConditionalGeneration from their config.json shapes (bench/accuracy_configs.py), fp32 weights, the
configs' dropouts, on transformers 4.22 (``--release DIR``: ``pip install --no-deps --target DIR transformers==4.22.2
requests==2.31.0 urllib3==1.26.18 idna certifi charset_normalizer``), accelerate 0.12 and PyTorch 1.12.1, the loops of
the blog's scripts (github.com/pacman100/accelerate-deepspeed-test src/modeling/run_cls_no_trainer.py,
run_seq2seq_no_trainer.py; scripts/cls_no_deepspeed.sh, seq2seq_no_deepspeed.sh):

* ``model.to(device)``: one block per parameter and buffer;
* DistributedDataParallel as accelerate 0.12 builds it (no kwargs): the construction's broadcast of the parameters and
  buffers, the Reducer's 1 MB + 25 MB flat buckets and their rebuild, each forward's buffer broadcast (the helpers of
  scripts/trace_t5_blog_replay.py, as scripts/trace_gpt2_fsdp_blog_replay.py runs them for torch 1.12);
* ``outputs = model(**batch)`` under accelerate's ``convert_outputs_to_fp32(autocast()(forward))``; the loss inside
  the model (DeBERTa's CrossEntropyLoss over 2 labels; BlenderBot's over ``lm_logits + final_logits_bias``, labels
  padded with -100); the seq2seq loop builds ``decoder_input_ids`` from the labels first; ``outputs`` rebound each
  step (the previous step's output lives through the next forward);
* ``accelerator.backward(loss)`` (``scaler.scale(loss).backward()``), the optimizer through the scaler (unscale in
  place): torch 1.12's single-tensor ``AdamW`` (cls) / ``Adam`` (seq2seq), weight decay 0 (both scripts' default /
  flag), whose ``denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)`` makes two temporaries per parameter
  while the previous parameter's ``denom`` is still bound; ``optimizer.zero_grad()`` in place (set_to_none False).

Usage: python scripts/trace_accds_blog_replay.py [--release DIR] {deberta|blenderbot} [--batch B] [--len L]
       [--steps N] [--fp32] [--search]
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from collections.abc import Callable
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from allocation_log import AllocationLog, live_at, live_peak
from caching_allocator import Allocator, largest_fitting, replay_under
from trace_gpt2_fsdp_blog_replay import ddp_amp_run
from trace_t5_blog_replay import ROOT, GiB, breakdown, card_cap, scalar_fallback, use_release

#: the op, shape, dtype and phase that made each event's storage (for reading a replay)
OPS: dict[int, tuple[str, tuple[int, ...], str, str]] = {}
PHASE = ["weights"]
#: the event count when each step's output is returned (its backward not yet begun)
AFTER_FORWARD: list[int] = []
#: the rows: model id, bench row, the padded lengths (source, target; DeBERTa's --max_length 128 read as the cut-off)
ROWS = {"deberta": ("microsoft/deberta-v2-xlarge-mnli", "1159", (128, 0)),
        "blenderbot": ("facebook/blenderbot-400M-distill", "1161", (128, 64))}
BETAS, EPS = (0.9, 0.999), 1e-8


def config_of(kind: str, **over: Any) -> Any:
    """The row's model config from its config.json shape (bench/accuracy_configs.py), eager attention."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from accuracy_configs import CONFIGS
    from transformers import BlenderbotConfig, DebertaV2Config

    cfg = {k: v for k, v in CONFIGS[ROWS[kind][0]].items() if k not in ("model_type", "architectures", "_name_or_path", "torch_dtype")}
    cfg.update(over)
    if kind == "deberta":
        config = DebertaV2Config(**cfg, num_labels=2)   # --ignore_mismatched_sizes: a fresh 2-label MRPC head
    else:   # blenderbot-400M-distill's config.json token ids
        config = BlenderbotConfig(**cfg, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
    config._attn_implementation = "eager"
    return config


def adam_112(params: list[Any], state: dict[int, dict[str, Any]], lr: float = 2e-5) -> None:
    """PyTorch 1.12 ``_single_tensor_adam(w)`` (foreach unset: the per-tensor loop), weight decay 0, in its order:
    ``denom`` stays bound to the previous parameter's until the new one is made."""
    import torch

    with torch.no_grad():   # Optimizer.step runs under no_grad
        _adam_loop(params, state, lr)


def _adam_loop(params: list[Any], state: dict[int, dict[str, Any]], lr: float) -> None:
    import torch

    denom = None
    for p in params:
        if p.grad is None:
            continue
        st = state.setdefault(id(p), {})
        if not st:   # 1.12: step a CPU scalar tensor; the moments zeros_like on the parameter's device
            st["step"] = 0
            st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        grad, exp_avg, exp_avg_sq = p.grad, st["exp_avg"], st["exp_avg_sq"]
        st["step"] += 1
        exp_avg.mul_(BETAS[0]).add_(grad, alpha=1 - BETAS[0])
        exp_avg_sq.mul_(BETAS[1]).addcmul_(grad, grad.conj(), value=1 - BETAS[1])
        bias_correction1 = 1 - BETAS[0] ** st["step"]
        bias_correction2_sqrt = math.sqrt(1 - BETAS[1] ** st["step"])
        denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(EPS)
        p.addcdiv_(exp_avg, denom, value=-lr / bias_correction1)
    del denom


def all_nonzero() -> Any:
    """``nonzero`` on a fake tensor: every element set (DeBERTa 4.22's ``(labels >= 0).nonzero()``: MRPC's labels are
    0 or 1, none ignored), an index per element."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class AllNonzero(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if func is torch.ops.aten.nonzero.default:
                t = args[0]
                return torch.empty((t.numel(), t.dim()), dtype=torch.long)
            return func(*args, **(kwargs or {}))

    return AllNonzero()


def batch_of(kind: str, config: Any, batch: int, src: int, tgt: int) -> dict[str, Any]:
    """The collated batch on the device: DataCollatorWithPadding's (cls) / default padding to max length (seq2seq)."""
    import torch

    if kind == "deberta":
        return {"input_ids": torch.randint(5, config.vocab_size, (batch, src)),
                "token_type_ids": torch.zeros(batch, src, dtype=torch.long),
                "attention_mask": torch.ones(batch, src, dtype=torch.long), "labels": torch.randint(0, 2, (batch,))}
    labels = torch.randint(5, config.vocab_size, (batch, tgt))
    out = {"input_ids": torch.randint(5, config.vocab_size, (batch, src)),
           "attention_mask": torch.ones(batch, src, dtype=torch.long), "labels": labels}
    decoder_input_ids = labels.new_zeros(labels.shape)   # run_seq2seq_no_trainer.py's shift, verbatim in effect
    decoder_input_ids[..., 1:] = labels[..., :-1].clone()
    decoder_input_ids[..., 0] = 0
    decoder_input_ids.masked_fill_(decoder_input_ids == -100, 0)
    out["decoder_input_ids"] = decoder_input_ids
    return out


def events_of_run(kind: str, batch: int, src: int, tgt: int = 0, steps: int = 3,
                  config: Any = None, amp: bool = True) -> list[tuple[str, int, int]]:
    """The run's allocation events in order: weights and buffers, DDP's construction, then ``steps`` steps. ``amp``
    False: accelerate without mixed precision (a check of the rows' inferred fp16; docs/validation.md 35)."""
    import torch

    from perfguide.memory.tracing.cuda_emulation import make_cuda_emulation

    AFTER_FORWARD.clear()
    OPS.clear()
    PHASE[0] = "weights"
    config = config if config is not None else config_of(kind)
    log = AllocationLog.noting(OPS, PHASE)
    emulation = make_cuda_emulation(torch.float16 if amp else None, emulate_sdpa=True)
    with contextlib.ExitStack() as stack:
        model = fake_model(stack, kind, config)
        ddp_amp_run(model, stack, log, emulation, steps, amp, lambda: batch_of(kind, config, batch, src, tgt), adam_112,
                    PHASE, AFTER_FORWARD, hold_batch=False)
    return log.events


def fake_model(stack: contextlib.ExitStack, kind: str, config: Any) -> Any:
    """The row's model from ``config`` on fake tensors, in train mode, with the fake-mode helpers every replay of
    this blog enters on ``stack`` (the DDP and the ZeRO-2 replays)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from transformers import BlenderbotForConditionalGeneration, DebertaV2ForSequenceClassification

    stack.enter_context(FakeTensorMode(allow_non_fake_inputs=True))
    stack.enter_context(scalar_fallback())
    stack.enter_context(all_nonzero())
    cls = DebertaV2ForSequenceClassification if kind == "deberta" else BlenderbotForConditionalGeneration
    model = cls(config)
    model.train()
    return model


def fits(kind: str, batch: int, src: int, tgt: int, cap: int, steps: int = 3,
         amp: bool = True) -> tuple[bool, Allocator]:
    return replay_under(events_of_run(kind, batch, src, tgt, steps, amp=amp), cap, OPS.get)


def run_args(args: list[str]) -> tuple[str, int, int, int, int]:
    """The CLI's row and shape (kind, source and target length, batch, steps) after ``--release`` is put first on the
    path; ``--len`` is the (source) padded length in place of the row's cut-off. Shared with the ZeRO-2 replay."""
    if "--release" in args:
        use_release(args[args.index("--release") + 1])
    kind = next(a for a in args if a in ROWS)
    src, tgt = ROWS[kind][2]
    if "--len" in args:
        src = int(args[args.index("--len") + 1])
    batch = int(args[args.index("--batch") + 1]) if "--batch" in args else 8
    steps = int(args[args.index("--steps") + 1]) if "--steps" in args else 3
    return kind, src, tgt, batch, steps


def search(gpu: str, fits_at: Callable[[int, int], tuple[bool, Allocator]], batch: int, shape: str) -> None:
    """The largest batch from ``batch`` up whose replay fits under ``gpu``'s cap (``fits_at(batch, cap)``), printed."""
    cap = card_cap(gpu)
    print(f"cap on reserved bytes: {cap / GiB:.3f} GiB")
    largest_fitting(lambda b: fits_at(b, cap), batch, lambda b: f"b={b} {shape}")


def main() -> int:
    args = sys.argv[1:]
    kind, src, tgt, batch, steps = run_args(args)
    amp = "--fp32" not in args
    import transformers

    print(f"transformers {transformers.__version__}")
    if "--search" in args:
        search(ROWS[kind][1], lambda b, cap: fits(kind, b, src, tgt, cap, steps, amp), batch, f"{src}/{tgt}")
        return 0
    print_run(events_of_run(kind, batch, src, tgt, steps, amp=amp), f"b={batch} {src}/{tgt}", OPS, AFTER_FORWARD[-1])
    return 0


def print_run(events: list[tuple[str, int, int]], label: str, ops: dict[int, tuple[str, tuple[int, ...], str, str]],
              last_forward: int, streams: dict[int, int] | None = None) -> None:
    """One replayed run, as the CLI prints it: the live peak and what holds it (``ops``: the run's requests), the
    allocator's peaks, the bytes alive after the last forward (event ``last_forward``); the DDP and ZeRO-2 replays."""
    a = Allocator()
    a.replay(events, streams)
    peak, at = live_peak(events)
    print(f"{label}: live peak {peak / GiB:.3f} GiB, allocator allocated {a.peak_allocated / GiB:.3f}, "
          f"reserved {a.peak_reserved / GiB:.3f}, segments {a.segments}")
    for k, v in breakdown(at, ops).items():
        if v >= 2**20:
            print(f"  {v / GiB:8.4f} GiB  {k}")
    print(f"after the last forward: {sum(live_at(events, last_forward).values()) / GiB:.3f} GiB alive")


if __name__ == "__main__":
    raise SystemExit(main())
