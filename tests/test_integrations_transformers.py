"""Adapters to transformers: TrainingArguments (real ones, trained with a real Trainer), from_pretrained and
generate kwargs, and prepare_model (checkpointing, LoRA/QLoRA, bnb 8-bit embedding state).

Expected values come from the Setup a test writes and from the libraries themselves (TrainingArguments'
own fields and plugin args, the optimizer state dtypes bnb creates), never from perfguide's output.
"""

from __future__ import annotations

import dataclasses
import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

try:  # tests/ as a plain folder or as a package
    from helpers import hardware, make_rec, reset_accelerate_state, tiny_model, token_dataset
except ImportError:  # pragma: no cover
    from tests.helpers import hardware, make_rec, reset_accelerate_state, tiny_model, token_dataset

from perfguide.errors import InvalidSetupError, WrongMachineError  # noqa: E402

FIELDS = {f.name for f in dataclasses.fields(transformers.TrainingArguments)}
QUIET = dict(report_to="none", save_strategy="no", logging_strategy="no", disable_tqdm=True)

A100_BF16 = {"micro_batch_size": 4, "gradient_accumulation_steps": 8, "autocast": "bf16", "tf32": True,
             "optimizer": "adamw_torch_fused", "gradient_checkpointing": True, "dataloader_num_workers": 4}


def train(rec, model, tmp_path, steps=2, **overrides):
    """Two optimizer steps with a real Trainer on the plan's TrainingArguments."""
    args = rec.training_args(output_dir=str(tmp_path / "out"), max_steps=steps, **QUIET, **overrides)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=token_dataset())
    trainer.train()
    assert trainer.state.global_step == steps
    return trainer


# --- TrainingArguments ------------------------------------------------------------------------------------

def test_cpu_plan_builds_real_training_args_and_trains(tmp_path):
    rec = make_rec({"device": "cpu", "micro_batch_size": 2, "gradient_accumulation_steps": 2, "optimizer": "adamw_torch",
                    "dataloader_num_workers": 0})
    args = rec.training_args(output_dir=str(tmp_path))
    assert isinstance(args, transformers.TrainingArguments)
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (2, 2)
    assert args.use_cpu and args.device.type == "cpu" and args.optim == "adamw_torch"
    assert not args.bf16 and not args.fp16 and args.tf32 is None
    model = rec.prepare_model(tiny_model())
    before = model.model.layers[0].mlp.up_proj.weight.detach().clone()
    train(rec, model, tmp_path)
    assert not torch.equal(before, model.model.layers[0].mlp.up_proj.weight)


def test_dict_names_are_real_training_arguments_fields():
    plans = [
        make_rec(A100_BF16),
        make_rec({**A100_BF16, "strategy": "fsdp", "num_gpus": 8}),
        make_rec({**A100_BF16, "strategy": "zero3", "num_gpus": 8, "offload_optimizer": True, "offload_params": True}),
        make_rec({"device": "cpu", "autocast": "bf16", "num_gpus": 2, "strategy": "ddp", "torch_compile": True}),
    ]
    for rec in plans:
        assert set(rec.training_args_dict()) <= FIELDS


def test_evaluation_runs_at_the_planned_micro_batch(tmp_path):
    """TrainingArguments evaluates 8 rows per device unless told (its own default, read here); a plan priced at a
    smaller micro-batch sets the evaluation batch to it, so a first evaluation does not hold more rows of logits than
    the step it priced. A real Trainer evaluates with it."""
    assert transformers.TrainingArguments(output_dir=str(tmp_path)).per_device_eval_batch_size == 8
    rec = make_rec({"device": "cpu", "micro_batch_size": 2, "gradient_accumulation_steps": 2, "optimizer": "adamw_torch",
                    "dataloader_num_workers": 0})
    args = rec.training_args(output_dir=str(tmp_path / "out"), **QUIET)
    assert args.per_device_eval_batch_size == args.per_device_train_batch_size == 2
    trainer = transformers.Trainer(model=rec.prepare_model(tiny_model()), args=args, eval_dataset=token_dataset())
    assert trainer.get_eval_dataloader().total_batch_size == 2 and "eval_loss" in trainer.evaluate()


