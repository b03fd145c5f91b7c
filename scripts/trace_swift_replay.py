"""ms-swift's benchmark runs (bench rows 1900-1995) replayed through the caching allocator over the lengths each run
saw: the reading docs/validation.md section 31 tests.

swift pads each batch to its own longest sample and its trainer reports torch.cuda.max_memory_reserved() over the
whole run. Far below the card the caching allocator never returns a segment (scripts/caching_allocator.py), so the
reserved bytes grow with the lengths the run requested. This script:

* traces one micro-step (forward, loss, backward; the optimizer step separately) of the Qwen-1 step as the rows ran
  it, on fake tensors at the model's real shape: transformers' Llama modules at Qwen-1's sizes (MHA, FFN, vocabulary
  151,936 / 152,064; Qwen-1's fused c_attn is three Linears here), bf16 weights, LoRA r 8 / alpha 32 / dropout 0.05
  written as peft 0.7's Linear.forward (``result += lora_B(lora_A(dropout(x))) * scaling``) on the attention
  projections, reentrant checkpointing, flash kernel, Qwen-1's loss (QWenLMHeadModel.forward: bf16 logits, the
  shifted ``.contiguous()`` slice, CrossEntropyLoss under bf16 autocast, so in fp32), accelerate's
  convert_outputs_to_fp32 (an fp32 copy of the logits replaces the bf16 ones) and swift's token accuracy (argmax),
  the outputs dropped before backward (swift trainers.py compute_loss);
* reads each event's size as affine in the padded length (traced at two lengths, the event order checked equal and
  a third length checked to the byte), so a run of thousands of lengths costs two traces;
* draws each run's sample lengths from the published token statistics (bench/data/swift_dataset_lengths.csv),
  drops those above max_length (truncation_strategy 'delete'), shuffles, pads each batch to its longest, and replays
  every micro-step's events in order (the optimizer step after every 16th), reporting the maximum reserved bytes.

Usage: python scripts/trace_swift_replay.py [--write]   (``--write``: bench/data/swift_replays.csv)
"""

from __future__ import annotations

import contextlib
import csv
import math
import os
import random
import sys
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from allocation_log import AllocationLog
from caching_allocator import Allocator

GiB = 2**30
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LENGTHS_TABLE = os.path.join(ROOT, "bench", "data", "swift_dataset_lengths.csv")
TABLE = os.path.join(ROOT, "bench", "data", "swift_replays.csv")
#: Qwen-1 sizes (huggingface.co/Qwen/Qwen-{1_8B,7B,14B}-Chat/config.json): hidden, heads, layers, FFN width (half the
#: config's intermediate_size: w1 and w2 each), vocabulary
MODELS: dict[str, tuple[int, int, int, int, int]] = {
    "Qwen/Qwen-1_8B-Chat": (2048, 16, 24, 5504, 151936),
    "Qwen/Qwen-7B-Chat": (4096, 32, 32, 11008, 151936),
    "Qwen/Qwen-14B-Chat": (5120, 40, 40, 13696, 152064),
}
TARGETS = ("q_proj", "k_proj", "v_proj")
Event = tuple[str, int, int]


