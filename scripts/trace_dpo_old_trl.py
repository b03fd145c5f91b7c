"""Trace a released TRL 1.0-1.14 DPOTrainer's own training_step on CPU and print its loss path per logit, beside what
memory/dpo_logits.py prices (data/trl.json eras ``dpo_loss``).

Run with the release's wheel unpacked on the path (no install; the venv's transformers and accelerate):
``pip download trl==1.13.0 --no-deps -d /tmp/w && unzip -q /tmp/w/*.whl -d /tmp/trl-1.13.0``, then
``PYTHONPATH=/tmp/trl-1.13.0 HF_HUB_OFFLINE=1 .venv/bin/python scripts/trace_dpo_old_trl.py``. A tiny Llama with a wide
vocabulary (V 32768, h 16, one block) so the logits dwarf everything else; one pair of 256-token rows, a separate
reference model, no checkpointing; fp32 weights, then bf16=True (accelerate's native AMP on CPU). perfguide's
live-bytes tracker (memory/tracing/tracker.py) watches ``trainer.training_step``; the phase turns to backward when
the loss reaches ``accelerator.backward``. The parameters' gradients, born in backward, are taken off. On a CPU 1.14
runs the torch ops (its Triton kernel needs CUDA): tests/test_dpo_old_trl.py replays the kernel.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

V, H, S = 32768, 16, 256


def trace(bf16: bool) -> tuple[float, float]:
    import datasets
    import torch
    import trl
    from helpers import tiny_config, tiny_tokenizer
    from transformers import AutoModelForCausalLM

    from perfguide.memory.tracing.tracker import make_tracker

    cfg = tiny_config(vocab_size=V, hidden_size=H, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, max_position_embeddings=512)
    torch.manual_seed(0)
    model, ref = AutoModelForCausalLM.from_config(cfg), AutoModelForCausalLM.from_config(cfg)
    g = torch.Generator().manual_seed(0)

    def words(k: int) -> str:
        return " ".join(f"t{int(i)}" for i in torch.randint(3, 128, (k,), generator=g))

    pairs = datasets.Dataset.from_list([{"prompt": words(8) + " ", "chosen": words(400), "rejected": words(400)}] * 2)
    args = trl.DPOConfig(output_dir="/tmp/trace_dpo_old_trl", max_length=S, per_device_train_batch_size=1, use_cpu=True,
                         gradient_checkpointing=False, bf16=bf16, fp16=False, report_to="none", save_strategy="no",
                         logging_strategy="no", disable_tqdm=True, max_steps=1)
    trainer = trl.DPOTrainer(model=model, ref_model=ref, args=args, train_dataset=pairs, processing_class=tiny_tokenizer())
    batch = next(iter(trainer.get_train_dataloader()))
    rows, s = batch["input_ids"].shape
    assert (rows, s) == (2, S), (rows, s)   # both rows cut at max_length: every position is a completion label
    trainer.current_gradient_accumulation_steps = 1   # set by Trainer's train loop, read by training_step
    wrapped = trainer.accelerator.prepare(trainer.model)
    wrapped.train()
    tracker = make_tracker(1)
    backward = trainer.accelerator.backward

    def phased(loss: Any, **kw: Any) -> Any:
        tracker.set_phase("backward")
        return backward(loss, **kw)

    trainer.accelerator.backward = phased
    with tracker:
        trainer.training_step(wrapped, batch)
    grads = sum(p.numel() * p.element_size() for p in model.parameters())
    logits = rows * s * V
    return tracker.peaks["forward"][0] / logits, (tracker.peaks["backward"][0] - grads) / logits


def main() -> None:
    import trl

    from perfguide.memory import dpo_logits, fused_head

    era = fused_head.trl_era(trl.__version__)
    assert era.dpo_loss in ("torch", "kernel"), f"TRL {trl.__version__}: put a 1.0-1.14 wheel on PYTHONPATH"
    chunk = fused_head.trl_data().dpo_entropy_chunk_rows / (2 * S)
    for bf16 in (False, True):
        d, upcast = (4, 2) if bf16 else (4, 0)
        priced = dpo_logits.units("torch", era.dpo_contiguous, d, upcast, 2, True,
                                  entropy_after_reference=era.dpo_loss == "torch", chunk_share=chunk)
        traced = trace(bf16)
        print(f"TRL {trl.__version__} {'bf16=True' if bf16 else 'fp32'}: bytes per logit forward / backward "
              f"traced {traced[0]:.2f} / {traced[1]:.2f}, priced {priced[0]:.2f} / {priced[1]:.2f}")


if __name__ == "__main__":
    main()
