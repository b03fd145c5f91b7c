"""Bad input and odd machines: every mistake a user can make ends in ONE line that names the bad value and
says what is accepted, and a model that fits nowhere gets an answer (fits=False + what would fit), not an error.

Probe faults are injected at the NVML boundary with tests/test_probe.py's FakeNVML (the one allowed mock),
then the whole public path (``recommend(hardware=None)``) runs on what the fake machine reports.
"""

from __future__ import annotations

import warnings

import pytest

import perfguide
from perfguide import Hardware, ModelSpec, PerfGuideError, estimate, recommend
from perfguide.errors import (ConflictingConstraintsError, InvalidModelError, InvalidSetupError, OfflineError,
                              UnknownHardwareError, UnknownScenarioError, WrongMachineError)
from perfguide.hardware.named import known_names
from perfguide.hardware.probe import ProbeWarning
import test_probe
from test_probe import MIB, a100, mig_a100, t4

fake = test_probe.fake  # the fixture, requested by name as a test argument (an import would read as unused)

GiB = 2**30

# words that point the user at what is accepted
POINTERS = ("accepted", "use ", "e.g.", "pick ", "pass ", "expected", "must be", "did you mean", "supported", "needs ", "should be")


def one_line(exc: pytest.ExceptionInfo[BaseException], *named: str) -> str:
    """The message is one line, names each of ``named`` and points at what is accepted."""
    msg = str(exc.value)
    assert isinstance(exc.value, PerfGuideError), type(exc.value)
    assert "\n" not in msg and msg.strip() == msg and msg, msg
    for text in named:
        assert text.lower() in msg.lower(), (text, msg)
    assert any(p in msg.lower() for p in POINTERS), msg
    return msg


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


def test_local_paths_that_are_not_configs(tmp_path) -> None:  # noqa: ANN001
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

def test_fp16_forced_on_a_bf16_native_model() -> None:
    with pytest.raises(ConflictingConstraintsError) as exc:
        recommend("meta-llama/Llama-3.1-8B", hardware="a100-80gb", precision="fp16")
    one_line(exc, "precision='fp16'", "bf16")


def test_bf16_forced_on_a_t4() -> None:
    with pytest.raises(ConflictingConstraintsError) as exc:
        recommend("gpt2", hardware="t4", precision="bf16")
    one_line(exc, "precision='bf16'", "t4", "7.5")


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


# --- fits nowhere: an answer, not an exception ------------------------------------------------------

@pytest.mark.parametrize(("model", "scenario", "hw", "kw"), [
    ("70b", "train_gpu_one", "t4", {}), ("70b", "train_gpu_one", "a100-80gb", {}), ("70b", "train_cpu", "cpu", {}),
    ("gpt2", "train_gpu_one", "a100", {"headroom": 0.99}),
])
def test_model_that_fits_nowhere_gets_suggestions(model: str, scenario: str, hw: str, kw: dict) -> None:
    rec = recommend(model, scenario, hardware=hw, allow_offload=False, **kw)
    assert not rec.fits and rec.suggestions
    assert all(isinstance(s, str) and "\n" not in s for s in rec.suggestions)
    assert rec.memory.device_total > int(rec.memory.capacity * (1 - rec.request.constraints.headroom))
    rec.report()  # the report renders a does-not-fit plan too


def test_70b_on_one_a100_suggests_what_would_fit() -> None:
    rec = recommend("70b", hardware="a100-80gb", allow_offload=False)
    assert not rec.fits
    text = " ".join(rec.suggestions)
    assert "qlora" in text and "train_gpu_many" in text


def test_inference_that_fits_nowhere() -> None:
    rec = recommend("70b", "infer_gpu_one", hardware="t4", allow_offload=False)
    assert not rec.fits and rec.suggestions


# --- probe faults, end to end ---------------------------------------------------------------------

def _probe_recommend(scenario: str = "train_gpu_one", model: str = "125m", **kw: object) -> perfguide.Recommendation:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProbeWarning)
        return recommend(model, scenario, hardware=None, seq_len=512, global_batch_size=8, **kw)


