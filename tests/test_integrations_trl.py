"""TRL and PEFT adapters: ``rec.sft_config()`` and ``rec.lora_config()`` run a real SFTTrainer on CPU, and what the
trainer really uses (its effective arguments, the batches its collator builds, the modules PEFT wraps) equals
the plan. Expected values come from the Setup and the model a test builds, never from perfguide's own output.
"""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

try:  # tests/ as a plain folder or as a package
    from helpers import TINY_LLAMA, hardware, make_rec, one_line, tiny_model, tiny_tokenizer
except ImportError:  # pragma: no cover
    from tests.helpers import TINY_LLAMA, hardware, make_rec, one_line, tiny_model, tiny_tokenizer

import perfguide  # noqa: E402
from perfguide.errors import InvalidSetupError, WrongMachineError  # noqa: E402

QUIET = dict(report_to="none", save_strategy="no", logging_strategy="no", disable_tqdm=True)
SFT_FIELDS = {f.name for f in dataclasses.fields(trl.SFTConfig)}
ROW_LEN = 40  # longer than every planned seq_len below: truncation to the plan is observable


def rows(n: int = 16, length: int = ROW_LEN, vocab: int = TINY_LLAMA["vocab_size"]):
    g = torch.Generator().manual_seed(0)
    return datasets.Dataset.from_list([{"input_ids": torch.randint(3, vocab, (length,), generator=g).tolist()} for _ in range(n)])


def assert_effective_args_equal_plan(args, rec):
    """What the trainer really runs with, field by field, against the Setup."""
    s = rec.setup
    assert args.per_device_train_batch_size == s.micro_batch_size
    assert args.gradient_accumulation_steps == s.gradient_accumulation_steps
    assert args.activation_checkpointing is s.gradient_checkpointing
    assert args.gradient_checkpointing is s.gradient_checkpointing  # TRL reads the old name
    assert args.bf16 is (s.autocast == "bf16") and args.fp16 is (s.autocast == "fp16")
    assert args.optim == s.optimizer
    assert args.max_length == (None if s.padding_free else s.seq_len)
    assert args.packing is False and args.padding_free is s.padding_free
    assert args.use_liger_kernel is s.liger_kernel and args.activation_offloading is s.activation_offloading
    assert args.use_cpu is (s.device == "cpu")
    assert args.torch_compile is s.torch_compile


def sft_run(rec, model, tmp_path, peft_config=None, steps=2, data=None):
    args = rec.sft_config(output_dir=str(tmp_path / "out"), max_steps=steps, **QUIET)
    trainer = trl.SFTTrainer(model=model, args=args, train_dataset=data or rows(), processing_class=tiny_tokenizer(), peft_config=peft_config)
    batch = next(iter(trainer.get_train_dataloader()))
    trainer.train()
    assert trainer.state.global_step == steps
    return trainer, batch


@pytest.mark.slow
@pytest.mark.parametrize("checkpointing", [False, True])
def test_full_finetune_sft_trainer_runs_the_plan(tmp_path, checkpointing):
    model = tiny_model()
    rec = perfguide.recommend(model, "train_cpu", seq_len=24, global_batch_size=4,
                              gradient_checkpointing=checkpointing, precision="fp32")
    assert rec.setup.gradient_checkpointing is checkpointing and rec.setup.lora is None
    trainer, batch = sft_run(rec, model, tmp_path)
    assert_effective_args_equal_plan(trainer.args, rec)
    # the collator cut the 40-token rows at the planned length, batched at the planned micro-batch
    assert tuple(batch["input_ids"].shape) == (rec.setup.micro_batch_size, 24)
    assert getattr(trainer.model, "is_activation_checkpointing", False) is checkpointing
    assert all(p.requires_grad for p in trainer.model.parameters())


@pytest.mark.slow
def test_lora_sft_trainer_wraps_exactly_the_priced_linears(tmp_path):
    model = tiny_model()
    rec = perfguide.recommend(model, "train_cpu", seq_len=16, global_batch_size=4, finetune="lora",
                              lora={"r": 4, "alpha": 8, "dropout": 0.05}, gradient_checkpointing=True, precision="fp32")
    config = rec.lora_config()
    assert isinstance(config, peft.LoraConfig) and config.task_type == "CAUSAL_LM"
    assert (config.r, config.lora_alpha, config.lora_dropout) == (4, 8, 0.05)
    trainer, batch = sft_run(rec, model, tmp_path, peft_config=config)
    assert_effective_args_equal_plan(trainer.args, rec)
    assert tuple(batch["input_ids"].shape) == (rec.setup.micro_batch_size, 16)
    wrapped = {n for n, m in trainer.model.named_modules() if isinstance(m, peft.tuners.lora.LoraLayer)}
    # every Linear of every block, never the lm_head: 7 per Llama block
    assert len(wrapped) == 7 * TINY_LLAMA["num_hidden_layers"] and not any("lm_head" in n for n in wrapped)
    h, i, r = TINY_LLAMA["hidden_size"], TINY_LLAMA["intermediate_size"], 4
    kv = h // TINY_LLAMA["num_attention_heads"] * TINY_LLAMA["num_key_value_heads"]
    per_block = r * ((h + h) + (h + kv) * 2 + (h + h) + (h + i) * 2 + (i + h))  # q, k+v, o, gate+up, down
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    assert trainable == per_block * TINY_LLAMA["num_hidden_layers"]


