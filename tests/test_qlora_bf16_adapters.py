"""perfguide's QLoRA plans train the adapters in bf16, as TRL's SFTTrainer (0.26 on) casts them on a quantized base,
and say what PEFT's fp32 adapters would add.

The bytes are checked against a hand count from Llama-3.1-8B's config (hidden 4,096, FFN 14,336, 8 KV heads of 128,
32 blocks): all-linear LoRA at rank r adds r x (in + out) elements per Linear, and fp32 adapters take 2 more bytes for
each of the parameter, its gradient and AdamW's two moments (torch keeps the moments in the parameter's dtype). The
dtypes are checked on a real tiny nf4 model: what prepare_model leaves is what TRL's own SFTTrainer leaves."""

from __future__ import annotations

import pytest

import perfguide

#: (in, out) of each Linear of a Llama-3.1-8B block: q, k, v, o, gate, up, down
LINEARS = ((4096, 4096), (4096, 1024), (4096, 1024), (4096, 4096), (4096, 14336), (4096, 14336), (14336, 4096))


def _decision(rec, setting):
    return next((d for d in rec.decisions if d.setting == setting), None)


@pytest.fixture(scope="module")
def one_gpu():
    return perfguide.recommend("meta-llama/Llama-3.1-8B", "train_gpu_one", hardware="rtx4090", seq_len=4096, finetune="qlora")


def test_a_bf16_qlora_plan_prices_bf16_adapters_and_the_fp32_ones_it_leaves_out(one_gpu) -> None:
    s = one_gpu.setup
    assert s.quantized and s.autocast == "bf16" and s.lora.adapter_dtype == "bf16"
    assert s.lora.target_modules == "all-linear"
    adapter_elems = 32 * sum(s.lora.r * (i + o) for i, o in LINEARS)
    d = _decision(one_gpu, "adapter_dtype")
    assert d.value == "bf16" and "trl" in d.source.lower()
    # 2 bytes more for each of parameter, gradient and two moments; beyond that at most autocast's cached bf16 copy
    # of each fp32 adapter weight (2 B per element) and small transients
    assert 8 * adapter_elems <= d.number <= 10 * adapter_elems + 16 * 2**20, (d.number, 8 * adapter_elems)
    from perfguide.memory import estimate_memory
    fp32 = estimate_memory(one_gpu.model, s.replace(lora=s.lora.model_copy(update={"adapter_dtype": None})), one_gpu.hardware)
    assert fp32.needed - one_gpu.memory.needed == pytest.approx(d.number, rel=1e-9)


def test_fp16_plans_and_dora_keep_pefts_fp32_adapters() -> None:
    # a T4 has no bf16: the fp16 GradScaler unscales fp32 adapter gradients, so the plan keeps them fp32
    t4 = perfguide.recommend("meta-llama/Llama-3.1-8B", "train_gpu_one", hardware="t4", seq_len=1024, finetune="qlora")
    assert t4.setup.quantized and t4.setup.autocast == "fp16"
    assert t4.setup.lora.adapter_dtype is None and _decision(t4, "adapter_dtype") is None
    from perfguide.setup import LoraSpec
    from perfguide.techniques.qlora import trl_adapters
    assert trl_adapters(LoraSpec(r=8, use_dora=True), "bf16").adapter_dtype is None       # TRL keeps DoRA's magnitude fp32
    assert trl_adapters(LoraSpec(r=8, adapter_dtype="fp32"), "bf16").adapter_dtype == "fp32"   # the user's choice stays


