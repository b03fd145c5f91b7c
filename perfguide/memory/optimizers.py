"""Optimizer state bytes per trainable tensor, for every ``optim`` name perfguide prices.

States are counted per tensor shape because the rules differ by shape: bitsandbytes keeps tensors under
4096 elements in 32-bit (Optimizer8bit ``min_8bit_size``), and every nn.Embedding too where the training stack registers
bnb's GlobalOptimManager override (the HF Trainer does, torchtune does not: ``Setup.bnb_embedding_override``); Adafactor factors the second moment
of >=2-D tensors into row + column vectors; torch optimizers keep state in the parameter's dtype while
bitsandbytes 32-bit optimizers always use fp32. The per-optimizer facts (family, state tensors, bits) are the
rows of data/optimizers.json (perfguide.optimizer_facts), each with its public source.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Literal

from ..optimizer_facts import row

Kind = Literal["linear", "head", "embedding", "other"]

BNB_MIN_8BIT_SIZE = 4096      # bitsandbytes Optimizer8bit min_8bit_size default
BNB_BLOCK = 2048              # blockwise quantization block of bnb 8-bit optimizer states (fp32 absmax each)
TORCHAO_MIN_SIZE = 4096       # torchao low-bit optimizers keep small tensors in full precision
TORCHAO_BLOCK = {8: 256, 4: 128}


@dataclass(frozen=True)
class TensorGroup:
    """``count`` trainable tensors of shape (rows, cols); cols == 1 for 1-D tensors (norms, biases).

    ``width``: bytes per element where these tensors are stored at another width than the rest (PEFT's
    modules_to_save copies keep their original's 16 bits beside fp32 adapters); None: the width the pricing is handed
    (``param_bytes``), which a step that casts every trainable tensor (DeepSpeed's fp32 masters) also imposes."""

    count: int
    rows: int
    cols: int
    kind: Kind = "linear"
    width: int | None = None

    @property
    def numel(self) -> int:
        return self.rows * self.cols

    @property
    def total(self) -> int:
        return self.count * self.numel


def group_bytes(groups: tuple[TensorGroup, ...] | list[TensorGroup], param_bytes: int) -> int:
    """Bytes of one copy of ``groups`` (the weights, or their gradients), each at its own width or ``param_bytes``."""
    return sum(g.total * (g.width or param_bytes) for g in groups)


@dataclass(frozen=True)
class OptimizerCost:
    """State bytes kept between steps, and the extra transient bytes the step itself allocates."""

    states: int
    step_temp: int
    paged: bool = False




def _bnb_state_bytes(g: TensorGroup, states: int, bits: int, embedding_32bit: bool = True) -> int:
    """bnb: 8-bit state + one fp32 absmax per 2048-block, except tensors under ``min_8bit_size`` elements and, where the
    stack registers the 32-bit override for them (``embedding_32bit``), embeddings: those keep fp32 state."""
    if bits == 32 or g.numel < BNB_MIN_8BIT_SIZE or (embedding_32bit and g.kind == "embedding"):
        return g.total * 4 * states
    blocks = -(-g.numel // BNB_BLOCK)
    return g.count * states * (g.numel + blocks * 4)


def _torchao_state_bytes(g: TensorGroup, states: int, bits: int, param_bytes: int) -> int:
    """torchao AdamW8bit/4bit: quantized state + one fp32 scale per block; small tensors unquantized."""
    if g.numel < TORCHAO_MIN_SIZE:
        return g.total * param_bytes * states
    block = TORCHAO_BLOCK[bits]
    blocks = -(-g.numel // block)
    return g.count * states * (g.numel * bits // 8 + blocks * 4)


def _adafactor_state_bytes(g: TensorGroup, param_bytes: int) -> int:
    """transformers Adafactor (beta1=None, as the Trainer builds it): row+col second moments for 2-D, full for 1-D.

    The state is created with ``.to(grad)``, i.e. in the gradient's dtype; each tensor also keeps a scalar RMS.
    """
    per = (g.rows + g.cols) if g.cols > 1 else g.rows
    return g.count * (per * param_bytes + 4)


def _factored_fp32_bytes(g: TensorGroup) -> int:
    """AdaLomo: fp32 row + column second moments of a matrix, a full fp32 one for a vector (lomo_optim adalomo.py)."""
    per = (g.rows + g.cols) if g.cols > 1 else g.rows
    return g.count * per * 4


def _projected_state_bytes(g: TensorGroup, states: int, bits: int, rank: int, param_bytes: int) -> int:
    """GaLore / APOLLO on a target matrix (m x n): ``states`` moments of the projected r x max(m, n) gradient plus the
    min(m, n) x r projection, in the gradient's dtype; 8-bit moments are bnb blocks. Any other tensor: plain AdamW
    (8-bit for embeddings too: the Trainer's 32-bit embedding override is only registered for bitsandbytes' own classes)."""
    if g.kind != "linear" or g.cols == 1:
        return _bnb_state_bytes(TensorGroup(g.count, g.rows, g.cols), states, bits) if bits == 8 else g.total * param_bytes * states
    r = min(rank, g.rows, g.cols)
    low = r * max(g.rows, g.cols)
    moments = _bnb_state_bytes(TensorGroup(g.count, r, max(g.rows, g.cols)), states, 8) if bits == 8 else g.count * low * param_bytes * states
    return moments + g.count * r * min(g.rows, g.cols) * param_bytes


def optimizer_cost(name: str | None, groups: list[TensorGroup], param_bytes: int, *, embedding_32bit: bool = True) -> OptimizerCost:
    """State and step-temporary bytes for ``groups`` of trainable tensors whose dtype has ``param_bytes``; a plan asks
    it for hundreds of candidates that share the same trainable tensors, so each answer is kept. ``embedding_32bit``:
    the stack registers bnb's 32-bit state override for nn.Embedding weights (``Setup.bnb_embedding_override``)."""
    return _optimizer_cost(name, tuple(groups), param_bytes, embedding_32bit)


@lru_cache(maxsize=512)
def _optimizer_cost(name: str | None, groups: tuple[TensorGroup, ...], param_bytes: int, embedding_32bit: bool = True) -> OptimizerCost:
    if name is None:
        return OptimizerCost(0, 0)
    if any(g.width is not None for g in groups):
        return _per_width(name, groups, param_bytes, embedding_32bit)
    facts = row(name)
    family, states, bits = facts.family, facts.states, facts.bits
    largest = max((g.numel for g in groups), default=0)
    if family == "torch":
        total = sum(g.total for g in groups)
        state = total * param_bytes * states
        # the default foreach step of AdamW / RMSprop / Adagrad builds a parameter-sized temporary (_foreach_sqrt
        # of the second moment) for the whole group (FakeTensor trace, memory/trace.py: 20N peak for 7B); fused AdamW and
        # momentum-free SGD update in place.
        temp = total * param_bytes if facts.foreach_temp else 0
        return OptimizerCost(state, temp)
    if family == "adafactor":
        state = sum(_adafactor_state_bytes(g, param_bytes) for g in groups)
        # per-tensor update temporaries (grad**2 + eps, update) in fp32, one tensor at a time
        return OptimizerCost(state, largest * 4 * 2)
    if family == "bnb":
        state = sum(_bnb_state_bytes(g, states, bits, embedding_32bit) for g in groups)
        return OptimizerCost(state, 0, paged=facts.paged)
    if family == "lomo":
        return OptimizerCost(0, 0)   # plain SGD fused into backward: no state, the update reuses the gradient
    if family == "adalomo":
        return OptimizerCost(sum(_factored_fp32_bytes(g) for g in groups), largest * 4 * 2)
    if family in ("galore", "apollo"):
        rank = facts.rank or 128
        state = sum(_projected_state_bytes(g, states, bits, rank, param_bytes) for g in groups)
        return OptimizerCost(state, largest * 4 * 2)   # one tensor's projection + update temporaries in fp32
    state = sum(_torchao_state_bytes(g, states, bits, param_bytes) for g in groups)
    return OptimizerCost(state, largest * 4 * states)


def _per_width(name: str, groups: tuple[TensorGroup, ...], param_bytes: int, embedding_32bit: bool) -> OptimizerCost:
    """Tensors of two widths: each width's states priced at it and added. Step temporaries: torch's foreach step
    runs once per (device, dtype) group (``Optimizer._group_tensors_by_device_and_dtype`` in torch/optim/adam.py
    ``_multi_tensor_adam``) and the group's ``exp_avg_sq_sqrt`` list is only rebound, not deleted, by the next
    group's ``torch._foreach_sqrt``, so the two groups' temporaries are alive together: their sum (measured on CPU
    tensors, tests/test_mixed_width.py). The per-tensor temporaries of the other families are one tensor's: the max."""
    widths = sorted({g.width or param_bytes for g in groups})
    parts = [_optimizer_cost(name, tuple(replace(g, width=None) for g in groups if (g.width or param_bytes) == w), w,
                             embedding_32bit) for w in widths]
    temps = [p.step_temp for p in parts]
    temp = sum(temps) if row(name).family == "torch" else max(temps)
    return OptimizerCost(sum(p.states for p in parts), temp, any(p.paged for p in parts))


def state_bytes_per_param(name: str | None, param_bytes: int = 4) -> float:
    """Nominal state bytes per parameter of a large matrix (for reports and the rules engine)."""
    big = TensorGroup(1, 4096, 4096)
    return optimizer_cost(name, [big], param_bytes).states / big.total
