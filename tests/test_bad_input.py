"""Bad input: every mistake a user can make (scenario, hardware name, sizes, model, constraints, a hand-written
Setup, sequence lengths) ends in ONE line that names the bad value and says what is accepted.
"""

from __future__ import annotations

import pytest
from helpers import one_line

import perfguide
from perfguide import Hardware, ModelSpec, PerfGuideError, estimate, recommend
from perfguide.errors import (
    ConflictingConstraintsError,
    InvalidModelError,
    InvalidSetupError,
    OfflineError,
    UnknownHardwareError,
    UnknownScenarioError,
    WrongMachineError,
)
from perfguide.hardware.named import known_names


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")



# --- scenario -------------------------------------------------------------------------------------

@pytest.mark.parametrize(("typo", "suggested"), [("train_gpu_on", "train_gpu_one"), ("infer-gpu-one", "infer_gpu_one"),
                                                 ("train_cpuu", "train_cpu"), ("inference", None)])
def test_unknown_scenario_did_you_mean(typo: str, suggested: str | None) -> None:
    with pytest.raises(UnknownScenarioError) as exc:
        recommend("gpt2", typo, hardware="a100-80gb")
    msg = one_line(exc, repr(typo), *perfguide.SCENARIOS)
    if suggested:
        assert f"Did you mean: {suggested}" in msg


# --- hardware -------------------------------------------------------------------------------------

def test_unknown_hardware_lists_every_known_name() -> None:
    with pytest.raises(UnknownHardwareError) as exc:
        recommend("gpt2", hardware="a200")
    msg = one_line(exc, "'a200'", "Did you mean")
    assert all(name in msg for name in known_names())


@pytest.mark.parametrize(("name", "what"), [
    ("a100:0", "GPU count must be >= 1, got 0"), ("a100-80gb:-1", "got -1"), ("a100:abc", "'abc'"),
    ("a100:", "''"), ("a100:1x0", "node count must be >= 1"), ("a100:64", "more than 16"), (":8", "no GPU name"),
    ("cpu:2", "'cpu' takes no count"), ("", "empty hardware name"), ("h100:2.5", "'2.5'"),
])
def test_malformed_hardware_strings(name: str, what: str) -> None:
    with pytest.raises(UnknownHardwareError) as exc:
        Hardware.from_name(name)
    one_line(exc, repr(name), what)
    with pytest.raises(UnknownHardwareError):  # the same through the public entry points
        recommend("gpt2", hardware=name)
    with pytest.raises(UnknownHardwareError):
        estimate("gpt2", {}, hardware=name)


@pytest.mark.parametrize("name", known_names())
def test_every_known_name_builds_and_plans(name: str) -> None:
    hw = Hardware.from_name(name)
    scenario = "train_gpu_one" if hw.has_gpu else "train_cpu"
    rec = recommend("125m", scenario, hardware=name, seq_len=256, global_batch_size=8)
    assert rec.fits and rec.hardware.name == name


def test_hardware_of_the_wrong_type() -> None:
    with pytest.raises(PerfGuideError) as exc:
        recommend("gpt2", hardware=8)  # type: ignore[arg-type]
    one_line(exc, "int", "a100-80gb:8")


# --- sizes ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("field", ["seq_len", "global_batch_size"])
@pytest.mark.parametrize("value", [0, -1, 2.5, True, 10**13])
def test_bad_sizes_name_the_field_and_the_range(field: str, value: object) -> None:
    with pytest.raises(PerfGuideError) as exc:
        recommend("gpt2", hardware="a100", **{field: value})
    one_line(exc, field, repr(value))


@pytest.mark.parametrize(("field", "value"), [
    ("micro_batch_size", 0), ("micro_batch_size", -4), ("batch_size", 0), ("prompt_len", -1), ("max_new_tokens", 0),
    ("num_gpus", 0), ("nodes", 0), ("headroom", 1.0), ("headroom", -0.1),
])
def test_bad_constraint_values(field: str, value: object) -> None:
    with pytest.raises(PerfGuideError) as exc:
        recommend("gpt2", "infer_gpu_one" if field in ("batch_size", "prompt_len", "max_new_tokens") else "train_gpu_one",
                  hardware="a100", **{field: value})
    one_line(exc, field, repr(value))


