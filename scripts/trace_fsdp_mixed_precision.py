"""Trace what FSDP mixed precision saves for backward, as accelerate builds it, on real CPU tensors.

Run: ``HF_HUB_OFFLINE=1 .venv/bin/python scripts/trace_fsdp_mixed_precision.py``. Two CPU ranks on gloo train a tiny
Llama (h 48, FFN 136, 2 blocks, 4 heads / 2 KV heads, vocab 200, eager, fp32 weights as from_pretrained loads them)
at b 3 x s 20, four ways, two steps each (AdamW), and record the second step:

* ``fsdp1`` / ``fsdp2``: what ``Accelerator(mixed_precision="bf16")`` builds for FSDP. accelerate never enters FSDP
  mode on CPU (state.py promotes only GPU-like distributed types), so the script makes the same calls
  ``Accelerator.prepare_model`` makes: ``FullyShardedDataParallelPlugin.set_mixed_precision("bf16")`` (what
  ``AcceleratorState`` calls; FSDP1 ``MixedPrecision(param_dtype=reduce_dtype=buffer_dtype=bf16)``, FSDP2
  ``MixedPrecisionPolicy(param_dtype=reduce_dtype=output_dtype=bf16)``), FSDP1 ``FullyShardedDataParallel`` with the
  plugin's kwargs (transformer wrap of LlamaDecoderLayer) or ``fsdp2_prepare_model``, then the model's forward
  wrapped in ``get_mixed_precision_context_manager`` (``torch.autocast`` on the device's type) and
  ``convert_outputs_to_fp32``;
* ``half``: the same model cast to bf16, no autocast, no FSDP (perfguide's "half" regime);
* ``amp``: fp32 weights under ``torch.autocast`` (bf16), no FSDP (plain AMP, perfguide's "amp" regime).

What is recorded through forward + loss (``torch.autograd.graph.saved_tensors_hooks``), per distinct storage:
activation bytes by dtype, 16-bit weight copies autocast made and a matmul saved (a saved tensor shaped like a
weight that is not the parameter itself nor FSDP's gathered copy), and the dtype of the weights each Linear ran on
(a forward hook reads ``module.weight`` inside the FSDP unit), the dtype of each unit's unsharded gradient as FSDP
hands it to the reduce-scatter (``dist.reduce_scatter_single``, wrapped). Also the live bytes the allocator holds at the end
of forward + loss above the step's start (``torch.profiler`` memory events, scripts/trace_fsdp1_phases.py).
Why: perfguide priced FSDP mixed precision over fp32 weights as plain AMP (fp32 stream, every Linear's 16-bit cast
saved), and this shows what FSDP's param_dtype cast does instead.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from trace_fsdp1_phases import allocator_events, finish_rank, live_peaks, run_ranks

CONFIG: dict[str, Any] = dict(vocab_size=200, hidden_size=48, intermediate_size=136, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                              tie_word_embeddings=False, use_cache=False)
B, S = 3, 20
RUNS = ("fsdp1", "fsdp2", "half", "amp")


def _model(dtype: Any) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(**CONFIG)
    config._attn_implementation = "eager"   # LLaMA's attention before transformers 4.36 (the rows' releases)
    model = LlamaForCausalLM(config)
    return model.to(dtype)


def _accelerate_autocast(model: Any, device: Any) -> Any:
    """What Accelerator.prepare_model does to the forward when native AMP is on (accelerate 1.15 accelerator.py)."""
    import torch
    from accelerate.utils import convert_outputs_to_fp32

    forward = model.forward
    model.forward = convert_outputs_to_fp32(torch.autocast(device_type=device.type, dtype=torch.bfloat16)(forward))
    return model


def _prepare(run: str, model: Any) -> Any:
    import torch
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.fsdp_utils import fsdp2_prepare_model

    device = torch.device("cpu")
    if run in ("half", "amp"):
        return _accelerate_autocast(model, device) if run == "amp" else model
    version = 1 if run == "fsdp1" else 2
    plugin = FullyShardedDataParallelPlugin(fsdp_version=version, auto_wrap_policy="transformer_based_wrap",
                                            transformer_cls_names_to_wrap=["LlamaDecoderLayer"])
    plugin.set_mixed_precision("bf16")   # what AcceleratorState does for FSDP when mixed_precision != "no"
    plugin.set_auto_wrap_policy(model)
    if version == 1:
        from torch.distributed.fsdp import FullyShardedDataParallel

        model = FullyShardedDataParallel(model, sharding_strategy=plugin.sharding_strategy, cpu_offload=plugin.cpu_offload,
                                         auto_wrap_policy=plugin.auto_wrap_policy, mixed_precision=plugin.mixed_precision_policy,
                                         backward_prefetch=plugin.backward_prefetch, use_orig_params=plugin.use_orig_params,
                                         limit_all_gathers=plugin.limit_all_gathers, device_id=device)
    else:
        from types import SimpleNamespace

        shim = SimpleNamespace(state=SimpleNamespace(fsdp_plugin=plugin), device=device, is_main_process=True,
                               mixed_precision="bf16", torch_device_mesh=None, parallelism_config=None)
        model = fsdp2_prepare_model(shim, model)
    return _accelerate_autocast(model, device)


def _saved(run: str, model: Any, ids: Any) -> tuple[dict[str, Any], Any]:
    """Forward + loss under a saved-tensors hook: bytes per storage by kind and dtype, and what each Linear ran on."""
    import torch

    # the parameters themselves are not extra bytes (FSDP2's are DTensors: their local shards)
    params = {getattr(p, "_local_tensor", p).untyped_storage().data_ptr() for p in model.parameters()}
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    # a matmul saves a weight transposed; RMSNorm's ``weight * hidden`` saves the (h,) weight. No activation has
    # these shapes here (they are (b, s, ...) or (b * s, ...) with b * s = 60)
    shapes: set[tuple[int, ...]] = {(m.out_features, m.in_features) for m in linears}
    shapes |= {(m.in_features, m.out_features) for m in linears} | {(CONFIG["hidden_size"],)}
    linear_dtypes: set[str] = set()
    hooks = [m.register_forward_hook(lambda mod, i, o: linear_dtypes.add(str(mod.weight.dtype))) for m in linears]
    storages: dict[int, tuple[str, str, int]] = {}

    def pack(t: Any) -> Any:
        st = t.untyped_storage()
        if st.data_ptr() in params or st.nbytes() == 0:
            return t
        kind = "activation"
        if tuple(t.shape) in shapes:   # FSDP's all-gathered unit (a view of it), or a cast autocast made of a parameter
            kind = "gathered_weight" if run.startswith("fsdp") else "weight_copy"
        if storages.get(st._cdata, ("activation",))[0] == "activation":
            storages[st._cdata] = (kind, str(t.dtype).replace("torch.", ""), st.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(input_ids=ids, labels=ids)
    for h in hooks:
        h.remove()
    totals: dict[str, int] = {}
    for kind, dtype, nbytes in storages.values():
        totals[f"{kind}:{dtype}"] = totals.get(f"{kind}:{dtype}", 0) + nbytes
    return {"saved": totals, "linear_weight_dtypes": sorted(linear_dtypes)}, out


def _worker(rank: int, port: int, out_dir: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, record_function

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    report: dict[str, Any] = {}
    reduced: list[str] = []
    original = dist.reduce_scatter_single

    def recording(output: Any, input: Any, *args: Any, **kwargs: Any) -> Any:
        reduced.append(str(input.dtype))   # the unit's unsharded gradient as FSDP hands it to the collective
        return original(output, input, *args, **kwargs)

    dist.reduce_scatter_single = recording   # FSDP1 _reduce_grad and FSDP2 foreach_reduce call dist.reduce_scatter_single
    for run in RUNS:
        model = _prepare(run, _model(torch.bfloat16 if run == "half" else torch.float32))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        ids = torch.randint(0, CONFIG["vocab_size"], (B, S), generator=torch.Generator().manual_seed(rank))
        for step in range(2):
            if step == 1:
                with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
                    with record_function("MARK_start"):
                        pass
                    record, out = _saved(run, model, ids)
                    with record_function("MARK_forward"):
                        pass
                    out.loss.backward()
                    with record_function("MARK_backward"):
                        pass
                record["live"] = live_peaks(allocator_events(prof))
                record["reduce_scatter_dtypes"] = sorted(set(reduced))
                report[run] = record
            else:
                model(input_ids=ids, labels=ids).loss.backward()
                reduced.clear()
            opt.step()
            opt.zero_grad(set_to_none=True)
        del model, opt
    finish_rank(rank, out_dir, report)


def trace() -> dict[str, Any]:
    """Rank 0's record per run: saved bytes by kind:dtype, the Linears' weight dtypes, live bytes by phase."""
    report: dict[str, Any] = run_ranks(_worker)
    return report


def main() -> None:
    report = trace()
    print(f"tiny Llama {CONFIG}, b {B} x s {S}, 2 gloo ranks; rank 0")
    for run, rec in report.items():
        print(f"{run:>6}: Linears ran on {rec['linear_weight_dtypes']}; saved {rec['saved']}; live {rec['live']}")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
