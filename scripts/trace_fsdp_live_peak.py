"""Trace FSDP's live bytes per rank over a whole training step, and when they peak, on real CPU tensors.

Run: ``HF_HUB_OFFLINE=1 .venv/bin/python scripts/trace_fsdp_live_peak.py``. Two CPU ranks on gloo train a tiny fp32
Llama (CONFIG: untied, eager) as accelerate 1.15 builds FSDP with ``mixed_precision="bf16"`` (the calls of
scripts/trace_fsdp_mixed_precision.py: ``set_mixed_precision("bf16")``, so param_dtype = reduce_dtype = bf16; the
transformer wrap of LlamaDecoderLayer; the forward under autocast), eight ways: FSDP1 (FULL_SHARD, BACKWARD_PRE,
``use_orig_params=True`` so LoRA's frozen and trainable parameters may share a unit) and FSDP2 (``fully_shard``), full
fine-tuning and LoRA (peft, r 8 on every Linear of the blocks), with and without accelerate's activation checkpointing
(``apply_activation_checkpointing`` NO_REENTRANT for FSDP1, ``fsdp2_apply_ac`` for FSDP2). Two steps each (AdamW,
``zero_grad(set_to_none=True)``); the second is recorded from its start to the end of ``zero_grad``.

Live bytes are the CPU allocator's own events (``torch.profiler`` ``profile_memory=True``: every allocation and free,
FSDP's storage resizes included, the accounting of scripts/trace_fsdp1_phases.py), counted from the live bytes at the
step's start. FSDP's own steps are marks in the same event stream: FSDP1's ``_runtime_utils._unshard`` / ``_reshard``
/ ``_reduce_grad`` and FSDP2's ``FSDPParamGroup.unshard`` / ``reshard`` / ``post_backward`` are wrapped, each mark
naming the unit and the set of units gathered after it, so the peak is placed between two of FSDP's own events. The
unsharded gradient each unit hands to its reduce-scatter is recorded with its dtype and size.

The FSDP terms (which units are gathered after each of FSDP's steps, the gradients reduced) come from FSDP's own
state and repeat exactly; the live totals do not: gloo's worker thread frees a collective's buffers when it gets to
it, so a phase's total moves by up to a unit's gradient buffers between runs (fsdp1_full_ac's forward: 590,752,
953,760 and 1,259,096 B in three runs). tests/test_fsdp_live_peak.py checks the FSDP terms, not the totals.

Printed output: bench/results/fsdp_live_peak.txt.

Why: perfguide priced FSDP's transient as two gathered units in compute dtype plus one unit's gradient at 4 B per
parameter, held in every phase but the optimizer step (analytic._gather_bytes), sized on the largest of a block, the
embedding and the head; this shows which units are gathered, and which gradients in flight, at the live peak.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from trace_fsdp1_phases import allocator_events, finish_rank, run_ranks

#: block Linears 181,248 parameters, the root (embedding + head + final norm) 131,200: the run the pricing was read
#: from. tests/test_fsdp_live_peak.py checks it at ``--vocab 2048``, where the root (524,416) outweighs a block
CONFIG: dict[str, Any] = dict(vocab_size=512, hidden_size=128, intermediate_size=344, num_hidden_layers=4,
                              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                              tie_word_embeddings=False, use_cache=False)
B, S, LORA_R = 2, 32, 8
RUNS = tuple(f"fsdp{v}_{kind}{'_ac' if ac else ''}" for v in (1, 2) for kind in ("full", "lora") for ac in (False, True))
#: the collectives FSDP1 and FSDP2 call in torch 2.13 (torch.distributed.fsdp: _flat_param.py, _runtime_utils.py,
#: _fully_shard/_fsdp_collectives.py; FSDP1 all-gathers CPU tensors through the list API). Bytes gloo allocates
#: inside them are its own staging on CPU (NCCL writes the caller's output in place), so the live peak leaves them
#: out; their outputs are allocated by FSDP before the call
COLLECTIVES = ("all_gather", "all_gather_single", "reduce_scatter_single", "all_reduce")
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _model(config: dict[str, Any], lora: bool) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(**config)
    cfg._attn_implementation = "eager"
    model = LlamaForCausalLM(cfg)
    if not lora:
        return model
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(r=LORA_R, lora_alpha=16, lora_dropout=0.0, target_modules=TARGETS))


def _prepare(run: str, model: Any) -> Any:
    """What Accelerator.prepare_model does for FSDP on a GPU, made on the CPU (accelerate never enters FSDP mode there)."""
    import functools

    import torch
    from accelerate.utils import FullyShardedDataParallelPlugin, convert_outputs_to_fp32

    device = torch.device("cpu")
    version, ac = int(run[4]), run.endswith("_ac")
    plugin = FullyShardedDataParallelPlugin(fsdp_version=version, auto_wrap_policy="transformer_based_wrap",
                                            transformer_cls_names_to_wrap=["LlamaDecoderLayer"],
                                            backward_prefetch="BACKWARD_PRE" if version == 1 else None,
                                            use_orig_params=True if version == 1 else None, activation_checkpointing=ac)
    plugin.set_mixed_precision("bf16")
    plugin.set_auto_wrap_policy(model)
    if version == 1:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            CheckpointImpl,
            apply_activation_checkpointing,
            checkpoint_wrapper,
        )
        from torch.distributed.fsdp import FullyShardedDataParallel

        model = FullyShardedDataParallel(model, sharding_strategy=plugin.sharding_strategy, auto_wrap_policy=plugin.auto_wrap_policy,
                                         mixed_precision=plugin.mixed_precision_policy, backward_prefetch=plugin.backward_prefetch,
                                         use_orig_params=plugin.use_orig_params, limit_all_gathers=plugin.limit_all_gathers,
                                         device_id=device)
        if ac:   # accelerator.py prepare_model, FSDP1 branch
            apply_activation_checkpointing(model, auto_wrap_policy=plugin.auto_wrap_policy, checkpoint_wrapper_fn=functools.partial(
                checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT))
    else:
        from types import SimpleNamespace

        from accelerate.utils.fsdp_utils import fsdp2_apply_ac, fsdp2_prepare_model

        shim = SimpleNamespace(state=SimpleNamespace(fsdp_plugin=plugin), device=device, is_main_process=True,
                               mixed_precision="bf16", torch_device_mesh=None, parallelism_config=None)
        if ac:   # accelerator.py prepare_model: AC before fully_shard
            model = fsdp2_apply_ac(shim, model)
        model = fsdp2_prepare_model(shim, model)
    forward = model.forward
    model.forward = convert_outputs_to_fp32(torch.autocast(device_type="cpu", dtype=torch.bfloat16)(forward))
    return model


def _unit_names(model: Any) -> dict[int, str]:
    """id(FSDP1 FlatParameter or FSDP2 FSDPParamGroup) -> "L<i>" (the decoder layer it wraps), "root" (the wrapped
    model itself) or, for an FSDP2 unit of its own (accelerate 1.15 carves the embedding and the [final norm, LM head]
    tail into units), its modules' class names."""
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    index = {id(m): i for i, m in enumerate(m for m in model.modules() if isinstance(m, LlamaDecoderLayer))}

    def name(mods: list[Any], root: bool) -> str:
        inner = [index[id(x)] for m in mods for x in m.modules() if id(x) in index]
        if root:
            return "root"
        return f"L{inner[0]}" if len(inner) == 1 else "+".join(type(m).__name__ for m in mods)

    names: dict[int, str] = {}
    for mod in model.modules():
        if getattr(mod, "_handle", None) is not None:   # FSDP1: the wrapper, its wrapped module below it
            names[id(mod._handle.flat_param)] = name([mod.module], mod is model)
        elif hasattr(mod, "_get_fsdp_state"):
            for group in mod._get_fsdp_state()._fsdp_param_groups:
                names[id(group)] = name(list(group.modules), mod is model)
    return names