def test_misspelt_constraint_did_you_mean() -> None:
    with pytest.raises(PerfGuideError) as exc:
        recommend("gpt2", hardware="a100", precisoin="bf16")
    one_line(exc, "'precisoin'", "Did you mean: precision")


def test_micro_batch_that_cannot_keep_the_global_batch() -> None:
    with pytest.raises(ConflictingConstraintsError) as exc:
        recommend("gpt2", hardware="a100", micro_batch_size=3, global_batch_size=32)
    one_line(exc, "micro_batch_size=3", "1, 2, 4, 8, 16, 32")


# --- models ---------------------------------------------------------------------------------------

class NotAModel:
    """Something a user might pass by mistake: neither an nn.Module nor a config."""


@pytest.mark.parametrize("model", [42, None, 3.5, [1, 2], b"gpt2", NotAModel(), object()])
def test_model_that_is_neither_module_nor_config(model: object) -> None:
    with pytest.raises(InvalidModelError) as exc:
        recommend(model, hardware="a100")
    one_line(exc, type(model).__name__, "nn.Module", "PretrainedConfig")


def test_module_without_transformer_shape() -> None:
    import torch

    with pytest.raises(InvalidModelError) as exc:
        ModelSpec.from_any(torch.nn.Linear(4, 4))
    one_line(exc, "Linear")


@pytest.mark.parametrize("hub_id", ["someorg/some-model", "gtp2"])
def test_hub_id_while_offline(hub_id: str) -> None:
    with pytest.raises(OfflineError) as exc:
        recommend(hub_id, hardware="a100")
    msg = one_line(exc, repr(hub_id), "HF_HUB_OFFLINE", "config.json", "'7b'")
    if hub_id == "gtp2":
        assert "Did you mean: gpt2" in msg


@pytest.mark.parametrize(("config", "named"), [
    ({"model_type": "llama", "hidden_size": 64}, "'num_hidden_layers'"),
    ({}, "'model_type'"),
    ({"model_type": "llama", "hidden_size": -64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64,
      "vocab_size": 100}, "-64"),
    ({"model_type": "llama", "hidden_size": "big", "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64,
      "vocab_size": 100}, "'big'"),
])
def test_config_missing_or_bad_fields(config: dict, named: str) -> None:
    with pytest.raises(InvalidModelError) as exc:
        recommend(config, hardware="a100")
    msg = str(exc.value)
    assert "\n" not in msg and named in msg and ("config" in msg or "must be" in msg)


def test_local_paths_that_are_not_configs(tmp_path) -> None:
    with pytest.raises(InvalidModelError) as exc:
        recommend(str(tmp_path), hardware="a100")
    one_line(exc, str(tmp_path), "config.json")
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(InvalidModelError) as exc:
        recommend(str(tmp_path), hardware="a100")
    assert "\n" not in str(exc.value) and str(bad) in str(exc.value)
    bad.write_text("[1, 2]")
    with pytest.raises(InvalidModelError) as exc:
        recommend(str(bad), hardware="a100")
    assert "JSON list" in str(exc.value)


# --- conflicting constraints ----------------------------------------------------------------------

def test_fp16_forced_on_a_bf16_native_model_whose_family_overflows() -> None:
    with pytest.raises(ConflictingConstraintsError) as exc:
        recommend("google/gemma-2-2b", hardware="a100-80gb", precision="fp16")
    one_line(exc, "precision='fp16'", "bf16")


def test_bf16_forced_on_a_t4_is_honoured_with_a_warning_in_training_and_inference() -> None:
    """A T4 (cc 7.5) has no bf16 tensor cores, but torch.cuda.is_bf16_supported() counts emulation and transformers'
    is_torch_bf16_gpu_available() asks exactly that, so bf16 runs there (slowly): honoured and warned, one verdict."""
    for scenario in ("train_gpu_one", "infer_gpu_one"):
        rec = recommend("gpt2", scenario, hardware="t4", precision="bf16")
        dtype = rec.setup.autocast if scenario == "train_gpu_one" else rec.setup.weights_dtype
        assert dtype == "bf16", scenario
        assert any("precision='bf16'" in w and "emulat" in w for w in rec.warnings), scenario