def test_a100_plan_values_and_wrong_machine_here():
    rec = make_rec(A100_BF16, hw=hardware("a100"))
    d = rec.training_args_dict()
    assert d["per_device_train_batch_size"] == 4 and d["gradient_accumulation_steps"] == 8
    assert d["bf16"] is True and "fp16" not in d and d["tf32"] is True
    assert d["optim"] == "adamw_torch_fused" and d["activation_checkpointing"] is True
    assert "gradient_checkpointing" not in d  # deprecated 4.x alias
    assert "use_cpu" not in d and "ddp_backend" not in d  # one process
    assert d["dataloader_num_workers"] == 4 and d["dataloader_pin_memory"] is True
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the wrong-machine refusal cannot be observed")
    with pytest.raises(WrongMachineError) as info:
        rec.training_args(output_dir="unused")
    msg = str(info.value)
    assert "\n" not in msg and "A100" in msg and "training_args_dict()" in msg


def test_t4_plan_uses_fp16_never_tf32_and_refuses_here():
    rec = make_rec({"micro_batch_size": 2, "autocast": "fp16", "tf32": True}, hw=hardware("t4"))
    d = rec.training_args_dict()
    assert d["fp16"] is True and "bf16" not in d
    assert "tf32" not in d  # TrainingArguments(tf32=True) raises on pre-Ampere GPUs
    if not torch.cuda.is_available():
        with pytest.raises(WrongMachineError, match="Tesla T4"):
            rec.training_args()


def test_overrides_win():
    rec = make_rec({"device": "cpu", "micro_batch_size": 2})
    d = rec.training_args_dict(output_dir="runs/x", per_device_train_batch_size=7, learning_rate=1e-4)
    assert d["output_dir"] == "runs/x" and d["per_device_train_batch_size"] == 7 and d["learning_rate"] == 1e-4


def test_multi_process_cpu_plan_needs_a_launcher():
    rec = make_rec({"device": "cpu", "num_gpus": 2, "strategy": "ddp"})
    d = rec.training_args_dict()
    assert d["ddp_backend"] == "gloo" and d["use_cpu"] is True and d["ddp_find_unused_parameters"] is False
    with pytest.raises(WrongMachineError, match="accelerate launch"):
        rec.training_args(output_dir="unused")


def test_gpu_ddp_plan_uses_nccl():
    assert make_rec({**A100_BF16, "strategy": "ddp", "num_gpus": 4}).training_args_dict()["ddp_backend"] == "nccl"


@pytest.mark.parametrize("strategy, reshard", [("fsdp", True), ("fsdp_shard_grad_op", False)])
def test_fsdp_plan_builds_fsdp2_plugin_args(strategy, reshard, tmp_path):
    rec = make_rec({**A100_BF16, "strategy": strategy, "num_gpus": 8})
    d = rec.training_args_dict()
    assert d["fsdp"] is True and "activation_checkpointing" not in d  # both flags raise in the Trainer
    cfg = d["fsdp_config"]
    assert cfg["activation_checkpointing"] is True
    # what transformers makes of it (fsdp=True constructs on a CPU machine; precision/launch keys are GPU-only)
    cpu_safe = {k: v for k, v in d.items() if k not in ("bf16", "tf32", "ddp_backend")}
    args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, **cpu_safe)
    plugin = args.fsdp_plugin_args
    assert plugin["fsdp_version"] == 2 and plugin["reshard_after_forward"] is reshard
    assert plugin["transformer_cls_names_to_wrap"] == "LlamaDecoderLayer"
    assert plugin["activation_checkpointing"] is True and "cpu_offload" not in plugin
    assert d["fsdp_config"] == cfg  # TrainingArguments rewrote its copy, not ours


def test_fsdp_offload_plan_sets_cpu_offload():
    rec = make_rec({**A100_BF16, "strategy": "fsdp", "num_gpus": 8, "offload_params": True})
    assert rec.training_args_dict()["fsdp_config"]["cpu_offload"] is True


def test_inference_plan_has_no_training_args():
    rec = make_rec({"task": "infer", "weights_dtype": "bf16"})
    with pytest.raises(InvalidSetupError, match="inference"):
        rec.training_args_dict()


# --- from_pretrained / generate kwargs ---------------------------------------------------------------------

