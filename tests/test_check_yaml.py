"""perfguide.check on axolotl, LLaMA-Factory and torchtune YAMLs copied from those projects' published examples
(tests/data/check/, each citing its source commit). Each Setup read is compared field by field with the YAML as
yaml.safe_load reads it, each verdict with ``perfguide.estimate`` of that Setup, and a config made not to fit gets
exit 3 and a change, in the format's own keys, that fits when applied."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

import perfguide
from perfguide.cli import main

DATA = Path(__file__).parent / "data" / "check"


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def load(name: str) -> dict:
    return yaml.safe_load((DATA / name).read_text(encoding="utf-8"))


def same_as_estimate(c: perfguide.Check, model: str, hardware: str) -> None:
    memory = perfguide.estimate(model, c.setup, hardware=hardware)
    assert c.memory == memory and c.fits is memory.fits
    assert c.throughput == perfguide.estimate_speed(model, c.setup, hardware=hardware)


def named(c: perfguide.Check) -> str:
    return next(s.value for s in c.read if s.field == "model")


# --- axolotl ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["axolotl_lora-1b.yml", "axolotl_qlora-1b.yml"])
def test_axolotl_lora_examples(name: str) -> None:
    y = load(name)
    c = perfguide.check("meta-llama/Llama-3.2-1B", DATA / name, hardware="a100-80gb")
    s = c.setup
    assert named(c) == y["base_model"]
    assert (s.micro_batch_size, s.gradient_accumulation_steps, s.seq_len) == (y["micro_batch_size"], y["gradient_accumulation_steps"], y["sequence_len"])
    assert s.optimizer == y["optimizer"] and s.gradient_checkpointing is y["gradient_checkpointing"]
    assert s.lora is not None and (s.lora.r, s.lora.alpha, s.lora.dropout) == (y["lora_r"], y["lora_alpha"], y["lora_dropout"])
    assert set(s.lora.target_modules) == set(y["lora_target_modules"])
    assert s.weights_dtype == ("nf4" if y.get("load_in_4bit") else "bf16")   # bf16: auto -> torch_dtype bfloat16
    assert s.autocast == "bf16" and s.attn_implementation == y["attn_implementation"]
    assert s.padding_free is y["sample_packing"]
    assert f"{name}: learning_rate" in c.ignored and not c.unknown
    same_as_estimate(c, "meta-llama/Llama-3.2-1B", "a100-80gb")


def test_axolotl_fsdp_liger_example() -> None:
    y = load("axolotl_fft-8b-liger-fsdp.yaml")
    c = perfguide.check("meta-llama/Llama-3.1-8B", DATA / "axolotl_fft-8b-liger-fsdp.yaml", hardware="a100-80gb:8", num_gpus=8)
    s = c.setup
    assert y["fsdp_config"]["fsdp_sharding_strategy"] == "FULL_SHARD" and s.strategy == "fsdp"
    assert s.offload_params is y["fsdp_config"]["fsdp_offload_params"] is True
    assert s.liger_kernel is y["liger_fused_linear_cross_entropy"] is True
    assert (s.seq_len, s.micro_batch_size, s.lora) == (y["sequence_len"], y["micro_batch_size"], None)
    same_as_estimate(c, "meta-llama/Llama-3.1-8B", "a100-80gb:8")


@pytest.mark.parametrize(("extra", "upcast", "recast"), [({}, False, False), ({"fp32_norms": True}, True, True)])
def test_axolotl_kbit_base_keeps_axolotls_dtypes(extra: dict, upcast: bool, recast: bool, tmp_path: Path) -> None:
    """axolotl (067b021c8, loaders/model.py) casts a k-bit base's norms, embedding and head back to torch_dtype after
    peft's k-bit preparation for every adapter run, so they are not the fp32 that prepare_model_for_kbit_training
    leaves; ``fp32_norms`` keeps the norms fp32. Priced so, and the difference is the bytes by hand."""
    y = {**load("axolotl_qlora-1b.yml"), **extra}
    path = tmp_path / "q.yml"
    path.write_text(yaml.safe_dump(y), encoding="utf-8")
    c = perfguide.check("meta-llama/Llama-3.2-1B", path, hardware="a100-80gb")
    assert (c.setup.kbit_upcast, c.setup.kbit_recast_bf16) == (upcast, recast)
    assert any("casts the norms, embeddings and head back to torch_dtype" in s.source for s in c.read)
    same_as_estimate(c, "meta-llama/Llama-3.2-1B", "a100-80gb")
    if not extra:
        peft_reading = perfguide.estimate("meta-llama/Llama-3.2-1B", c.setup.model_copy(update={"kbit_upcast": True}),
                                          hardware="a100-80gb")
        tied_embedding = 128256 * 2048   # Llama-3.2-1B's one embedding matrix, also its head
        assert peft_reading.weights - c.memory.weights == tied_embedding * (4 - 2) + 2048 * 33 * (4 - 2)   # + 33 norms


def test_axolotl_fp32_norms_under_fsdp_is_named_not_a_conflict(tmp_path: Path) -> None:
    """Sharded QLoRA skips the k-bit preparation (and TRL's-style recast cannot apply there): the base stays 16-bit
    and the fp32 norms are named as priced 16-bit."""
    y = {**load("axolotl_qlora-1b.yml"), "fp32_norms": True, "fsdp_config": {"fsdp_version": 2}}
    path = tmp_path / "q.yml"
    path.write_text(yaml.safe_dump(y), encoding="utf-8")
    c = perfguide.check("meta-llama/Llama-3.2-1B", path, hardware="a100-80gb:2", num_gpus=2)
    assert c.setup.strategy == "fsdp" and (c.setup.kbit_upcast, c.setup.kbit_recast_bf16) == (False, False)
    assert any("fp32_norms" in n and "priced 16-bit" in n for n in c.notes)


def test_axolotl_peft_autocast_adapter_dtype_is_read(tmp_path: Path) -> None:
    y = {**load("axolotl_lora-1b.yml"), "peft_autocast_adapter_dtype": False}
    path = tmp_path / "l.yml"
    path.write_text(yaml.safe_dump(y), encoding="utf-8")
    c = perfguide.check("meta-llama/Llama-3.2-1B", path, hardware="a100-80gb")
    assert c.setup.lora is not None and c.setup.lora.autocast_adapter_dtype is False


def test_axolotl_change_is_written_in_axolotl_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    y = {**load("axolotl_lora-1b.yml"), "base_model": "meta-llama/Llama-3.1-8B", "micro_batch_size": 16, "sequence_len": 4096,
         "gradient_checkpointing": False}
    path = tmp_path / "big.yml"
    path.write_text(yaml.safe_dump(y), encoding="utf-8")
    assert main(["check", str(path), "--hardware", "a100-40gb", "--json"]) == 3
    result = json.loads(capsys.readouterr().out)
    edit = next(e for c in result["changes"] if c["kind"] == "fit" for e in c["edits"] if e["source"] == "big.yml")
    assert edit["format"] == "axolotl" and set(edit["keys"]) <= set(y) | {"plugins", "liger_fused_linear_cross_entropy"}
    path.write_text(yaml.safe_dump({**y, **edit["keys"]}), encoding="utf-8")
    assert main(["check", str(path), "--hardware", "a100-40gb"]) == 0, capsys.readouterr().err


# --- LLaMA-Factory ---------------------------------------------------------------------------------------------------

def test_llamafactory_lora_with_its_deepspeed_file() -> None:
    y = load("llamafactory_qwen3_lora_sft_ds3.yaml")
    ds = json.loads((DATA / y["deepspeed"]).read_text(encoding="utf-8"))
    c = perfguide.check("Qwen/Qwen3-4B", DATA / "llamafactory_qwen3_lora_sft_ds3.yaml", hardware="a100-80gb:8", num_gpus=8)
    s = c.setup
    assert named(c) == y["model_name_or_path"]
    assert s.strategy == f"zero{ds['zero_optimization']['stage']}"
    assert (s.micro_batch_size, s.gradient_accumulation_steps, s.seq_len) == (y["per_device_train_batch_size"], y["gradient_accumulation_steps"], y["cutoff_len"])
    assert s.lora is not None and (s.lora.r, s.lora.alpha, s.lora.target_modules) == (y["lora_rank"], 2 * y["lora_rank"], "all-linear")
    assert s.autocast == "bf16" and s.gradient_checkpointing is True   # LLaMA-Factory's default, not the Trainer's
    assert s.dataloader_num_workers == y["dataloader_num_workers"]
    assert {"llamafactory_qwen3_lora_sft_ds3.yaml: template", "llamafactory_qwen3_lora_sft_ds3.yaml: warmup_ratio"} <= set(c.ignored)
    same_as_estimate(c, "Qwen/Qwen3-4B", "a100-80gb:8")


def test_llamafactory_full_and_qlora() -> None:
    full = perfguide.check("Qwen/Qwen3-4B", DATA / "llamafactory_qwen3_full_sft.yaml", hardware="a100-80gb:8", num_gpus=8)
    assert (full.setup.lora, full.setup.weights_dtype, full.setup.autocast) == (None, "fp32", "bf16")   # upcast unless pure_bf16
    same_as_estimate(full, "Qwen/Qwen3-4B", "a100-80gb:8")
    y = load("llamafactory_qwen3_lora_sft_otfq.yaml")
    q = perfguide.check("Qwen/Qwen3-4B", DATA / "llamafactory_qwen3_lora_sft_otfq.yaml", hardware="l4")
    assert y["quantization_bit"] == 4 and q.setup.weights_dtype == "nf4" and q.setup.lora is not None
    assert q.setup.gradient_accumulation_steps == y["gradient_accumulation_steps"]
    same_as_estimate(q, "Qwen/Qwen3-4B", "l4")
    # LLaMA-Factory runs no peft k-bit preparation: embedding, head and norms stay in the load dtype
    assert (q.setup.kbit_upcast, q.setup.kbit_recast_bf16) == (False, False)


def test_llamafactory_upcast_layernorm_keeps_only_the_norms_fp32(tmp_path: Path) -> None:
    y = {**load("llamafactory_qwen3_lora_sft_otfq.yaml"), "upcast_layernorm": True, "upcast_lmhead_output": True}
    path = tmp_path / "q.yaml"
    path.write_text(yaml.safe_dump(y), encoding="utf-8")
    q = perfguide.check("Qwen/Qwen3-4B", path, hardware="l4")
    assert (q.setup.kbit_upcast, q.setup.kbit_recast_bf16) == (True, True)
    assert any("upcast_lmhead_output" in n and "not priced" in n for n in q.notes)


# --- torchtune -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["torchtune_llama3_2_1B_lora_single_device.yaml", "torchtune_llama3_2_1B_qlora_single_device.yaml"])
def test_torchtune_lora_builders(name: str) -> None:
    y = load(name)
    m = y["model"]
    c = perfguide.check(None, DATA / name, hardware="a100-80gb", seq_len=2048)
    s = c.setup
    assert m["_component_"].endswith("llama3_2_1b") and c.model == "meta-llama/Llama-3.2-1B"
    assert (s.micro_batch_size, s.gradient_accumulation_steps) == (y["batch_size"], y["gradient_accumulation_steps"])
    assert s.lora is not None and (s.lora.r, s.lora.alpha, s.lora.dropout) == (m["lora_rank"], m["lora_alpha"], m["lora_dropout"])
    hf_names = {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "output_proj": "o_proj"}
    expected = {hf_names[x] for x in m["lora_attn_modules"]} | ({"gate_proj", "up_proj", "down_proj"} if m["apply_lora_to_mlp"] else set())
    assert set(s.lora.target_modules) == expected
    assert s.weights_dtype == ("nf4" if ".qlora_" in m["_component_"] else y["dtype"]) and s.autocast is None
    assert s.lora.adapter_dtype == y["dtype"]   # built under set_default_dtype(dtype), on an NF4 base too: no peft
    if ".qlora_" in m["_component_"]:
        assert not s.kbit_upcast   # torchao NF4 Linears only: the embedding, head and norms stay in the run dtype
    assert s.gradient_checkpointing is y["enable_activation_checkpointing"] and s.torch_compile is y["compile"]
    assert s.optimizer == ("adamw_torch_fused" if y["optimizer"].get("fused") else "adamw_torch")
    same_as_estimate(c, "meta-llama/Llama-3.2-1B", "a100-80gb")


def test_torchtune_distributed_full_is_fsdp() -> None:
    y = load("torchtune_llama3_2_3B_full.yaml")
    c = perfguide.check(None, DATA / "torchtune_llama3_2_3B_full.yaml", hardware="a100-80gb:4", num_gpus=4, seq_len=2048)
    assert c.model == "meta-llama/Llama-3.2-3B" and c.setup.strategy == "fsdp" and c.setup.num_gpus == 4
    assert c.setup.gradient_checkpointing is y["enable_activation_checkpointing"] and c.setup.optimizer_in_backward is y["optimizer_in_bwd"]
    assert not c.unknown and "torchtune_llama3_2_3B_full.yaml: profiler" in c.ignored
    same_as_estimate(c, "meta-llama/Llama-3.2-3B", "a100-80gb:4")


def test_unreadable_yaml_values_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for name, data in (("a.yml", {"base_model": "gpt2", "adapter": "ia3"}),
                       ("t.yaml", {"model": {"_component_": "torchtune.models.phi9.phi9_1b"}, "batch_size": 2}),
                       ("l.yaml", {"model_name_or_path": "gpt2", "finetuning_type": "freeze", "stage": "sft", "do_train": True})):
        path = tmp_path / name
        path.write_text(yaml.safe_dump(data), encoding="utf-8")
        assert main(["check", str(path), "--hardware", "a100-80gb"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err


@pytest.mark.parametrize(("kernel", "built"), [("kernels-community/vllm-flash-attn3", "flash_attention_3"),
                                               ("kernels-community/flash-attn3:flash_attn_func", "flash_attention_3"),
                                               ("kernels-community/flash-attn2", "flash_attention_2")])
def test_hub_flash_attention_kernel_is_priced_as_flash(kernel: str, built: str, tmp_path: Path) -> None:
    """transformers loads ``attn_implementation="org/repo[:function]"`` from the Hub through the kernels package
    (axolotl's gpt-oss examples use kernels-community/vllm-flash-attn3): a flash-attention build keeps no s x s scores,
    so it is priced as the flash-attn it builds and the notes say so; a Hub kernel that is not a flash build is refused."""
    path = tmp_path / "hub.yml"
    path.write_text(yaml.safe_dump({**load("axolotl_qlora-1b.yml"), "attn_implementation": kernel}), encoding="utf-8")
    c = perfguide.check("meta-llama/Llama-3.2-1B", path, hardware="h100-80gb")
    assert c.setup.attn_implementation == built
    assert any("is a Hub kernel" in n and kernel in n for n in c.notes)
    path.write_text(yaml.safe_dump({**load("axolotl_qlora-1b.yml"), "attn_implementation": "kernels-community/paged-attention"}),
                    encoding="utf-8")
    with pytest.raises(perfguide.PerfGuideError, match="a Hub attention kernel perfguide cannot price"):
        perfguide.check("meta-llama/Llama-3.2-1B", path, hardware="h100-80gb")


@pytest.mark.parametrize("family", ["galore", "apollo"])
def test_llamafactory_low_rank_optimizers_are_priced_as_the_optimizer_it_builds(family: str) -> None:
    """LLaMA-Factory's GaLore / APOLLO examples (full fine-tune of Llama-3-8B, ``pure_bf16``): ``use_galore`` builds
    GaLoreAdamW over ``optim: adamw_torch`` (train/trainer_utils.py ``_create_galore_optimizer``), one per parameter
    stepped from a post-accumulate-grad hook when layerwise: transformers' ``galore_adamw_layerwise`` with the optimizer
    in backward. ``pure_bf16`` makes bf16 the compute dtype (hparams/parser.py), so the model loads in bf16 and no
    autocast runs. Read as plain AdamW in fp32 before, the example did not fit an 80 GB card (134 GiB)."""
    name = f"llamafactory_llama3_{family}_full_sft.yaml"
    y = load(name)
    assert y[f"use_{family}"] is True and y[f"{family}_layerwise"] is True and y["pure_bf16"] is True   # the premise
    c = perfguide.check("meta-llama/Llama-3.1-8B", DATA / name, hardware="a100-80gb")
    s = c.setup
    assert (s.optimizer, s.optimizer_in_backward) == (f"{family}_adamw_layerwise", True)
    assert (s.weights_dtype, s.autocast, s.lora) == ("bf16", None, None)
    same_as_estimate(c, "meta-llama/Llama-3.1-8B", "a100-80gb")
    assert c.fits   # the bf16 weights alone are 16 GB; the projected states a few percent of them


def test_llamafactory_low_rank_optimizer_over_an_optim_it_cannot_build_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "apollo.yaml"
    path.write_text(yaml.safe_dump({"model_name_or_path": "meta-llama/Llama-3.1-8B", "do_train": True, "finetuning_type": "full",
                                    "use_apollo": True, "optim": "adamw_bnb_8bit", "bf16": True}), encoding="utf-8")
    with pytest.raises(perfguide.PerfGuideError, match="builds apollo only over adamw_torch"):
        perfguide.check(config=path, hardware="a100-80gb")


def test_a_llamafactory_predict_config_is_refused_not_priced_as_training() -> None:
    """LLaMA-Factory's nlg_eval example (do_predict, predict_with_generate, no do_train) generates; its sft workflow
    calls trainer.train() only under do_train (train/sft/workflow.py). It was priced as a LoRA training run at the
    Trainer's default micro-batch 8; it is now refused in one line pointing at the inference scenarios."""
    path = Path(__file__).parent / "data" / "check" / "llamafactory_llama3_lora_predict.yaml"
    assert load(path.name)["do_predict"] is True and "do_train" not in load(path.name)   # the premise
    with pytest.raises(perfguide.PerfGuideError, match="do_predict without do_train.*infer_gpu_one"):
        perfguide.check("meta-llama/Llama-3.1-8B", path, hardware="a100-80gb")


def test_a_llamafactory_v1_config_is_refused_not_read_as_v0() -> None:
    """LLaMA-Factory's v1 trainer takes another schema (``model``, ``dist_config``, ``micro_batch_size``). Read as the v0
    YAML it became a LoRA run (v0's default finetuning_type) at the Trainer's micro-batch 8, where the file is a full
    FSDP2 fine-tune at micro-batch 1; it is refused in one line naming the format that is read."""
    y = load("llamafactory_v1_train_full_fsdp2.yaml")
    assert isinstance(y["model"], str) and y["dist_config"]["name"] == "fsdp2" and y["micro_batch_size"] == 1   # the premise
    with pytest.raises(perfguide.PerfGuideError, match="LLaMA-Factory v1 config .* is not read yet"):
        perfguide.check("Qwen/Qwen3-0.6B", DATA / "llamafactory_v1_train_full_fsdp2.yaml", hardware="a100-80gb")


def test_torchtune_configs_that_do_not_fine_tune_one_model_are_refused(tmp_path: Path) -> None:
    """An evaluation recipe's config has no optimizer (torchtune's llama3_2/evaluation), a PPO recipe's a policy and a
    reward/value model: both were priced as a training run at the Trainer's defaults; both are refused in one line."""
    with pytest.raises(perfguide.PerfGuideError, match="optimizer is missing: this torchtune config does not train"):
        perfguide.check("meta-llama/Llama-3.2-1B", DATA / "torchtune_llama3_2_evaluation.yaml", hardware="a100-80gb")
    ppo = tmp_path / "ppo.yaml"
    ppo.write_text(yaml.safe_dump({"policy_model": {"_component_": "torchtune.models.mistral.mistral_7b"},
                                   "reward_and_value_model": {"_component_": "torchtune.models.mistral.mistral_reward_7b"},
                                   "optimizer": {"_component_": "bitsandbytes.optim.PagedAdamW"}, "batch_size": 64}), encoding="utf-8")
    with pytest.raises(perfguide.PerfGuideError, match="this is a PPO recipe's"):
        perfguide.check("mistralai/Mistral-7B-v0.1", ppo, hardware="rtx4090")


def test_torchtune_fsdp_cpu_offload_on_one_process_is_fsdp() -> None:
    """llama3_1/70B_full sets fsdp_cpu_offload; launched as one process (the check's default), torchtune's distributed
    recipe still wraps the model in FSDP, so the offload is priced under FSDP on one GPU rather than refused as an
    offload without sharding (which surfaced as a Setup validation message)."""
    assert load("torchtune_llama3_1_70B_full.yaml")["fsdp_cpu_offload"] is True   # the premise
    c = perfguide.check(config=DATA / "torchtune_llama3_1_70B_full.yaml", hardware="a100-80gb:8")
    assert (c.setup.strategy, c.setup.num_gpus, c.setup.offload_params) == ("fsdp", 1, True)
    assert named(c) == "meta-llama/Llama-3.1-70B"


def test_torchtune_gemma2_builder_and_its_chunked_loss() -> None:
    """gemma2/2B_qlora_single_device: the builder maps to google/gemma-2-2b, and its LinearCrossEntropyLoss is priced as
    torchtune's loop, where the 256,000-token vocabulary made HF's full-logits path the bulk of the step."""
    c = perfguide.check(config=DATA / "torchtune_gemma2_2B_qlora_single_device.yaml", hardware="rtx4090", seq_len=2048)
    assert named(c) == "google/gemma-2-2b" and c.setup.trainer == "torchtune" and c.setup.weights_dtype == "nf4"
    same_as_estimate(c, "google/gemma-2-2b", "rtx4090")


def test_gemma2_attention_follows_its_transformers_class(tmp_path: Path) -> None:
    """Gemma 2's class refuses SDPA (_supports_sdpa = False): a config that names no attention is priced with the eager
    attention transformers loads (as estimate prices it), and one that names sdpa is refused in one line, where the
    check used to price SDPA's memory for a run that loads eager or fails."""
    path = tmp_path / "args.json"
    path.write_text(json.dumps({"per_device_train_batch_size": 1, "bf16": True, "output_dir": "o"}), encoding="utf-8")
    c = perfguide.check("google/gemma-2-2b", path, hardware="a100-80gb", seq_len=1024)
    assert c.setup.attn_implementation == "eager"
    same_as_estimate(c, "google/gemma-2-2b", "a100-80gb")
    path.write_text(json.dumps({"per_device_train_batch_size": 1, "bf16": True, "output_dir": "o",
                                "model_init_kwargs": {"attn_implementation": "sdpa"}}), encoding="utf-8")
    with pytest.raises(perfguide.PerfGuideError, match="refused by google/gemma-2-2b's transformers class"):
        perfguide.check("google/gemma-2-2b", path, hardware="a100-80gb", seq_len=1024)


def test_accelerate_context_parallelism_is_priced_per_rank_and_tensor_parallelism_refused(tmp_path: Path) -> None:
    """TRL's context_parallel_2gpu.yaml sets accelerate's parallelism_config cp_size 2: each sequence is split over the
    two ranks (Setup.sequence_parallel; it was once listed as "read, not priced", then as an upper bound). Its
    ALST config's sp_size 2 (DeepSpeed's Ulysses) is the same split. A tp_size above 1 splits the weights, which the
    check cannot price at all: refused in one line."""
    cp = DATA / "trl_context_parallel_2gpu.yaml"
    assert load(cp.name)["parallelism_config"]["parallelism_config_cp_size"] == 2   # the premise
    c = perfguide.check(config=[DATA / "trl_example_config.yaml", cp], hardware="h100-80gb:8")
    assert not any("parallelism_config" in k for k in c.ignored)
    assert c.setup.sequence_parallel == 2 and c.setup.world_size == load(cp.name)["num_processes"]
    whole = perfguide.check(config=[DATA / "trl_example_config.yaml", cp], hardware="h100-80gb:8", sequence_parallel=1)
    assert c.memory.activations < whole.memory.activations   # each rank holds half of every sequence's activations
    sp = tmp_path / "sp.yaml"
    sp.write_text(yaml.safe_dump({**load(cp.name), "parallelism_config": {"parallelism_config_sp_size": 2,
                                                                          "parallelism_config_sp_backend": "deepspeed"}}), encoding="utf-8")
    assert perfguide.check(config=[DATA / "trl_example_config.yaml", sp], hardware="h100-80gb:8").setup.sequence_parallel == 2
    tp = tmp_path / "tp.yaml"
    tp.write_text(yaml.safe_dump({**{k: v for k, v in load(cp.name).items()},
                                  "parallelism_config": {"parallelism_config_tp_size": 2}}), encoding="utf-8")
    with pytest.raises(perfguide.PerfGuideError, match="tensor-parallel training is not priced"):
        perfguide.check(config=[DATA / "trl_example_config.yaml", tp], hardware="h100-80gb:8")


def test_axolotls_nousresearch_base_models_resolve_offline() -> None:
    """axolotl's examples name NousResearch's ungated re-uploads of Meta's checkpoints (the same config.json): offline,
    the catalog resolves them as Meta's, so the example checks as written, and prices as the Meta id does."""
    assert load("axolotl_lora-1b.yml")["base_model"] == "NousResearch/Llama-3.2-1B"   # the premise
    c = perfguide.check(config=DATA / "axolotl_lora-1b.yml", hardware="rtx4090")
    meta = perfguide.check("meta-llama/Llama-3.2-1B", DATA / "axolotl_lora-1b.yml", hardware="rtx4090")
    assert c.model == "NousResearch/Llama-3.2-1B" and c.memory == meta.memory
    for alias, meta_id in (("NousResearch/Meta-Llama-3.1-8B", "meta-llama/Llama-3.1-8B"), ("NousResearch/Llama-2-7b-hf", "meta-llama/Llama-2-7b-hf")):
        assert perfguide.ModelSpec.from_any(alias).total_params == perfguide.ModelSpec.from_any(meta_id).total_params


@pytest.mark.parametrize("pattern", [r"model.layers.[\d]+.(mlp|self_attn).(up|down|gate|q|k|v|o)_proj",
                                     r".*\.(q_proj|v_proj)", r"model\.layers\.\d+\.mlp\.(gate|up)_proj"])
def test_axolotl_target_regex_selects_what_peft_selects(tmp_path: Path, pattern: str) -> None:
    """axolotl passes a string lora_target_modules to PEFT, which fullmatches it as a regex against every module's
    full name (axolotl's gemma-3 vision example names one). It was handed to Setup as one name and failed with a raw
    validation message; the names read are the ones real PEFT adapts on a tiny Llama."""
    from helpers import tiny_model
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(tiny_model(), LoraConfig(r=4, target_modules=pattern))
    adapted = {n.split(".")[-1] for n, m in model.named_modules() if hasattr(m, "lora_A") and n.rsplit(".", 1)[-1] != "lora_A"}
    path = tmp_path / "regex.yml"
    path.write_text(yaml.safe_dump({**load("axolotl_lora-1b.yml"), "lora_target_linear": None, "lora_target_modules": pattern}),
                    encoding="utf-8")
    c = perfguide.check("meta-llama/Llama-3.2-1B", path, hardware="a100-80gb")
    assert c.setup.lora is not None and set(c.setup.lora.target_modules) == adapted


def test_axolotl_target_regex_that_matches_nothing_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "regex.yml"
    for pattern, message in (("q_proj", "matches none of a decoder block's Linears"), ("(q_proj", "is not a regular expression")):
        path.write_text(yaml.safe_dump({**load("axolotl_lora-1b.yml"), "lora_target_linear": None, "lora_target_modules": pattern}),
                        encoding="utf-8")
        with pytest.raises(perfguide.PerfGuideError, match=message) as exc:
            perfguide.check("meta-llama/Llama-3.2-1B", path, hardware="a100-80gb")
        assert "\n" not in str(exc.value)


def test_a_rule_across_fields_is_one_sentence_without_the_input_echoed() -> None:
    """LLaMA-Factory's layer-wise GaLore example steps inside backward, which runs on one process; on an 8-GPU machine
    llamafactory-cli launches all eight. The refusal was pydantic's "Value error, ..." followed by the whole Setup
    dict; it is now the rule's own sentence."""
    with pytest.raises(perfguide.PerfGuideError) as exc:
        perfguide.check(None, DATA / "llamafactory_llama3_galore_full_sft.yaml", hardware="a100-80gb:8")
    message = str(exc.value)
    assert "invalid setup: optimizer_in_backward runs on one process" in message
    assert "Value error" not in message and "(got {" not in message and "\n" not in message


@pytest.mark.parametrize(("name", "key", "what"), [
    ("llamafactory_llama3_badam_full_sft.yaml", "use_badam", "BAdam"),
    ("llamafactory_megatron_qwen3_moe_full.yaml", "tensor_model_parallel_size", "Megatron-core parallelism"),
])
def test_llamafactory_switches_perfguide_does_not_price_are_refused(name: str, key: str, what: str) -> None:
    """LLaMA-Factory's BAdam example (one block's gradients and optimizer states at a time) was priced as a plain fp32
    AdamW full fine-tune (172 GiB, "does not fit" on 8 x 80 GB), with use_badam listed as having no effect; its Megatron
    example (pipeline 4 x expert 2 under USE_MCA=1) as DDP of a 30B MoE. Both are refused in one line."""
    assert key in load(name)   # the premise
    with pytest.raises(perfguide.PerfGuideError, match=f"{name}: {key}: {what}") as exc:
        perfguide.check(None, DATA / name, hardware="a100-80gb:8")
    assert "\n" not in str(exc.value)


def _axolotl(tmp_path: Path, name: str, **keys: object) -> Path:
    path = tmp_path / "a.yml"
    path.write_text(yaml.safe_dump({**load(name), **keys}), encoding="utf-8")
    return path


def test_axolotl_runs_that_are_not_sft_are_priced_or_refused(tmp_path: Path) -> None:
    """axolotl's `rl`, reward-model, QAT, ReLoRA, LISA and tensor-parallel keys were listed as "read, not priced" and
    the run priced as SFT (its DPO examples as one row per sample, no reference). `rl: dpo` is priced as DPO; the others
    are refused in one line; a context-parallel split is priced per rank."""
    lora = "axolotl_lora-1b.yml"
    assert perfguide.check("meta-llama/Llama-3.2-1B", _axolotl(tmp_path, lora, rl="dpo", sample_packing=False), hardware="a100-80gb").setup.objective == "dpo"
    for keys, message in (({"rl": "kto"}, "rl='kto': axolotl's kto trainer is not priced"),
                          ({"reward_model": True}, "reward_model: reward-model training"),
                          ({"qat": {"weight_dtype": "int4"}}, "qat: quantization-aware training"),
                          ({"tensor_parallel_size": 2}, "tensor_parallel_size=2: tensor-parallel training is not priced"),
                          # its expert_parallel examples (ExpertParallelPlugin) were priced as DDP, the key "no effect"
                          ({"expert_parallel_size": 4}, "expert_parallel_size=4: expert-parallel training is not priced")):
        with pytest.raises(perfguide.PerfGuideError, match=re.escape(message)) as exc:
            perfguide.check("meta-llama/Llama-3.2-1B", _axolotl(tmp_path, lora, **keys), hardware="a100-80gb:2")
        assert "\n" not in str(exc.value)
    # context parallelism splits each sequence over the ranks (ring-flash-attn: axolotl refuses it without flash attention)
    c = perfguide.check("meta-llama/Llama-3.2-1B", _axolotl(tmp_path, lora, context_parallel_size=2, flash_attention=True),
                        hardware="a100-80gb:2")
    assert (c.setup.sequence_parallel, c.setup.world_size) == (2, 2)
    with pytest.raises(perfguide.PerfGuideError, match="needs flash attention"):
        perfguide.check("meta-llama/Llama-3.2-1B", _axolotl(tmp_path, lora, context_parallel_size=2, flash_attention=False,
                                                            attn_implementation="sdpa"), hardware="a100-80gb:2")


def test_axolotl_modules_to_save_are_trained_copies(tmp_path: Path) -> None:
    c = perfguide.check("meta-llama/Llama-3.2-1B", _axolotl(tmp_path, "axolotl_lora-1b.yml", lora_modules_to_save=["embed_tokens", "lm_head"]),
                        hardware="a100-80gb")
    assert c.setup.lora is not None and c.setup.lora.modules_to_save == ("embed_tokens", "lm_head")
    plain = perfguide.check("meta-llama/Llama-3.2-1B", DATA / "axolotl_lora-1b.yml", hardware="a100-80gb")
    assert c.memory.optimizer_states > plain.memory.optimizer_states


@pytest.mark.parametrize(("patterns", "priced"), [
    (["model.layers.*", "model.embed_tokens.*", "model.norm.*", "lm_head.*"], True),    # the whole text model
    (["model.language_model.*", "lm_head.*"], True),                                  # a VLM's language model
    (["^model.layers.2[0-9]+.mlp.*"], False),                                          # some blocks' MLPs
    (["^model.embed_tokens.weight$[:32000]"], False),                                  # a row range
    ([r"model\.language_model\..*", r"lm_head\..*"], False),                          # escaped dots: nothing matches
])
def test_axolotl_unfrozen_parameters(tmp_path: Path, patterns: list[str], priced: bool) -> None:
    """axolotl trains only what its patterns match (utils/freeze.py LayerNamePattern: '.' literal unless '+' follows,
    re.match from the start, an optional row range). The whole text model is priced as its full fine-tune; less is
    refused rather than priced as all of it."""
    path = _axolotl(tmp_path, "axolotl_fft-8b-liger-fsdp.yaml", unfrozen_parameters=patterns)
    if priced:
        c = perfguide.check(None, path, hardware="a100-80gb:8")
        assert any("covers the whole text model" in n for n in c.notes)
    else:
        with pytest.raises(perfguide.PerfGuideError, match="unfrozen_parameters"):
            perfguide.check(None, path, hardware="a100-80gb:8")


def test_axolotl_escaped_dots_match_no_parameter(tmp_path: Path) -> None:
    """axolotl's LayerNamePattern escapes every '.' not followed by '+' itself, so a pattern written with '\\.' asks
    for a backslash in the name and matches nothing. axolotl's Qwen3.5 27B full fine-tune example shipped such patterns
    (examples/qwen3.5/27b-fft.yaml at 113d275bd) until 7daf7d96f ('fix: regex for unfrozen language tower') rewrote them
    as 'model.language_model.*' and 'lm_head.*'; the run in between trained nothing. Alone they are refused with the
    fix; beside patterns that match, each is named in a note."""
    path = _axolotl(tmp_path, "axolotl_fft-8b-liger-fsdp.yaml", unfrozen_parameters=[r"model\.language_model\..*", r"lm_head\..*"])
    with pytest.raises(perfguide.PerfGuideError, match=r"matches no parameter, so nothing trains.*write 'model\.language_model\.\*'"):
        perfguide.check(None, path, hardware="a100-80gb:8")
    mixed = _axolotl(tmp_path, "axolotl_fft-8b-liger-fsdp.yaml",
                     unfrozen_parameters=["model.language_model.*", "lm_head.*", r"model\.visual\..*"])
    c = perfguide.check(None, mixed, hardware="a100-80gb:8")
    assert any("model\\\\.visual" in n and "matches no parameter" in n for n in c.notes), c.notes


#: torchtune's qwen2 builders' arguments (torchtune/models/qwen2/_model_builders.py): vocab, layers, heads, kv heads,
#: embed_dim, intermediate_dim, max_seq_len, tie_word_embeddings
TORCHTUNE_QWEN2 = {"qwen2_0_5b": (151936, 24, 14, 2, 896, 4864, 32768, True),
                   "qwen2_1_5b": (151936, 28, 12, 2, 1536, 8960, 32768, True),
                   "qwen2_7b": (152064, 28, 28, 4, 3584, 18944, 32768, False)}


@pytest.mark.parametrize("builder", sorted(TORCHTUNE_QWEN2))
def test_torchtune_qwen2_builders_load_their_shape(builder: str, tmp_path: Path) -> None:
    from perfguide.model.catalog import config_of

    path = tmp_path / "lora.yaml"
    path.write_text(yaml.safe_dump({"model": {"_component_": f"torchtune.models.qwen2.lora_{builder}", "lora_attn_modules": ["q_proj"],
                                               "lora_rank": 8, "lora_alpha": 16}, "optimizer": {"_component_": "torch.optim.AdamW"},
                                     "batch_size": 1, "dtype": "bf16"}), encoding="utf-8")
    c = perfguide.check(None, path, hardware="rtx4090", seq_len=512)
    cfg = config_of(c.model)
    shape = (cfg["vocab_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
             cfg["hidden_size"], cfg["intermediate_size"], cfg["max_position_embeddings"], cfg["tie_word_embeddings"])
    assert shape == TORCHTUNE_QWEN2[builder] and c.setup.lora is not None


@pytest.mark.parametrize("component", ["torchtune.models.llama3_2_vision.lora_llama3_2_vision_11b",
                                       "torchtune.models.llama4.llama4_scout_17b_16e"])
def test_torchtune_multimodal_builders_are_refused_as_such(component: str, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "v.yaml"
    path.write_text(yaml.safe_dump({"model": {"_component_": component}, "optimizer": {"_component_": "torch.optim.AdamW"}}),
                    encoding="utf-8")
    assert main(["check", str(path), "--hardware", "a100-80gb"]) == 2
    err = capsys.readouterr().err
    assert "multimodal builder" in err and "pass --model" not in err and err.count("\n") == 1


def test_a_verdict_at_an_assumed_length_says_so_on_its_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t.yaml"   # torchtune's distributed configs leave tokenizer.max_seq_len null: the data decides
    path.write_text(yaml.safe_dump({"model": {"_component_": "torchtune.models.qwen2_5.qwen2_5_0_5b"}, "tokenizer": {"max_seq_len": None},
                                    "optimizer": {"_component_": "torch.optim.AdamW"}, "batch_size": 1, "dtype": "bf16"}),
                    encoding="utf-8")
    verdicts = []
    for extra in ([], ["--seq-len", "300"]):
        main(["check", str(path), "--hardware", "a100-80gb", *extra])
        verdicts.append(next(line for line in capsys.readouterr().out.splitlines() if line.startswith("verdict:")))
    assert verdicts[0].endswith("at an assumed 2,048 tokens per sample (none read; pass --seq-len)"), verdicts[0]
    assert "assumed" not in verdicts[1], verdicts[1]
    # a library's own default cap is the run's cap, not a guess: TRL's SFTConfig truncates at max_length 1,024
    trl = tmp_path / "sft.json"
    trl.write_text(json.dumps({"output_dir": "o", "dataset_text_field": "text"}), encoding="utf-8")
    c = perfguide.check("Qwen/Qwen2.5-0.5B", trl, hardware="a100-80gb")
    assert any(s.field == "seq_len" and s.assumed and s.value == 1024 for s in c.read)
    main(["check", str(trl), "--model", "Qwen/Qwen2.5-0.5B", "--hardware", "a100-80gb"])
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("verdict:"))
    assert "assumed" not in line, line


def _axolotl_linear_names(model: object) -> set[str]:
    """axolotl's find_all_linear_names (loaders/adapter.py), restated: every module that is an nn.Linear or has
    'Linear' in its class name, by leaf name, less the LM head."""
    import torch

    names = {name.rsplit(".", 1)[-1] for name, module in model.named_modules()   # type: ignore[attr-defined]
             if isinstance(module, torch.nn.Linear) or "Linear" in type(module).__name__}
    return names - {"lm_head"}


@pytest.mark.parametrize(("hub_id", "config"), [
    ("mistralai/Mixtral-8x7B-v0.1", {"model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2}),
    ("meta-llama/Llama-3.2-1B", {"model_type": "llama"}),
])
def test_axolotl_lora_target_linear_is_its_own_list_of_linears(hub_id: str, config: dict[str, object], tmp_path: Path) -> None:
    """``lora_target_linear`` hands peft the Linear modules axolotl finds, not peft's "all-linear": on transformers 5's
    Mixtral the fused experts and the router are parameters of modules that are no Linear, so its LoRA is on attention
    only (and takes dropout, which peft's ParamWrapper on the experts refuses). Checked against a real transformers
    module tree of the same class, built small."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    small = AutoConfig.for_model(**config, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, vocab_size=256)
    with torch.device("meta"):
        expected = _axolotl_linear_names(AutoModelForCausalLM.from_config(small))
    c = perfguide.check(hub_id, _axolotl(tmp_path, "axolotl_lora-1b.yml", lora_target_linear=True, lora_target_modules=None,
                                         lora_dropout=0.05, base_model=hub_id), hardware="a100-80gb")
    assert c.setup.lora is not None and set(c.setup.lora.target_modules) == expected


def test_fsdp_checkpointing_is_a_switch_of_its_own(tmp_path: Path) -> None:
    """TRL's context-parallel guide sets FSDP's activation checkpointing in the accelerate config and
    ``gradient_checkpointing=False`` in SFTConfig ("can't be set to True simultaneously"). The training argument's False
    does not turn FSDP's off: transformers' Trainer keeps the two switches apart and refuses both on (the premise,
    read in the installed Trainer). The check used to let the training argument win and priced no checkpointing."""
    import inspect

    from transformers import Trainer

    source = inspect.getsource(Trainer)
    assert "fsdp_plugin.activation_checkpointing and self.args.activation_checkpointing" in source   # the premise
    acc = DATA / "trl_context_parallel_2gpu.yaml"
    assert load(acc.name)["fsdp_config"]["fsdp_activation_checkpointing"] is True
    args = tmp_path / "sft.json"
    for flag, starts in ((False, True), (True, False)):
        args.write_text(json.dumps({"output_dir": "o", "gradient_checkpointing": flag, "bf16": True}), encoding="utf-8")
        c = perfguide.check("Qwen/Qwen3-8B", [args, acc], hardware="h100-80gb:2", seq_len=4096)
        assert c.setup.gradient_checkpointing is True
        assert any(n.startswith("does not start here") for n in c.notes) is not starts


@pytest.mark.parametrize("config", [
    # LLaMA-Factory's examples/inference/qwen3.yaml and examples/merge_lora/qwen3_lora_sft.yaml (ff6d4d12), as published
    {"model_name_or_path": "Qwen/Qwen3-4B-Instruct-2507", "template": "qwen3_nothink", "infer_backend": "huggingface",
     "trust_remote_code": True},
    {"model_name_or_path": "Qwen/Qwen3-4B-Instruct-2507", "adapter_name_or_path": "saves/qwen3-4b/lora/sft",
     "template": "qwen3_nothink", "trust_remote_code": True, "export_dir": "saves/qwen3_sft_merged", "export_size": 5,
     "export_device": "cpu", "export_legacy_format": False},
])
def test_llamafactorys_chat_and_export_configs_do_not_train(config: dict[str, object], tmp_path: Path) -> None:
    """They carry no training key, so they were read as TrainingArguments at TRL's defaults (8 x 1,024 tokens, "fits:
    69.8 GiB"); LLaMA-Factory's template / inference / export keys mark the format, and without ``do_train`` its
    workflows never call trainer.train()."""
    path = tmp_path / "lf.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    with pytest.raises(perfguide.PerfGuideError, match="do_train is not true: this LLaMA-Factory config does not train") as exc:
        perfguide.check(None, path, hardware="a100-80gb")
    assert "\n" not in str(exc.value)


def test_axolotls_own_kernels_are_said_not_priced_not_listed_as_inert(tmp_path: Path) -> None:
    """axolotl's fused LoRA kernels (``lora_mlp_kernel`` ...) and flash-attn's fused MLP change the step's memory and
    speed; they were listed under "read, not priced (no effect on memory or speed here)", which is not so."""
    c = perfguide.check("meta-llama/Llama-3.2-1B", _axolotl(tmp_path, "axolotl_lora-1b.yml", lora_mlp_kernel=True,
                                                           lora_qkv_kernel=False), hardware="a100-80gb")
    assert not any(k.endswith(("lora_mlp_kernel", "lora_qkv_kernel")) for k in c.ignored)
    assert any("lora_mlp_kernel=True: axolotl's fused LoRA MLP kernel is not priced" in n for n in c.notes)
    assert not any("lora_qkv_kernel" in n for n in c.notes)   # switched off: nothing to say


@pytest.mark.parametrize(("keys", "said", "inert"), [
    ({"layer_offloading": True}, "layer_offloading=True: axolotl's layer offloading", None),
    ({"eval_batch_size": 16}, "eval_batch_size=16: the evaluation forward at this batch", None),
    ({"eval_batch_size": 1}, None, "eval_batch_size"),   # no larger than micro_batch_size: nothing above the step
])
def test_axolotl_keys_with_unpriced_effects_are_said(tmp_path: Path, keys: dict, said: str | None, inert: str | None) -> None:
    """axolotl's ``layer_offloading`` streams each decoder layer's frozen weights in from the CPU, and an eval batch
    above the training batch runs a forward the step does not; both change the memory and were listed as having no
    effect. They are said in the notes; an eval batch no larger than the training batch stays inert."""
    c = perfguide.check("meta-llama/Llama-3.2-1B", _axolotl(tmp_path, "axolotl_lora-1b.yml", **keys), hardware="a100-80gb")
    assert any(said in n for n in c.notes) if said else not any(next(iter(keys)) in n for n in c.notes)
    assert any(k.endswith(inert) for k in c.ignored) if inert else not any(k.endswith(next(iter(keys))) for k in c.ignored)


def test_torchtune_parallel_dims(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """torchtune's distributed recipes build a device mesh from ``tensor_parallel_dim`` / ``context_parallel_dim``
    (recipes/full_finetune_distributed.py ParallelDims). Both were listed as "read, not priced (no effect on memory or
    speed)": its 70B multinode config (tensor_parallel_dim 8) was priced as plain FSDP. Tensor parallelism is refused
    in one line; context parallelism splits each sequence over the ranks (Setup.sequence_parallel)."""
    y = load("torchtune_llama3_2_3B_full.yaml")
    path = tmp_path / "full.yaml"
    path.write_text(yaml.safe_dump({**y, "context_parallel_dim": 2}), encoding="utf-8")
    c = perfguide.check(None, path, hardware="a100-80gb:4", num_gpus=4, seq_len=8192)
    assert (c.setup.sequence_parallel, c.setup.strategy) == (2, "fsdp")
    assert not any(k.endswith("context_parallel_dim") for k in c.ignored)
    path.write_text(yaml.safe_dump({**y, "tensor_parallel_dim": 2}), encoding="utf-8")
    assert main(["check", str(path), "--hardware", "a100-80gb:4", "--num-gpus", "4"]) == 2
    err = capsys.readouterr().err
    assert "tensor_parallel_dim=2: tensor-parallel training is not priced" in err and err.count("\n") == 1


def test_llamafactory_v1_kernels_are_said_not_priced(tmp_path: Path) -> None:
    """``use_v1_kernels`` applies LLaMA-Factory's v1 automatic kernels to the v0 model (model/loader.py
    apply_v1_kernels); it was listed as having no effect on memory or speed."""
    y = {**load("llamafactory_qwen3_lora_sft_otfq.yaml"), "use_v1_kernels": True}
    path = tmp_path / "lf.yaml"
    path.write_text(yaml.safe_dump(y), encoding="utf-8")
    c = perfguide.check("Qwen/Qwen3-4B", path, hardware="l4")
    assert not any(k.endswith("use_v1_kernels") for k in c.ignored)
    assert any("use_v1_kernels: LLaMA-Factory's v1 kernel plugins" in n for n in c.notes)