def test_fp16_on_cpu_training_and_flash_attention_on_a_t4() -> None:
    with pytest.raises(ConflictingConstraintsError) as exc:
        recommend("gpt2", "train_cpu", hardware="cpu", precision="fp16")
    one_line(exc, "precision='fp16'", "CPU")
    with pytest.raises(ConflictingConstraintsError) as exc:
        recommend("gpt2", hardware="t4", attn_implementation="flash_attention_2")
    one_line(exc, "flash_attention_2", "sdpa")


def test_unknown_optimizer() -> None:
    with pytest.raises(ConflictingConstraintsError) as exc:
        recommend("gpt2", hardware="a100", optimizer="adamm")
    one_line(exc, "'adamm'", "adamw_torch_fused")


def test_gpu_scenario_on_a_machine_without_gpu() -> None:
    with pytest.raises(WrongMachineError) as exc:
        recommend("gpt2", "train_gpu_one", hardware="cpu")
    one_line(exc, "train_gpu_one", "train_cpu", "a100-80gb")


# --- huge values: a one-line error at the door, or an answer; never a late pydantic crash ----------

@pytest.mark.parametrize(("scenario", "kw"), [
    ("train_gpu_one", {"global_batch_size": 10_000_000}), ("train_gpu_one", {"micro_batch_size": 10**9}),
    ("infer_gpu_one", {"max_new_tokens": 10**9}), ("infer_gpu_one", {"prompt_len": 10**9}),
    ("infer_gpu_one", {"batch_size": 10**9}), ("train_gpu_one", {"nodes": 10**9}),
])
def test_huge_values_are_refused_with_their_range(scenario: str, kw: dict) -> None:
    with pytest.raises(PerfGuideError) as exc:
        recommend("gpt2", scenario, hardware="a100", **kw)
    (field, value), = kw.items()
    one_line(exc, field, str(value))


@pytest.mark.parametrize(("scenario", "kw"), [
    ("train_gpu_one", {"global_batch_size": 1_000_000}), ("train_cpu", {"global_batch_size": 1_000_000}),
    ("infer_gpu_one", {"max_new_tokens": 10_000_000}), ("infer_gpu_one", {"batch_size": 1_000_000}),
])
def test_largest_accepted_values_give_an_answer(scenario: str, kw: dict) -> None:
    rec = recommend("125m", scenario, hardware="cpu" if scenario.endswith("cpu") else "a100", seq_len=128, **kw)
    if "global_batch_size" in kw:
        assert rec.setup.global_batch_size == kw["global_batch_size"]
    assert rec.fits or rec.suggestions


# --- constraints a scenario would ignore are refused, never dropped in silence ---------------------

@pytest.mark.parametrize(("scenario", "hw", "kw", "named"), [
    ("train_gpu_one", "a100", {"num_gpus": 4}, ("num_gpus=4", "train_gpu_many")),
    ("train_gpu_one", "a100", {"nodes": 2}, ("nodes=2", "train_gpu_many")),
    ("train_gpu_one", "a100", {"strategy": "fsdp"}, ("'fsdp'", "train_gpu_many", "'zero2'")),  # ZeRO-Offload is one-GPU; FSDP is not
    ("infer_gpu_one", "a100", {"strategy": "tp"}, ("'tp'", "infer_gpu_many")),
    ("train_cpu", "cpu", {"strategy": "ddp"}, ("'ddp'", "'single'")),
    ("train_gpu_one", "a100", {"quantization": "nf4"}, ("quantization='nf4'", "finetune='qlora'")),
    ("train_gpu_one", "a100", {"max_new_tokens": 10}, ("max_new_tokens=10", "inference")),
    ("infer_gpu_one", "a100", {"optimizer": "sgd"}, ("optimizer='sgd'", "training")),
    ("infer_cpu", "cpu", {"micro_batch_size": 4}, ("micro_batch_size=4", "batch_size")),
    ("infer_gpu_one", "a100", {"finetune": "lora"}, ("finetune='lora'", "training")),
    ("train_gpu_one", "a100", {"finetune": "full", "lora": {"r": 8}}, ("finetune='full'", "lora")),
    ("train_cpu", "cpu", {"finetune": "qlora"}, ("finetune='qlora'", "finetune='lora'")),
    ("infer_gpu_many", "a100:2", {"strategy": "zero3"}, ("'zero3'", "device_map", "tp")),
    ("infer_gpu_many", "a100:2", {"num_gpus": 8}, ("num_gpus=8", "2 GPU")),
    ("infer_gpu_many", "a100:2", {"nodes": 2}, ("nodes=2", "nodes=1")),
    ("infer_gpu_many", "a100", {"strategy": "tp"}, ("'tp'", "12 query", "single")),
])
def test_constraints_the_scenario_cannot_honour(scenario: str, hw: str, kw: dict, named: tuple[str, ...]) -> None:
    with pytest.raises(ConflictingConstraintsError) as exc:
        recommend("gpt2", scenario, hardware=hw, **kw)
    one_line(exc, *named)