def test_model_kwargs_dtype_follows_the_weights():
    amp = make_rec(A100_BF16).model_kwargs()
    assert amp["dtype"] is torch.float32 and amp["attn_implementation"] == "sdpa"  # AMP keeps fp32 masters
    pure = make_rec({"weights_dtype": "bf16", "attn_implementation": "flash_attention_2"}).model_kwargs()
    assert pure["dtype"] is torch.bfloat16 and pure["attn_implementation"] == "flash_attention_2"
    lora = make_rec({"weights_dtype": "bf16", "lora": {"r": 8}}).model_kwargs()
    assert lora["dtype"] is torch.bfloat16 and "quantization_config" not in lora and "device_map" not in lora


def test_model_kwargs_nf4_config():
    qc = make_rec({"weights_dtype": "nf4", "lora": {}, "autocast": "bf16"}).model_kwargs()["quantization_config"]
    assert qc.load_in_4bit and qc.bnb_4bit_quant_type == "nf4" and qc.bnb_4bit_use_double_quant
    assert qc.bnb_4bit_compute_dtype is torch.bfloat16
    t4 = make_rec({"weights_dtype": "nf4", "lora": {}, "autocast": "fp16"}, hw=hardware("t4")).model_kwargs()
    assert t4["quantization_config"].bnb_4bit_compute_dtype is torch.float16 and t4["dtype"] is torch.float16
    # no autocast on a GPU without bf16: the plan trains in fp32, and so do the quantized base's matmuls
    fp32 = make_rec({"weights_dtype": "nf4", "lora": {}}, hw=hardware("t4")).model_kwargs()
    assert fp32["quantization_config"].bnb_4bit_compute_dtype is torch.float32 and fp32["dtype"] is torch.float32
    assert t4["device_map"] == {"": 0}  # quantized while loading, onto this rank's GPU
    fsdp = make_rec({"weights_dtype": "nf4", "lora": {}, "strategy": "fsdp", "num_gpus": 2}).model_kwargs()
    assert fsdp["quantization_config"].bnb_4bit_quant_storage is torch.bfloat16 and "device_map" not in fsdp


def test_model_kwargs_int8_and_inference_placement():
    assert make_rec({"task": "infer", "weights_dtype": "int8"}).model_kwargs()["quantization_config"].load_in_8bit
    spread = make_rec({"task": "infer", "weights_dtype": "bf16", "strategy": "device_map", "num_gpus": 2}).model_kwargs()
    assert spread["device_map"] == "auto"
    tp = make_rec({"task": "infer", "weights_dtype": "bf16", "strategy": "tp", "num_gpus": 2}).model_kwargs()
    assert tp["tp_plan"] == "auto" and "device_map" not in tp
    assert "device_map" not in make_rec({"task": "infer", "device": "cpu"}).model_kwargs()


def test_generation_kwargs_drive_real_generate():
    rec = make_rec({"task": "infer", "device": "cpu", "new_tokens": 5, "cache_implementation": "static"})
    kw = rec.generation_kwargs()
    assert kw == {"max_new_tokens": 5, "cache_implementation": "static"}
    model = tiny_model().eval()
    prompt = torch.tensor([[1, 2, 3]])
    out = model.generate(prompt, do_sample=False, pad_token_id=0, **kw)
    assert out.shape == (1, 3 + 5)
    default = make_rec({"task": "infer", "device": "cpu"}, max_new_tokens=64).generation_kwargs()
    assert default["max_new_tokens"] == 64


# --- prepare_model ----------------------------------------------------------------------------------------

def test_checkpointing_uses_the_5x_method_and_not_under_fsdp():
    rec = make_rec({"device": "cpu", "gradient_checkpointing": True})
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # the deprecated alias warns
        model = rec.prepare_model(tiny_model())
        rec.prepare_model(model)  # idempotent
    assert model.is_activation_checkpointing
    fsdp = make_rec({**A100_BF16, "strategy": "fsdp", "num_gpus": 2}).prepare_model(tiny_model())
    assert not fsdp.is_activation_checkpointing


