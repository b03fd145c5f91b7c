"""Live bytes of one real TRL step (SFTTrainer, DPOTrainer) on a tiny Gemma 3 on CPU: the s^2 bytes where the
checkpointed blocks are recomputed, and every s^2 tensor alive there, by the op that made it.

Why: rows 1181-1185 (TRL v1.15.0's table, gemma-3-1b at 59k-108k tokens) fit 20-39% longer in perfguide than
published; at those lengths the peak is the checkpoint recompute and its s^2 terms (memory/masks.py) decide the length.
This runs the installed trainers for real (trl 1.16, transformers 5.24, torch CPU): a Gemma3ForCausalLM of
``gemma3_text`` shape (5 sliding + 1 full layer, window 16, h 64, 4 heads x 32, 1 KV head, vocab 4096), bf16
weights, ``bf16=True``, SDPA, the trainers' default gradient checkpointing (``use_reentrant=False``), batch 1 (one pair
for DPO), at s = 512, 1024, 2048. Live bytes are counted per storage (torch dispatch mode, as
memory/tracing/tracker.py does) and split by phase: forward, the fused head's backward, and each block's
recompute + backward (and, for DPO, the no-grad reference forward). The s^2 coefficient is the second difference
over s, 2s, 4s (linear and constant terms cancel); the most s x s bytes alive at any moment of each phase is printed
too, since at these shapes the LM head's tiles, not the masks, hold the forward's total peak.

Run: ``HF_HUB_OFFLINE=1 .venv/bin/python scripts/trace_trl_gemma.py [--pad N]`` (``--pad``: the DPO rejected
completion N tokens shorter, so the pair is padded and the 2-D attention mask carries zeros).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import warnings
import weakref
from collections.abc import Callable
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

VOCAB = 4096
LENGTHS = (512, 1024, 2048)
#: gemma-3-1b's shape in small: 1 KV head, 5 sliding layers then a full one (Gemma 3's pattern), a window far below s
GEMMA3: dict[str, Any] = dict(model_type="gemma3_text", vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
              num_attention_heads=4, num_key_value_heads=1, head_dim=32, sliding_window=16)


def tiny_gemma3(max_len: int) -> Any:
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    fields: dict[str, Any] = {k: v for k, v in GEMMA3.items() if k != "model_type"}
    fields.update(max_position_embeddings=max_len, attn_implementation="sdpa", pad_token_id=0, eos_token_id=1, bos_token_id=2)
    config: Any = Gemma3TextConfig(**fields)
    assert config.layer_types.count("sliding_attention") == 5, config.layer_types
    torch.manual_seed(0)
    model: Any = Gemma3ForCausalLM(config)
    return model.to(torch.bfloat16)   # from the config with random bf16 weights, as the release's benchmark


def word_tokenizer() -> Any:
    """A word-level tokenizer made here (no hub): the trainers want a processing class, the step reads ids only."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t3"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="t0", eos_token="t1", bos_token="t2", unk_token="t3")


class Storages:
    """Live bytes by storage, the phase's peak, and the s^2-sized storages alive at it (creator op, shape, dtype);
    beside it, the most bytes of s x s tensors alive at any moment of the phase (``square_peaks``), which at these
    small shapes the LM-head tiles hide from the phase's total peak (the mask building, the reference forward)."""

    def __init__(self, s: int) -> None:
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_flatten

        self.s, self.big, self.total, self.square, self.phase = s, s * s // 2, 0, 0, "forward"
        self.square_peaks: dict[str, tuple[int, list[tuple[str, str, str, int]]]] = {}
        self.seen: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()
        self.peaks: dict[str, tuple[int, list[tuple[str, str, str, int]]]] = {}
        outer = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                out = func(*args, **(kwargs or {}))
                for t in tree_flatten(out)[0]:
                    if isinstance(t, torch.Tensor):
                        outer.charge(t, func)
                return out

        self.mode = Mode()

    def charge(self, t: Any, func: Any) -> None:
        storage = t.untyped_storage()
        if storage in self.seen:
            return
        square = t.dim() >= 2 and t.shape[-1] == t.shape[-2] == self.s
        rec = [storage.nbytes(), f"{func.overloadpacket.__name__} in {self.phase}", tuple(t.shape), str(t.dtype), square]
        self.seen[storage] = rec
        self.total += rec[0]
        self.square += rec[0] if square else 0
        weakref.finalize(storage, self._free, rec)
        self.note()

    def _free(self, rec: list[Any]) -> None:
        self.total -= rec[0]
        self.square -= rec[0] if rec[4] else 0

    def note(self) -> None:
        best = self.peaks.get(self.phase)
        if best is None or self.total > best[0]:
            alive = [(r[1], str(r[2]), r[3], r[0]) for r in self.seen.values() if r[0] >= self.big]
            self.peaks[self.phase] = (self.total, alive)
        best = self.square_peaks.get(self.phase)
        if best is None or self.square > best[0]:
            alive = [(r[1], str(r[2]), r[3], r[0]) for r in self.seen.values() if r[4]]
            self.square_peaks[self.phase] = (self.square, alive)