def test_defaults_passed_explicitly_are_not_conflicts() -> None:
    rec = recommend("gpt2", "train_gpu_one", hardware="a100", max_new_tokens=256, prefer="throughput", num_gpus=1, nodes=1,
                    strategy="single")
    assert rec.setup.strategy == "single" and rec.setup.world_size == 1
    rec = recommend("gpt2", "infer_gpu_many", hardware="a100:2", strategy="device_map", num_gpus=2)
    assert rec.setup.strategy == "device_map" and rec.setup.num_gpus == 2


# --- estimate(): a hand-written Setup is checked against the machine it is priced on ---------------

def test_estimate_cuda_setup_on_a_machine_without_gpu() -> None:
    with pytest.raises(WrongMachineError) as exc:
        estimate("gpt2", {"device": "cuda"}, hardware="cpu")
    one_line(exc, "device='cuda'", "'cpu'", "device='cpu'")
    assert estimate("gpt2", {"device": "cpu"}, hardware="cpu").capacity == Hardware.from_name("cpu").cpu.ram_available


def test_estimate_more_gpus_than_the_target_has() -> None:
    with pytest.raises(InvalidSetupError) as exc:
        estimate("gpt2", {"num_gpus": 8, "strategy": "ddp"}, hardware="a100")
    one_line(exc, "num_gpus=8", "1 GPU")
    assert estimate("gpt2", {"num_gpus": 8, "strategy": "ddp"}, hardware="a100:8").fits


@pytest.mark.parametrize(("setup", "named"), [
    ({"micro_batch": 4}, "'micro_batch'"), ({"micro_batch_size": 0}, "micro_batch_size"), ({"optimizer": "adamm"}, "'adamm'"),
    ({"weights_dtype": "nf4"}, "LoRA"), ({"device": "cpu", "autocast": "fp16"}, "fp16"), ({"strategy": "zero9"}, "strategy"),
])
def test_estimate_bad_setups(setup: dict, named: str) -> None:
    with pytest.raises(InvalidSetupError) as exc:
        estimate("gpt2", setup)
    assert "\n" not in str(exc.value) and named in str(exc.value)


def test_estimate_bad_method_and_setup_type() -> None:
    with pytest.raises(PerfGuideError) as exc:
        estimate("gpt2", {}, method="exact")
    one_line(exc, "'exact'", "analytic", "trace")
    with pytest.raises(InvalidSetupError) as exc:
        estimate("gpt2", "mb=4")  # type: ignore[arg-type]
    assert "dict" in str(exc.value) and "str" in str(exc.value)


# --- sequences longer than the model's positions --------------------------------------------------

@pytest.mark.parametrize(("scenario", "kw", "named"), [
    ("train_gpu_one", {"seq_len": 4096}, "seq_len=4096"),           # GPT-2: n_positions 1024 (config.json)
    ("infer_gpu_one", {"seq_len": 2048}, "seq_len=2048"),
    ("infer_gpu_one", {"prompt_len": 1025}, "prompt_len=1025"),
])
def test_sequence_longer_than_the_position_table(scenario: str, kw: dict, named: str) -> None:
    with pytest.raises(ConflictingConstraintsError) as exc:
        recommend("gpt2", scenario, hardware="a100", **kw)
    one_line(exc, named, "max_position_embeddings=1024", "<= 1024")
    assert recommend("gpt2", scenario, hardware="a100", **{k: 1024 for k in kw}).setup.seq_len == 1024


