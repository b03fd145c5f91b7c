"""The callback's pre-flight on real CPU Trainer runs: a run given less memory than its plan needs stops before step 1
naming the change (in TrainingArguments keys) that fits, and that change, applied, trains; a fitting run trains; the
same works for TRL's SFTTrainer; ``preflight=False`` turns it off."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers import tiny_model, tiny_tokenizer, token_dataset

import perfguide
from perfguide.integrations.readers.trainer import WillNotFitError

QUIET = {"report_to": "none", "disable_tqdm": True, "save_strategy": "no", "logging_strategy": "no"}


class Steps:
    """Counts the optimizer steps that started: the pre-flight must stop the run before the first."""

    def __init__(self) -> None:
        from transformers import TrainerCallback

        outer = self

        class _Counter(TrainerCallback):
            def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                outer.started += 1

        self.started = 0
        self.callback = _Counter()


def trainer(tmp_path: Path, callbacks: list, **args: Any) -> Any:
    from transformers import Trainer, TrainingArguments

    kw = {"output_dir": str(tmp_path / "out"), "use_cpu": True, "max_steps": 2, "per_device_train_batch_size": 4, **QUIET, **args}
    return Trainer(model=tiny_model(), args=TrainingArguments(**kw), train_dataset=token_dataset(n=16))


def test_a_run_that_does_not_fit_stops_before_step_one_and_the_named_change_trains(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from perfguide.integrations.readers.trainer import trainer_check

    steps = Steps()
    t = trainer(tmp_path, [])
    need = trainer_check(t.args, t.model, train_dataloader=SimpleNamespace(dataset=t.train_dataset))
    from perfguide.memory import estimate_memory

    smaller = need.setup.replace(micro_batch_size=1, gradient_accumulation_steps=4)
    small = estimate_memory(perfguide.ModelSpec.from_any(t.model), smaller, perfguide.Hardware.probe(), None).device_total
    assert small < need.memory.device_total
    limit = (small + need.memory.device_total) // 2   # below what this run needs, above what micro-batches of 1 need
    cb = perfguide.PerfGuideCallback(memory_limit=limit)
    t.add_callback(cb)
    t.add_callback(steps.callback)
    with pytest.raises(WillNotFitError, match="to fit: ") as err:
        t.train()
    assert steps.started == 0 and t.state.global_step == 0
    check = cb.preflight_check
    assert check is not None and not check.fits and check.memory.capacity == limit
    assert check.setup.micro_batch_size == 4 and check.setup.device == "cpu" and check.setup.weights_dtype == "fp32"
    assert check.setup.seq_len == len(token_dataset(n=1)[0]["input_ids"])   # read from the Trainer's own samples
    edit = check.change("fit").edits[0]
    assert edit.format == "training_args" and "\n" not in str(err.value)
    fixed = trainer(tmp_path, [], **edit.keys)
    again = perfguide.PerfGuideCallback(memory_limit=limit)
    fixed.add_callback(again)
    fixed.train()
    assert again.preflight_check.fits and fixed.state.global_step == 2


def test_a_fitting_run_trains_and_preflight_false_skips(tmp_path: Path) -> None:
    cb = perfguide.PerfGuideCallback()
    t = trainer(tmp_path, [])
    t.add_callback(cb)
    t.train()
    assert cb.preflight_check.fits and t.state.global_step == 2
    off = perfguide.PerfGuideCallback(preflight=False, memory_limit=1)
    t = trainer(tmp_path, [])
    t.add_callback(off)
    t.train()
    assert off.preflight_check is None and t.state.global_step == 2


def test_sft_trainer_preflight_reads_the_sft_config(tmp_path: Path) -> None:
    import datasets
    import trl

    rows = datasets.Dataset.from_list([{"input_ids": [(i * 7 + j) % 120 + 3 for j in range(24)]} for i in range(16)])
    args = trl.SFTConfig(output_dir=str(tmp_path / "sft"), use_cpu=True, max_steps=1, per_device_train_batch_size=2, max_length=32,
                         bf16=False, activation_checkpointing=False, **QUIET)
    cb = perfguide.PerfGuideCallback(memory_limit=1024**2)
    t = trl.SFTTrainer(model=tiny_model(), args=args, train_dataset=rows, processing_class=tiny_tokenizer(), callbacks=[cb])
    with pytest.raises(WillNotFitError):
        t.train()
    assert t.state.global_step == 0
    s = cb.preflight_check.setup
    assert (s.seq_len, s.micro_batch_size, s.gradient_checkpointing, s.autocast) == (32, 2, False, None)


@pytest.mark.parametrize("saved", [None, ["lm_head"], ["embed_tokens", "lm_head"]])
def test_an_all_linear_peft_model_is_read_from_the_module(saved) -> None:
    """peft 0.21 stores an "all-linear" LoraConfig's targets as every module's full path ("model.layers.0.mlp.down_proj"),
    which no block-relative name matches: the pre-flight read them from the config and skipped every such run. It now
    reads the adapter as ``ModelSpec.from_any`` does, from the module, modules_to_save included, so the gradients it
    prices are exactly the trainable parameters the model holds, at 4 bytes each (fp32 adapters and copies)."""
    peft = pytest.importorskip("peft")
    from transformers import TrainingArguments

    from perfguide.integrations.readers.trainer import trainer_check

    model = peft.get_peft_model(tiny_model(), peft.LoraConfig(r=4, target_modules="all-linear", modules_to_save=saved))
    assert any(t.startswith("model.layers.0.") for t in model.peft_config["default"].target_modules)
    args = TrainingArguments(output_dir="unused", use_cpu=True, per_device_train_batch_size=2, report_to="none")
    check = trainer_check(args, model, seq_len=16)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert check.memory.gradients == 4 * trainable
    assert check.setup.lora.modules_to_save == tuple(saved or ())
