"""transformers' own step-in-backward and low-rank optimizers (issue 11 item 2/4): LOMO, AdaLomo, GaLore and APOLLO
(plain and layer-wise), schedule-free: state bytes against hand formulas from their papers' definitions, the
TrainingArguments each plan emits built for real, and the rules (one process, no accumulation, packages named)."""

from __future__ import annotations

import pytest

import perfguide as pg
from perfguide import Setup
from perfguide.errors import ConflictingConstraintsError
from perfguide.memory.optimizers import TensorGroup, optimizer_cost
from perfguide.optimizer_facts import row, steps_in_backward

MATRIX = TensorGroup(3, 4096, 14336, "linear")     # three MLP matrices (out x in)
HEAD = TensorGroup(1, 128256, 4096, "head")        # the lm_head: not a GaLore/APOLLO target
NORM = TensorGroup(10, 4096, 1, "other")
GROUPS = [MATRIX, HEAD, NORM]
NEW = ("lomo", "adalomo", "galore_adamw", "galore_adamw_8bit", "galore_adamw_layerwise", "galore_adamw_8bit_layerwise",
       "apollo_adamw", "apollo_adamw_layerwise", "schedule_free_adamw", "schedule_free_radam", "schedule_free_sgd")


def test_lomo_keeps_no_state():
    assert optimizer_cost("lomo", GROUPS, 2).states == 0


def test_adalomo_factored_fp32_second_moments():
    want = 3 * (4096 + 14336) * 4 + (128256 + 4096) * 4 + 10 * 4096 * 4
    assert optimizer_cost("adalomo", GROUPS, 2).states == want


@pytest.mark.parametrize("name", ["galore_adamw", "galore_adamw_layerwise", "apollo_adamw_layerwise"])
def test_low_rank_states_projected_on_targets_full_elsewhere(name):
    """Target m x n: 2 moments of r x max(m, n) + an r x min(m, n) projection; head and norms: plain AdamW (2 x numel)."""
    pb, r = 4, 128
    target = 3 * (2 * r * 14336 + r * 4096) * pb
    rest = (128256 * 4096 + 10 * 4096) * pb * 2
    assert optimizer_cost(name, GROUPS, pb).states == target + rest


def test_galore_8bit_uses_bnb_blocks():
    r, blocks = 128, 2048
    low = r * 14336
    target = 3 * (2 * (low + -(-low // blocks) * 4) + r * 4096 * 2)
    head = 2 * (128256 * 4096 + -(-128256 * 4096 // blocks) * 4)
    norms = 10 * 2 * (4096 + 2 * 4)   # 4096 elements is not under bnb's min_8bit_size (numel < 4096 stays fp32)
    assert optimizer_cost("galore_adamw_8bit_layerwise", GROUPS, 2).states == target + head + norms


def test_schedule_free_states():
    total = sum(g.total for g in GROUPS)
    assert optimizer_cost("schedule_free_adamw", GROUPS, 2).states == 2 * 2 * total
    assert optimizer_cost("schedule_free_sgd", GROUPS, 4).states == 4 * total


@pytest.mark.parametrize("name", NEW)
def test_every_name_is_a_transformers_optim_and_names_its_package(name):
    from transformers.training_args import OptimizerNames

    assert OptimizerNames(name).value == name
    assert row(name).package in ("lomo-optim", "galore-torch", "apollo-torch", "schedulefree")


def test_in_backward_names_need_optimizer_in_backward():
    assert steps_in_backward("lomo") and steps_in_backward("apollo_adamw_layerwise") and not steps_in_backward("galore_adamw")
    with pytest.raises(ValueError, match="steps inside backward through the Trainer"):
        Setup(optimizer="lomo", autocast="bf16", weights_dtype="bf16")
    Setup(optimizer="lomo", autocast="bf16", weights_dtype="bf16", optimizer_in_backward=True)


@pytest.fixture(scope="module")
def lomo_plan():
    return pg.recommend("meta-llama/Llama-3.1-8B", scenario="train_gpu_one", hardware="rtx4090", optimizer="adalomo", global_batch_size=4)


def test_adalomo_plan_steps_in_backward(lomo_plan):
    s = lomo_plan.setup
    assert s.optimizer == "adalomo" and s.optimizer_in_backward and s.gradient_accumulation_steps == 1
    assert any("lomo-optim" in w for w in lomo_plan.warnings)
    p = lomo_plan.model.total_params
    # AdaLomo's factored state is well under 1% of AdamW's 8 B/param (bf16: 4 B/param)
    assert lomo_plan.memory.optimizer_states < 0.01 * 4 * p


def test_layerwise_galore_plan_emits_target_modules_and_builds_training_arguments(tmp_path):
    rec = pg.recommend("meta-llama/Llama-3.2-1B", scenario="train_gpu_one", hardware="a100-80gb", optimizer="galore_adamw_layerwise")
    kw = rec.training_args_dict()
    assert kw["optim"] == "galore_adamw_layerwise" and kw["optim_target_modules"] == [r".*.attn.*", r".*.mlp.*"]
    assert kw["gradient_accumulation_steps"] == 1 and kw["max_grad_norm"] == 0.0
    from transformers import TrainingArguments

    kw = {**kw, "use_cpu": True}
    kw.pop("bf16", None)
    kw.pop("tf32", None)
    args = TrainingArguments(output_dir=str(tmp_path), **kw)   # validates the optim name and the target modules' type
    assert args.optim.value == "galore_adamw_layerwise"
    assert rec.optimizers(None, args) == (None, None)          # the Trainer builds and hooks it itself


def test_in_backward_names_refused_on_several_gpus():
    with pytest.raises(ConflictingConstraintsError, match="one GPU"):
        pg.recommend("meta-llama/Llama-3.1-8B", scenario="train_gpu_many", hardware="a100-80gb:8", optimizer="lomo")


def test_in_backward_names_refused_with_lora():
    with pytest.raises(ConflictingConstraintsError, match="full fine-tune"):
        pg.recommend("meta-llama/Llama-3.1-8B", scenario="train_gpu_one", hardware="a100-80gb", optimizer="lomo", finetune="lora")


@pytest.mark.parametrize("name", NEW)
def test_training_arguments_accept_every_new_name_without_its_package(name, tmp_path):
    """TrainingArguments validates the name at init (an OptimizerNames member) but imports the optimizer's package only
    when the Trainer builds it, so a plan naming lomo-optim / galore-torch / apollo-torch / schedulefree constructs here;
    the plan's warning names the package the target needs."""
    from transformers import TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path), optim=name, use_cpu=True)
    assert args.optim.value == name
