"""The technique and scenario registries, and the Setup facts they rely on."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import perfguide
from perfguide import techniques
from perfguide.errors import InvalidSetupError, PerfGuideError, UnknownScenarioError
from perfguide.scenarios import registry
from perfguide.scenarios.ladder import training_rungs
from perfguide.setup import LoraSpec, Setup

ROOT = Path(perfguide.__file__).parent


def test_names_lists_the_starting_techniques() -> None:
    expected = {"gradient_checkpointing", "optimizer", "mixed_precision", "pure_bf16", "lora", "qlora", "cpu_offload", "torch_compile"}
    assert expected <= set(techniques.names())
    assert techniques.get("lora").name == "lora"
    with pytest.raises(PerfGuideError, match="technique"):
        techniques.get("no-such-technique")


def test_every_setup_field_a_technique_owns_exists_and_has_one_owner() -> None:
    owners: dict[str, str] = {}
    for t in techniques.registry():
        for f in t.fields:
            assert f in Setup.model_fields, f"{t.name} owns unknown Setup field {f!r}"
            assert f not in owners, f"{f} owned by {owners[f]} and {t.name}"
            owners[f] = t.name


def test_every_technique_cites_a_public_source() -> None:
    for t in techniques.registry():
        assert t.sources, t.name
        for src in t.sources:
            assert "rules.md" not in src and "anchors.md" not in src, (t.name, src)
            assert src.startswith("https://") or "arXiv" in src, (t.name, src)


def _ladder(finetune: str = "full", optimizer: str | None = None, ckpt: bool | None = None, pure: bool = True) -> list:
    base = Setup(seq_len=128)
    return training_rungs(base, "bf16", "bf16", pure, finetune=finetune, lora=LoraSpec(), optimizer=optimizer, checkpointing=ckpt)


def test_full_ladder_gives_up_the_least_first() -> None:
    rungs = _ladder()
    # savers that keep AdamW's update rule first; Adafactor (a different rule) only after CPU offload
    assert [r.name for r in rungs] == ["exact AMP", "lighter optimizer states", "pure bf16", "step in backward", "CPU offload (one GPU)",
                                       "a different update rule"]
    exact = rungs[0].templates
    # checkpointing is an axis: both values inside the first rung, before any optimizer change; so is activation
    # offloading, kept only with checkpointing (the combination it is priced for)
    assert [(t.optimizer, t.gradient_checkpointing, t.activation_offloading) for t in exact] == [
        ("adamw_torch_fused", False, False), ("adamw_torch_fused", True, False), ("adamw_torch_fused", True, True)]
    assert {t.optimizer for t in rungs[1].templates} == {"adamw_bnb_8bit"}
    assert {t.optimizer for t in rungs[5].templates} == {"adafactor"}
    assert {t.weights_dtype for t in rungs[2].templates} == {"bf16"}
    assert all(t.weights_dtype == "fp32" for r in rungs[:2] for t in r.templates)
    # stepping inside backward gives up accumulation: one micro-batch of the whole per-device batch
    assert all(t.optimizer_in_backward and t.gradient_accumulation_steps == 1 for t in rungs[3].templates)
    # the last one-GPU rung keeps exact AMP (fp32 masters on the CPU) and gives up speed: ZeRO-Offload
    assert {(t.strategy, t.offload_optimizer, t.offload_params) for t in rungs[4].templates} == {("zero2", True, False), ("zero3", True, True)}


def test_ladder_honours_requests() -> None:
    rungs = _ladder(optimizer="sgd", ckpt=True, pure=False)
    # no lighter optimizer when one was asked for, no pure bf16 without it; the asked optimizer everywhere
    assert [r.name for r in rungs] == ["exact AMP", "step in backward", "CPU offload (one GPU)"]
    assert [(t.optimizer, t.gradient_checkpointing, t.activation_offloading) for t in rungs[0].templates] == [("sgd", True, False),
                                                                                                          ("sgd", True, True)]
    assert all(t.optimizer == "sgd" and t.gradient_checkpointing for r in rungs for t in r.templates)
    (qlora,) = _ladder(finetune="qlora")
    assert qlora.name == "QLoRA" and all(t.weights_dtype == "nf4" and t.lora is not None for t in qlora.templates)
    (lora,) = _ladder(finetune="lora")
    assert lora.name == "LoRA" and all(t.weights_dtype == "bf16" and t.lora == LoraSpec() for t in lora.templates)


def test_replace_revalidates() -> None:
    s = Setup()
    assert s.replace(micro_batch_size=4).micro_batch_size == 4
    with pytest.raises(ValueError, match="offload_optimizer needs a sharded strategy"):
        s.replace(offload_optimizer=True)  # model_copy(update=...) accepted this silently
    with pytest.raises(ValueError, match="unknown optimizer"):
        s.replace(optimizer="adamw_typo")
    with pytest.raises(InvalidSetupError):
        Setup.parse({"strategy": "ddp", "offload_params": True})


@pytest.mark.parametrize(("strategy", "opt", "grads", "params", "stage"), [
    # ZeRO paper (arXiv:1910.02054) stages: 1 partitions optimizer states, 2 adds gradients, 3 adds parameters;
    # torch FSDP: FULL_SHARD ~ ZeRO-3, SHARD_GRAD_OP ~ ZeRO-2 (parameters sharded at rest, gathered between fwd/bwd)
    ("ddp", False, False, False, None), ("zero1", True, False, False, 1), ("zero2", True, True, False, 2),
    ("zero3", True, True, True, 3), ("fsdp", True, True, True, None), ("fsdp_shard_grad_op", True, True, True, None),
])
def test_sharding_facts(strategy: str, opt: bool, grads: bool, params: bool, stage: int | None) -> None:
    s = Setup(strategy=strategy, num_gpus=2)
    assert (s.shards_optimizer, s.shards_grads, s.shards_params, s.zero_stage) == (opt, grads, params, stage)
    assert s.gathers_params == (strategy in ("zero3", "fsdp"))


def test_weight_bytes() -> None:
    assert [Setup(weights_dtype=d, lora=LoraSpec() if d in ("int8", "nf4") else None).weight_bytes
            for d in ("fp32", "bf16", "fp16", "int8", "nf4")] == [4, 2, 2, 1, 0.5]


def test_scenario_registry_matches_the_public_tuple() -> None:
    assert perfguide.SCENARIOS == registry.names()
    for info in registry.SCENARIO_LIST:
        assert callable(info.plan)
        assert info.name.startswith(info.task)  # names stay readable, but nothing reads meaning from them
    with pytest.raises(UnknownScenarioError):
        registry.get("train_tpu")


def _string_tests(path: Path) -> list[str]:
    """Calls like name.startswith("infer") / "gpu_" in name over the scenario name anywhere in a module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("startswith", "endswith"):
            target = ast.unparse(node.func.value)
            if "scenario" in target:
                found.append(ast.unparse(node))
        if isinstance(node, ast.Compare) and "scenario" in ast.unparse(node.left) and any(
                isinstance(c, ast.Constant) and isinstance(c.value, str) for c in node.comparators):
            found.append(ast.unparse(node))
    return found


def test_no_code_branches_on_a_scenario_name() -> None:
    offenders = {str(p.relative_to(ROOT)): hits for p in ROOT.rglob("*.py") if (hits := _string_tests(p))}
    assert offenders == {}
