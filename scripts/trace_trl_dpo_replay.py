"""TRL's gemma-3-1b DPO step (bench rows 1180: trl 1.14.2, 1181: trl 1.15.0) as allocations and frees at the real
shape and length, on fake tensors, replayed through the caching allocator under the release's 79 GiB cap.

Why: perfguide's plan fits these rows 35-40% longer than published, the largest max-context misses; the SFT rows
were explained (1182) or bounded (1183-1185) by the same replay (docs/validation.md 28). This runs the release's own
``DPOTrainer.compute_loss`` (the wheel unpacked on PYTHONPATH, not the installed trl) over the shared step of
scripts/trace_trl_gemma_replay.py: the policy and a frozen reference copy (full fine-tuning, no ref_model given:
a second model; bf16 as the policy), each prepared as accelerate prepares a model for bf16 mixed precision (its
forward under autocast, then ``convert_outputs_to_fp32``: every bf16 output upcast), the policy's forward over the
concatenated [chosen; rejected] pair (2 rows of ``max_length`` tokens), the reference's under ``torch.no_grad()``,
the loss and metrics as the release computes them, backward (checkpoint recompute), clipping, adamw_torch_fused.

What runs as on the GPU, not as the CPU would:
* Triton is not installed here: a stand-in module lets the release's kernels import, and its ``@triton.jit``
  kernels do nothing when launched. Every torch allocation around them is the release's own code
  (1.14.2 trl/kernels/logprob_entropy.py ``_LogProbEntropyFunction``; 1.15.0 trl/kernels/chunked_logprob.py
  ``ChunkedLogProbFunction``). 1.14.2's ``_supports_trl_loss_kernel`` answers for a CUDA device (True: logits
  contiguous in the vocabulary, int64 ids and mask of the ids' shape); 1.15.0's ``_addmm_fp32`` takes its CUDA
  branch, ``torch.addmm(..., out_dtype=torch.float32, out=acc)``: in place, no fp32 copies of the tile.
* Boolean-mask indexing (1.14.2's metrics ``chosen_logits[chosen_mask.bool()]``, 1.15.0's ``hidden_states[mask]``)
  has a data-dependent size; fake ids carry no values, so every position is read as a completion token (the
  prompt's p tokens would shrink these copies by p / s).

Usage: PYTHONPATH=/tmp/trl-1.14.2 python scripts/trace_trl_dpo_replay.py [--padded] [--reference-fp32] [--sft]
[--steps N] [--peak SEQ] [--search LO HI] (``--sft``: SFTTrainer's fused-head step, section 28's, on the release's code) (``pip download --no-deps trl==1.14.2 -d /tmp/w && unzip -q /tmp/w/*.whl -d /tmp/trl-1.14.2``).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import types
from collections import defaultdict
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import trace_trl_gemma_replay as shared

#: the releases whose DPO step is replayed, and the row each one's max length is published on
RELEASES = {"1.14.2": "1180", "1.15.0": "1181"}


def import_kernels_with_triton_stand_in() -> None:
    """Import the release's trl/kernels with ``triton`` and ``triton.language`` stand-ins whose every name is a
    no-op: the kernels' launches do nothing."""

    class Anything:
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            return self

        def __getattr__(self, name: str) -> Any:
            return self

        def __getitem__(self, grid: Any) -> Any:
            return lambda *args, **kwargs: None

    def attribute(name: str) -> Any:
        if name.startswith("__"):   # __file__, __path__...: a plain module's answers (inspect walks sys.modules)
            raise AttributeError(name)
        return Anything()

    triton = types.ModuleType("triton")
    language = types.ModuleType("triton.language")
    triton.__getattr__ = attribute  # type: ignore[method-assign]
    language.__getattr__ = attribute  # type: ignore[method-assign]
    triton.language = language  # type: ignore[attr-defined]
    # only while trl's kernels import: torch and transformers probe for a real triton (and find none) beforehand
    import torch._dynamo
    import torch._inductor.utils  # noqa: F401
    from transformers import PreTrainedModel, Trainer  # noqa: F401

    sys.modules["triton"], sys.modules["triton.language"] = triton, language
    try:
        import trl.kernels  # noqa: F401
    finally:
        del sys.modules["triton"], sys.modules["triton.language"]


def release() -> str:
    import_kernels_with_triton_stand_in()
    import trl

    assert trl.__version__ in RELEASES, f"trl {trl.__version__}: put the 1.14.2 or 1.15.0 wheel on PYTHONPATH"
    import trl.trainer.utils as utils

    if trl.__version__ == "1.14.2":
        utils._supports_trl_loss_kernel = lambda logits, index=None, row_mask=None: True
    else:
        import trl.kernels.chunked_logprob as chunked

        chunked._addmm_fp32 = lambda acc, a, b: None
    return str(trl.__version__)


def every_position_mode() -> Any:
    """Boolean-mask indexing and masked_select read every position as selected (fake ids carry no values)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    aten = torch.ops.aten

    class EveryPosition(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            if func is aten.index.Tensor:
                x, indices = args
                if len(indices) == 1 and indices[0] is not None and indices[0].dtype == torch.bool:
                    mask = indices[0]
                    return torch.empty((mask.numel(), *x.shape[mask.ndim:]), dtype=x.dtype)
            if func is aten.masked_select.default:
                x, mask = args
                return torch.empty((torch.broadcast_shapes(x.shape, mask.shape).numel(),), dtype=x.dtype)
            return func(*args, **kwargs)

    return EveryPosition()


def accelerate_prepared(model: Any, emulation: Any) -> None:
    """accelerate's prepare_model for bf16 native AMP: the forward under autocast (the emulation's CUDA lists), its
    outputs through accelerate's own ``convert_outputs_to_fp32`` outside autocast (accelerator.py prepare_model)."""
    from accelerate.utils import convert_outputs_to_fp32

    inner = model.forward

    def autocast_forward(*args: Any, **kwargs: Any) -> Any:
        emulation.casting = True
        emulation.cache_enabled = True   # torch.autocast's default: fp32 leaf weights' casts kept for the region
        try:
            return inner(*args, **kwargs)
        finally:
            emulation.casting = False
            emulation.cache.clear()   # leaving torch.autocast drops its weight-cast cache

    model.forward = convert_outputs_to_fp32(autocast_forward)