def test_lora_plan_trains_only_adapters(tmp_path):
    peft = pytest.importorskip("peft")
    rec = make_rec({"device": "cpu", "lora": {"r": 4, "alpha": 8}, "gradient_checkpointing": True,
                    "optimizer": "adamw_torch", "micro_batch_size": 2})
    model = rec.prepare_model(tiny_model())
    assert isinstance(model, peft.PeftModel)
    assert rec.prepare_model(model) is model
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    # "all-linear": every Linear of every block, never the lm_head (peft's rule for causal LMs)
    wrapped = {n.split(".")[-4] for n in trainable if n.endswith("lora_A.default.weight")}
    assert wrapped == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert model.peft_config["default"].r == 4 and model.peft_config["default"].lora_alpha == 8
    base = model.get_base_model().model.layers[0].self_attn.q_proj
    frozen_before = base.base_layer.weight.detach().clone()
    train(rec, model, tmp_path)
    assert torch.equal(frozen_before, base.base_layer.weight)
    assert base.lora_B["default"].weight.abs().sum() > 0  # B starts at zero


def test_qlora_plan_loads_nf4_on_cpu_and_trains(tmp_path):
    pytest.importorskip("peft")
    bnb = pytest.importorskip("bitsandbytes")
    rec = make_rec({"device": "cpu", "weights_dtype": "nf4", "lora": {"r": 4}, "optimizer": "adamw_torch",
                    "gradient_checkpointing": True, "micro_batch_size": 2})
    tiny_model(hidden_size=64, intermediate_size=128).save_pretrained(tmp_path / "base")
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base", **rec.model_kwargs())
    assert isinstance(model.model.layers[0].mlp.up_proj, bnb.nn.Linear4bit)
    model = rec.prepare_model(model)
    train(rec, model, tmp_path)


def _bnb_states(optimizer, model):
    emb = model.get_input_embeddings().weight
    lin = model.model.layers[0].mlp.up_proj.weight
    return optimizer.state[emb], optimizer.state[lin]


BNB_PLAN = {"device": "cpu", "optimizer": "adamw_bnb_8bit", "micro_batch_size": 2}
BNB_SIZES = dict(hidden_size=64, intermediate_size=128)  # >= 4096 elements: bnb keeps smaller tensors 32-bit


def test_bnb_8bit_plan_with_trainer_keeps_embedding_state_fp32(tmp_path):
    pytest.importorskip("bitsandbytes")
    rec = make_rec(BNB_PLAN)
    model = rec.prepare_model(tiny_model(**BNB_SIZES))
    trainer = train(rec, model, tmp_path)
    emb, lin = _bnb_states(trainer.optimizer.optimizer, model)
    assert emb["state1"].dtype == torch.float32 and emb["state2"].dtype == torch.float32
    assert lin["state1"].dtype == torch.uint8 and lin["state2"].dtype == torch.uint8


def test_bnb_8bit_plan_in_an_accelerate_loop(tmp_path):
    bnb = pytest.importorskip("bitsandbytes")
    rec = make_rec(BNB_PLAN)
    model = tiny_model(**BNB_SIZES)
    manager = bnb.optim.GlobalOptimManager.get_instance()
    rec.prepare_model(model)
    rec.prepare_model(model)  # idempotent: one override per embedding
    assert sum(m is model.get_input_embeddings() for m, _, _ in manager.module_weight_config_triple) == 1
    reset_accelerate_state()
    acc = rec.accelerator()
    opt = bnb.optim.AdamW8bit(model.parameters(), lr=1e-3)
    model, opt = acc.prepare(model, opt)
    batch = torch.stack([row["input_ids"] for row in token_dataset(4)])
    for _ in range(2):
        loss = model(input_ids=batch, labels=batch).loss
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
    emb, lin = _bnb_states(opt.optimizer, acc.unwrap_model(model))
    assert emb["state1"].dtype == torch.float32 and lin["state1"].dtype == torch.uint8


def test_stable_embedding_only_from_scratch():
    bnb = pytest.importorskip("bitsandbytes")
    pretrained = make_rec(BNB_PLAN).prepare_model(tiny_model())
    assert type(pretrained.get_input_embeddings()) is torch.nn.Embedding
    scratch = make_rec(BNB_PLAN, from_scratch=True).prepare_model(tiny_model())
    assert isinstance(scratch.get_input_embeddings(), bnb.nn.StableEmbedding)
    ids = torch.tensor([[1, 2, 3]])
    assert scratch(input_ids=ids, labels=ids).loss.isfinite()
