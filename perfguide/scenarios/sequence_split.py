"""Splitting each sequence over several GPUs (Ulysses sequence parallelism) in a multi-GPU training plan.

Which split sizes a plan may use, refused in one line where one asked for cannot run, and the decision that says
why the chosen plan splits. The layouts themselves are strategies.py's (``Split``, the sequence level); the cost of
a split is the technique's (techniques/sequence_parallel.py: memory of one slice per rank, speed/sequence_split.py:
the whole attention's share and the all-to-alls).

What runs it: accelerate's ``ParallelismConfig(sp_size=N, sp_backend="deepspeed")`` under DeepSpeed (the only SP
backend accelerate has), registering DeepSpeed's ``UlyssesSPAttentionHF``; it needs the attention heads divisible by
N and the key/value heads divisible by N or dividing it (deepspeed runtime/sequence_parallel/ulysses_sp.py), a
fused attention kernel (no eager: its 4D mask), and a decoder's next-token loss.
"""

from __future__ import annotations

from ..decisions import Alternative, Decision
from ..errors import ConflictingConstraintsError
from .search import Option, Priced, gib, not_fitting_why, usable_bytes
from .strategies import SEQUENCE_STRATEGY, Layout, Split, is_offload_level, layout_of
from .types import Request

SOURCE = ("https://huggingface.co/docs/accelerate/concept_guides/sequence_parallelism; "
          "https://huggingface.co/docs/trl/distributing_training (ALST/Ulysses: pad_to_multiple_of = sp_size); "
          "Bekman et al. 2025, Arctic Long Sequence Training (arXiv:2506.13996)")


def recurrent_problem(name: str, kinds: tuple[str, ...]) -> str:
    """Why a model whose layers carry a recurrent state cannot split its sequences (accelerate refuses it)."""
    return (f"{name}'s {', '.join(kinds)} layers carry a recurrent state along the sequence, which a split restarts on every "
            "rank (accelerate refuses Ulysses on them: big_modeling._refuse_recurrent_layers_under_sequence_parallelism)")


def head_problem(request: Request, size: int) -> str | None:
    """Why Ulysses cannot split this model's heads ``size`` ways (ulysses_sp.py's two checks), None when it can."""
    heads, kv = request.model.num_attention_heads, request.model.num_key_value_heads
    if heads % size:
        return f"{request.model.name} has {heads} attention heads, not divisible by {size}"
    if kv % size and size % kv:
        return f"{request.model.name} has {kv} key/value heads: {size} must divide them or be a multiple of them"
    return None


def _request_problem(request: Request) -> str | None:
    """Why no split can run what was asked (None: one can), whatever its size."""
    cons, spec = request.constraints, request.model
    if spec.recurrent_layer_types:
        return recurrent_problem(spec.name, spec.recurrent_layer_types)
    if cons.strategy not in (None, SEQUENCE_STRATEGY):
        return (f"strategy={cons.strategy!r} was asked, and accelerate splits sequences only under DeepSpeed "
                f"(sp_backend='deepspeed'), planned with {SEQUENCE_STRATEGY}")
    if cons.attn_implementation == "eager":
        return "attn_implementation='eager' was asked, and Ulysses needs a fused kernel (eager builds a 4D mask)"
    if cons.objective != "sft" or cons.target_len is not None or spec.is_encoder_decoder or not spec.generates:
        return "a split is planned for a decoder's next-token loss (no DPO pair, no encoder-decoder, no task head)"
    return None


def sequence_splits(request: Request, per_node: int, nodes: int) -> Split:
    """The split sizes the plan offers: ``sequence_parallel=N`` asked is the only one (refused in one line where it
    cannot run); None offers every size that divides the GPUs of one node and the model's heads (the all-to-alls stay
    on the node's link); 1 offers none."""
    asked = request.constraints.sequence_parallel
    if asked == 1 or (asked is None and per_node * nodes == 1):
        return Split()
    problem = _request_problem(request)
    if asked is None:
        if problem is not None:
            return Split()
        return Split(tuple(n for n in range(2, per_node + 1) if per_node % n == 0 and head_problem(request, n) is None))
    world = per_node * nodes
    problem = problem or (f"it must divide the world size ({world} GPU(s))" if world % asked else None) or head_problem(request, asked)
    if problem is not None:
        raise ConflictingConstraintsError(f"sequence_parallel={asked} cannot run here: {problem}; drop sequence_parallel "
                                          "or change what conflicts with it")
    return Split((asked,), only=True)


def split_decision(request: Request, chosen: Priced, compared: list) -> list[Decision]:
    """Why each sequence is split, with the bytes that decided it and the other split sizes priced beside it."""
    s, h = chosen.setup, request.constraints.headroom
    n = s.sequence_parallel
    if n == 1:
        return []
    usable = gib(usable_bytes(chosen.memory, h) or 0)
    unsplit = [(lay, opt) for lay, lv, opt, why in compared
               if lay.sequence_parallel == 1 and not is_offload_level(lv.name) and why is None and opt is not None and opt.too_big is not None]
    closest = min(unsplit, key=lambda lo: lo[1].too_big.memory.device_total, default=None)
    if request.constraints.sequence_parallel:
        why = f"sequence_parallel={n} was asked"
    elif closest is not None:
        lay, opt = closest
        why = f"no unsplit layout fits: the closest, {lay.name}, needs {gib(opt.too_big.memory.device_total)} per GPU over {usable} usable"
    else:
        why = "no unsplit layout fits"
    reason = (f"{why}; split over {n} GPUs, each holds and computes {s.seq_len // n:,} of every sequence's {s.seq_len:,} tokens and "
              f"1/{n} of its attention heads ({gib(chosen.memory.device_total)} per GPU, {chosen.step_time:.3g} s/step); {s.world_size // n} "
              f"data-parallel group(s) of {n}: accelerate's parallelism_config sp_size={n} (sp_backend 'deepspeed'), and "
              f"SFTConfig(pad_to_multiple_of={n}) so every sequence splits evenly")
    alts = tuple(_alternative(request, lay, opt, why_not) for lay, lv, opt, why_not in compared
                 if lay.sequence_parallel > 1 and lay != layout_of(s) and opt is not None)
    return [Decision(setting="sequence_parallel", value=n, reason=reason, number=chosen.memory.device_total, unit="bytes per GPU",
                     source=SOURCE, alternatives=alts)]


def _alternative(request: Request, lay: Layout, opt: Option, why: str | None) -> Alternative:
    shown = opt.best or opt.too_big
    if why is not None:
        note = f"not offered: {why}"
    elif opt.best is not None:
        note = f"fits, but slower: {opt.best.step_time:.3g} s/step"
    elif shown is not None:
        note = f"does not fit: {not_fitting_why(shown.memory, request.hardware, request.constraints.headroom)}"
    else:
        note = "does not fit"
    return Alternative(value=str(lay.sequence_parallel), why_not=note, number=shown.memory.device_total if shown else None,
                       unit="bytes per GPU" if shown else None)