def test_recommend_on_a_mixed_box_plans_for_the_smallest_gpu(fake) -> None:  # noqa: ANN001
    fake([a100(0), t4(1)])
    rec = _probe_recommend()
    assert rec.hardware.gpu_count == 2 and rec.hardware.source == "probe"
    # every rank must fit the T4: its 15360 MiB, and its precision (cc 7.5: fp16 autocast, no bf16, no TF32)
    assert rec.memory.capacity == 15360 * MIB
    assert rec.setup.autocast == "fp16" and not rec.setup.tf32
    rec_a100 = recommend("125m", hardware="a100-80gb", seq_len=512, global_batch_size=8)
    assert rec_a100.setup.autocast == "bf16"  # the same request on the A100 alone would pick bf16


def test_recommend_on_a_mixed_box_does_not_promise_the_big_gpu(fake) -> None:  # noqa: ANN001
    fake([a100(0), t4(1)])
    rec = _probe_recommend(model="7b", allow_offload=False, finetune="full")
    assert rec.memory.capacity == 15360 * MIB
    assert not rec.fits or rec.memory.device_total <= 15360 * MIB


def test_recommend_on_a_mig_slice(fake, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    fake([mig_a100()])
    rec = _probe_recommend()
    assert rec.memory.capacity == 4864 * MIB  # the 1g.5gb slice is the smallest device
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-aaaa")
    rec = _probe_recommend()
    assert rec.hardware.gpu_count == 1 and rec.memory.capacity == 19968 * MIB and rec.setup.autocast == "bf16"


def test_recommend_with_visible_uuid_picks_that_gpu(fake, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    fake([t4(0), a100(1)])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-a100000")
    rec = _probe_recommend()
    assert rec.memory.capacity == 81920 * MIB and rec.setup.autocast == "bf16"


@pytest.mark.parametrize("value", ["", "-1"])
def test_recommend_with_every_gpu_hidden(fake, monkeypatch: pytest.MonkeyPatch, value: str) -> None:  # noqa: ANN001
    fake([a100(0)])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
    with pytest.raises(WrongMachineError) as exc:
        _probe_recommend()
    one_line(exc, "train_cpu")
    assert _probe_recommend("train_cpu").setup.device == "cpu"


@pytest.mark.parametrize("kw", [{"init_error": RuntimeError("NVML Shared Library Not Found")}, {"count_error": True}])
def test_recommend_when_nvml_fails_plans_cpu_only(fake, kw: dict) -> None:  # noqa: ANN001
    fake([a100(0)], **kw)
    with pytest.warns(ProbeWarning):
        hw = perfguide.probe()
    assert not hw.has_gpu
    assert _probe_recommend("infer_cpu").setup.device == "cpu"


def test_recommend_when_one_gpu_errors_on_queries(fake) -> None:  # noqa: ANN001
    fake([a100(0, fail={"handle"}), t4(1, fail={"memory", "cc"})])
    rec = _probe_recommend()
    # the A100 cannot be opened and is left out; the T4 falls back to its spec sheet (16 GB board, 15360 MiB)
    assert rec.hardware.gpu_count == 1 and rec.memory.capacity == 15360 * MIB and rec.setup.autocast == "fp16"
    assert any("could not be read" in w for w in rec.hardware.warnings)


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
    ("train_gpu_one", "a100", {"strategy": "zero3"}, ("'zero3'", "train_gpu_many")),
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


def test_busy_gpu_counts_only_its_free_memory_in_every_scenario(fake) -> None:  # noqa: ANN001
    fake([a100(0, free_mib=1000)])  # another job holds all but 1000 MiB
    for scenario in ("train_gpu_one", "infer_gpu_one", "infer_gpu_many"):
        rec = _probe_recommend(scenario)
        assert rec.memory.capacity == 1000 * MIB, scenario
        assert not rec.fits or rec.memory.device_total <= 0.9 * 1000 * MIB, scenario


def test_cpu_training_on_a_box_with_a_busy_gpu_plans_for_ram(fake) -> None:  # noqa: ANN001
    fake([a100(0, free_mib=1000)])
    rec = _probe_recommend("train_cpu")
    assert rec.setup.device == "cpu" and rec.memory.capacity == rec.hardware.cpu.ram_available
    assert rec.fits and rec.memory.device_total > 1000 * MIB  # judged against RAM, not the GPU's free 1000 MiB


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


def test_70b_on_a_t4_names_a_gpu_where_qlora_fits() -> None:
    rec = recommend("70b", hardware="t4")
    assert not rec.fits
    (hint,) = [s for s in rec.suggestions if "finetune='qlora' on hardware=" in s]
    name = hint.split("hardware='")[1].split("'")[0]
    check = recommend("70b", hardware=name, finetune="qlora")  # the suggestion holds when followed
    assert check.fits and check.setup.weights_dtype == "nf4"


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


# --- MIG slices: one CUDA process sees one slice; only independent replicas span several ------------

def test_training_across_mig_slices_is_refused(fake) -> None:  # noqa: ANN001
    fake([mig_a100()])
    with pytest.raises(ConflictingConstraintsError) as exc:
        _probe_recommend("train_gpu_many")
    one_line(exc, "MIG", "train_gpu_one", "CUDA_VISIBLE_DEVICES=MIG-")


def test_serving_across_mig_slices_uses_replicas_only(fake) -> None:  # noqa: ANN001
    fake([mig_a100()])
    rec = _probe_recommend("infer_gpu_many", model="125m")
    assert rec.setup.strategy == "single" and rec.setup.num_gpus == 2
    assert all(c.setup.strategy == "single" for c in rec.candidates)
    big = _probe_recommend("infer_gpu_many", model="7b")  # 13.5 GB of bf16 weights: no slice holds it, no split either
    assert big.setup.num_gpus == 1 or big.setup.strategy == "single"  # replicas, or one slice offloading to RAM
    with pytest.raises(ConflictingConstraintsError) as exc:
        _probe_recommend("infer_gpu_many", strategy="tp")
    one_line(exc, "'tp'", "MIG", "strategy='single'")


@pytest.mark.parametrize(("hw", "world"), [("a100:6", 6), ("a100:7x3", 21), ("a100:8", 8), ("a100:16x4", 64)])
def test_default_global_batch_splits_over_any_world_size(hw: str, world: int) -> None:
    """Without global_batch_size the default (32) is rounded up to the world size instead of raising."""
    rec = recommend("125m", "train_gpu_many", hardware=hw, seq_len=256)
    assert rec.setup.world_size == world
    assert rec.setup.global_batch_size == -(-32 // world) * world
    with pytest.raises(ConflictingConstraintsError) as exc:  # an explicit batch that cannot split is still an error
        recommend("125m", "train_gpu_many", hardware=hw, seq_len=256, global_batch_size=world + 1)
    one_line(exc, f"global_batch_size={world + 1}")


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
    ("infer_gpu_one", "a100", {"precision": "fp32"}, "fp32"), ("train_gpu_one", "t4", {}, "cc >= 8.0"),
])
def test_flash_attention_forced_where_it_cannot_run(scenario: str, hw: str, kw: dict, named: str) -> None:
    with pytest.raises(ConflictingConstraintsError) as exc:
        recommend("gpt2", scenario, hardware=hw, attn_implementation="flash_attention_2", **kw)
    one_line(exc, "flash_attention_2", named, "'sdpa'")
    assert recommend("gpt2", "infer_gpu_one", hardware="a100", attn_implementation="flash_attention_2").setup.attn_implementation \
        == "flash_attention_2"


def test_fp16_on_cpu_serving_is_said() -> None:
    rec = recommend("gpt2", "infer_cpu", hardware="cpu", precision="fp16")
    assert rec.setup.weights_dtype == "fp32" and any("precision='fp16' runs as fp32" in w for w in rec.warnings)


def test_serving_that_fits_nowhere_names_the_limit_and_a_gpu_that_holds_it() -> None:
    rec = recommend("70b", "infer_gpu_one", hardware="t4", allow_offload=False)
    assert not rec.fits
    first, *rest = rec.suggestions
    assert "per GPU" in first and "is usable" in first
    (hint,) = [s for s in rest if "holds it on one GPU" in s]
    name = hint.split("hardware='")[1].split("'")[0]
    assert recommend("70b", "infer_gpu_one", hardware=name, allow_offload=False).fits  # the hint holds when followed
    assert any("allow_offload=True" in s for s in rest)


def test_serving_no_fit_hints_only_what_still_applies() -> None:
    rec = recommend("100t", "infer_gpu_many", hardware="h100:8")  # offload is on and the box has 8 GPUs already
    assert not rec.fits and "CPU RAM" in rec.suggestions[0]
    assert not any("allow_offload=True" in s or "scenario='infer_gpu_many'" in s for s in rec.suggestions)
    rec = recommend("999t", "infer_cpu", hardware="cpu")
    assert not rec.fits and "of RAM" in rec.suggestions[0] and "infer_gpu_one" in rec.suggestions[-1]