def prepare(version: str, reference_fp32: bool = False) -> Any:
    """``reference_fp32``: the reference as TRL loads it when given none (create_model_from_path: dtype float32 unless
    model_init_kwargs says otherwise), where the policy is bf16."""

    def run(policy: Any, ref: Any, emulation: Any) -> None:
        if reference_fp32:
            import torch

            ref.to(torch.float32)
        if version != "1.14.2":   # 1.15.0 dpo_trainer.py 932-938: the fused head on both, the policy's extra fields
            from trl.trainer.utils import add_fused_lm_head

            add_fused_lm_head(policy, outputs=("log_probs", "entropy", "mean_logits", "is_top1"))
            add_fused_lm_head(ref)
        accelerate_prepared(ref, emulation)     # DPOTrainer.__init__: accelerator.prepare_model(ref, evaluation_mode=True)
        accelerate_prepared(policy, emulation)  # Trainer.train: accelerator.prepare(model)

    return run


def trainer_stand_in(policy: Any, ref: Any) -> Any:
    """The DPOTrainer attributes compute_loss reads, at DPOConfig's defaults (read off the release's dataclass)."""
    import torch
    from trl import DPOConfig

    defaults = {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
                for f in dataclasses.fields(DPOConfig)
                if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING}
    args = types.SimpleNamespace(**defaults)
    args.gradient_checkpointing_kwargs = {"use_reentrant": False}
    loss_types = args.loss_type if isinstance(args.loss_type, list) else [args.loss_type]
    identity = types.SimpleNamespace(device=torch.device("cpu"), gather=lambda t: t, gather_for_metrics=lambda t: t,
                                     unwrap_model=lambda m: m)
    return types.SimpleNamespace(
        args=args, model=policy, ref_model=ref, accelerator=identity, use_liger_kernel=False, aux_loss_enabled=False,
        precompute_ref_logps=False, ld_alpha=args.ld_alpha, beta=args.beta, f_divergence_type=args.f_divergence_type,
        f_alpha_divergence_coef=args.f_alpha_divergence_coef, label_smoothing=args.label_smoothing, loss_types=loss_types,
        loss_weights=args.loss_weights or [1.0] * len(loss_types), use_weighting=args.use_weighting,
        router_aux_loss_coef=0.0, is_fsdp_enabled=False, _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        _total_train_tokens=0, _tp_size=1)


def dpo_step() -> shared.Step:
    """Trainer.training_step's loss: the release's DPOTrainer.compute_loss over one pair (collator keys, unpadded)."""
    from trl import DPOTrainer

    state: dict[str, Any] = {}

    def step(policy: Any, ref: Any, ids: Any, emulation: Any) -> Any:
        import torch

        if "trainer" not in state:
            state["trainer"] = trainer_stand_in(policy, ref)
            state["trainer"]._compute_loss = types.MethodType(DPOTrainer._compute_loss, state["trainer"])
        inputs = {"input_ids": ids.clone(), "attention_mask": torch.ones_like(ids), "completion_mask": torch.ones_like(ids)}
        return DPOTrainer.compute_loss(state["trainer"], policy, inputs)

    return step


def events_of_run(seq: int, version: str, steps: int = 2, layers: int | None = None, padded: bool = False,
                  reference_fp32: bool = False) -> list[tuple[str, int, int]]:
    return shared.events_of_steps(seq, dpo_step(), steps, layers, rows=2, reference=True,
                                  prepare=prepare(version, reference_fp32), unpadded=not padded,
                                  modes=(every_position_mode(),))


def sft_events_of_run(seq: int, steps: int = 2) -> list[tuple[str, int, int]]:
    """SFTTrainer's fused-head step (scripts/trace_trl_gemma_replay.py) with the release's own fused head (1.15.0)."""
    return shared.events_of_steps(seq, shared.sft_step(True), steps, prepare=shared.add_fused_head,
                                  modes=(every_position_mode(),))


def main() -> int:
    args = sys.argv[1:]
    version = release()
    padded, fp32, sft = "--padded" in args, "--reference-fp32" in args, "--sft" in args
    steps = int(args[args.index("--steps") + 1]) if "--steps" in args else 2
    label = f"trl {version} DPO {'padded' if padded else 'unpadded'}{', fp32 reference' if fp32 else ''}"
    label = f"trl {version} SFT fused head" if sft else label

    def events_at(s: int) -> list[tuple[str, int, int]]:
        return sft_events_of_run(s, steps) if sft else events_of_run(s, version, steps, padded=padded, reference_fp32=fp32)

    if "--peak" in args:
        seq = int(args[args.index("--peak") + 1])
        shared.print_peak(events_at(seq), seq, label)
    if "--search" in args:
        i = args.index("--search")
        print(label)
        shared.search(events_at, int(args[i + 1]), int(args[i + 2]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
