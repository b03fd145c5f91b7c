"""transformers 4.30-4.31's Trainer builds its optimizer and lr scheduler before accelerate wraps the model in FSDP
(eras.trainer_fsdp_pre_wrap_bytes), so the scheduler's optimizer keeps the original parameters whole on every GPU.

Read in the wheels: 4.30.2 and 4.31.0 trainer.py ``_inner_training_loop`` call ``create_optimizer_and_scheduler``
and then ``accelerator.prepare(self.model, self.optimizer)``; 4.29.2 wraps FSDP itself (``_wrap_model``) before
building the optimizer; 4.32.1 calls ``self.accelerator.prepare(self.model)`` first. accelerate 0.20.3's
``_prepare_fsdp`` builds a new optimizer over ``model.parameters()`` (the flat parameters) and rebinds only schedulers
passed to the same ``prepare`` call; torch 2.0.1's FSDP moves the module with ``module.to(device_id)`` before
flattening (``_move_module_to_device``), so the old Parameters' data is on the GPU.

Hand count: LLaMA-7B (h 4096, ffn 11008, 32 layers, vocab 32000, untied) has 6,738,415,616 parameters; loaded in fp32
(stanford_alpaca's train.py) that is 26,953,662,464 B per GPU whatever the sharding.
"""

from __future__ import annotations

from types import ModuleType

import pytest
from helpers import load_bench

from perfguide.memory.eras import trainer_fsdp_pre_wrap_bytes
from perfguide.model.types import ModelSpec
from perfguide.setup import LoraSpec, Setup

LLAMA_7B = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
            "intermediate_size": 11008, "num_attention_heads": 32, "num_hidden_layers": 32, "vocab_size": 32000,
            "tie_word_embeddings": False, "max_position_embeddings": 2048}


def _setup(**kw: object) -> Setup:
    fields: dict[str, object] = dict(task="train", micro_batch_size=4, seq_len=512, weights_dtype="fp32", autocast="bf16",
                                     num_gpus=4, strategy="fsdp", attn_implementation="eager", optimizer="adamw_torch")
    fields.update(kw)
    return Setup(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("release", ["4.30.0", "4.30.2", "4.31.0"])
def test_the_accelerate_trainer_keeps_the_whole_fp32_model_by_hand(release: str) -> None:
    spec = ModelSpec.from_any(LLAMA_7B)
    assert spec.total_params == 6_738_415_616
    assert trainer_fsdp_pre_wrap_bytes(spec, _setup(), release) == 6_738_415_616 * 4 == 26_953_662_464
    # the original Parameters are whole: the same on 8 GPUs, and under SHARD_GRAD_OP
    assert trainer_fsdp_pre_wrap_bytes(spec, _setup(num_gpus=8, strategy="fsdp_shard_grad_op"), release) == 26_953_662_464


def test_the_load_dtype_sets_the_bytes() -> None:
    spec = ModelSpec.from_any(LLAMA_7B)
    assert trainer_fsdp_pre_wrap_bytes(spec, _setup(weights_dtype="bf16", autocast=None), "4.31.0") == 6_738_415_616 * 2


@pytest.mark.parametrize("release", ["4.28.1", "4.29.2", "4.32.0", "4.32.1", "5.24.0"])
def test_other_releases_build_the_optimizer_on_the_wrapped_model(release: str) -> None:
    assert trainer_fsdp_pre_wrap_bytes(ModelSpec.from_any(LLAMA_7B), _setup(), release) == 0


def test_only_fsdp_and_only_the_trainable_parameters() -> None:
    spec = ModelSpec.from_any(LLAMA_7B)
    assert trainer_fsdp_pre_wrap_bytes(spec, _setup(strategy="ddp"), "4.31.0") == 0
    lora = _setup(lora=LoraSpec(r=8, target_modules=("q_proj", "v_proj")))
    # r 8 on q and v: (4096 x 8 + 8 x 4096) x 2 modules x 32 layers = 4,194,304 adapter parameters, kept in fp32
    assert trainer_fsdp_pre_wrap_bytes(spec, lora, "4.31.0") == 4_194_304 * 4


@pytest.fixture(scope="module")
def acc() -> ModuleType:
    return load_bench("accuracy")


def test_stanford_alpaca_278_rows_get_their_release(acc: ModuleType) -> None:
    """Row 808 ran 4.28.1, rows 809/810 4.31.0.dev0 (the issue's words): only the latter carry the model whole."""
    import csv

    from accuracy_loss import _resident_bytes

    with acc.CSV.open(encoding="utf-8") as fh:
        rows = {r["row_id"]: r for r in csv.DictReader(fh)}
    spec = acc._spec(rows["808"]["model_hf_id"])
    for rid, expected in (("808", 0), ("809", 26_953_662_464), ("810", 26_953_662_464)):
        setup = acc._train_setup(rows[rid], spec)
        assert setup.is_fsdp and setup.weights_dtype == "fp32"
        assert _resident_bytes(rows[rid], spec, setup) == expected, rid