@pytest.mark.slow
def test_padding_free_plan_flattens_the_batch_in_sft_trainer(tmp_path):
    rec = make_rec({"device": "cpu", "optimizer": "adamw_torch", "micro_batch_size": 4, "seq_len": 16, "padding_free": True})
    model = rec.prepare_model(tiny_model())
    with pytest.warns(UserWarning, match="truncate each sample"):
        trainer, batch = sft_run(rec, model, tmp_path, data=rows(length=16))
    assert_effective_args_equal_plan(trainer.args, rec)
    # four 16-token samples in one row, positions restarting at every sample: no padding token anywhere
    assert tuple(batch["input_ids"].shape) == (1, 4 * 16)
    assert batch["position_ids"][0].tolist() == list(range(16)) * 4


def test_technique_fields_reach_trl_keys():
    rec = make_rec({"autocast": "bf16", "liger_kernel": True, "activation_offloading": True, "gradient_checkpointing": True})
    d = rec.sft_config_dict()
    assert (d["use_liger_kernel"], d["activation_offloading"], d["padding_free"], d["max_length"]) == (True, True, False, rec.setup.seq_len)
    off = make_rec({"autocast": "bf16"}).sft_config_dict()
    assert (off["use_liger_kernel"], off["activation_offloading"], off["padding_free"], off["packing"]) == (False, False, False, False)


def test_sft_config_differs_from_naive_training_args_where_trl_defaults_differ():
    """The reason sft_config exists: SFTConfig(**training_args_dict()) checkpoints, casts to bf16 and cuts at 1024."""
    rec = make_rec({"device": "cpu", "optimizer": "adamw_torch", "seq_len": 256, "gradient_checkpointing": False})
    naive = trl.SFTConfig(output_dir="unused", **rec.training_args_dict())
    assert naive.gradient_checkpointing is True and naive.bf16 is True and naive.max_length == 1024
    planned = rec.sft_config(output_dir="unused")
    assert planned.gradient_checkpointing is False and planned.bf16 is False and planned.max_length == 256


def test_sft_config_dict_keys_are_sft_config_fields_for_every_strategy():
    base = {"micro_batch_size": 4, "gradient_accumulation_steps": 8, "autocast": "bf16", "tf32": True,
            "optimizer": "adamw_torch_fused", "gradient_checkpointing": True}
    plans = [make_rec(base), make_rec({**base, "strategy": "fsdp", "num_gpus": 8}),
             make_rec({**base, "strategy": "zero3", "num_gpus": 8, "offload_optimizer": True}),
             make_rec({"device": "cpu", "lora": {"r": 8}, "weights_dtype": "bf16"})]
    for rec in plans:
        d = rec.sft_config_dict()
        assert set(d) <= SFT_FIELDS
        assert d["max_length"] == rec.setup.seq_len


def test_fsdp_plan_turns_trl_checkpointing_off_at_top_level():
    """FSDP checkpoints through fsdp_config; TRL's default top-level flag on as well raises in the Trainer."""
    rec = make_rec({"autocast": "bf16", "gradient_checkpointing": True, "strategy": "fsdp", "num_gpus": 2})
    d = rec.sft_config_dict()
    assert d["activation_checkpointing"] is False and d["fsdp_config"]["activation_checkpointing"] is True


def test_a100_plan_values_and_wrong_machine_here():
    rec = make_rec({"autocast": "bf16", "tf32": True, "micro_batch_size": 4, "seq_len": 4096}, hw=hardware("a100"))
    d = rec.sft_config_dict(learning_rate=1e-4)
    assert (d["bf16"], d["fp16"], d["tf32"], d["max_length"], d["learning_rate"]) == (True, False, True, 4096, 1e-4)
    t4 = make_rec({"autocast": "fp16", "tf32": True}, hw=hardware("t4")).sft_config_dict()
    assert (t4["bf16"], t4["fp16"], t4["tf32"]) == (False, True, False)  # T4: no bf16, no tf32
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the wrong-machine refusal cannot be observed")
    with pytest.raises(WrongMachineError) as info:
        rec.sft_config(output_dir="unused")
    one_line(info, "sft_config_dict" if "sft_config_dict" in str(info.value) else "training_args_dict")


def test_inference_plan_has_no_sft_config():
    rec = make_rec({"task": "infer", "device": "cpu", "optimizer": None})
    with pytest.raises(InvalidSetupError) as info:
        rec.sft_config_dict()
    one_line(info, "sft_config_dict", "infer")


# --- LoraConfig ---------------------------------------------------------------------------------------

def tiny_bert(head: str = "ForSequenceClassification", **extra):
    cfg = transformers.BertConfig(vocab_size=TINY_LLAMA["vocab_size"], hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=64, num_labels=3, **extra)
    torch.manual_seed(0)
    return getattr(transformers, f"Bert{head}")(cfg)