class Marks:
    """Wraps FSDP's unshard / reshard / reduce steps so each leaves a named mark in the profiler's event stream."""

    def __init__(self) -> None:
        self.names: dict[int, str] = {}
        self.gathered: dict[str, int] = {}   # unit -> bytes of its unsharded compute-dtype parameters
        self.reduced: list[tuple[str, str, int]] = []   # (unit, dtype, bytes) handed to the reduce-scatter
        self.backward = False
        self.most_in_backward = 0   # the most bytes gathered at once after any of FSDP's steps in backward

    def mark(self, what: str) -> None:
        from torch.profiler import record_function

        if self.backward:
            self.most_in_backward = max(self.most_in_backward, sum(self.gathered.values()))
        label = f"{what} | gathered " + ",".join(f"{k}" for k in sorted(self.gathered)) + f" ({sum(self.gathered.values())} B)"
        with record_function("MARK_" + label):
            pass

    def install(self) -> None:
        import torch.distributed.fsdp._runtime_utils as ru
        from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

        orig = {k: getattr(ru, k) for k in ("_unshard", "_reshard", "_reduce_grad")}
        gorig = {k: getattr(FSDPParamGroup, k) for k in ("unshard", "reshard", "post_backward")}

        def unshard1(state: Any, handle: Any, *a: Any) -> Any:
            if handle:
                self.mark(f"all-gather {self.names.get(id(handle.flat_param), '?')}")
            out = orig["_unshard"](state, handle, *a)
            if handle:
                full = handle.flat_param._full_param_padded
                self.gathered[self.names.get(id(handle.flat_param), "?")] = full.untyped_storage().nbytes()
                self.mark(f"unshard {self.names.get(id(handle.flat_param), '?')}")
            return out

        def reshard1(state: Any, handle: Any, free: bool) -> Any:
            out = orig["_reshard"](state, handle, free)
            if free:
                self.gathered.pop(self.names.get(id(handle.flat_param), "?"), None)
            self.mark(f"reshard{'' if free else '(kept)'} {self.names.get(id(handle.flat_param), '?')}")
            return out

        def reduce1(state: Any, handle: Any) -> Any:
            g = handle.flat_param.grad
            unit = self.names.get(id(handle.flat_param), "?")
            self.reduced.append((unit, str(g.dtype).replace("torch.", ""), g.numel() * g.element_size()))
            self.mark(f"reduce {unit}")
            return orig["_reduce_grad"](state, handle)

        def unshard2(group: Any, *a: Any, **k: Any) -> Any:
            self.mark(f"all-gather {self.names.get(id(group), '?')}")
            out = gorig["unshard"](group, *a, **k)
            self.gathered[self.names.get(id(group), "?")] = sum(fp.padded_sharded_param_size.numel() * 2 * 2 for fp in group.fsdp_params)
            self.mark(f"unshard {self.names.get(id(group), '?')}")
            return out

        def reshard2(group: Any, *a: Any, **k: Any) -> Any:
            out = gorig["reshard"](group, *a, **k)
            if not group.is_unsharded:
                self.gathered.pop(self.names.get(id(group), "?"), None)
            self.mark(f"reshard {self.names.get(id(group), '?')}")
            return out

        def post_backward2(group: Any, *a: Any, **k: Any) -> Any:
            unit = self.names.get(id(group), "?")
            grads = [fp._unsharded_param.grad for fp in group.fsdp_params if fp._unsharded_param.grad is not None]
            for dtype in sorted({str(g.dtype).replace("torch.", "") for g in grads}):
                self.reduced.append((unit, dtype, sum(g.numel() * g.element_size() for g in grads if str(g.dtype).endswith(dtype))))
            self.mark(f"reduce {unit}")
            return gorig["post_backward"](group, *a, **k)

        import torch.distributed as dist

        def collective(name: str) -> Any:
            inner = getattr(dist, name)

            def wrapped(*a: Any, **k: Any) -> Any:
                with record_function("MARK_collective_begin"):
                    pass
                try:
                    return inner(*a, **k)
                finally:
                    with record_function("MARK_collective_end"):
                        pass
            return wrapped

        from torch.profiler import record_function

        for name in COLLECTIVES:
            setattr(dist, name, collective(name))
        fsdp1: dict[str, Any] = {"_unshard": unshard1, "_reshard": reshard1, "_reduce_grad": reduce1}
        fsdp2: dict[str, Any] = {"unshard": unshard2, "reshard": reshard2, "post_backward": post_backward2}
        for k, f in fsdp1.items():
            setattr(ru, k, f)
        for k, f in fsdp2.items():
            setattr(FSDPParamGroup, k, f)