def recompute_phases(model: Any, meter: Storages) -> Callable[[], None]:
    """Name each decoder block's forward in backward (its checkpoint recompute) as a phase of its own. The hook sits on
    the block's first submodule: the checkpointed block re-runs its ``forward`` directly, not through its own hooks."""
    hooks = []
    for i, layer in enumerate(model.model.layers):
        kind = model.config.layer_types[i]

        def pre(_mod: Any, _args: Any, i: int = i, kind: str = kind) -> None:
            if meter.phase != "forward":
                meter.phase = f"recompute+backward block {i} ({kind})"
                meter.note()
        hooks.append(layer.input_layernorm.register_forward_pre_hook(pre))
    def remove() -> None:
        for h in hooks:
            h.remove()
    return remove


def traced_step(trainer: Any, batch: dict[str, Any], s: int) -> Storages:
    """One ``training_step`` (forward, loss, backward) under the meter; the backward's start names the head phase."""
    meter = Storages(s)
    backward = trainer.accelerator.backward

    def timed_backward(loss: Any, **kw: Any) -> Any:
        meter.phase = "fused head backward"
        meter.note()
        return backward(loss, **kw)

    trainer.accelerator.backward = timed_backward
    trainer.current_gradient_accumulation_steps = 1   # what the training loop sets before its first step
    trainer.model.train()
    # Trainer.train() switches checkpointing on (transformers 5.24 trainer.py: activation_checkpointing_enable with the
    # args' kwargs; None -> use_reentrant=False)
    trainer.model.activation_checkpointing_enable(activation_checkpointing_kwargs=trainer.args.activation_checkpointing_kwargs)
    assert trainer.args.activation_checkpointing and trainer.model.is_activation_checkpointing
    remove = recompute_phases(trainer.model, meter)
    reference = getattr(trainer, "ref_model", None)
    if reference is not None:   # DPO: the no-grad reference forward, from its mask building on
        def ref_start(_mod: Any, _args: Any, _kwargs: Any) -> None:
            meter.phase = "reference forward"
            meter.note()
        handle = reference.model.register_forward_pre_hook(ref_start, with_kwargs=True)
        remove_policy = remove

        def remove() -> None:
            remove_policy()
            handle.remove()
    try:
        with meter.mode:
            trainer.training_step(trainer.model, batch)
    finally:
        remove()
        trainer.accelerator.backward = backward
    return meter


def sft_trainer(out: str, s: int) -> tuple[Any, dict[str, Any]]:
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    ids = [[4 + (7 * i) % (VOCAB - 4) for i in range(s)]]
    args = SFTConfig(output_dir=out, per_device_train_batch_size=1, max_length=s, bf16=True, use_cpu=True,
                     report_to=[], loss_type="nll", dataset_num_proc=None)
    trainer = SFTTrainer(model=tiny_gemma3(s), args=args, train_dataset=Dataset.from_dict({"input_ids": ids}),
                         processing_class=word_tokenizer())
    return trainer, trainer.data_collator([{"input_ids": ids[0]}])


def dpo_trainer(out: str, s: int, pad: int) -> tuple[Any, dict[str, Any]]:
    import copy

    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    prompt = s // 4
    text = {"prompt": ["t5 t6"], "chosen": ["t7"], "rejected": ["t8"]}
    model = tiny_gemma3(s)
    args = DPOConfig(output_dir=out, per_device_train_batch_size=1, max_length=s, bf16=True, use_cpu=True,
                     report_to=[], dataset_num_proc=None)
    trainer = DPOTrainer(model=model, ref_model=copy.deepcopy(model), args=args, train_dataset=Dataset.from_dict(text),
                         processing_class=word_tokenizer())
    example = {"prompt_ids": [5] * prompt, "chosen_ids": [9] * (s - prompt), "rejected_ids": [11] * (s - prompt - pad)}
    return trainer, trainer.data_collator([example])