def test_default_prompt_leaves_room_for_the_new_tokens() -> None:
    rec = recommend("gpt2", "infer_gpu_one", hardware="a100", max_new_tokens=256)
    assert rec.setup.seq_len + rec.setup.new_tokens <= 1024 and not rec.warnings
    rec = recommend("gpt2", "infer_gpu_one", hardware="a100", prompt_len=1000, max_new_tokens=100)
    assert any("1100 tokens exceeds" in w for w in rec.warnings)
    assert not recommend("bert-base-uncased", "infer_gpu_one", hardware="a100").warnings  # encoders do not generate


def test_fp16_forced_for_serving_a_bf16_model_is_warned_not_silent() -> None:
    """Serving in fp16 often works, so it is allowed, but the overflow risk is said (training refuses it)."""
    rec = recommend("meta-llama/Llama-3.1-8B", "infer_gpu_one", hardware="a100-80gb", precision="fp16")
    assert rec.setup.weights_dtype == "fp16" and any("trained in bf16" in w for w in rec.warnings)
    assert not recommend("gpt2", "infer_gpu_one", hardware="a100-80gb", precision="fp16").warnings  # GPT-2 is fp32-trained


@pytest.mark.parametrize("size", ["0b", "0.0m", " 0k "])
def test_zero_size_is_not_sent_to_the_hub(size: str) -> None:
    with pytest.raises(InvalidModelError) as exc:
        recommend(size, hardware="a100")
    one_line(exc, repr(size.strip()), "more than zero", "'7b'")


def test_a_class_instead_of_an_instance() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    for cls in (LlamaForCausalLM, LlamaConfig):
        with pytest.raises(InvalidModelError) as exc:
            recommend(cls, hardware="a100")
        one_line(exc, f"class {cls.__name__}", "not an instance", "PretrainedConfig")


# --- the exact (trace) mode runs third-party model code on fake tensors: a failure is one line ----------

TINY_MIXTRAL = {"model_type": "mixtral", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                "intermediate_size": 64, "vocab_size": 128, "num_local_experts": 4, "num_experts_per_tok": 2}


@pytest.mark.slow
@pytest.mark.parametrize("model", ["t5-small", TINY_MIXTRAL])
def test_trace_answers_or_fails_in_one_line(model: object) -> None:
    try:
        mem = estimate(model, {"micro_batch_size": 1, "seq_len": 16}, method="trace")
    except PerfGuideError as exc:
        one_line(pytest.ExceptionInfo.from_exc_info((type(exc), exc, exc.__traceback__)), "trace", "method='analytic'")
    else:
        assert mem.peak_allocated > 0


@pytest.mark.parametrize(("scenario", "hw", "kw", "named"), [
    ("infer_cpu", "cpu", {}, "the CPU"), ("infer_gpu_one", "t4", {}, "7.5"),
    ("infer_gpu_one", "a100", {"precision": "fp32"}, "fp32"), ("train_gpu_one", "t4", {}, "cc 7.5"),
])
def test_flash_attention_forced_where_it_cannot_run(scenario: str, hw: str, kw: dict, named: str) -> None:
    with pytest.raises(ConflictingConstraintsError) as exc:
        recommend("gpt2", scenario, hardware=hw, attn_implementation="flash_attention_2", **kw)
    one_line(exc, "flash_attention_2", named, "'sdpa'")
    assert recommend("gpt2", "infer_gpu_one", hardware="a100", attn_implementation="flash_attention_2").setup.attn_implementation \
        == "flash_attention_2"


def test_fp16_on_cpu_serving_is_honoured_and_said() -> None:
    """torch runs fp16 matmuls on CPU (slowly): a forced fp16 is loaded as asked, never quietly turned into fp32."""
    rec = recommend("gpt2", "infer_cpu", hardware="cpu", precision="fp16")
    assert rec.setup.weights_dtype == "fp16" and any("precision='fp16' on the CPU" in w for w in rec.warnings)

