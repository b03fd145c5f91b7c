"""Variable-length rows trained on several ranks: each step waits for the rank with the longest padded batch.

A data collator that pads each batch to its own longest row (``padding=True``, ``pad_to_multiple_of``) gives every
rank a different padded length each step. Under DDP / FSDP the ranks meet in the gradient all-reduce, and under
FSDP in every unit's all-gather and reduce-scatter, so a step lasts as long as its slowest rank's compute, while the
rate a log reports counts the tokens of all ranks. Reading such a row at the ranks' mean padded length prices every
rank as fast as the average one; the step is the slowest rank's.

What the logs give: HF Trainer's ``num_input_tokens_seen`` (``include_num_input_tokens_seen``) after each step, the
padded tokens summed over the ranks. Each step's sum is ``micro_batch x (L_1 + ... + L_n)``, so the spread of the
per-step sums gives the spread of one rank's padded length (ranks draw their batches independently: the variance of
a mean of n ranks is sigma^2 / n). The expected slowest of n ranks then follows from the order statistics of a
normal of that spread, capped at the collator's cut-off (``max_len``): no constant is read off any rate.

The spread is pooled over the runs of one model at one micro-batch and cut-off (the same dataset, tokenizer and
collator: the example's four patching variants), since one run's 4-20 steps give a noisy spread on their own.

Data: bench/data/rank_padding.csv (the logs' cumulative ``num_input_tokens_seen``, step 1 first, as logged).
"""

from __future__ import annotations

import csv
import itertools
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from statistics import mean

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "bench" / "data" / "rank_padding.csv"


@dataclass(frozen=True)
class RankPadding:
    row_id: str
    model: str
    ranks: int
    micro_batch: int
    max_len: int
    rank_means: tuple[float, ...]   # per timed step: the ranks' mean padded length (step 1, the warm-up, left out)

    @property
    def pool(self) -> tuple[str, int, int]:
        return self.model, self.micro_batch, self.max_len


def _entry(raw: dict[str, str]) -> RankPadding:
    """One validated row: the totals must be whole padded batches (multiples of micro_batch x pad_multiple on
    each rank, so of that product) and the cumulative count must grow every step."""
    rid = raw["row_id"]
    ranks, mb, multiple, cap = (int(raw[k]) for k in ("ranks", "micro_batch", "pad_multiple", "max_len"))
    if ranks < 2 or mb < 1 or multiple < 1 or cap % multiple:
        raise ValueError(f"rank_padding.csv row {rid}: ranks >= 2, micro_batch >= 1 and a max_len divisible by "
                         f"pad_multiple are required (got {ranks}, {mb}, {multiple}, {cap})")
    seen = [int(x) for x in raw["tokens_seen"].split()]
    steps = [b - a for a, b in itertools.pairwise(seen)]
    if len(steps) < 2:
        raise ValueError(f"rank_padding.csv row {rid}: at least three logged steps are needed (two timed)")
    for total in [seen[0], *steps]:
        if total <= 0 or total % (mb * multiple) or total > ranks * mb * cap:
            raise ValueError(f"rank_padding.csv row {rid}: a step of {total} tokens is not {ranks} ranks of "
                             f"{mb} rows padded to a multiple of {multiple} up to {cap}")
    return RankPadding(rid, raw["model"], ranks, mb, cap, tuple(s / (ranks * mb) for s in steps))


def load(path: Path = DATA) -> dict[str, RankPadding]:
    with path.open(newline="", encoding="utf-8") as f:
        entries = [_entry(raw) for raw in csv.DictReader(f)]
    return {e.row_id: e for e in entries}


def pooled_rank_sigma(runs: list[RankPadding]) -> float:
    """One rank's padded-length spread: the within-run variance of the per-step rank means, pooled over the runs
    (each run's own mean removed, n - 1 degrees of freedom each), times the number of ranks."""
    ss = sum(sum((x - mean(r.rank_means)) ** 2 for x in r.rank_means) for r in runs)
    dof = sum(len(r.rank_means) - 1 for r in runs)
    return math.sqrt(ss / dof * runs[0].ranks)


def slowest_rank_length(mu: float, sigma: float, ranks: int, cap: float) -> float:
    """E[min(max of ``ranks`` draws of N(mu, sigma), cap)]: the slowest rank's expected padded length.

    E[min(M, cap)] = cap - E[(cap - M)+] = cap - (integral of F_M below cap), F_M = Phi^ranks (midpoint rule over
    mu +- 10 sigma, outside which F_M is 0 or 1 to 1e-23)."""
    if sigma <= 0:
        return min(mu, cap)
    lo, hi, n = mu - 10 * sigma, min(cap, mu + 10 * sigma), 4000
    if hi <= lo:
        return cap
    h = (hi - lo) / n   # above hi (when below cap) F_M is 1 to 1e-23, so the integral to cap adds cap - hi
    area = sum((0.5 * (1 + math.erf((lo + (i + 0.5) * h - mu) / (sigma * math.sqrt(2))))) ** ranks for i in range(n))
    return hi - area * h


def effective_lengths(path: Path = DATA) -> dict[str, tuple[float, float]]:
    """Per row: (the ranks' mean padded length over the timed steps, the slowest rank's expected length)."""
    table = load(path)
    pools: dict[tuple[str, int, int], list[RankPadding]] = defaultdict(list)
    for e in table.values():
        pools[e.pool].append(e)
    sigma = {k: pooled_rank_sigma(v) for k, v in pools.items()}
    return {rid: (mean(e.rank_means), slowest_rank_length(mean(e.rank_means), sigma[e.pool], e.ranks, e.max_len))
            for rid, e in table.items()}