def test_prepare_model_leaves_the_adapters_trl_leaves(tmp_path) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("bitsandbytes")
    trl = pytest.importorskip("trl")
    try:
        from helpers import prepared_tiny_qlora, tiny_tokenizer
        from test_adapted_models import _bytes
    except ImportError:  # pragma: no cover
        from tests.helpers import prepared_tiny_qlora, tiny_tokenizer
        from tests.test_adapted_models import _bytes
    datasets = pytest.importorskip("datasets")
    data = datasets.Dataset.from_list([{"input_ids": list(range(3, 19))} for _ in range(4)])
    from perfguide.memory.ledger import ledger

    spec, rec, model = prepared_tiny_qlora(tmp_path, lora={"r": 4, "adapter_dtype": "bf16"}, kbit_upcast=False)
    lora_dtypes = {p.dtype for n, p in model.named_parameters() if "lora_" in n}
    assert lora_dtypes == {torch.bfloat16}
    assert abs(_bytes(model) - ledger(spec, rec.setup).weight_bytes) <= 64
    # TRL's own SFTTrainer on the prepared model: its quantized-model cast finds bf16 adapters and changes nothing
    before = {n: p.dtype for n, p in model.named_parameters()}
    args = trl.SFTConfig(output_dir=str(tmp_path / "out"), use_cpu=True, report_to=[], max_steps=2, bf16=True,
                         per_device_train_batch_size=2, optim="adamw_torch")
    trainer = trl.SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tiny_tokenizer())
    after = {n: p.dtype for n, p in trainer.model.named_parameters()}
    assert after == before
    # and it trains there: two bf16-autocast steps on the real 4-bit base move every adapter, which stays bf16
    start = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.train()
    trained = {n: p for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert trainer.state.global_step == 2 and {p.dtype for p in trained.values()} == {torch.bfloat16}
    assert all(not torch.equal(start[n], p) for n, p in trained.items())
    # control: the same tiny model through PEFT alone keeps fp32 adapters, which TRL then casts
    _, _, plain = prepared_tiny_qlora(tmp_path / "plain", lora={"r": 4}, kbit_upcast=False)
    assert {p.dtype for n, p in plain.named_parameters() if "lora_" in n} == {torch.float32}
    trainer = trl.SFTTrainer(model=plain, args=args, train_dataset=data, processing_class=tiny_tokenizer())
    assert {p.dtype for n, p in trainer.model.named_parameters() if "lora_" in n} == {torch.bfloat16}


def test_a_trl_config_on_a_quantized_base_is_read_with_the_adapters_trl_casts(tmp_path) -> None:
    """`perfguide check` on a TRL script's YAML prices the run TRL makes: bf16 adapters on a 4-bit base (the installed
    TRL is >= 0.26), PEFT's fp32 ones for DoRA (TRL keeps the magnitude fp32) and on a 16-bit base; the recommended plan
    then changes nothing about the adapters."""
    import yaml

    def read(**extra):
        keys = {"model_name_or_path": "meta-llama/Llama-3.1-8B", "use_peft": True, "lora_target_modules": "all-linear",
                "output_dir": "out", "max_length": 1024, **extra}
        path = tmp_path / f"sft{len(list(tmp_path.iterdir()))}.yaml"
        path.write_text(yaml.safe_dump(keys))
        return perfguide.check(None, str(path), hardware="rtx4090", device="cuda")

    four_bit = read(load_in_4bit=True)
    assert four_bit.setup.quantized and four_bit.setup.lora.adapter_dtype == "bf16"
    recommended = four_bit.change("recommended")
    assert recommended is not None and "lora" not in recommended.setup
    assert read(load_in_4bit=True, use_dora=True).setup.lora.adapter_dtype is None
    assert read().setup.lora.adapter_dtype is None


@pytest.mark.parametrize("release, upcast, adapters", [("0.24.0", True, None), ("1.16.0", False, "bf16")])
def test_the_memory_bench_reads_a_trl_qlora_row_by_its_release(release, upcast, adapters) -> None:
    """A published QLoRA row that names its TRL release is priced with that release's dtypes: TRL 0.24's notebook run
    (row 2055, peft's upcast and TRL's recast, fp32 adapters) as published; the same row under a 1.16 release string
    with neither cast and bf16 adapters, the reading perfguide's own plans and config reader make."""
    try:
        from helpers import load_bench, published_rows
    except ImportError:  # pragma: no cover
        from tests.helpers import load_bench, published_rows
    row = dict(published_rows()["2055"])
    row["method"] = row["method"].replace("0.24.0", release)
    spec = load_bench("accuracy_spec")._spec(row["model_hf_id"])
    setup = load_bench("accuracy_setup")._train_setup(row, spec)
    assert setup.quantized and setup.kbit_upcast is upcast and setup.kbit_recast_bf16 is upcast
    assert setup.lora.adapter_dtype == adapters


def test_offloaded_adapters_save_host_ram_and_the_decision_says_so() -> None:
    """70B QLoRA under FSDP with CPU offload on 2 x RTX 4090: the adapters' parameters, gradients and moments live on
    the host, so bf16 saves host RAM, 8 B per adapter element over the node (Llama-3.1-70B, rank 16, all-linear:
    80 blocks of q, k, v, o over h 8,192 with 8 KV heads of 128, gate / up / down over FFN 28,672), and the reason
    names it."""
    rec = perfguide.recommend("meta-llama/Llama-3.1-70B", "train_gpu_many", hardware="rtx4090:2", seq_len=2048, finetune="qlora")
    s = rec.setup
    assert s.offload_params and s.lora.adapter_dtype == "bf16" and s.lora.r == 16
    h, kv, ffn = 8192, 1024, 28672
    elems = 80 * s.lora.r * (2 * (h + h) + 2 * (h + kv) + 3 * (h + ffn))
    from perfguide.memory import estimate_memory
    fp32 = estimate_memory(rec.model, s.replace(lora=s.lora.model_copy(update={"adapter_dtype": None})), rec.hardware)
    assert fp32.cpu_ram - rec.memory.cpu_ram == 8 * elems
    assert "host RAM" in rec.decision("adapter_dtype").reason


@pytest.mark.parametrize("name, keys", [
    ("axolotl.yaml", {"base_model": "meta-llama/Llama-3.1-8B", "load_in_4bit": True, "adapter": "qlora", "lora_r": 16,
                      "lora_alpha": 32, "lora_target_linear": True, "sequence_len": 2048, "micro_batch_size": 2,
                      "gradient_accumulation_steps": 4, "bf16": True, "gradient_checkpointing": True}),
    ("llamafactory.yaml", {"model_name_or_path": "meta-llama/Llama-3.1-8B", "stage": "sft", "do_train": True,
                           "finetuning_type": "lora", "quantization_bit": 4, "lora_rank": 16, "cutoff_len": 2048,
                           "per_device_train_batch_size": 2, "gradient_accumulation_steps": 4, "bf16": True}),
])
def test_stacks_that_keep_fp32_adapters_are_read_so_and_not_told_to_cast(tmp_path, name, keys) -> None:
    """axolotl (loaders/adapter.py: PEFT's defaults) and LLaMA-Factory (model/adapter.py: trainable parameters to fp32
    unless pure_bf16) keep a quantized model's adapters fp32, which no key of theirs changes: the reading says so,
    prices them as PEFT's default does, and the recommended plan keeps them rather than ask for a cast the stack
    cannot make."""
    import yaml

    from perfguide.hardware.named import hardware_from_name
    from perfguide.memory import estimate_memory

    path = tmp_path / name
    path.write_text(yaml.safe_dump(keys))
    c = perfguide.check(None, str(path), hardware="rtx4090")
    s = c.setup
    assert s.quantized and s.lora.adapter_dtype == "fp32"
    hw = hardware_from_name("rtx4090")
    default = s.replace(lora=s.lora.model_copy(update={"adapter_dtype": None}))
    spec = perfguide.ModelSpec.from_any("meta-llama/Llama-3.1-8B")
    assert estimate_memory(spec, s, hw).needed == estimate_memory(spec, default, hw).needed
    recommended = c.change("recommended")
    assert recommended is not None and "lora" not in recommended.setup


@pytest.mark.parametrize("release, sft, dpo", [("0.25.1", False, False), ("0.27.0", True, False), ("0.29.0", True, True)])
def test_the_config_reader_follows_each_trainers_first_casting_release(monkeypatch, release, sft, dpo) -> None:
    """SFTTrainer casts from 0.26.0 (#4577), DPOTrainer from 0.29.0 (#3906), both read in the trainers' code."""
    from perfguide.integrations.readers import training_args
    from perfguide.memory import fused_head

    monkeypatch.setattr(fused_head, "installed_trl", lambda: release)
    assert (training_args._trl_adapter_cast(dpo=False) is not None) is sft
    assert (training_args._trl_adapter_cast(dpo=True) is not None) is dpo


@pytest.mark.parametrize("strategy, adapters", [("zero3", "bfloat16"), ("zero2", "float32"), ("fsdp", "float32")])
def test_zero3_lora_on_a_16_bit_base_gets_base_dtype_adapters(strategy, adapters) -> None:
    """Under ZeRO-3 over a bf16 base, prepare_model creates the adapters in bf16 (get_peft_model's
    autocast_adapter_dtype=False, as TRL 1.7+ does): DeepSpeed 0.19.2+ leaves a zero.Init model uncast, and fp32
    adapters beside bf16 partitions broke its coalesced all-gather (deepspeedai/DeepSpeed#8072). ZeRO-2 (the engine
    casts the whole module) and FSDP keep PEFT's default."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("peft")
    try:
        from helpers import make_rec, tiny_model
    except ImportError:  # pragma: no cover
        from tests.helpers import make_rec, tiny_model
    rec = make_rec({"weights_dtype": "bf16", "autocast": "bf16", "strategy": strategy, "num_gpus": 2, "lora": {"r": 4},
                    "optimizer": "adamw_torch", "seq_len": 64})
    model = rec.prepare_model(tiny_model().to(torch.bfloat16))
    assert {p.dtype for n, p in model.named_parameters() if "lora_" in n} == {getattr(torch, adapters)}


@pytest.mark.parametrize("upcast", [False, True])
def test_the_callbacks_preflight_reads_the_dtypes_the_trainer_holds(tmp_path, upcast) -> None:
    """PerfGuideCallback's pre-flight prices the model object it is handed: after TRL's SFTTrainer, a 4-bit model
    prepared without peft's k-bit upcast keeps its embedding, head and norms 16-bit and its adapters bf16, and is read
    so (it was priced with the upcast, the Setup's default, and could be refused as not fitting); one prepared with the
    upcast is read with it. Either way the weight bytes priced are the bytes the real model holds."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("bitsandbytes")
    trl = pytest.importorskip("trl")
    datasets = pytest.importorskip("datasets")
    try:
        from helpers import prepared_tiny_qlora, tiny_tokenizer
        from test_adapted_models import _bytes
    except ImportError:  # pragma: no cover
        from tests.helpers import prepared_tiny_qlora, tiny_tokenizer
        from tests.test_adapted_models import _bytes
    from perfguide.integrations.readers.trainer import trainer_check
    from perfguide.memory.ledger import ledger

    spec, _, model = prepared_tiny_qlora(tmp_path, lora={"r": 4}, kbit_upcast=upcast)
    data = datasets.Dataset.from_list([{"input_ids": list(range(3, 19))} for _ in range(4)])
    args = trl.SFTConfig(output_dir=str(tmp_path / "out"), use_cpu=True, report_to=[], max_steps=1, bf16=True,
                         per_device_train_batch_size=2)
    trainer = trl.SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tiny_tokenizer())
    check = trainer_check(trainer.args, trainer.model)
    assert check.setup.kbit_upcast is upcast and check.setup.lora.adapter_dtype == "bf16"
    assert {p.dtype for n, p in trainer.model.named_parameters() if "lora_" in n} == {torch.bfloat16}
    assert abs(_bytes(trainer.model) - ledger(spec, check.setup).weight_bytes) <= 64