def s2_coefficient(totals: list[int], rows: int) -> float:
    """Bytes per row x s^2 from peaks at s, 2s, 4s: (P(4s) - 3 P(2s) + 2 P(s)) / (6 s^2), in which the linear and
    constant terms cancel (16 - 12 + 2 = 6 for s^2; 4 - 6 + 2 = 0; 1 - 3 + 2 = 0)."""
    s = LENGTHS[0]
    return (totals[2] - 3 * totals[1] + 2 * totals[0]) / (6 * rows * s * s)


def perfguide_s2(rows: int, s: int, sliding: bool = True) -> float:
    """perfguide's s^2 bytes per row where a block is recomputed (memory/masks.py): the bool sliding mask the
    checkpointed blocks keep, plus, in a sliding block, its recomputed SDPA bias. A padded DPO pair's full-attention
    mask is not priced (perfguide's Setup has no padding)."""
    from perfguide import ModelSpec, Setup
    from perfguide.memory.masks import checkpointed_mask_bytes, sdpa_bias_bytes

    spec = ModelSpec.from_any({**GEMMA3, "max_position_embeddings": s})
    setup = Setup(attn_implementation="sdpa", micro_batch_size=rows, seq_len=s, gradient_checkpointing=True,
                  weights_dtype="bf16")
    bias = sdpa_bias_bytes(spec, setup, checkpointed=True) if sliding else 0
    return (checkpointed_mask_bytes(spec, setup) + bias) / (rows * s * s)


def square_bytes(peak: tuple[int, list[tuple[str, str, str, int]]], s: int) -> list[tuple[str, str, str, int]]:
    """The s x s tensors alive at a phase's peak."""
    return [t for t in peak[1] if t[1].endswith(f"{s}, {s})")]


def report(name: str, meters: list[Storages], rows: int) -> None:
    print(f"\n== {name}: {rows} row(s) per step, s = {LENGTHS}")
    runs = [m.peaks for m in meters]
    phases = [p for p in runs[-1] if all(p in r for r in runs)]
    for phase in phases:
        totals = [r[phase][0] for r in runs]
        print(f"{phase:42s} peak {totals[-1] / 2**20:8.2f} MiB at s={LENGTHS[-1]}; s^2 bytes per row "
              f"{s2_coefficient(totals, rows):6.3f}")
    recompute = [p for p in phases if p.startswith("recompute")]
    worst = max(recompute, key=lambda p: runs[-1][p][0])
    s = LENGTHS[-1]
    print(f"-> recompute peak ({worst}): {s2_coefficient([r[worst][0] for r in runs], rows):.3f} B per row x s^2; "
          f"perfguide prices {perfguide_s2(rows, s, 'sliding' in worst):.3f}")
    square = square_bytes(runs[-1][worst], s)
    print(f"   s x s tensors alive there: {sum(t[3] for t in square) / (rows * s * s):.3f} B per row x s^2")
    for op, shape, dtype, nbytes in sorted(square, key=lambda t: -t[3]):
        print(f"   {nbytes / (rows * s * s):5.2f} B/row/s^2  {dtype:15s} {shape:28s} made by {op}")
    print(f"most s x s bytes alive at any moment of each phase (s={s}), per row x s^2:")
    for phase, (nbytes, alive) in meters[-1].square_peaks.items():
        made = ", ".join(f"{op.split(' in ')[0]} {dtype.removeprefix('torch.')} {b / (rows * s * s):.0f}"
                         for op, _shape, dtype, b in sorted(alive, key=lambda t: -t[3]))
        print(f"   {phase:46s} {nbytes / (rows * s * s):5.2f}  ({made})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pad", type=int, default=0, help="DPO: rejected completion this many tokens shorter")
    parser.add_argument("--only", choices=("sft", "dpo"), default=None)
    a = parser.parse_args()
    warnings.filterwarnings("ignore")
    from transformers.utils import logging

    logging.set_verbosity_error()
    with tempfile.TemporaryDirectory() as out:
        for name in ("sft", "dpo"):
            if a.only not in (None, name):
                continue
            runs = []
            for s in LENGTHS:
                trainer, batch = sft_trainer(out, s) if name == "sft" else dpo_trainer(out, s, a.pad)
                runs.append(traced_step(trainer, batch, s))
            report(name, runs, 1 if name == "sft" else 2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