@pytest.mark.parametrize(("head", "task"), [
    ("ForSequenceClassification", "SEQ_CLS"), ("ForTokenClassification", "TOKEN_CLS"),
    ("ForQuestionAnswering", "QUESTION_ANS"), ("Model", "FEATURE_EXTRACTION"), ("ForMaskedLM", None),
])
def test_task_type_follows_the_head_and_peft_wraps_it(head, task):
    model = tiny_bert(head)
    rec = perfguide.recommend(model, "train_cpu", finetune="lora", seq_len=16, global_batch_size=2)
    config = rec.lora_config()
    assert config.task_type == task
    wrapped = peft.get_peft_model(model, config)
    expected = {"SEQ_CLS": peft.PeftModelForSequenceClassification, "TOKEN_CLS": peft.PeftModelForTokenClassification,
                "QUESTION_ANS": peft.PeftModelForQuestionAnswering, "FEATURE_EXTRACTION": peft.PeftModelForFeatureExtraction,
                None: peft.PeftModel}[task]
    assert type(wrapped) is expected
    adapted = [n for n, m in wrapped.named_modules() if isinstance(m, peft.tuners.lora.LoraLayer)]
    # the six Linears of each BERT block; the pooler (outside the blocks, unpriced) keeps no adapter
    assert len(adapted) == 6 * 2 and not any("pooler" in n for n in adapted)


def test_t5_is_a_seq2seq_lm():
    cfg = transformers.T5Config(vocab_size=128, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4)
    model = transformers.T5ForConditionalGeneration(cfg)
    rec = perfguide.recommend(model, "train_cpu", finetune="lora", seq_len=16, global_batch_size=2)
    config = rec.lora_config()
    assert config.task_type == "SEQ_2_SEQ_LM"
    wrapped = peft.get_peft_model(model, config)
    assert isinstance(wrapped, peft.PeftModelForSeq2SeqLM)
    adapted = [n for n, m in wrapped.named_modules() if isinstance(m, peft.tuners.lora.LoraLayer)]
    assert len(adapted) == 2 * 6 + 2 * 10  # encoder: q k v o wi wo; decoder adds cross-attention q k v o


@pytest.mark.slow
def test_bert_classifier_lora_trains_through_prepare_model(tmp_path):
    """The issue's failure: a CAUSAL_LM wrapper around BertForSequenceClassification. SFTTrainer is for language
    models (its loss shifts labels), so the classifier trains in the Trainer on the same plan's arguments."""
    model = tiny_bert()
    rec = perfguide.recommend(model, "train_cpu", finetune="lora", seq_len=16, global_batch_size=4, precision="fp32",
                              lora={"r": 4, "alpha": 8, "use_rslora": True})
    wrapped = rec.prepare_model(model)
    assert isinstance(wrapped, peft.PeftModelForSequenceClassification)
    layer = next(m for m in wrapped.modules() if isinstance(m, peft.tuners.lora.LoraLayer))
    assert layer.scaling["default"] == pytest.approx(8 / 4**0.5)  # rsLoRA: alpha / sqrt(r)
    g = torch.Generator().manual_seed(0)
    data = [{"input_ids": torch.randint(3, 128, (16,), generator=g), "labels": torch.tensor(i % 3)} for i in range(16)]
    args = rec.sft_config(output_dir=str(tmp_path / "out"), max_steps=2, **QUIET)
    trainer = transformers.Trainer(model=wrapped, args=args, train_dataset=data)
    before = wrapped.base_model.model.classifier.modules_to_save["default"].weight.detach().clone()
    trainer.train()
    assert trainer.state.global_step == 2
    assert_effective_args_equal_plan(trainer.args, rec)
    assert not torch.equal(before, wrapped.base_model.model.classifier.modules_to_save["default"].weight)


def test_dora_and_explicit_targets_reach_peft():
    rec = make_rec({"device": "cpu", "lora": {"r": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj"], "use_dora": True}})
    wrapped = peft.get_peft_model(tiny_model(), rec.lora_config())
    adapted = {n.rsplit(".", 1)[-1] for n, m in wrapped.named_modules() if isinstance(m, peft.tuners.lora.LoraLayer)}
    assert adapted == {"q_proj", "v_proj"}
    assert any("lora_magnitude_vector" in n for n, _ in wrapped.named_parameters())
    assert rec.lora_config(modules_to_save=["lm_head"]).modules_to_save == ["lm_head"]  # overrides win


def test_full_finetune_plan_has_no_lora_config():
    with pytest.raises(InvalidSetupError) as info:
        make_rec({"device": "cpu"}).lora_config()
    one_line(info, "finetune='lora'")


def test_peft_model_with_other_adapter_is_refused_not_kept():
    rec = make_rec({"device": "cpu", "lora": {"r": 4, "alpha": 8}})
    other = peft.get_peft_model(tiny_model(), peft.LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj"], task_type="CAUSAL_LM"))
    with pytest.raises(InvalidSetupError) as info:
        rec.prepare_model(other)
    one_line(info, "r 8 vs 4", "get_base_model")
