"""Loss-path bytes of HF causal-LM training by transformers release and training loop.

The default logits term (activations.logits_bytes) is traced on the current release under a loop that drops the
model output before backward (HF Trainer). Published rows ran other releases and loops, which keep other copies:

* what the model output holds: before 4.46 the fp32 upcast (``logits = logits.float()`` in the model), since 4.46
  the head's own logits (the loss upcasts a private copy);
* whether the loss shifts the logits by a copy (``logits[..., :-1, :].contiguous()``, until 4.48; a copy only at
  batch > 1, since one row minus its last position is already contiguous); since 4.49 the labels are shifted;
* whether the loop keeps that output through backward (a hand-written loop that holds ``outputs`` while calling
  ``backward``: accelerate's run_clm_no_trainer, Answer.AI's fsdp_qlora train.py) or drops it (HF Trainer).

The peak is the larger of the cross-entropy's forward (held output + upcast copy + shift copy + fp32 log-softmax
output) and the start of its backward (output still held + log-softmax output + its gradient + the input gradient).
The eras and their sources are rows of data/activations.json (``loss_paths``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Literal, TypeVar

from pydantic import Field

from .._data import DataModel
from .._packages import installed_release
from ..model.types import ModelSpec
from ..setup import Setup
from .kbit import kbit_fp32_parts


class LossEra(DataModel):
    since: str
    output_keeps: Literal["fp32", "head"]
    shift_copy: bool
    source: str = Field(min_length=10)


class LossPaths(DataModel):
    source: str = Field(min_length=10)
    ce_bytes: int
    traced_release: str  # the release activations.json's logits coefficients were traced on
    eras: tuple[LossEra, ...]


def version_tuple(text: str) -> tuple[int, ...]:
    """``"4.47.1+cu121"`` -> (4, 47, 1); the leading numeric fields only."""
    return tuple(int(p) for p in text.split("+")[0].split(".")[:3] if p.isdigit())


_Era = TypeVar("_Era")


def era_at(eras: Sequence[_Era], release: str | None, since: Callable[[_Era], str]) -> _Era:
    """The last of ``eras`` (oldest first) whose first release (``since``) is not newer than ``release``: the one
    rule every release-dependent fact uses. None (the package is not installed here): the newest; a release older
    than every era: the first."""
    if release is None:
        return eras[-1]
    v = version_tuple(release)
    return ([e for e in eras if version_tuple(since(e)) <= v] or [eras[0]])[-1]


def loss_era(transformers_version: str) -> LossEra:
    """The last era whose first release is not newer than ``transformers_version``."""
    from .activations_data import activations_data

    return era_at(activations_data().loss_paths.eras, transformers_version, lambda e: e.since)


def head_bytes(setup: Setup) -> int:
    """Bytes per logit the head returns: 16-bit under autocast or 16-bit weights; fp32 for fp32 weights without
    autocast and for a quantized base whose head peft upcast (kbit_upcast) and no autocast casts back down."""
    if setup.autocast:
        return 2
    if setup.weights_dtype == "fp32" or kbit_fp32_parts(setup):
        return 4
    return 2


def loss_path_units(setup: Setup, transformers_version: str, loop_keeps_outputs: bool, ce_bytes: int | None = None) -> int:
    """Peak loss-path bytes per (batch x position x logit); see the module docstring. ``ce_bytes``: the bytes per
    element of the cross-entropy's own tensors (log-softmax output and the gradients); None is HF's loss, which
    upcasts the logits to fp32 first (loss_paths.ce_bytes), where a bare ``torch.nn.functional.cross_entropy`` on
    16-bit logits runs in their dtype (Liger-Kernel's benchmark reference: bench/kernels.py)."""
    return max(loss_path_phases(setup, transformers_version, loop_keeps_outputs, ce_bytes))


def loss_path_phases(setup: Setup, transformers_version: str, loop_keeps_outputs: bool,
                     ce_bytes: int | None = None) -> tuple[int, int]:
    """(the cross-entropy's forward, the start of its backward), bytes per logit. They sit on either side of the
    model's return: HF computes the loss inside ``forward``, so inside the autocast region accelerate and Trainer wrap
    around it, and the backward runs after the region has exited (what autocast's weight cache holds until then:
    memory/autocast_copies.py)."""
    era = loss_era(transformers_version)
    from .activations_data import activations_data

    ce = activations_data().loss_paths.ce_bytes if ce_bytes is None else ce_bytes
    head = head_bytes(setup)
    held = ce if era.output_keeps == "fp32" else head
    upcast = 0 if era.output_keeps == "fp32" or head == ce else ce
    shift = ce if era.shift_copy and setup.micro_batch_size > 1 else 0
    forward = held + upcast + shift + ce
    backward = (held if loop_keeps_outputs else 0) + 3 * ce
    return forward, backward


def hf_loss_bytes(spec: ModelSpec, setup: Setup, transformers_version: str, loop_keeps_outputs: bool) -> int:
    """Loss-path bytes of a causal LM trained with HF's loss at ``transformers_version`` (pass as ``loss_bytes``)."""
    from .softcap import final_softcap_bytes

    units = loss_path_units(setup, transformers_version, loop_keeps_outputs)
    return setup.micro_batch_size * setup.seq_len * spec.logits_width * units + final_softcap_bytes(spec, setup)


@lru_cache(maxsize=1)
def installed_transformers() -> str | None:
    """The transformers release installed next to perfguide (the one a plan made here will train with)."""
    return installed_release("transformers")


def forward_loss_bytes(spec: ModelSpec, setup: Setup, release: str | None) -> int:
    """What HF's own loss holds at its forward, inside the model's autocast region (a trainer that drops the output
    before backward): the bytes autocast's cached casts sit beside. 0 where no causal-LM loss runs."""
    if not spec.generates or spec.is_encoder_decoder:
        return 0
    from .activations_data import activations_data

    forward, _ = loss_path_phases(setup, release or activations_data().loss_paths.traced_release, False)
    return setup.micro_batch_size * setup.seq_len * spec.logits_width * forward


def release_delta_bytes(spec: ModelSpec, setup: Setup, release: str | None) -> int:
    """Loss-path bytes ``release`` keeps beyond the release the default logits term was traced on (HF Trainer,
    which drops the model output before backward). Non-zero only where the eras differ at this batch: 4.46-4.48
    keep the 16-bit head logits, the fp32 upcast and its shift copy at batch > 1 (14 B per logit vs 12)."""
    if release is None or not spec.generates or spec.is_encoder_decoder:
        return 0
    from .activations_data import activations_data

    traced = activations_data().loss_paths.traced_release
    units = loss_path_units(setup, release, False) - loss_path_units(setup, traced, False)
    return setup.micro_batch_size * setup.seq_len * spec.logits_width * units
