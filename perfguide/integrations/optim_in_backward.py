"""Optimizer step inside backward for the plain Trainer / accelerate path: each parameter steps as soon as its
gradient is complete, and the gradient is freed right away, so the full set of gradients never exists.

How: one optimizer per parameter, stepped from ``Tensor.register_post_accumulate_grad_hook`` (torch >= 2.1;
the pattern of the PyTorch tutorial "How to save memory by fusing the optimizer step into the backward pass",
https://pytorch.org/tutorials/intermediate/optimizer_step_in_backward_tutorial.html, and of torchtune's
``optimizer_in_bwd``). The Trainer / accelerate still get one optimizer object: ``InBackwardOptimizer`` shares
the per-parameter optimizers' ``param_groups`` dicts, so any LR scheduler built on it (the Trainer's own) sets
the learning rate the hooks use, while its ``step()`` and ``zero_grad()`` have nothing left to do.

Two things cannot work and are refused in one line: gradient accumulation (a parameter would step on every
micro-batch) and global-norm clipping (no moment exists where all gradients are alive to take their norm).
fp16 loss scaling is refused too: GradScaler unscales and checks every gradient before one step.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ..errors import ConflictingConstraintsError

if TYPE_CHECKING:
    import torch

    from ..recommendation import Recommendation

logger = logging.getLogger("perfguide.integrations")

SOURCE = "https://pytorch.org/tutorials/intermediate/optimizer_step_in_backward_tutorial.html"
#: attribute set on a model once hooks are attached, so a second call is refused instead of stepping twice
_ATTACHED = "_perfguide_optimizer_in_backward"


def check_compatible(gradient_accumulation_steps: int, max_grad_norm: float | None, world_size: int = 1, fp16: bool = False) -> None:
    """Refuse the settings under which a step inside backward would silently train differently."""
    if gradient_accumulation_steps != 1:
        raise ConflictingConstraintsError(
            f"optimizer_in_backward steps each parameter as its gradient arrives, so gradient_accumulation_steps="
            f"{gradient_accumulation_steps} would step on every micro-batch; use gradient_accumulation_steps=1 "
            f"(a larger micro-batch), or optimizer_in_backward=False ({SOURCE})")
    if max_grad_norm:
        raise ConflictingConstraintsError(
            f"optimizer_in_backward frees each gradient after its step, so global-norm clipping (max_grad_norm={max_grad_norm}) "
            "has no moment where all gradients exist; use max_grad_norm=0, or optimizer_in_backward=False")
    if world_size > 1:
        raise ConflictingConstraintsError(
            f"optimizer_in_backward steps before data-parallel gradients are reduced ({world_size} processes); "
            "use it on one process, or optimizer_in_backward=False")
    if fp16:
        raise ConflictingConstraintsError(
            "optimizer_in_backward cannot be combined with fp16 loss scaling (GradScaler checks every gradient before one step); "
            "use bf16, or optimizer_in_backward=False")


def _in_backward_optimizer_class() -> type:
    import torch

    class InBackwardOptimizer(torch.optim.Optimizer):
        """The one optimizer object the loop sees; the real updates ran inside backward."""

        def __init__(self, optimizers: dict[Any, torch.optim.Optimizer]) -> None:
            params = list(optimizers)
            first = next(iter(optimizers.values()))
            super().__init__(params, dict(first.defaults))
            self.optimizers = optimizers
            # the very dicts the inner optimizers read: a scheduler writing 'lr' here reaches them
            self.param_groups = [g for opt in optimizers.values() for g in opt.param_groups]

        def step(self, closure: Callable[[], Any] | None = None) -> Any:
            return closure() if closure is not None else None

        def zero_grad(self, set_to_none: bool = True) -> None:
            return None

        def state_dict(self) -> dict[str, Any]:
            return {"per_parameter": [opt.state_dict() for opt in self.optimizers.values()]}

        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            for opt, sd in zip(self.optimizers.values(), state_dict["per_parameter"]):
                opt.load_state_dict(sd)
            self.param_groups = [g for opt in self.optimizers.values() for g in opt.param_groups]

    return InBackwardOptimizer


def attach(model: Any, make_optimizer: Callable[[list[dict[str, Any]]], torch.optim.Optimizer],
           weight_decay: float = 0.0) -> torch.optim.Optimizer:
    """Give every trainable parameter its own optimizer, stepped by a post-accumulate-grad hook.

    ``make_optimizer(param_groups)`` builds one optimizer for one parameter. Weight decay goes to matrices only
    (not biases or norm weights), the usual split. Returns the loop-facing ``InBackwardOptimizer``.
    """
    if getattr(model, _ATTACHED, False):
        raise ConflictingConstraintsError("optimizer_in_backward hooks are already attached to this model; build its optimizer once")
    optimizers: dict[Any, Any] = {}
    for param in _trainable(model.parameters()):
        decay = weight_decay if param.ndim >= 2 else 0.0
        optimizers[param] = make_optimizer([{"params": [param], "weight_decay": decay}])

    def step_now(param: Any) -> None:
        opt = optimizers[param]
        opt.step()
        opt.zero_grad(set_to_none=True)

    for param in optimizers:
        param.register_post_accumulate_grad_hook(step_now)
    if not optimizers:
        raise ConflictingConstraintsError("optimizer_in_backward found no trainable parameter in the model")
    setattr(model, _ATTACHED, True)
    return _in_backward_optimizer_class()(optimizers)


def _trainable(params: Iterable[Any]) -> list[Any]:
    seen: set[int] = set()
    out = []
    for p in params:
        if p.requires_grad and id(p) not in seen:  # tied weights appear once
            seen.add(id(p))
            out.append(p)
    return out


def trainer_optimizers(rec: Recommendation, model: Any, args: Any) -> tuple[Any, None]:
    """``Trainer(optimizers=...)`` for a plan with ``optimizer_in_backward``: the plan's ``optim`` per parameter.

    The optimizer class and its kwargs come from transformers' own ``Trainer.get_optimizer_cls_and_kwargs``,
    so every ``optim`` name the Trainer accepts (fused AdamW, bnb paged 8-bit, torchao low-bit...) builds the
    same optimizer it would, only once per parameter. The scheduler is left to the Trainer (None).
    """
    check_compatible(args.gradient_accumulation_steps, args.max_grad_norm, args.world_size,
                     fp16=bool(getattr(args, "fp16", False)))
    from transformers import Trainer

    cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args, model)
    kwargs = {k: v for k, v in kwargs.items() if k != "params"}
    logger.info("optimizer_in_backward: one %s per parameter, stepped inside backward", cls.__name__)
    return attach(model, lambda groups: cls(groups, **kwargs), weight_decay=args.weight_decay), None