def peaks(events: list[tuple[int, int, str]]) -> dict[str, Any]:
    """(time, bytes, mark) -> the highest live bytes above the step's start in each phase (forward: to the end of the
    loss; backward; optimizer: step and zero_grad), the overall peak with the marks around it, and the timeline:
    [mark, live bytes at it, highest live bytes before the next mark], all above the step's start."""
    live, base, phase, out = 0, 0, "", {}
    timeline: list[list[Any]] = []
    phases = {"start": "forward", "loss": "backward", "backward_end": "optimizer", "step_end": ""}
    inside = 0
    for _, nbytes, mark in sorted(events):
        if mark in ("collective_begin", "collective_end"):
            inside += 1 if mark == "collective_begin" else -1
            continue
        if mark:
            if mark == "start":
                base = live
            phase = phases.get(mark, phase)
            if timeline or mark == "start":
                timeline.append([mark, live - base, live - base, phase])
            continue
        live += nbytes
        if timeline and phase and not inside:
            timeline[-1][2] = max(timeline[-1][2], live - base)
    for ph in ("forward", "backward", "optimizer"):
        out[ph] = max(t[2] for t in timeline if t[3] == ph)
    i = max(range(len(timeline)), key=lambda k: timeline[k][2])
    out.update(peak=timeline[i][2], peak_phase=timeline[i][3], peak_before=timeline[i][0],
               peak_after=timeline[i + 1][0] if i + 1 < len(timeline) else "", timeline=[t[:3] for t in timeline])
    return out


