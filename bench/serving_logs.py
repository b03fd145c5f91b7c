"""Published engine start-up logs as bench rows (bench/serving_log_rows.py): what vLLM / SGLang printed, with the
setup and version stated in the same log or issue, and perfguide's prediction of the same figure from the model
shape and datasheet alone.

Four kinds of figure, each checking one part of the account:
- ``weights``: "Model loading took X GiB" / "Load weight end ... mem usage" (vLLM printed GiB as "GB" before 0.8):
  the per-rank weight bytes of the format (experts included, the checkpoint's ignore list kept 16-bit) under TP;
- ``kv_tokens``: the tokens (or blocks x 16) the engine cut from the KV memory it logged: the per-token bytes of
  every layer, the block size, what a rank holds under TP;
- ``kv_gib``: "Available KV cache memory" / kv_cache_size: the whole budget rule (utilization, weights, the
  profiled activation peak - the forward or the sampler, whichever is larger - non-torch memory; CUDA graphs
  only from vLLM 0.21, where they entered the rule);
- ``pool_tokens``: SGLang's "#tokens" from mem_fraction_static: its whole rule, in tokens.
Nothing in perfguide/data/serving.json was fitted to a row marked out of sample.
"""

from __future__ import annotations

from _report import SourceSummary
from serving_log_notes import DISAGREEMENTS
from serving_log_rows import ROWS, LogRow

from perfguide import Hardware, engines
from perfguide.memory.overhead import cuda_context_bytes
from perfguide.model.types import ModelSpec
from perfguide.setup import ServingSetup

GiB = 1024**3
__all__ = ["ROWS", "LogRow", "error", "predict", "report_lines"]


def _setup(row: LogRow) -> ServingSetup:
    """The row's setup; before vLLM 0.21 the graphs were captured after the cache was sized, so none are budgeted."""
    serving = ServingSetup(engine=row.engine, **row.serving)
    if row.engine == "vllm" and not row.graphs_in_budget:
        serving = serving.model_copy(update={"enforce_eager": True})
    return serving


def predict(row: LogRow) -> float:
    """perfguide's figure for the row, from the model shape and the GPU datasheet (or the CUDA total it printed)."""
    spec = ModelSpec.from_any(row.model)
    serving = _setup(row)
    engine = engines.server(row.engine)
    if row.kind == "weights":   # as the engine's own load figure counts them (rotary table; SGLang: allocator rounding)
        gpu = Hardware.from_name(row.gpu).smallest_gpu if row.gpu else None
        return engine.loaded_weight_bytes(spec, serving, gpu.vendor if gpu else row.vendor) / GiB
    if row.kind == "kv_tokens":
        assert row.kv_gib is not None
        pool = engine.pool_layout(spec, serving)
        blocks = int(row.kv_gib * GiB) // int(pool.page_bytes * pool.group)
        if pool.states or pool.per_request != -(-serving.max_model_len // pool.block_size):
            # a hybrid's pool (recurrent states, or sliding and full groups), logged as its concurrency x max_model_len
            return int(blocks / pool.per_request * serving.max_model_len)
        return blocks * pool.block_size
    assert row.gpu is not None
    hardware = Hardware.from_name(row.gpu)
    mem = engine.memory(spec, serving, hardware)
    if row.kind == "pool_tokens":
        return mem.kv_cache_tokens
    kv = mem.kv_cache_bytes
    if row.total_gib is not None:   # the same rule on the total the engine printed
        kv += engine.budget(int(row.total_gib * GiB), cuda_context_bytes(hardware), serving) - mem.budget
    return kv / GiB


def error(row: LogRow, predicted: float) -> float:
    """Relative error; a KV budget near zero is compared in GiB of the GPU's memory instead (1 GiB of 80 = 1.3%)."""
    if row.kind == "kv_gib" and abs(row.published) < 4:
        total = row.total_gib * GiB if row.total_gib else Hardware.from_name(row.gpu or "h100-80gb").smallest_gpu.memory_total  # type: ignore[union-attr]
        return (predicted - row.published) * GiB / total
    return predicted / row.published - 1


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report_lines() -> list[str]:
    """Every published start-up log row, then the error per source (median of per-source medians) and per kind,
    out of sample, then each disagreement with who is right."""
    lines = ["## Engine start-up logs (vLLM, SGLang)", "",
             "Figures the engines printed at start-up, with the setup and version stated in the same log (bench/serving_log_rows.py",
             "marks what is inferred); perfguide predicts each from the model shape and the GPU datasheet (bench/serving_logs.py",
             "says what each kind checks). A KV budget near zero is compared in GiB of the GPU's memory (1 GiB of 80 reads 1.3%).",
             "", "| setup | engine | kind | published | predicted | error | source |", "|---|---|---|---|---|---|---|"]
    by_source: dict[str, list[float]] = {}
    by_kind: dict[str, list[float]] = {}
    for row in ROWS:
        predicted = predict(row)
        err = error(row, predicted)
        mark = " (in sample)" if row.in_sample else ""
        lines.append(f"| {row.label}{mark} | {row.engine} {row.version} | {row.kind} | {row.published:,.2f} | {predicted:,.2f} | "
                     f"{err:+.1%} | {row.source} |")
        if not row.in_sample:
            by_source.setdefault(row.source, []).append(abs(err))
            by_kind.setdefault(row.kind, []).append(abs(err))
    every = [e for errs in by_source.values() for e in errs]
    summary = SourceSummary.of(by_source)
    medians = list(summary.medians.values())
    budget = [e for kind in ("kv_gib", "pool_tokens") for e in by_kind.get(kind, [])]
    lines += ["", f"Out of sample: {len(every)} rows from {len(by_source)} sources ({len(ROWS)} rows in all); median of per-source "
                  f"medians {summary.median_of_medians:.1%}, p90 of the per-source medians {_pct(medians, 0.9):.1%} (worst source "
                  f"{summary.worst[1]:.1%}); over all rows median {_pct(every, 0.5):.1%}, p90 {_pct(every, 0.9):.1%}; whole-budget rows "
                  f"(kv_gib, pool_tokens) median {_pct(budget, 0.5):.1%}, p90 {_pct(budget, 0.9):.1%}.",
              "", "| source | rows | median abs error |", "|---|---|---|"]
    lines += [f"| {src} | {len(by_source[src])} | {med:.1%} |" for src, med in summary.medians.items()]
    lines += ["", "| kind | rows | median abs error | p90 |", "|---|---|---|---|"]
    lines += [f"| {kind} | {len(errs)} | {_pct(errs, 0.5):.1%} | {_pct(errs, 0.9):.1%} |" for kind, errs in by_kind.items()]
    return [*lines, "", *DISAGREEMENTS, ""]