class LoraLinear:
    """peft 0.7's LoRA Linear forward on a frozen base Linear (adapters in the base weight's dtype)."""

    @staticmethod
    def wrap(base: Any, r: int = 8, alpha: int = 32, dropout: float = 0.05) -> Any:
        import torch

        class Lora(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.base_layer = base
                self.lora_A = torch.nn.Linear(base.in_features, r, bias=False, dtype=base.weight.dtype)
                self.lora_B = torch.nn.Linear(r, base.out_features, bias=False, dtype=base.weight.dtype)
                self.lora_dropout = torch.nn.Dropout(dropout)
                self.scaling = alpha / r

            def forward(self, x: Any) -> Any:
                result = self.base_layer(x)
                result += self.lora_B(self.lora_A(self.lora_dropout(x))) * self.scaling
                return result

        return Lora()


def qwen1_loss(logits: Any, labels: Any, vocab_size: int, **_: Any) -> Any:
    """QWenLMHeadModel.forward's loss: the shifted slice made contiguous, CrossEntropyLoss (fp32 under autocast)."""
    import torch

    shift_logits = logits[..., :-1, :].contiguous()
    shift_labels = labels[..., 1:].contiguous()
    return torch.nn.CrossEntropyLoss()(shift_logits.view(-1, shift_logits.size(-1)), shift_labels.view(-1))


def build(model_id: str, layers: int | None, lora: bool, checkpointing: bool) -> tuple[Any, Any]:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    hidden, heads, n_layers, ffn, vocab = MODELS[model_id]
    config = LlamaConfig(hidden_size=hidden, intermediate_size=ffn, num_attention_heads=heads,
                         num_key_value_heads=heads, num_hidden_layers=layers or n_layers, vocab_size=vocab,
                         max_position_embeddings=8192, rms_norm_eps=1e-6, tie_word_embeddings=False)
    with torch.device("meta"):
        model = LlamaForCausalLM._from_config(config, attn_implementation="sdpa", dtype=torch.bfloat16)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
        model.enable_input_require_grads()
    if lora:
        for p in model.parameters():
            p.requires_grad_(False)
        for layer in model.model.layers:
            for name in TARGETS:
                setattr(layer.self_attn, name, LoraLinear.wrap(getattr(layer.self_attn, name)))
    model.train()
    return model, model


def events_of_step(model_id: str, seq: int, batch: int = 1, lora: bool = True, checkpointing: bool = True,
                   layers: int | None = None) -> tuple[list[Event], list[Event]]:
    """One micro-step's events (forward, loss, swift's accuracy, backward) and the optimizer step's, in order."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from perfguide.memory.tracing.cuda_emulation import make_cuda_emulation, make_scalar_fallback
    from perfguide.memory.tracing.step import _unpacked_rows

    model, base = build(model_id, layers, lora, checkpointing)
    log = AllocationLog()
    events = log.events

    emulation = make_cuda_emulation(torch.bfloat16, emulate_sdpa=True)
    cls = type(base)
    with contextlib.ExitStack() as stack:
        stack.enter_context(_unpacked_rows())
        stack.enter_context(FakeTensorMode(allow_non_fake_inputs=True))
        stack.enter_context(make_scalar_fallback())
        model.to_empty(device="cpu")
        trainable = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(trainable, lr=1e-4, weight_decay=0.01, foreach=True)
        for p in trainable:
            p.grad = torch.zeros_like(p)
        opt.step()                                   # states exist; the earlier micro-steps' gradients are held
        ids = torch.randint(0, MODELS[model_id][4], (batch, seq))
        inputs = {"input_ids": ids, "labels": ids.clone()}
        saved = cls.loss_function
        cls.loss_function = property(lambda self: qwen1_loss)
        stack.callback(setattr, cls, "loss_function", saved)
        existing = [*model.parameters(), *model.buffers(), *(p.grad for p in trainable), *inputs.values(),
                    *(v for state in opt.state.values() for v in state.values() if isinstance(v, torch.Tensor))]
        log.existing(existing)                       # allocated before the step: not replayed
        stack.enter_context(log.mode())
        with emulation:
            out = model(**inputs)
            loss = out.loss
            logits = out.logits.float()              # accelerate convert_outputs_to_fp32
            del out
            preds = logits.argmax(dim=2)             # swift compute_loss: token accuracy
            del logits, preds
            emulation.end_region()
            emulation.backward(loss)
            del loss
        step_events = list(events)
        events.clear()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0, foreach=True)
        opt.step()
    return step_events, list(events)


def affine_events(model_id: str, s1: int, s2: int, **kw: Any) -> tuple[list[tuple[str, int, int, int]], list[Event]]:
    """Each micro-step event as (kind, key, bytes at length 0, bytes per token), from traces at ``s1`` and ``s2``."""
    e1, opt = events_of_step(model_id, s1, **kw)
    e2, _ = events_of_step(model_id, s2, **kw)
    if [(k, key) for k, key, _ in e1] != [(k, key) for k, key, _ in e2]:
        raise ValueError("the step's event order depends on the length")
    out = []
    for (kind, key, n1), (_, _, n2) in zip(e1, e2):
        slope, rest = divmod(n2 - n1, s2 - s1)
        if rest:
            raise ValueError(f"event {key}: {n1} -> {n2} bytes is not affine in the length")
        out.append((kind, key, n1 - slope * s1, slope))
    return out, opt


def at_length(affine: list[tuple[str, int, int, int]], seq: int) -> list[Event]:
    return [(kind, key, base + slope * seq) for kind, key, base, slope in affine]


def _live(events: list[Event]) -> list[int]:
    freed = {k for kind, k, _ in events if kind == "f"}
    return [k for kind, k, _ in events if kind == "a" and k not in freed]


def replay_run(affine: list[tuple[str, int, int, int]], opt: list[Event], lengths: list[int],
               accumulation: int = 16) -> tuple[Allocator, list[int]]:
    """The allocator after one micro-step per padded length in ``lengths`` (the optimizer step after every
    ``accumulation``-th), and the reserved bytes after each micro-step (for the plateau check)."""
    alloc = Allocator()
    trail = []
    cache: dict[int, list[Event]] = {}
    for n, seq in enumerate(lengths):
        events = cache.get(seq)
        if events is None:
            events = cache[seq] = at_length(affine, seq)
        offset = (2 * n + 1) * 10**7
        alloc.replay([(kind, key + offset, nbytes) for kind, key, nbytes in events])
        for k in _live(events):                  # the loss and what the step leaves are freed before the next
            if k + offset in alloc.live:
                alloc.free(k + offset)
        if (n + 1) % accumulation == 0 and opt:
            offset = (2 * n + 2) * 10**7
            alloc.replay([(kind, key + offset, nbytes) for kind, key, nbytes in opt])
            for k in _live(opt):
                if k + offset in alloc.live:
                    alloc.free(k + offset)
        trail.append(alloc.peak_reserved)
    return alloc, trail


def read_lengths(dataset: str) -> dict[str, float]:
    """The published token statistics of ``dataset`` (mean, std, min, max, size)."""
    with open(LENGTHS_TABLE, newline="") as f:
        for row in csv.DictReader(f):
            if row["dataset"] == dataset:
                return {k: float(row[k]) for k in ("mean", "std", "min", "max", "size")}
    raise KeyError(dataset)


def lognormal_params(mean: float, std: float) -> tuple[float, float]:
    """(mu, sigma) of the log-normal with this mean and standard deviation (moments matched)."""
    sigma2 = math.log(1 + (std / mean) ** 2)
    return math.log(mean) - sigma2 / 2, math.sqrt(sigma2)


def truncated_moments(mu: float, sigma: float, lo: float, hi: float) -> tuple[float, float]:
    """Mean and standard deviation of the log-normal (mu, sigma) restricted to [lo, hi] (closed form)."""
    from statistics import NormalDist

    phi = NormalDist().cdf
    a, b = (math.log(lo) - mu) / sigma, (math.log(hi) - mu) / sigma
    mass = phi(b) - phi(a)
    m1, m2 = (math.exp(k * mu + k * k * sigma * sigma / 2) * (phi(b - k * sigma) - phi(a - k * sigma)) / mass
              for k in (1, 2))
    return m1, math.sqrt(m2 - m1 * m1)


def fitted_params(stats: dict[str, float]) -> tuple[float, float]:
    """(mu, sigma) whose log-normal, restricted to the published [min, max], has the published mean and std: the
    longest samples cut off lower the spread of a plain moment match by about 6%."""
    mean, std = stats["mean"], stats["std"]
    for _ in range(200):
        m, s = truncated_moments(*lognormal_params(mean, std), stats["min"], stats["max"])
        mean, std = mean + stats["mean"] - m, std + stats["std"] - s
    return lognormal_params(mean, std)


def draw_lengths(stats: dict[str, float], n: int, rng: random.Random) -> list[int]:
    """``n`` sample lengths: a log-normal (a positive, right-skewed length; the published max is 7.7 standard
    deviations of the mean's log above the min) restricted to the published [min, max], fitted so that the restricted
    distribution has the published mean and std."""
    mu, sigma = fitted_params(stats)
    lo, hi = int(stats["min"]), int(stats["max"])
    out: list[int] = []
    while len(out) < n:
        x = round(rng.lognormvariate(mu, sigma))
        if lo <= x <= hi:
            out.append(x)
    return out


def run_lengths(stats: dict[str, float], max_length: int, sampled: int | None, batch: int, epochs: int,
                rng: random.Random) -> list[int]:
    """The padded length of every micro-step of a run: the dataset (or ``sampled`` of it) drawn, samples above
    ``max_length`` dropped, shuffled each epoch, batched and padded to each batch's longest."""
    kept = [x for x in draw_lengths(stats, sampled or int(stats["size"]), rng) if x <= max_length]
    steps: list[int] = []
    for _ in range(epochs):
        rng.shuffle(kept)
        steps += [max(kept[i:i + batch]) for i in range(0, len(kept), batch)]
    return steps


#: (model, max_length, lora, samples drawn (None: the whole dataset), batch): the January runs' cells replayed
RUNS: tuple[tuple[str, int, bool, int | None, int], ...] = (
    ("Qwen/Qwen-1_8B-Chat", 512, True, None, 1), ("Qwen/Qwen-1_8B-Chat", 1024, True, None, 1),
    ("Qwen/Qwen-1_8B-Chat", 2048, True, None, 1), ("Qwen/Qwen-1_8B-Chat", 4096, True, 1000, 1),
    ("Qwen/Qwen-1_8B-Chat", 8192, True, 1000, 1),
    ("Qwen/Qwen-7B-Chat", 512, True, None, 1), ("Qwen/Qwen-7B-Chat", 1024, True, None, 1),
    ("Qwen/Qwen-7B-Chat", 2048, True, None, 1), ("Qwen/Qwen-7B-Chat", 4096, True, 1000, 1),
)
SEEDS = (0, 1, 2)
SOURCE = ("scripts/trace_swift_replay.py: the Qwen-1 LoRA step (Llama modules at Qwen-1's sizes, bf16, reentrant "
          "checkpointing, flash kernel, Qwen-1's loss, accelerate's fp32 logits) replayed by scripts/caching_allocator.py "
          "over one epoch of lengths drawn from bench/data/swift_dataset_lengths.csv (restricted log-normal, 'delete' "
          "above max_length, batch 1), seeds 0-2; run_* of the median seed, min / max over the seeds")


def main() -> int:
    write = "--write" in sys.argv[1:]
    stats = read_lengths("cls-fudan-news-zh")
    traces: dict[tuple[str, bool], Any] = {}
    rows = []
    print("model  max_length  steps  run reserved GiB (median, min-max over seeds)  cached GiB  one step at max_length")
    for model_id, max_length, lora, sampled, batch in RUNS:
        if (model_id, lora) not in traces:
            traces[model_id, lora] = affine_events(model_id, 1024, 2048, lora=lora)
        affine, opt = traces[model_id, lora]
        one, _ = replay_run(affine, opt, [max_length] * 3)
        results = []
        for seed in SEEDS:
            lengths = run_lengths(stats, max_length, sampled, batch, 1, random.Random(seed))
            alloc, trail = replay_run(affine, opt, lengths)
            half = trail[len(trail) // 2]
            results.append((alloc.peak_reserved, alloc.peak_allocated, len(lengths), half))
        results.sort()
        med = results[len(results) // 2]
        print(f"{model_id} {max_length} {med[2]} {med[0] / GiB:.2f} ({results[0][0] / GiB:.2f}-{results[-1][0] / GiB:.2f}) "
              f"cached {(med[0] - med[1]) / GiB:.2f} (half-run {med[3] / GiB:.2f}); one length: "
              f"{one.peak_reserved / GiB:.2f} reserved, {one.peak_allocated / GiB:.2f} allocated", flush=True)
        rows.append((model_id, max_length, "lora" if lora else "full", batch, med[2], med[1], med[0],
                     results[0][0], results[-1][0], one.peak_allocated, one.peak_reserved))
    if write:
        with open(TABLE, "w", newline="") as f:
            out = csv.writer(f)
            out.writerow(["model_hf_id", "max_length", "method", "micro_batch", "steps", "run_allocated_bytes",
                          "run_reserved_bytes_median", "run_reserved_bytes_min", "run_reserved_bytes_max",
                          "fixed_length_allocated_bytes", "fixed_length_reserved_bytes", "source"])
            out.writerows([*row, SOURCE] for row in rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