def persistent_bytes(model: Any, opt: Any) -> dict[str, int]:
    """Bytes of what stays between steps on this rank: parameter shards and optimizer state (distinct storages)."""
    seen: set[int] = set()

    def size(t: Any) -> int:
        st = getattr(t, "_local_tensor", t).untyped_storage()
        if st.data_ptr() in seen or st.nbytes() == 0:
            return 0
        seen.add(st.data_ptr())
        return int(st.nbytes())

    weights = sum(size(p) for p in model.parameters())
    states = sum(size(v) for s in opt.state.values() for v in s.values() if hasattr(v, "untyped_storage") and v.dim())
    return {"shard_weights": weights, "shard_states": states}


def _worker(rank: int, port: int, out_dir: str, config: dict[str, Any] | None = None) -> None:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, record_function

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    cfg = config or CONFIG
    marks = Marks()
    marks.install()
    report: dict[str, Any] = {}
    for run in RUNS:
        model = _prepare(run, _model(cfg, "lora" in run))
        marks.names = _unit_names(model)
        # foreach: the GPU default (torch.optim uses the per-tensor loop for CPU tensors)
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, foreach=True)
        ids = torch.randint(0, cfg["vocab_size"], (B, S), generator=torch.Generator().manual_seed(rank))
        for step in range(2):
            marks.gathered.clear()
            marks.reduced.clear()
            marks.backward, marks.most_in_backward = False, 0
            if step == 1:
                with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
                    with record_function("MARK_start"):
                        pass
                    loss = model(input_ids=ids, labels=ids).loss
                    with record_function("MARK_loss"):
                        pass
                    at_loss = dict(marks.gathered)
                    marks.backward = True
                    loss.backward()
                    marks.backward = False
                    with record_function("MARK_backward_end"):
                        pass
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                    with record_function("MARK_step_end"):
                        pass
                rec = peaks(allocator_events(prof))
                rec["reduced"] = sorted(set(marks.reduced))
                rec["gathered_at_loss"] = at_loss
                rec["most_gathered_in_backward"] = marks.most_in_backward
                rec.update(persistent_bytes(model, opt))
                report[run] = rec
            else:
                model(input_ids=ids, labels=ids).loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
        del model, opt, loss
    finish_rank(rank, out_dir, report)


def trace(config: dict[str, Any] | None = None) -> dict[str, Any]:
    """Rank 0's record per run: peak live bytes above the step's start per phase, the overall peak with the FSDP
    marks around it, the unit gradients reduced (unit, dtype, bytes), and the persistent weight / state bytes."""
    import functools

    report: dict[str, Any] = run_ranks(functools.partial(_worker, config=config) if config else _worker)
    return report


def main() -> None:
    config = dict(CONFIG)
    if "--vocab" in sys.argv:
        config["vocab_size"] = int(sys.argv[sys.argv.index("--vocab") + 1])
    report = trace(config)
    print(f"tiny Llama {config}, b {B} x s {S}, 2 gloo ranks, bf16 mixed precision as accelerate 1.15 sets it; rank 0, bytes")
    for run, rec in report.items():
        print(f"{run}: forward {rec['forward']:,} backward {rec['backward']:,} optimizer {rec['optimizer']:,}; "
              f"weights {rec['shard_weights']:,} states {rec['shard_states']:,}")
        print(f"    peak {rec['peak']:,} in {rec['peak_phase']} after [{rec['peak_before']}] before [{rec['peak_after']}]")
        print(f"    gathered at the loss {rec['gathered_at_loss']}; most gathered at once in backward "
              f"{rec['most_gathered_in_backward']:,}; reduced {rec['reduced']}")
    if "--timeline" in sys.argv:
        run = sys.argv[sys.argv.index("--timeline") + 1]
        for mark, at, top in report[run]["timeline"]:
            print(f"{at:>10,} {top:>10,}  {mark}")
    print(json.dumps({k: {kk: vv for kk, vv in v.items() if kk != "timeline"} for k, v in report.items()}))


if __name__ == "__main__":
    main()
