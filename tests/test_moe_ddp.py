"""``ddp_find_unused_parameters`` for MoE, checked under real DistributedDataParallel (gloo, one CPU process).

DDP's reducer raises "Expected to have finished reduction in the prior iteration" when a parameter got no gradient
and find_unused_parameters is False. transformers 5 stores a layer's routed experts as fused 3-D tensors, so with
top-1 routing of two tokens over eight experts (six experts idle) every parameter still gets a gradient and False
holds; experts kept as modules of their own (remote code, transformers 4's ModuleList) fail that way, and perfguide
then asks DDP to look for unused parameters.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from perfguide import ModelSpec, recommend

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
dist = pytest.importorskip("torch.distributed")

TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=64, max_position_embeddings=64, num_experts_per_tok=1)
MOE = {
    "mixtral": dict(model_type="mixtral", num_local_experts=8, **TINY),
    "qwen2_moe": dict(model_type="qwen2_moe", num_experts=8, moe_intermediate_size=16, shared_expert_intermediate_size=48, **TINY),
    "qwen3_moe": dict(model_type="qwen3_moe", num_experts=8, moe_intermediate_size=16, **TINY),
}


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    store = Path(tmp_path_factory.mktemp("ddp")) / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _steps(model: Any, find_unused: bool, batches: list[Any]) -> None:
    ddp = torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=find_unused)
    for batch in batches:
        out = ddp(**batch) if isinstance(batch, dict) else ddp(batch)
        (out.loss if hasattr(out, "loss") else out).backward()


@pytest.mark.parametrize("family", sorted(MOE))
def test_fused_experts_train_under_ddp_with_the_flag_perfguide_emits(group: None, family: str) -> None:
    config = MOE[family]
    rec = recommend(config, "train_gpu_many", hardware="a100-80gb:2", seq_len=32, global_batch_size=4, strategy="ddp")
    flag = rec.training_args_dict()["ddp_find_unused_parameters"]
    assert flag is ModelSpec.from_any(config).separate_expert_modules is False
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.for_model(**{k: v for k, v in config.items()}))
    ids = torch.tensor([[3, 5]])  # two tokens, top-1 of 8: at least six experts per layer get no token
    _steps(model, flag, [{"input_ids": ids, "labels": ids}] * 3)  # raises if any parameter went without a gradient


class _SeparateExperts(torch.nn.Module if torch else object):  # type: ignore[misc]
    """The ModuleList layout: each expert its own Linear, one routed to."""

    def __init__(self) -> None:
        super().__init__()
        self.experts = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(4))

    def forward(self, x: Any) -> Any:
        return self.experts[0](x).sum()


def test_separate_expert_modules_need_the_unused_parameter_walk(group: None) -> None:
    with pytest.raises(RuntimeError, match="finished reduction"):
        _steps(_SeparateExperts(), False, [torch.ones(2, 4)] * 3)
    _steps(_SeparateExperts(), True, [torch.ones(2, 4)] * 3)


def test_separate_experts_are_read_from_the_module_and_emitted() -> None:
    """A module whose experts are numbered submodules (remote-code DeepSeek/Mixtral layout) is planned with True."""
    config = transformers.MixtralConfig(**{k: v for k, v in MOE["mixtral"].items() if k != "model_type"})
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
        for layer in model.model.layers:  # the transformers-4 tree: experts.<i>.w1/w2/w3
            layer.mlp.experts = torch.nn.ModuleList(
                torch.nn.ModuleDict({w: torch.nn.Linear(32, 64 if w != "w2" else 32, bias=False) for w in ("w1", "w2", "w3")})
                for _ in range(8))
    spec = ModelSpec.from_any(model)
    assert spec.is_moe and spec.separate_expert_modules
    rec = recommend(spec, "train_gpu_many", hardware="a100-80gb:2", seq_len=32, global_batch_size=4, strategy="ddp")
    assert rec.training_args_dict()["ddp_find_unused_parameters"] is True


def test_dense_models_keep_false() -> None:
    rec = recommend("gpt2", "train_gpu_many", hardware="a100-80gb:2", seq_len=128, global_batch_size=8, strategy="ddp")
    assert rec.training_args_dict()["ddp_find_unused_parameters"] is False
